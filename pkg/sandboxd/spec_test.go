package sandboxd

import (
	"errors"
	"strings"
	"testing"
)

// The limit is exact (FuzzDecodeSpec checks it too). A body over it used to be accepted when the
// bytes past the limit were whitespace: the limited reader cut them off, the decoder saw the end.
func TestDecodeStrictLimit(t *testing.T) {
	const body = `{"signal":"SIGTERM"}`
	tests := []struct {
		name    string
		body    string
		limit   int64
		wantErr error
	}{
		{name: "exactly the limit", body: body, limit: int64(len(body))},
		{name: "one byte over", body: body, limit: int64(len(body) - 1), wantErr: errBodyTooLarge},
		{name: "trailing space over the limit", body: body + " ", limit: int64(len(body)), wantErr: errBodyTooLarge},
		{name: "much trailing space", body: body + strings.Repeat(" ", 100), limit: 30, wantErr: errBodyTooLarge},
		{name: "a second value over the limit", body: body + `{}`, limit: int64(len(body)), wantErr: errBodyTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var req signalRequest
			if err := decodeStrict(strings.NewReader(tc.body), tc.limit, &req); !errors.Is(err, tc.wantErr) {
				t.Errorf("decodeStrict(%d bytes, limit %d) = %v, want %v", len(tc.body), tc.limit, err, tc.wantErr)
			}
		})
	}
}

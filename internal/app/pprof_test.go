package app_test

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
)

// TestPprofNeedsTheOpsServer: the profiles are off by default and, asked for, need the ops
// server to be served on; the error names both settings.
func TestPprofNeedsTheOpsServer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       map[string]string
		wantPprof bool
		wantErr   string
	}{
		{name: "default", env: map[string]string{}},
		{name: "with the ops server", env: map[string]string{"KUBECLIP_PPROF": "true", "KUBECLIP_OPS_ADDR": ":8080"}, wantPprof: true},
		{name: "without the ops server", env: map[string]string{"KUBECLIP_PPROF": "true"}, wantPprof: true,
			wantErr: "--pprof (KUBECLIP_PPROF) needs --ops-addr (KUBECLIP_OPS_ADDR)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c app.Common
			fs := config.New("test", func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			c.Bind(fs)
			if err := fs.Parse(nil); err != nil {
				t.Fatal(err)
			}
			if c.Pprof != tc.wantPprof {
				t.Errorf("Pprof = %v, want %v", c.Pprof, tc.wantPprof)
			}
			err := c.Validate(fs)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

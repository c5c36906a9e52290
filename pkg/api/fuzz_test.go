package api

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// FuzzValidateRequest feeds the validate service what any NATS client may send. Its seed corpus
// under testdata/fuzz runs with every `go test`; `make fuzz` explores.
func FuzzValidateRequest(f *testing.F) {
	f.Add([]byte(`{"config":{"backend":"pod","egressAllowCidrs":["10.0.0.0/8"]}}`))
	op := policy.DefaultOperator()
	f.Fuzz(func(t *testing.T, data []byte) {
		reply := validateMsg(data, op)
		// The plugin reads errors and warnings as arrays, and ok exactly when there are no errors.
		if reply.Errors == nil || reply.Warnings == nil {
			t.Fatalf("reply %+v: errors and warnings must be arrays", reply)
		}
		if reply.OK != (len(reply.Errors) == 0) || reply.OK != (reply.NormalizedConfig != nil) {
			t.Fatalf("reply ok %v with %d errors, normalized config %v", reply.OK, len(reply.Errors), reply.NormalizedConfig != nil)
		}
		for _, fe := range reply.Errors {
			if fe.Message == "" {
				t.Fatalf("error without a message: %+v", fe)
			}
		}
		if _, err := json.Marshal(reply); err != nil {
			t.Fatalf("encoding the reply: %v", err)
		}
		if !reply.OK {
			return
		}
		// The verdict is pkg/policy's: the config the request carries parses to the normalized one.
		var req ValidateRequest
		if err := json.Unmarshal(data, &req); err != nil {
			t.Fatalf("an accepted request does not decode: %v", err)
		}
		cfg, err := policy.ParseConfig(req.Config)
		if err != nil {
			t.Fatalf("accepted a config pkg/policy refuses: %v", err)
		}
		if diff := cmp.Diff(cfg, *reply.NormalizedConfig); diff != "" {
			t.Fatalf("normalized config (-policy +reply):\n%s", diff)
		}
	})
}

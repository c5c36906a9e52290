package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestStatusAsTheCLIUser runs `kubeclip status` as the shipped cli user, which may read the lease
// and run streams' info and nothing else of the workers' (nats-auth.conf): the command still
// answers within its bound, with what it could read, and every row it could not read names what
// failed. A report under this user is partial by design; docs/scale/status.md says which
// permissions a full one needs.
func TestStatusAsTheCLIUser(t *testing.T) {
	in := install(t)
	start := time.Now()
	out, err := in.kubeclip(t.Context(), "cli", "status", "-o", "json", "--timeout", "8s")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var r statusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	readable := map[string]bool{"PAPERCLIP_LEASES": true, "PAPERCLIP_RUNS": true, "KV_" + lease.Bucket: true}
	for _, s := range r.Streams {
		switch {
		case readable[s.Stream] && (s.Error != "" || s.Absent):
			t.Errorf("stream %s: %+v, want its usage", s.Stream, s)
		case !readable[s.Stream] && !strings.Contains(s.Error, "reading stream "+s.Stream+": "):
			t.Errorf("stream %s: error %q, want one naming it", s.Stream, s.Error)
		}
	}
	for _, c := range r.Consumers {
		if !c.Absent && !strings.Contains(c.Error, "reading consumer "+c.Consumer+" of stream "+c.Stream+": ") {
			t.Errorf("consumer %s/%s: %+v, want absent or an error naming it", c.Stream, c.Consumer, c)
		}
	}
	if !strings.Contains(r.Leases.Error, "reading the lease records (stream KV_KUBECLIP_LEASES): ") {
		t.Errorf("leases: %+v, want an error naming the bucket's stream", r.Leases)
	}
	t.Logf("status as the cli user took %s", took)
}

package execsvc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// TestCompanyFloodDoesNotDelayAnother: company A floods a replica with long starts; alone, A is
// served up to the replica's capacity but its reserve (work-conserving: before, a fixed quarter)
// and the rest are refused at once (unavailable); company B's first exec is then admitted from
// the reserve and runs.
func TestCompanyFloodDoesNotDelayAnother(t *testing.T) {
	const flood, capacity, reserve = 200, 8, 1
	e := newEnvTuned(t, 1, func(o *execsvc.Options) { o.MaxSessions = capacity })
	a, b := e.newLease(newID("co-a")), e.newLease(newID("co-b"))

	subj, err := execproto.NewSubjects(e.subjects).Request(a.CompanyID, a.RunID, execproto.OpStart)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	answered, refused := map[string]bool{}, 0
	sub, err := e.clientNC.Subscribe(inbox.CLIPrefix+".flood.>", func(m *nats.Msg) {
		k := execproto.KindOf(m)
		if k != execproto.KindStarted && k != execproto.KindError {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !answered[m.Subject] {
			answered[m.Subject] = true
			if k == execproto.KindError {
				refused++
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for i := range flood {
		data, _ := json.Marshal(execproto.StartRequest{ExecID: newID("flood"), ProviderLeaseID: a.ProviderLeaseID, Command: "sleep", Args: []string{"20"}, TimeoutMs: 20_000})
		if err := e.clientNC.PublishRequest(subj, fmt.Sprintf("%s.flood.%d", inbox.CLIPrefix, i), data); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every request of the flood is answered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(answered) == flood
	})
	mu.Lock()
	if want := flood - (capacity - reserve); refused != want {
		t.Errorf("%d of company A's %d starts refused, want %d (all but the replica's %d streams less its reserve of %d)", refused, flood, want, capacity, reserve)
	}
	mu.Unlock()

	// B's first exec is served at once, from the reserve A may not take.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := e.client.Run(ctx, execclient.Exec{Lease: b.Lease, Command: "echo", Args: []string{"b"}})
	if err != nil || string(res.Stdout) != "b\n" {
		t.Fatalf("company B's exec during A's flood: stdout %q, %v", res.Stdout, err)
	}
}

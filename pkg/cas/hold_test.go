package cas_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/cas"
)

// TestTakeAndFree: a free key is taken; another taker finds the holder; the holder takes it
// again (a restart); only the holder frees it; a freed key is taken by the next.
func TestTakeAndFree(t *testing.T) {
	kv := bucket(t)
	ctx := t.Context()
	steps := []struct {
		name, op, value, wantHolder string
	}{
		{name: "A takes a free key", op: "take", value: "A", wantHolder: "A"},
		{name: "B finds A holding it", op: "take", value: "B", wantHolder: "A"},
		{name: "A takes it again", op: "take", value: "A", wantHolder: "A"},
		{name: "B cannot free A's hold", op: "free", value: "B", wantHolder: "A"},
		{name: "A frees it", op: "free", value: "A", wantHolder: ""},
		{name: "freeing a free key is a no-op", op: "free", value: "A", wantHolder: ""},
		{name: "B takes the freed key", op: "take", value: "B", wantHolder: "B"},
	}
	for _, s := range steps {
		switch s.op {
		case "take":
			held, rev, err := cas.Take(ctx, kv, "hold", []byte(s.value))
			if err != nil || string(held) != s.wantHolder || rev == 0 {
				t.Fatalf("%s: Take = %q at %d, %v; want %q", s.name, held, rev, err, s.wantHolder)
			}
		case "free":
			if err := cas.Free(ctx, kv, "hold", []byte(s.value)); err != nil {
				t.Fatalf("%s: Free: %v", s.name, err)
			}
		}
		got := ""
		if entry, err := kv.Get(ctx, "hold"); err == nil {
			got = string(entry.Value())
		}
		if got != s.wantHolder {
			t.Fatalf("%s: the key holds %q, want %q", s.name, got, s.wantHolder)
		}
	}
}

// TestTakeRace: takers racing for one key agree on one holder, the one the key names.
func TestTakeRace(t *testing.T) {
	kv := bucket(t)
	const takers = 6
	holders := make([]string, takers)
	var wg sync.WaitGroup
	for i := range takers {
		wg.Go(func() {
			held, _, err := cas.Take(t.Context(), kv, "hold", fmt.Appendf(nil, "t%d", i))
			if err != nil {
				t.Errorf("taker %d: %v", i, err)
			}
			holders[i] = string(held)
		})
	}
	wg.Wait()
	got, _ := value(t, kv, "hold")
	for i, h := range holders {
		if h != got {
			t.Errorf("taker %d was told %q holds the key; it holds %q", i, h, got)
		}
	}
}

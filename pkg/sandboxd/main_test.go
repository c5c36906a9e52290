package sandboxd

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// TestReaper is the test binary's one Reaper: servers of every test share it, since wait4(-1)
// in two reapers would steal each other's exit statuses.
var TestReaper *Reaper

func TestMain(m *testing.M) {
	r, err := NewReaper(zerolog.Nop())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	TestReaper = r
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	code := m.Run()
	cancel()
	<-done
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// KnownCodes is every API error code with its HTTP status, for the test that each is produced.
func KnownCodes() map[string]int {
	out := map[string]int{}
	for code, c := range codeTable() {
		out[code] = c.status
	}
	return out
}

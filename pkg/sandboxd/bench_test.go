package sandboxd_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// BenchmarkExecTrue measures one exec's round trip with keep-alive: start `true`, read its
// output stream to the exit frame. This is the cost of each of the ~9 bridge polls per second a
// Paperclip run makes, minus the network. "tls" is the exec-worker's route over the pod network
// (loopback here); "unix" the socket `sandboxd proxy` uses. BenchmarkSpawnTrue is the floor.
func BenchmarkExecTrue(b *testing.B) {
	h := startServer(b, func(o *sandboxd.Options) {
		o.JournalTTL = time.Second
		o.Logger = zerolog.Nop() // a debug line per request would be measured too
	})
	for _, bc := range []struct {
		name string
		c    *sandboxd.Client
	}{{"tls", h.tls}, {"unix", h.unix}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				id := newID()
				if _, err := bc.c.Start(ctx, sandboxd.Spec{ID: id, Command: "true"}); err != nil {
					b.Fatal(err)
				}
				if _, exit, err := output(ctx, bc.c, id, 1); err != nil || exit.ExitCode == nil || *exit.ExitCode != 0 {
					b.Fatalf("exit %+v, %v", exit, err)
				}
			}
		})
	}
}

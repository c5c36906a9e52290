package sandboxd

import (
	"os"
	"testing"
)

// BenchmarkSpawnTrue is the floor under BenchmarkExecTrue: fork, exec and reap `true` with its
// pipes, and nothing of HTTP, TLS or the journal. The difference is sandboxd's own cost.
func BenchmarkSpawnTrue(b *testing.B) {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		b.Fatal(err)
	}
	defer devNull.Close()
	for b.Loop() {
		p, err := spawn(TestReaper, Spec{Command: "true"}, []string{"PATH=/usr/bin:/bin"}, devNull)
		if err != nil {
			b.Fatal(err)
		}
		<-p.status
		_ = p.stdout.Close()
		_ = p.stderr.Close()
	}
}

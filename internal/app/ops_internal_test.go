package app

import (
	"testing"

	"github.com/kubeclip/kubeclip/pkg/dispatch"
)

// TestParkedStreamIsTheDispatchers: the workers report the dispatcher's parked stream under the
// name pkg/dispatch gives it; internal/app names it itself so as not to link pkg/dispatch into
// every worker.
func TestParkedStreamIsTheDispatchers(t *testing.T) {
	if parkedStream != dispatch.ParkedStream {
		t.Errorf("parkedStream = %q, want dispatch.ParkedStream %q", parkedStream, dispatch.ParkedStream)
	}
}

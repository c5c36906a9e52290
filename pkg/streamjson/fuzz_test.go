package streamjson_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// FuzzParser feeds the parser transcripts as an agent pod may write them: the pod is the
// tenant's, so anything. The fixtures under testdata are seeds with exit codes 0 and 1, beside
// the corpus under testdata/fuzz; all run with every `go test`, `make fuzz` explores.
func FuzzParser(f *testing.F) {
	fixtures, err := filepath.Glob(filepath.Join("testdata", "*.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range fixtures {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, 0)
		f.Add(data, 1)
	}
	const maxSummary = 256
	codes := []string{"",
		streamjson.ErrorAuthRequired, streamjson.ErrorModelNotFound, streamjson.ErrorMaxTurnsExhausted,
		streamjson.ErrorPoisonedPreviousMessageID, streamjson.ErrorProviderQuota, streamjson.ErrorTransientUpstream,
		streamjson.ErrorRefusal, streamjson.ErrorLLMAPI, streamjson.ErrorTruncated,
	}
	f.Fuzz(func(t *testing.T, transcript []byte, exitCode int) {
		p := streamjson.Parser{MaxSummaryBytes: maxSummary}
		for _, line := range bytes.Split(transcript, []byte("\n")) {
			p.Feed(line)
		}
		stream, got := p.ResultWithExitCode(0), p.ResultWithExitCode(exitCode)
		if diff := cmp.Diff(stream, p.ResultWithExitCode(0)); diff != "" {
			t.Fatalf("ResultWithExitCode changed the parser (-first +second):\n%s", diff)
		}

		// The exit code only decides whether a run without a successful result event failed.
		if stream.IsError && !got.IsError {
			t.Fatalf("failed with exit code 0 but not with %d", exitCode)
		}
		if got.Usage == nil && !got.IsError {
			t.Fatalf("a stream without a result event is a success")
		}
		same := *got
		same.IsError, same.ErrorCode = stream.IsError, stream.ErrorCode
		if diff := cmp.Diff(stream, &same); diff != "" {
			t.Fatalf("the exit code changed more than the verdict (-exit 0 +exit %d):\n%s", exitCode, diff)
		}

		// ErrorCode is a known code; without a failure only a refusal is worth a code.
		if !slices.Contains(codes, got.ErrorCode) || (!got.IsError && got.ErrorCode != "" && got.ErrorCode != streamjson.ErrorRefusal) {
			t.Fatalf("error code %q with isError %v", got.ErrorCode, got.IsError)
		}
		if got.ErrorCode == streamjson.ErrorPoisonedPreviousMessageID && got.SessionID != "" {
			t.Fatalf("a poisoned session %q is offered for resuming", got.SessionID)
		}

		// The summary is bounded text, and the result is the `agent` object of a result event.
		if len(got.Summary) > maxSummary+len("…") || !utf8.ValidString(got.Summary) {
			t.Fatalf("summary of %d bytes (valid UTF-8: %v)", len(got.Summary), utf8.ValidString(got.Summary))
		}
		if got.CostUSD != nil && (math.IsNaN(*got.CostUSD) || math.IsInf(*got.CostUSD, 0)) {
			t.Fatalf("cost %v", *got.CostUSD)
		}
		if _, err := json.Marshal(got); err != nil {
			t.Fatalf("encoding the result: %v", err)
		}
	})
}

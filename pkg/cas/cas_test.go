package cas_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/cas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func bucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "CAS_TEST", History: 1})
	if err != nil {
		t.Fatalf("creating the bucket: %v", err)
	}
	return kv
}

// increment is a Modify that adds one to a decimal counter (none: 0).
func increment(current []byte, _ uint64) ([]byte, bool, error) {
	n := 0
	if current != nil {
		var err error
		if n, err = strconv.Atoi(string(current)); err != nil {
			return nil, false, err
		}
	}
	return []byte(strconv.Itoa(n + 1)), true, nil
}

func value(t *testing.T, kv jetstream.KeyValue, key string) (string, uint64) {
	t.Helper()
	entry, err := kv.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	return string(entry.Value()), entry.Revision()
}

// TestUpdateConcurrentUpdaters: updaters racing on one key lose no update: the counter ends at
// the number of Updates that succeeded, and an Update that did not succeed says it was
// contended. Some of them must have conflicted, or the test proves nothing.
func TestUpdateConcurrentUpdaters(t *testing.T) {
	kv := bucket(t)
	const updaters, each = 4, 25
	var (
		mu              sync.Mutex
		ok, calls, lost int
		wg              sync.WaitGroup
	)
	for range updaters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				_, err := cas.Update(t.Context(), kv, "counter", func(current []byte, rev uint64) ([]byte, bool, error) {
					mu.Lock()
					calls++
					mu.Unlock()
					return increment(current, rev)
				})
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, cas.ErrContended):
					lost++
				default:
					t.Errorf("Update: %v", err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	got, _ := value(t, kv, "counter")
	if got != strconv.Itoa(ok) {
		t.Errorf("counter = %s after %d successful updates (%d contended)", got, ok, lost)
	}
	if calls <= updaters*each {
		t.Errorf("modify ran %d times for %d updates: no update conflicted", calls, updaters*each)
	}
}

// TestUpdateRetriesAConflict: a write that lands between Update's read and its write is read
// again and built upon, not overwritten.
func TestUpdateRetriesAConflict(t *testing.T) {
	kv := bucket(t)
	ctx := t.Context()
	if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	var seen []string
	rev, err := cas.Update(ctx, kv, "k", func(current []byte, rev uint64) ([]byte, bool, error) {
		seen = append(seen, string(current))
		if len(seen) == 1 {
			if _, err := kv.Put(ctx, "k", []byte("10")); err != nil { // another writer
				t.Fatal(err)
			}
		}
		return increment(current, rev)
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	got, gotRev := value(t, kv, "k")
	if got != "11" || gotRev != rev || len(seen) != 2 || seen[1] != "10" {
		t.Errorf("after a conflict: value %s at %d (Update said %d), modify saw %q; want 11, the other writer's 10 read again", got, gotRev, rev, seen)
	}
}

// TestUpdateCreates: a key with no value (never written, or deleted) is created; a Create racing
// another creator is a conflict like any other.
func TestUpdateCreates(t *testing.T) {
	kv := bucket(t)
	ctx := t.Context()
	if _, err := cas.Update(ctx, kv, "new", increment); err != nil {
		t.Fatalf("Update of a new key: %v", err)
	}
	if got, _ := value(t, kv, "new"); got != "1" {
		t.Errorf("new key = %s, want 1", got)
	}
	if err := kv.Delete(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := cas.Update(ctx, kv, "new", increment); err != nil {
		t.Fatalf("Update of a deleted key: %v", err)
	}
	if got, _ := value(t, kv, "new"); got != "1" {
		t.Errorf("deleted key updated to %s, want 1", got)
	}

	calls := 0
	_, err := cas.Update(ctx, kv, "raced", func(current []byte, rev uint64) ([]byte, bool, error) {
		calls++
		if calls == 1 {
			if _, err := kv.Create(ctx, "raced", []byte("5")); err != nil {
				t.Fatal(err)
			}
		}
		return increment(current, rev)
	})
	if got, _ := value(t, kv, "raced"); err != nil || got != "6" || calls != 2 {
		t.Errorf("Update racing a creator = %s after %d calls (%v); want 6 after 2", got, calls, err)
	}
}

// TestUpdateReturnsARefusal: an error from modify is Update's, as is, and nothing is written;
// a modify that wants no write writes nothing and gets the revision it read.
func TestUpdateReturnsARefusal(t *testing.T) {
	kv := bucket(t)
	ctx := t.Context()
	readRev, err := kv.Put(ctx, "k", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	refusal := errors.New("not allowed")
	rev, err := cas.Update(ctx, kv, "k", func([]byte, uint64) ([]byte, bool, error) {
		return []byte("2"), true, refusal
	})
	if err != refusal || rev != readRev { //nolint:errorlint // as is: the very error, not wrapped
		t.Errorf("Update with a refusing modify = %d, %v; want %d, the refusal itself", rev, err, readRev)
	}
	rev, err = cas.Update(ctx, kv, "k", func([]byte, uint64) ([]byte, bool, error) { return []byte("2"), false, nil })
	if err != nil || rev != readRev {
		t.Errorf("Update with no write = %d, %v; want %d", rev, err, readRev)
	}
	if got, gotRev := value(t, kv, "k"); got != "1" || gotRev != readRev {
		t.Errorf("key = %s at %d, want untouched 1 at %d", got, gotRev, readRev)
	}
}

// TestUpdateRetriesAreBounded: a key that changes under every attempt ends the Update with
// ErrContended after MaxAttempts reads, not a spin.
func TestUpdateRetriesAreBounded(t *testing.T) {
	kv := bucket(t)
	ctx := t.Context()
	calls := 0
	_, err := cas.Update(ctx, kv, "k", func(current []byte, rev uint64) ([]byte, bool, error) {
		calls++
		if _, err := kv.Put(ctx, "k", []byte("100")); err != nil {
			t.Fatal(err)
		}
		return increment(current, rev)
	})
	if !errors.Is(err, cas.ErrContended) || calls != cas.MaxAttempts {
		t.Errorf("Update under constant writes = %v after %d attempts; want ErrContended after %d", err, calls, cas.MaxAttempts)
	}
	if got, _ := value(t, kv, "k"); got != "100" {
		t.Errorf("key = %s, want the other writer's 100", got)
	}
}

// TestIsConflict: an Update's conflict on a replicated bucket (code 10164, which nats.go wraps
// with ErrKeyRevisionMismatch only) is a conflict, though ErrKeyExists does not match it.
func TestIsConflict(t *testing.T) {
	replicated := fmt.Errorf("%w: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}, jetstream.ErrKeyRevisionMismatch)
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "create of an existing key", err: jetstream.ErrKeyExists, want: true},
		{name: "update at another revision, one replica", err: fmt.Errorf("%w: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, jetstream.ErrKeyRevisionMismatch), want: true},
		{name: "update at another revision, replicated", err: replicated, want: true},
		{name: "no key", err: jetstream.ErrKeyNotFound},
		{name: "timeout", err: context.DeadlineExceeded},
		{name: "none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := cas.IsConflict(tc.err); got != tc.want {
				t.Errorf("IsConflict(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
	if errors.Is(replicated, jetstream.ErrKeyExists) {
		t.Error("ErrKeyExists matches a replicated bucket's conflict: the test no longer shows why IsConflict exists")
	}
}

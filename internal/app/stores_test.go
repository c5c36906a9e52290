package app_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// ensureEveryStore creates every stream and bucket the workers create at start-up, sized from
// st: the common set-up (app.Common.JetStream: the lease, run and work streams, the lease and
// tenant buckets), then each worker's own (tenant-worker: retry; dispatcher: parked, agents,
// warm; run-watcher: ownership, budgets; exec-worker: recorded execs, budgets).
func ensureEveryStore(t *testing.T, url string, st app.Streams) jetstream.JetStream {
	t.Helper()
	ctx := t.Context()
	c := app.Common{NATSURL: url, SubjectPrefix: events.DefaultPrefix}
	nc, js, err := c.JetStream(ctx, "tenant-worker", st, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	store := int64(st.StoreBytes)
	for _, cfg := range []jetstream.StreamConfig{events.RetryStreamConfig(st.Replicas, store), dispatch.ParkedStreamConfig(st.Replicas, store)} {
		if _, err := events.EnsureStream(ctx, js, cfg); err != nil {
			t.Fatalf("stream %s: %v", cfg.Name, err)
		}
	}
	for _, cfg := range []jetstream.KeyValueConfig{
		dispatch.AgentBucketConfig(st.Replicas, store), dispatch.WarmBucketConfig(st.Replicas, store),
		runwatch.OwnershipBucketConfig(runwatch.DefaultOwnershipTTL, st.Replicas, store),
		execsvc.RecordedBucketConfig(st.Replicas, store), events.BudgetBucketConfig(st.Replicas, 0, store),
		broker.BucketOptions{StoreBytes: store, Replicas: st.Replicas}.Config(),
	} {
		if _, err := events.EnsureBucket(ctx, js, cfg); err != nil {
			t.Fatalf("bucket %s: %v", cfg.Bucket, err)
		}
	}
	return js
}

// TestEveryStoreIsBounded: on a server whose file store is exactly --store-bytes (the smallest
// allowed and the cluster tests' 1 GiB), every stream and bucket the workers create is there,
// listed by the server itself, each with a byte limit that is its share in events.Stores; the
// server accepted all of them (it refuses a stream whose limit does not fit what the others
// reserved), and together they leave the headroom. Before, KV_KUBECLIP_LEASES,
// KV_KUBECLIP_TENANTS, KV_KUBECLIP_AGENTS, KV_KUBECLIP_WARM and KV_KUBECLIP_WATCH had none.
func TestEveryStoreIsBounded(t *testing.T) {
	for _, store := range []int64{events.MinStoreBytes, natstest.ClusterStoreBytes} {
		t.Run(fmt.Sprintf("%dMiB", store>>20), func(t *testing.T) {
			srv, _, _ := natstest.StartWithStore(t, store)
			st := app.Streams{Replicas: 1, LeaseRetention: events.DefaultLeaseMaxAge, RunRetention: events.DefaultRunMaxAge, StoreBytes: int(store)}
			js := ensureEveryStore(t, srv.ClientURL(), st)

			want := map[string]int64{}
			for i, name := range (events.Subjects{}).StreamNames() {
				want[name] = events.StoreLimit(store, events.Stores()[i].Store)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			names := js.ListStreams(ctx)
			var total int64
			seen := map[string]bool{}
			for info := range names.Info() {
				name, limit := info.Config.Name, info.Config.MaxBytes
				seen[name] = true
				total += max(limit, 0)
				switch w, listed := want[name]; {
				case limit <= 0:
					t.Errorf("%s has no byte limit (MaxBytes %d)", name, limit)
				case !listed:
					t.Errorf("%s (MaxBytes %d) is not in events.Stores: its share is nobody's", name, limit)
				case limit != w:
					t.Errorf("%s has MaxBytes %d, want its share %d", name, limit, w)
				}
			}
			if err := names.Err(); err != nil {
				t.Fatal(err)
			}
			for name := range want {
				if !seen[name] {
					t.Errorf("%s is in events.Stores but no worker created it", name)
				}
			}
			t.Logf("%d streams and buckets reserve %d of %d bytes (%.1f%%)", len(seen), total, store, 100*float64(total)/float64(store))
			if limit := store / 1000 * events.StoreSharedPermille; total > limit {
				t.Errorf("the stores reserve %d bytes, more than %d (%d‰ of the %d-byte store)", total, limit, events.StoreSharedPermille, store)
			}
		})
	}
}

// TestEveryStoreConfigSetsItsLimit reads kubeclip's own source: every stream or bucket
// configuration it writes (a jetstream.StreamConfig or KeyValueConfig literal outside tests)
// sets MaxBytes from the one table (events.StoreLimit), so a new store cannot be added without
// a share; TestEveryStoreIsBounded checks the shares the server holds.
func TestEveryStoreConfigSetsItsLimit(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", "testdata", ".git", "tests", "plugins", "hack":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "StreamConfig" && sel.Sel.Name != "KeyValueConfig") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "jetstream" {
				return true
			}
			found++
			where := fset.Position(lit.Pos())
			for _, elt := range lit.Elts {
				kv, ok := elt.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "MaxBytes" {
					value := string(src[fset.Position(kv.Value.Pos()).Offset:fset.Position(kv.Value.End()).Offset])
					if !strings.Contains(value, "StoreLimit(") && !strings.Contains(value, ".limit(Store") {
						t.Errorf("%s: a %s sets MaxBytes to %s, not its share (events.StoreLimit)", where, sel.Sel.Name, value)
					}
					return true
				}
			}
			t.Errorf("%s: a %s without MaxBytes: every store needs a share in events.Stores", where, sel.Sel.Name)
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < len(events.Stores()) {
		t.Errorf("found %d store configurations, fewer than the %d stores", found, len(events.Stores()))
	}
}

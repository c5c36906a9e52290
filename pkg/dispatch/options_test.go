package dispatch

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic/fake"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// TestOptionsDefaults pins the settings issue 16 chose: 32 requests at once (an acquire is API
// round trips, see DefaultConcurrency), reconcile pages of 500 (workload.DefaultListPageSize),
// and no dispatcher without the metadata client its reconcile pass lists with.
func TestOptionsDefaults(t *testing.T) {
	_, _, js := natstest.Start(t)
	dyn := fake.NewSimpleDynamicClient(runtime.NewScheme())
	cs := k8sfake.NewClientset()
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Clientset: cs, Dynamic: dyn, Applier: applier, JetStream: js}
	if _, err := opts.withDefaults(); err == nil {
		t.Error("withDefaults without Metadata succeeded, want an error naming it")
	}
	opts.Metadata = metadatafake.NewSimpleMetadataClient(runtime.NewScheme())
	got, err := opts.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.Concurrency != 32 || got.ReconcilePageSize != 500 || workload.DefaultListPageSize != 500 {
		t.Errorf("Concurrency %d, ReconcilePageSize %d (default %d); want 32 and 500", got.Concurrency, got.ReconcilePageSize, workload.DefaultListPageSize)
	}
}

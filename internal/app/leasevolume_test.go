package app_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Issue 19: reusable leases' volume claims take the operator's class and sizes from flags (and
// environment variables) of the tenant-worker and the dispatcher; a bad value names its flag.
func TestTenancyLeaseVolume(t *testing.T) {
	op, _, err := tenancyOperator(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := policy.DefaultLeaseVolume()
	want := []string{"", def.MinSize.String(), def.DefaultSize.String(), def.MaxSize.String()}
	got := []string{op.LeaseVolume.StorageClass, op.LeaseVolume.MinSize.String(), op.LeaseVolume.DefaultSize.String(), op.LeaseVolume.MaxSize.String()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}

	op, _, err = tenancyOperator(t, map[string]string{"KUBECLIP_LEASE_VOLUME_STORAGE_CLASS": "fast-ssd"},
		"--lease-volume-size", "4Gi", "--lease-volume-min-size", "2Gi", "--lease-volume-max-size", "8Gi")
	if err != nil {
		t.Fatal(err)
	}
	got = []string{op.LeaseVolume.StorageClass, op.LeaseVolume.MinSize.String(), op.LeaseVolume.DefaultSize.String(), op.LeaseVolume.MaxSize.String()}
	if diff := cmp.Diff([]string{"fast-ssd", "2Gi", "4Gi", "8Gi"}, got); diff != "" {
		t.Errorf("settings (-want +got):\n%s", diff)
	}

	for _, tc := range []struct{ args []string }{
		{[]string{"--lease-volume-size", "big"}},
		{[]string{"--lease-volume-min-size", "1Gb"}},
		{[]string{"--lease-volume-max-size", "1Gi"}}, // below the default 10Gi
		{[]string{"--lease-volume-storage-class", "Not_A_Class"}},
		{[]string{"--tenant-quota", "requests.storage=1Gi"}},
	} {
		_, s, err := tenancyOperator(t, nil, tc.args...)
		if err == nil || !strings.Contains(err.Error(), s.Names(strings.TrimPrefix(tc.args[0], "--"))) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, s.Names(strings.TrimPrefix(tc.args[0], "--")))
		}
	}
}

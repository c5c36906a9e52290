package policy

import (
	"fmt"
	"time"
)

// Bounds of a requested lease deadline (lease-expiry.ts).
const (
	// MinActiveDeadlineSec: a lease ending sooner than this is refused; no useful work fits.
	MinActiveDeadlineSec = 30
	// MaxActiveDeadlineSec caps a granted lease at 24h.
	MaxActiveDeadlineSec = 24 * 60 * 60
)

// LeaseDeadline is a provider-attested bound on a lease.
type LeaseDeadline struct {
	// ActiveDeadlineSeconds goes on the workload's pod; Kubernetes counts it from the pod's
	// start, so it is a backstop, and HardStopAt is the real bound.
	ActiveDeadlineSeconds int64
	// HardStopAt is the lease's expiry, whole seconds, never after the requested one.
	HardStopAt time.Time
}

// ExpiresAt formats HardStopAt as JavaScript's toISOString does ("2026-08-01T12:00:00.000Z"),
// for the lease's expiresAt.
func (d LeaseDeadline) ExpiresAt() string {
	return d.HardStopAt.UTC().Format("2006-01-02T15:04:05.000Z")
}

// ComputeBoundedLeaseDeadline bounds a lease by the caller's requestedExpiresAt
// (computeBoundedLeaseDeadline): nil when none is requested; an error wrapping
// ErrInvalidLeaseDeadline when it does not parse or is less than 30 s after now (fail closed);
// else activeDeadlineSeconds = min(whole seconds until it, 24h) and the hard stop that many
// seconds after now (rounded down to the second).
//
// Deviation: JavaScript's Date.parse accepts many formats, including local times without a
// zone; kubeclip accepts RFC 3339 only.
func ComputeBoundedLeaseDeadline(requestedExpiresAt string, now time.Time) (*LeaseDeadline, error) {
	if requestedExpiresAt == "" {
		return nil, nil
	}
	req, err := time.Parse(time.RFC3339Nano, requestedExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("requested lease deadline (%s) is not a valid ISO 8601 timestamp; failing closed instead of substituting a default deadline: %w",
			quoteShort(requestedExpiresAt), ErrInvalidLeaseDeadline)
	}
	nowMs := now.UnixMilli()
	secs := floorDiv(req.UnixMilli()-nowMs, 1000)
	if secs < MinActiveDeadlineSec {
		return nil, fmt.Errorf("requested lease deadline (%s) is already past or too close (< %ds) to acquire a bounded lease; failing closed: %w",
			requestedExpiresAt, MinActiveDeadlineSec, ErrInvalidLeaseDeadline)
	}
	secs = min(secs, MaxActiveDeadlineSec)
	return &LeaseDeadline{
		ActiveDeadlineSeconds: secs,
		HardStopAt:            time.Unix(floorDiv(nowMs, 1000)+secs, 0).UTC(),
	}, nil
}

// floorDiv is Math.floor(a / b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

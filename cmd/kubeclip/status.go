package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
)

const statusSummary = `status shows one screen of the installation, read from NATS alone (the lease records, the
streams, the workers' consumers) and from the workers' /metrics pages (--metrics-url, repeatable):
leases per company and state, live exec sessions, the oldest pending request and the lag of each
worker's consumer, stream usage against its limits, and the permissions the workers' self-checks
found missing. docs/monitoring.md (kubeclip status) explains each section and the -o json shape.`

// Defaults of the status bounds. Each is explained where statusOptions documents its field.
const (
	defaultStatusInterval   = 2 * time.Second
	defaultStatusTimeout    = 10 * time.Second
	defaultLeaseScanLimit   = 200_000
	defaultOldestLiveLeases = 5
)

// statusOptions are `kubeclip status`'s settings.
type statusOptions struct {
	// Company limits the lease section to one company (empty: every company).
	Company string
	// MetricsURLs are the workers' /metrics pages (none: the NATS sections only).
	MetricsURLs []string
	// Output is "text" or "json".
	Output string
	// Watch redraws every Interval until interrupted.
	Watch    bool
	Interval time.Duration
	// Timeout bounds one collection: every NATS request and scrape, and the lease scan, which
	// stops at it and says it is partial.
	Timeout time.Duration
	// LeaseScanLimit bounds the lease records one collection reads; the scan stops there and
	// says it is partial. Memory does not grow with it (the scan keeps counts and the few oldest
	// live leases), only time does: about 1 s per 100,000 records (docs/monitoring.md, `kubeclip status`).
	LeaseScanLimit int
	// OldestLive is how many of the oldest live leases are listed by id.
	OldestLive int
}

func (o statusOptions) validate(fs *config.Set) error {
	switch {
	case o.Output != "text" && o.Output != "json":
		return fmt.Errorf("%s must be text or json, got %q", fs.Names("output"), o.Output)
	case o.Interval <= 0:
		return fmt.Errorf("%s must be > 0", fs.Names("interval"))
	case o.Timeout <= 0:
		return fmt.Errorf("%s must be > 0", fs.Names("timeout"))
	case o.LeaseScanLimit <= 0:
		return fmt.Errorf("%s must be > 0", fs.Names("lease-scan-limit"))
	case o.OldestLive < 0 || o.OldestLive > maxOldestLive:
		return fmt.Errorf("%s must be between 0 and %d", fs.Names("oldest"), maxOldestLive)
	}
	if o.Company != "" {
		if err := validateCompany(o.Company); err != nil {
			return fmt.Errorf("%s: %w", fs.Names("company"), err)
		}
	}
	for _, u := range o.MetricsURLs {
		if err := validateMetricsURL(u); err != nil {
			return fmt.Errorf("%s: %w", fs.Names("metrics-url"), err)
		}
	}
	return nil
}

func runStatus(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	var c client
	var o statusOptions
	fs := config.New("kubeclip status", lookupEnv)
	c.bind(fs)
	fs.String(&o.Company, "company", "KUBECLIP_COMPANY", "", "show only this company's leases")
	fs.Strings(&o.MetricsURLs, "metrics-url", "", "KUBECLIP_METRICS_URLS", "a worker's /metrics URL, e.g. http://dispatcher:8080/metrics; the variable holds one per line")
	fs.String(&o.Output, "output", "KUBECLIP_OUTPUT", "text", "text, or json (also -o json; docs/monitoring.md has its shape)")
	fs.Bool(&o.Watch, "watch", "KUBECLIP_WATCH", false, "redraw every --interval until interrupted")
	fs.Duration(&o.Interval, "interval", "KUBECLIP_STATUS_INTERVAL", defaultStatusInterval, "how often --watch redraws")
	fs.Duration(&o.Timeout, "timeout", "KUBECLIP_STATUS_TIMEOUT", defaultStatusTimeout, "bound on one collection (NATS, the scrapes, the lease scan, which is partial past it)")
	fs.Int(&o.LeaseScanLimit, "lease-scan-limit", "KUBECLIP_LEASE_SCAN_LIMIT", defaultLeaseScanLimit, "most lease records one collection reads (the count is partial past it)")
	fs.Int(&o.OldestLive, "oldest", "KUBECLIP_STATUS_OLDEST", defaultOldestLiveLeases, "how many of the oldest live leases to list by id")
	// -o is kubectl's spelling of --output.
	oArgs := make([]string, 0, len(args))
	for _, a := range args {
		if a == "-o" {
			a = "--output"
		} else if v, ok := strings.CutPrefix(a, "-o="); ok {
			a = "--output=" + v
		}
		oArgs = append(oArgs, a)
	}
	if err := parse(fs, oArgs, stdout, statusSummary); err != nil {
		return err
	}
	if err := o.validate(fs); err != nil {
		return &app.UsageError{Err: err}
	}
	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	src := statusSource{
		JS: js, Subjects: s, HTTP: &http.Client{}, Now: time.Now,
		KeepScanConsumer: c.NATS.User == statusUser,
	}
	clear := o.Watch && o.Output == "text" && isTerminal(stdout)
	for {
		r, err := collectStatus(ctx, src, o)
		if err != nil {
			if o.Watch && ctx.Err() != nil {
				return nil // Ctrl-C during a draw ends a watch as it does between draws
			}
			return err
		}
		if clear {
			fmt.Fprint(stdout, "\033[H\033[2J")
		}
		if err := writeStatus(stdout, r, o.Output); err != nil {
			return err
		}
		if !o.Watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch: not an error
		case <-time.After(o.Interval):
		}
	}
}

// writeStatus writes r as text or as one JSON document.
func writeStatus(w io.Writer, r statusReport, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.writeText(w)
}

// isTerminal reports whether w is a terminal, where --watch clears the screen between draws (a
// file or a pipe gets one report after another).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kubeclip/kubeclip/pkg/lease"
)

// writeText prints the report for a person: one section after another, each a table.
func (r statusReport) writeText(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "kubeclip status at %s\n", r.Time.Format(time.RFC3339))
	if !r.Metrics {
		fmt.Fprintln(w, "no --metrics-url given: NATS only; exec sessions and self-checks not shown")
	}

	l := r.Leases
	fmt.Fprintln(w)
	title := "LEASES"
	if l.Company != "" {
		title += " of company " + l.Company
	}
	switch {
	case l.Error != "":
		fmt.Fprintf(w, "%s: %s\n", title, l.Error)
	case l.Complete:
		fmt.Fprintf(w, "%s (every record read: %d)\n", title, l.Scanned)
	default:
		fmt.Fprintf(w, "%s (partial: stopped at the %s after %d records; --lease-scan-limit %d, --timeout)\n", title, l.Partial, l.Scanned, l.Limit)
	}
	if l.Undecodable > 0 {
		fmt.Fprintf(w, "not lease records: %d (key or value of another shape)\n", l.Undecodable)
	}
	if len(l.Companies) > 0 {
		fmt.Fprintln(w, "COMPANY\tTOTAL\tLIVE\tBY STATE")
		rows := l.Companies
		if l.OtherCompanies != nil {
			rows = append(slices.Clip(rows), *l.OtherCompanies)
		}
		for _, c := range rows {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", c.Company, c.Total, c.Live, byState(c.States))
		}
	}
	if len(l.OldestLive) > 0 {
		fmt.Fprintln(w, "\nOLDEST LIVE LEASES")
		fmt.Fprintln(w, "COMPANY\tRUN\tLEASE\tSTATE\tBACKEND\tNAMESPACE\tAGE")
		for _, x := range l.OldestLive {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.Company, x.Run, orDash(x.Lease), x.State, orDash(x.Backend), orDash(x.Namespace), seconds(x.AgeSeconds))
		}
	}

	r.Spend.writeText(w)

	fmt.Fprintln(w, "\nCONSUMERS")
	fmt.Fprintln(w, "WORKER\tSTREAM\tCONSUMER\tPENDING\tACK PENDING\tREDELIVERED\tWAITING\tOLDEST PENDING")
	for _, c := range r.Consumers {
		switch {
		case c.Error != "":
			fmt.Fprintf(w, "%s\t%s\t%s\t-\t-\t-\t-\terror: %s\n", c.Worker, c.Stream, c.Consumer, c.Error)
		case c.Absent:
			fmt.Fprintf(w, "%s\t%s\t%s\t-\t-\t-\t-\tabsent (its worker never started)\n", c.Worker, c.Stream, c.Consumer)
		default:
			oldest := "-"
			if c.OldestPendingAt != nil {
				oldest = fmt.Sprintf("%s (seq %d)", seconds(c.OldestPendingAgeSeconds), c.OldestPendingSeq)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", c.Worker, c.Stream, c.Consumer, c.NumPending, c.NumAckPending, c.NumRedelivered, c.NumWaiting, oldest)
		}
	}

	fmt.Fprintln(w, "\nSTREAMS")
	fmt.Fprintln(w, "STREAM\tMSGS\tMAX MSGS\tBYTES\tMAX BYTES\tUSED\tCONSUMERS")
	for _, s := range r.Streams {
		switch {
		case s.Error != "":
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\terror: %s\n", s.Stream, s.Error)
		case s.Absent:
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\tabsent\n", s.Stream)
		default:
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\t%.1f%%\t%d\n", s.Stream, s.Msgs, limit(s.MaxMsgs), s.Bytes, limit(s.MaxBytes), s.UsedPercent, s.Consumers)
		}
	}

	if r.Metrics {
		fmt.Fprintf(w, "\nWORKERS (live exec sessions: %g)\n", r.ExecStreams)
		fmt.Fprintln(w, "URL\tSTATE\tSELF-CHECK\tEXEC SESSIONS\tMISSING PERMISSIONS OR ERROR")
		for _, x := range r.Workers {
			if !x.Reachable {
				fmt.Fprintf(w, "%s\tunreachable\t-\t-\t%s\n", x.URL, x.Error)
				continue
			}
			check := "-"
			if x.SelfCheckOK != nil {
				check = map[bool]string{true: "ok", false: "FAILED"}[*x.SelfCheckOK]
			}
			missing := make([]string, 0, len(x.MissingPermissions))
			for _, p := range x.MissingPermissions {
				missing = append(missing, p.Kind+": "+p.Permission)
			}
			fmt.Fprintf(w, "%s\tup\t%s\t%g\t%s\n", x.URL, check, x.ExecStreams, orDash(strings.Join(missing, ", ")))
		}
	}
	return w.Flush()
}

// byState lists the counts as "created=2 failed=1", in state order.
func byState(states map[lease.State]int) string {
	keys := make([]string, 0, len(states))
	for s := range states {
		keys = append(keys, string(s))
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, states[lease.State(k)]))
	}
	return strings.Join(parts, " ")
}

func seconds(s float64) string { return (time.Duration(s*10) * time.Second / 10).String() }

func limit(v int64) string {
	if v <= 0 {
		return "none"
	}
	return fmt.Sprint(v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeText prints the spend section: calls and tokens per company today.
func (s spendSummary) writeText(w io.Writer) {
	title := "MODEL API SPEND on " + s.Day + " (UTC, counted by the credential broker)"
	if s.Company != "" {
		title += " of company " + s.Company
	}
	switch {
	case s.Error != "":
		fmt.Fprintf(w, "\n%s: %s\n", title, s.Error)
		return
	case !s.Complete:
		title += " (partial: stopped at the --timeout)"
	}
	fmt.Fprintf(w, "\n%s\n", title)
	if s.Undecodable > 0 {
		fmt.Fprintf(w, "not spend counters: %d (value of another shape)\n", s.Undecodable)
	}
	rows := s.Companies
	if s.OtherCompanies != nil {
		rows = append(slices.Clip(rows), *s.OtherCompanies)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no brokered calls today")
		return
	}
	fmt.Fprintln(w, "COMPANY\tREQUESTS\tTOKENS")
	for _, c := range rows {
		fmt.Fprintf(w, "%s\t%d\t%d\n", c.Company, c.Requests, c.Tokens)
	}
}

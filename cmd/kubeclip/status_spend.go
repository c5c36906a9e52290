package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// spendStream and spendKeyPrefix are where the credential broker's per-company counters are
// (events.SpendKey in KUBECLIP_BUDGETS).
const (
	spendStream    = "KV_" + events.BudgetBucket
	spendKeyPrefix = "$KV." + events.BudgetBucket + "."
)

// spendSummary is what each company spent through the credential broker on Day (UTC), as the
// broker's replicas counted it in their shared counters: the calls that ended and the tokens
// (input plus output) their upstreams stated. A replica writes its share every second.
type spendSummary struct {
	// Day is the UTC date counted ("2026-12-07"); the counters turn over at midnight UTC.
	Day string `json:"day"`
	// Company is the --company filter (empty: all).
	Company string `json:"company,omitempty"`
	// Complete is false when the scan stopped at --timeout.
	Complete bool `json:"complete"`
	// Companies are sorted by company id; OtherCompanies sums those past maxStatusCompanies.
	Companies      []companySpend `json:"companies"`
	OtherCompanies *companySpend  `json:"otherCompanies,omitempty"`
	// Undecodable counts counters whose value is not a spend's.
	Undecodable int `json:"undecodable,omitempty"`
	// Error names what failed when the counters could not be read.
	Error string `json:"error,omitempty"`
}

// companySpend is one company's calls and tokens of the day.
type companySpend struct {
	Company  string `json:"company"`
	Requests int64  `json:"requests"`
	Tokens   int64  `json:"tokens"`
}

// scanSpend reads today's counter of every company (or of o.Company) through one ephemeral
// pull consumer, as scanLeases reads the lease records: each counter's last value, at most one
// batch and maxStatusCompanies rows held.
func scanSpend(ctx context.Context, js jetstream.JetStream, o statusOptions, now time.Time, deleteConsumer bool) (sum spendSummary) {
	day := events.SpendDay(now)
	sum = spendSummary{Day: events.SpendDayStart(day).Format(time.DateOnly), Company: o.Company, Companies: []companySpend{}}
	filter := spendKeyPrefix + events.SpendKeyFilter(day)
	if o.Company != "" {
		filter = spendKeyPrefix + events.SpendKey(o.Company, day)
	}
	createCtx, cancel := context.WithTimeout(ctx, statusRequestTimeout)
	defer cancel()
	cons, err := createScanConsumer(createCtx, js, spendStream, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: leaseScanInactive,
		MemoryStorage:     true,
		Replicas:          1,
	})
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamNotFound:
		sum.Complete = true // no worker made the bucket yet: nothing spent
		return sum
	case err != nil:
		sum.Error = fmt.Sprintf("reading the broker's spend counters (stream %s): %v", spendStream, unanswered(err))
		return sum
	}
	if deleteConsumer {
		defer deleteScanConsumer(ctx, js, cons)
	}
	rows := map[string]*companySpend{}
	defer func() { sum.finish(rows) }()
	if cons.CachedInfo().NumPending == 0 {
		sum.Complete = true
		return sum
	}
	for {
		batch, err := cons.FetchNoWait(leaseScanBatch)
		if err != nil {
			sum.Error = fmt.Sprintf("reading the broker's spend counters (stream %s): %v", spendStream, err)
			return sum
		}
		got, last := 0, false
		for m := range batch.Messages() {
			got++
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				last = true
			}
			if isKVMarker(m.Headers()) {
				continue
			}
			company, _, ok := events.ParseSpendKey(strings.TrimPrefix(m.Subject(), spendKeyPrefix))
			spend, err := events.DecodeSpend(m.Data())
			if !ok || err != nil {
				sum.Undecodable++
				continue
			}
			sum.count(rows, company, spend)
		}
		switch err := batch.Error(); {
		case errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
			return sum
		case err != nil && !errors.Is(err, jetstream.ErrNoMessages):
			sum.Error = fmt.Sprintf("reading the broker's spend counters (stream %s): %v", spendStream, err)
			return sum
		}
		if got == 0 || last {
			sum.Complete = true
			return sum
		}
	}
}

// count adds one company's counter, or adds it to OtherCompanies past maxStatusCompanies.
func (s *spendSummary) count(rows map[string]*companySpend, company string, spend events.Spend) {
	c, ok := rows[company]
	if !ok && len(rows) == maxStatusCompanies {
		if s.OtherCompanies == nil {
			s.OtherCompanies = &companySpend{Company: "(others)"}
		}
		c = s.OtherCompanies
	} else if !ok {
		c = &companySpend{Company: company}
		rows[company] = c
	}
	c.Requests += spend.Requests
	c.Tokens += spend.Tokens
}

// finish sorts the companies into the summary.
func (s *spendSummary) finish(rows map[string]*companySpend) {
	for _, c := range rows {
		s.Companies = append(s.Companies, *c)
	}
	slices.SortFunc(s.Companies, func(a, b companySpend) int { return cmp.Compare(a.Company, b.Company) })
}

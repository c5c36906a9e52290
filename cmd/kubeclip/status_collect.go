package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// Fixed bounds of one collection (docs/monitoring.md, `kubeclip status`).
const (
	// maxStatusCompanies bounds the per-company lease counts one report holds: past it, further
	// companies' leases are counted together under otherCompanies, so a bucket of a million
	// companies costs what a bucket of a thousand does.
	maxStatusCompanies = 1000
	// statusRequestTimeout bounds one stream's or consumer's reads (within --timeout).
	statusRequestTimeout = 3 * time.Second
	// maxOldestLive bounds --oldest.
	maxOldestLive = 100
)

// statusSource is what a collection reads.
type statusSource struct {
	JS       jetstream.JetStream
	Subjects events.Subjects
	HTTP     *http.Client
	// Now is the report's clock: its time and every age in it.
	Now func() time.Time
	// KeepScanConsumer leaves the lease scan's consumer to the server (leaseScanInactive) rather
	// than deleting it: for a user that may not delete a consumer, whose attempt would go
	// unanswered for deleteConsumerTimeout (the status user: NATS cannot narrow its deletions to
	// its own consumer, nats-auth.conf).
	KeepScanConsumer bool
}

// statusReport is one collection: what `kubeclip status` prints and `-o json` encodes. Every list
// is sorted; nothing in it is a secret (no environment, no token, no URL's user information).
type statusReport struct {
	Time      time.Time        `json:"time"`
	Leases    leaseSummary     `json:"leases"`
	Consumers []consumerStatus `json:"consumers"`
	Streams   []streamStatus   `json:"streams"`
	// Spend is what each company spent through the credential broker today (UTC).
	Spend spendSummary `json:"spend"`
	// Metrics is false when no --metrics-url was given: the exec sessions and the self-checks are
	// then unknown, not zero.
	Metrics bool           `json:"metrics"`
	Workers []workerStatus `json:"workers"`
	// ExecStreams is the sum of kubeclip_exec_streams over the workers that answered.
	ExecStreams float64 `json:"execStreams"`
}

// leaseSummary is the lease records by company and state.
type leaseSummary struct {
	// Company is the --company filter (empty: all).
	Company string `json:"company,omitempty"`
	// Scanned is how many records were read; Complete whether that is all of them, else
	// Partial says which bound stopped the scan ("limit" or "timeout").
	Scanned  int    `json:"scanned"`
	Complete bool   `json:"complete"`
	Partial  string `json:"partial,omitempty"`
	// Limit is the scan bound (--lease-scan-limit).
	Limit int `json:"limit"`
	// Undecodable counts records whose key or value is not a lease record's.
	Undecodable int `json:"undecodable"`
	// Companies are the counts per company, by company id; OtherCompanies sums the companies
	// past maxStatusCompanies (nil when there are none).
	Companies      []companyLeases `json:"companies"`
	OtherCompanies *companyLeases  `json:"otherCompanies,omitempty"`
	// OldestLive are the oldest live leases (requested, dispatching, created), oldest first.
	OldestLive []liveLease `json:"oldestLive"`
	// Error names what failed when the records could not be read.
	Error string `json:"error,omitempty"`
}

// companyLeases counts one company's leases.
type companyLeases struct {
	Company string `json:"company"`
	Total   int    `json:"total"`
	Live    int    `json:"live"`
	// States counts by state (encoding/json writes a map's keys sorted).
	States map[lease.State]int `json:"states"`
}

func (c *companyLeases) add(s lease.State) {
	c.Total++
	if s.Live() {
		c.Live++
	}
	c.States[s]++
}

// liveLease is one live lease, by id.
type liveLease struct {
	Company    string      `json:"company"`
	Run        string      `json:"run"`
	Lease      string      `json:"lease,omitempty"`
	State      lease.State `json:"state"`
	Backend    string      `json:"backend,omitempty"`
	Namespace  string      `json:"namespace,omitempty"`
	CreatedAt  time.Time   `json:"createdAt"`
	AgeSeconds float64     `json:"ageSeconds"`
}

// consumerStatus is one worker consumer's lag and its oldest request not yet acknowledged.
type consumerStatus struct {
	Worker   string `json:"worker"`
	Stream   string `json:"stream"`
	Consumer string `json:"consumer"`
	// Absent: the consumer does not exist (its worker never started).
	Absent         bool   `json:"absent,omitempty"`
	NumPending     uint64 `json:"numPending"`
	NumAckPending  int    `json:"numAckPending"`
	NumRedelivered int    `json:"numRedelivered"`
	NumWaiting     int    `json:"numWaiting"`
	AckFloor       uint64 `json:"ackFloor"`
	// OldestPendingSeq, OldestPendingAt and OldestPendingAgeSeconds are the stream message right
	// after the ack floor that the consumer takes: the oldest request it has not acknowledged
	// (0 and absent when it has none).
	OldestPendingSeq        uint64     `json:"oldestPendingSeq,omitempty"`
	OldestPendingAt         *time.Time `json:"oldestPendingAt,omitempty"`
	OldestPendingAgeSeconds float64    `json:"oldestPendingAgeSeconds,omitempty"`
	Error                   string     `json:"error,omitempty"`
}

// streamStatus is one stream's (or KV bucket's) usage against its limits; -1 is no limit.
type streamStatus struct {
	Stream    string `json:"stream"`
	Absent    bool   `json:"absent,omitempty"`
	Msgs      uint64 `json:"msgs"`
	MaxMsgs   int64  `json:"maxMsgs"`
	Bytes     uint64 `json:"bytes"`
	MaxBytes  int64  `json:"maxBytes"`
	Consumers int    `json:"consumers"`
	// UsedPercent is the larger of bytes/maxBytes and msgs/maxMsgs, in percent, 0.1 precision
	// (0 when neither is limited).
	UsedPercent float64 `json:"usedPercent"`
	Error       string  `json:"error,omitempty"`
}

// statusStreams are kubeclip's streams and the streams of its KV buckets (pkg/events' table of
// stores), sorted.
func statusStreams(s events.Subjects) []string {
	names := s.StreamNames()
	slices.Sort(names)
	return names
}

// collectStatus reads one report, bounded by o.Timeout. Only a cancelled ctx fails it: whatever
// else fails is written on the row it concerns, naming the stream, consumer or URL.
func collectStatus(ctx context.Context, src statusSource, o statusOptions) (statusReport, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	now := src.Now()
	r := statusReport{Time: now.UTC(), Metrics: len(o.MetricsURLs) > 0}
	// The scrapes, the streams and the consumers are fixed lists, read at once: a request the
	// user may not make is never answered (NATS drops it), so it costs statusRequestTimeout, and
	// one after the other they would cost that many times it.
	var wg sync.WaitGroup
	wg.Go(func() { r.Workers = scrapeWorkers(ctx, src.HTTP, o.MetricsURLs) })
	streams := statusStreams(src.Subjects)
	r.Streams = make([]streamStatus, len(streams))
	for i, name := range streams {
		wg.Go(func() { r.Streams[i] = streamUsage(ctx, src.JS, name) })
	}
	consumers := api.QueueConsumers(src.Subjects)
	r.Consumers = make([]consumerStatus, len(consumers))
	for i, wc := range consumers {
		wg.Go(func() { r.Consumers[i] = consumerLag(ctx, src.JS, wc) })
	}
	var queues api.QueuesReply
	var queuesErr error
	wg.Go(func() { queues, queuesErr = askQueues(ctx, src) })
	wg.Wait()
	for i := range r.Consumers {
		oldestPending(&r.Consumers[i], queues, queuesErr, now)
	}
	// After the streams' info: the scans' own consumers are not the buckets'.
	// The two scans at once, each on its own bucket.
	wg.Go(func() { r.Spend = scanSpend(ctx, src.JS, o, now, !src.KeepScanConsumer) })
	r.Leases = scanLeases(ctx, src.JS, o, now, !src.KeepScanConsumer)
	wg.Wait()
	for _, w := range r.Workers {
		r.ExecStreams += w.ExecStreams
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return statusReport{}, err
	}
	return r, nil
}

// streamUsage reads one stream's info.
func streamUsage(ctx context.Context, js jetstream.JetStream, name string) streamStatus {
	ctx, cancel := context.WithTimeout(ctx, statusRequestTimeout)
	defer cancel()
	st := streamStatus{Stream: name}
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st.Absent = true
		return st
	}
	if err != nil {
		st.Error = fmt.Sprintf("reading stream %s: %v", name, unanswered(err))
		return st
	}
	info := s.CachedInfo()
	st.Msgs, st.Bytes, st.Consumers = info.State.Msgs, info.State.Bytes, info.State.Consumers
	st.MaxMsgs, st.MaxBytes = info.Config.MaxMsgs, info.Config.MaxBytes
	st.UsedPercent = max(percent(st.Bytes, st.MaxBytes), percent(st.Msgs, st.MaxMsgs))
	return st
}

// percent is used of limit in percent to 0.1; 0 for no limit.
func percent(used uint64, limit int64) float64 {
	if limit <= 0 {
		return 0
	}
	return float64(int64(float64(used)*1000/float64(limit)+0.5)) / 10
}

// consumerLag reads a work consumer's info.
func consumerLag(ctx context.Context, js jetstream.JetStream, wc api.QueueConsumer) consumerStatus {
	ctx, cancel := context.WithTimeout(ctx, statusRequestTimeout)
	defer cancel()
	cs := consumerStatus{Worker: wc.Worker, Stream: wc.Stream, Consumer: wc.Consumer}
	c, err := js.Consumer(ctx, wc.Stream, wc.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		cs.Absent = true
		return cs
	case err != nil:
		cs.Error = fmt.Sprintf("reading consumer %s of stream %s: %v", wc.Consumer, wc.Stream, unanswered(err))
		return cs
	}
	info := c.CachedInfo()
	cs.NumPending, cs.NumAckPending = info.NumPending, info.NumAckPending
	cs.NumRedelivered, cs.NumWaiting = info.NumRedelivered, info.NumWaiting
	cs.AckFloor = info.AckFloor.Stream
	return cs
}

// askQueues asks the tenant-worker's queues service where each work consumer's oldest
// request stands (pkg/api.ServeQueues): the requests are the companies', which the status user
// does not read (docs/monitoring.md, `kubeclip status`).
func askQueues(ctx context.Context, src statusSource) (api.QueuesReply, error) {
	ctx, cancel := context.WithTimeout(ctx, statusRequestTimeout)
	defer cancel()
	subject := api.QueuesSubject(src.Subjects)
	m, err := src.JS.Conn().RequestWithContext(ctx, subject, nil)
	if err != nil {
		return api.QueuesReply{}, fmt.Errorf("asking %s (the tenant-worker answers): %w", subject, unanswered(err))
	}
	var r api.QueuesReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return api.QueuesReply{}, fmt.Errorf("decoding the answer of %s: %w", subject, err)
	}
	return r, nil
}

// oldestPending puts the oldest request of cs's consumer from the queues service's answer (or
// the error asking it) on cs, when cs holds requests.
func oldestPending(cs *consumerStatus, queues api.QueuesReply, err error, now time.Time) {
	if cs.Absent || cs.Error != "" || (cs.NumPending == 0 && cs.NumAckPending == 0) {
		return
	}
	if err != nil {
		cs.Error = fmt.Sprintf("reading consumer %s's oldest request: %v", cs.Consumer, err)
		return
	}
	for _, o := range queues.Oldest {
		if o.Stream != cs.Stream || o.Consumer != cs.Consumer {
			continue
		}
		switch {
		case o.Error != "":
			cs.Error = o.Error
		case o.At != nil:
			at := o.At.UTC()
			cs.OldestPendingSeq, cs.OldestPendingAt = o.Seq, &at
			cs.OldestPendingAgeSeconds = roundSeconds(now.Sub(at))
		}
		return
	}
}

// roundSeconds is d in seconds to 0.1.
func roundSeconds(d time.Duration) float64 { return d.Round(100 * time.Millisecond).Seconds() }

// scanLeases counts the lease records by company and state, reading each record's last value
// through an ephemeral pull consumer in batches of leaseScanBatch, and stops at o.LeaseScanLimit
// records or ctx's deadline. What it holds is bounded whatever the bucket holds: one batch,
// maxStatusCompanies counters and o.OldestLive leases. It deletes its consumer when it ends if
// deleteConsumer, else the server removes it after leaseScanInactive.
func scanLeases(ctx context.Context, js jetstream.JetStream, o statusOptions, now time.Time, deleteConsumer bool) (sum leaseSummary) {
	sum = leaseSummary{Company: o.Company, Limit: o.LeaseScanLimit, Companies: []companyLeases{}, OldestLive: []liveLease{}}
	companies := map[string]*companyLeases{}
	defer func() { sum.finish(companies) }()
	subjects := leaseKeyPrefix + ">"
	if o.Company != "" {
		subjects = leaseKeyPrefix + companyKeys(o.Company)
	}
	// One ephemeral consumer for the whole scan, not an ordered one: an ordered consumer makes a
	// new consumer for each fetch, from the next stream sequence, which delivers every revision
	// after it (a record's earlier states too), not each record's last.
	createCtx, cancel := context.WithTimeout(ctx, statusRequestTimeout)
	defer cancel()
	cons, err := createScanConsumer(createCtx, js, leaseStream, jetstream.ConsumerConfig{
		FilterSubject:     subjects,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: leaseScanInactive,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		sum.Error = fmt.Sprintf("reading the lease records (stream %s): %v", leaseStream, unanswered(err))
		return sum
	}
	if deleteConsumer {
		defer deleteScanConsumer(ctx, js, cons)
	}
	if cons.CachedInfo().NumPending == 0 {
		sum.Complete = true
		return sum
	}
	for {
		batch, err := cons.FetchNoWait(leaseScanBatch)
		if err != nil {
			sum.Error = fmt.Sprintf("reading the lease records (stream %s): %v", leaseStream, err)
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
			if sum.Scanned == o.LeaseScanLimit {
				sum.Partial = "limit"
				for range batch.Messages() { // the rest of the batch, before the consumer goes
				}
				return sum
			}
			sum.Scanned++
			sum.add(companies, m.Subject(), m.Data(), o.OldestLive, now)
		}
		switch err := batch.Error(); {
		case errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
			sum.Partial = "timeout"
			return sum
		case err != nil && !errors.Is(err, jetstream.ErrNoMessages):
			sum.Error = fmt.Sprintf("reading the lease records (stream %s): %v", leaseStream, err)
			return sum
		}
		if got == 0 || last { // every record's last value was read
			sum.Complete = true
			return sum
		}
	}
}

// The lease scan's settings (docs/monitoring.md, `kubeclip status`).
const (
	leaseStream    = "KV_" + lease.Bucket
	leaseKeyPrefix = "$KV." + lease.Bucket + "."
	// leaseScanBatch is how many records one fetch holds: a record is a few hundred bytes, so a
	// batch is about 64 KiB (16 MiB at the bucket's 64 KiB value bound, which no record nears).
	// Bigger batches are not faster: 100,000 records take about 1 s at 256, 1,024 or 4,096
	// (docs/monitoring.md, `kubeclip status`).
	leaseScanBatch = 256
	// leaseScanInactive lets the server remove a scan's consumer soon after the scan ends, when
	// the user may not delete it itself (neither the cli nor the status user may,
	// nats-auth.conf), or the command was killed.
	leaseScanInactive = 10 * time.Second
	// deleteConsumerTimeout bounds deleting a finished scan's consumer.
	deleteConsumerTimeout = 2 * time.Second
)

// add counts one record; a key or value of another shape is counted as undecodable.
func (s *leaseSummary) add(companies map[string]*companyLeases, subject string, data []byte, oldest int, now time.Time) {
	var rec lease.Record
	err := json.Unmarshal(data, &rec)
	ref, ok := events.ParseRunKey(strings.TrimPrefix(subject, leaseKeyPrefix))
	if err != nil || !ok || ref != rec.Ref() {
		s.Undecodable++
		return
	}
	s.count(companies, rec)
	if rec.State.Live() {
		s.OldestLive = keepOldest(s.OldestLive, liveLease{
			Company: rec.CompanyID, Run: rec.RunID, Lease: rec.WorkloadName, State: rec.State,
			Backend: rec.Backend, Namespace: rec.Namespace, CreatedAt: rec.CreatedAt.UTC(),
			AgeSeconds: roundSeconds(now.Sub(rec.CreatedAt)),
		}, oldest)
	}
}

// isKVMarker reports a KV delete or purge marker (or a server's marker of a removed key): no
// record.
func isKVMarker(h nats.Header) bool {
	return h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != ""
}

// createScanConsumer creates a scan's consumer on stream (the lease scan's, the spend scan's) through JetStream's ephemeral-only
// endpoint, CONSUMER.CREATE.<stream> (the server refuses a durable there), rather than the named
// one jetstream.CreateConsumer calls, whose subject cannot tell a durable from an ephemeral: so
// the status user may create only ephemeral consumers (nats-auth.conf).
func createScanConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	req, err := json.Marshal(struct {
		Stream string                   `json:"stream_name"`
		Config jetstream.ConsumerConfig `json:"config"`
	}{stream, cfg})
	if err != nil {
		return nil, err
	}
	msg, err := js.Conn().RequestWithContext(ctx, jetstream.DefaultAPIPrefix+"CONSUMER.CREATE."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Name  string              `json:"name"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("decoding the consumer's creation: %w", err)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	return js.Consumer(ctx, stream, resp.Name)
}

// deleteScanConsumer removes a finished scan's consumer; where the user may not, the server
// does after leaseScanInactive. It runs when the scan ends, often because ctx's deadline
// passed, so it keeps ctx's values but not its end: deleteConsumerTimeout bounds it instead.
func deleteScanConsumer(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteConsumerTimeout)
	defer cancel()
	_ = js.DeleteConsumer(ctx, info.Stream, info.Name)
}

// count adds rec to its company's counters, or to OtherCompanies past maxStatusCompanies.
func (s *leaseSummary) count(companies map[string]*companyLeases, rec lease.Record) {
	c, ok := companies[rec.CompanyID]
	if !ok && len(companies) == maxStatusCompanies {
		if s.OtherCompanies == nil {
			s.OtherCompanies = &companyLeases{Company: "(others)", States: map[lease.State]int{}}
		}
		s.OtherCompanies.add(rec.State)
		return
	}
	if !ok {
		c = &companyLeases{Company: rec.CompanyID, States: map[lease.State]int{}}
		companies[rec.CompanyID] = c
	}
	c.add(rec.State)
}

// finish sorts the companies into the summary.
func (s *leaseSummary) finish(companies map[string]*companyLeases) {
	for _, c := range companies {
		s.Companies = append(s.Companies, *c)
	}
	slices.SortFunc(s.Companies, func(a, b companyLeases) int { return strings.Compare(a.Company, b.Company) })
}

// keepOldest inserts l into oldest (sorted by creation, then company and run) and keeps n.
func keepOldest(oldest []liveLease, l liveLease, n int) []liveLease {
	i, _ := slices.BinarySearchFunc(oldest, l, compareLive)
	if i >= n {
		return oldest
	}
	oldest = slices.Insert(oldest, i, l)
	if len(oldest) > n {
		oldest = oldest[:n]
	}
	return oldest
}

func compareLive(a, b liveLease) int {
	return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.Company, b.Company), strings.Compare(a.Run, b.Run))
}

// companyKeys is the key filter of one company's records: RunRef.Key is "<company>.<run>", the
// company part encoded as every key encodes it.
func companyKeys(company string) string {
	part, _, _ := strings.Cut(events.Ref(company, "x").Key(), ".")
	return part + ".*"
}

// unanswered says what a request that timed out most likely met: NATS drops a request its user
// may not publish, and the client hears only the timeout (and logs the violation on stderr).
func unanswered(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer in time (%s per request, --timeout in all): the NATS user may lack the permission (see stderr), or the server is slow: %w", statusRequestTimeout, err)
	}
	return err
}

// validateCompany checks a --company value as the lease records' company ids are checked.
func validateCompany(company string) error { return events.ValidateToken("companyId", company) }

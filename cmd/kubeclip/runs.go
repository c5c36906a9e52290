package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// runsUsage is the help of `kubeclip runs`.
const runsUsage = `kubeclip runs reads a run's history from the run stream.

Usage:
  kubeclip runs replay <runId> [--company ID] [--from-seq N | --since DURATION]
  kubeclip runs follow <runId> [--company ID] [--from-seq N | --since DURATION]

replay prints what the stream holds and stops; follow prints the history, then live events
until the run's result (and its release receipt, when --until-released is set).
`

// runRuns dispatches `kubeclip runs <replay|follow> <runId> [flags]`.
func runRuns(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	if len(args) < 2 || strings.HasPrefix(args[1], "-") {
		fmt.Fprint(stdout, runsUsage)
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			return nil
		}
		return &app.UsageError{Err: errors.New("runs needs a subcommand and a run id")}
	}
	sub, runID := args[0], args[1]
	if sub != "replay" && sub != "follow" {
		fmt.Fprint(stdout, runsUsage)
		return &app.UsageError{Err: fmt.Errorf("unknown runs subcommand %q", sub)}
	}
	return readRun(ctx, sub == "follow", runID, args[2:], lookupEnv, stdout)
}

// runFollow is the older `kubeclip follow --company C --run R` form.
func runFollow(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	return readRun(ctx, true, "", args, lookupEnv, stdout)
}

func readRun(ctx context.Context, live bool, runID string, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	var c client
	var companyID string
	var fromSeq int
	var since time.Duration
	var untilReleased bool
	name := "kubeclip runs replay"
	if live {
		name = "kubeclip runs follow"
	}
	fs := config.New(name, lookupEnv)
	c.bind(fs)
	fs.String(&companyID, "company", "KUBECLIP_COMPANY", "", "company id; empty matches the run in any company")
	if runID == "" {
		fs.String(&runID, "run", "KUBECLIP_RUN", "", "run id (required)")
	}
	fs.Int(&fromSeq, "from-seq", "KUBECLIP_FROM_SEQ", 0, "start at this run-stream sequence")
	fs.Duration(&since, "since", "KUBECLIP_SINCE", 0, "start with the events stored this long ago")
	fs.Bool(&untilReleased, "until-released", "KUBECLIP_UNTIL_RELEASED", false, "follow: keep going after the result until the release receipt")
	if err := parse(fs, args, stdout, runsUsage); err != nil {
		return err
	}
	if runID == "" {
		return &app.UsageError{Err: errors.New("a run id is required")}
	}
	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	opts := events.FollowOptions{StartSeq: uint64(max(fromSeq, 0))}
	if since > 0 {
		opts.StartTime = time.Now().Add(-since)
	}
	p := printer{w: stdout}
	if !live {
		return replayRun(ctx, js, s, companyID, runID, opts, p)
	}
	return followRun(ctx, js, s, companyID, runID, opts, untilReleased, p)
}

// followUntilResult prints a run's events, history then live, until its result.
func followUntilResult(ctx context.Context, js jetstream.JetStream, s events.Subjects, companyID, runID string, p printer) error {
	return followRun(ctx, js, s, companyID, runID, events.FollowOptions{}, false, p)
}

// followRun prints a run's events until its result, or its release receipt with untilReleased
// (a `failed` event ends it too: the lease was never granted).
func followRun(ctx context.Context, js jetstream.JetStream, s events.Subjects, companyID, runID string, opts events.FollowOptions, untilReleased bool, p printer) error {
	return events.Follow(ctx, js, s, companyID, runID, opts, func(r events.Received) error {
		p.print(r)
		switch r.Event.(type) {
		case events.RunReleasedEvent, events.RunFailedEvent:
			return events.ErrStopFollowing
		case events.RunResultEvent:
			if !untilReleased {
				return events.ErrStopFollowing
			}
		}
		return nil
	})
}

// replayRun prints what the stream holds for a run, from opts on, and returns.
func replayRun(ctx context.Context, js jetstream.JetStream, s events.Subjects, companyID, runID string, opts events.FollowOptions, p printer) error {
	filter, err := s.RunFilter(companyID, runID)
	if companyID == "" {
		filter, err = s.AnyCompanyRunFilter(runID)
	}
	if err != nil {
		return &app.UsageError{Err: err}
	}
	stream, err := js.Stream(ctx, s.RunStream())
	if err != nil {
		return fmt.Errorf("opening stream %s: %w", s.RunStream(), err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return fmt.Errorf("reading stream %s: %w", s.RunStream(), err)
	}
	if len(info.State.Subjects) == 0 {
		fmt.Fprintf(p.w, "no events for run %s\n", runID)
		return nil
	}
	return events.Follow(ctx, js, s, companyID, runID, opts, func(r events.Received) error {
		p.print(r)
		if r.Pending == 0 {
			return events.ErrStopFollowing
		}
		return nil
	})
}

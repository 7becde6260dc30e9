package group

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Defaults of a replay.
const (
	DefaultReplayProgressInterval = 500 * time.Millisecond
	// DefaultReplayStallWarning is how long a replay that waits for the
	// group's own processes sees no progress and nobody pulling before it
	// says so.
	DefaultReplayStallWarning = 10 * time.Second
)

// Position is where a replay starts in the stream. Exactly one field is
// set.
type Position struct {
	// All starts at the first event the stream still retains.
	All bool
	// Seq starts at this stream sequence (or the first retained one, if
	// it is gone).
	Seq uint64
	// Since starts at the first event stored within this long before the
	// replay starts.
	Since time.Duration
	// At starts at the first event stored at or after this time.
	At time.Time
}

// Validate checks that exactly one start is given.
func (p Position) Validate() error {
	n := 0
	if p.All {
		n++
	}
	if p.Seq > 0 {
		n++
	}
	if p.Since > 0 {
		n++
	}
	if !p.At.IsZero() {
		n++
	}
	if p.Since < 0 {
		return fmt.Errorf("--since %s is negative: give how far back to start, such as 1h", p.Since)
	}
	if n != 1 {
		return errors.New("give exactly one of --all, --from-seq N, --since DURATION or --at TIME")
	}
	return nil
}

// String describes the start for people.
func (p Position) String() string {
	switch {
	case p.All:
		return "all retained events"
	case p.Seq > 0:
		return fmt.Sprintf("stream sequence %d", p.Seq)
	case p.Since > 0:
		return "the last " + p.Since.String()
	default:
		return p.At.Format(time.RFC3339Nano)
	}
}

// Runner is a consumer group that a replay runs in its own process: a
// *Group.
type Runner interface {
	// Durable returns the group's stream and durable consumer settings.
	Durable() (batonnats.StreamConfig, batonnats.ConsumerConfig)
	// Run consumes the group's events until ctx ends.
	Run(ctx context.Context) error
}

// ReplayConfig says which group to replay from where.
type ReplayConfig struct {
	// JetStream is the NATS JetStream context. Required.
	JetStream jetstream.JetStream
	// Stream is the outbox stream. Defaults to nats.StreamConfig's
	// defaults.
	Stream batonnats.StreamConfig
	// Group is the name of the group's durable consumer. Required.
	Group string
	// From is where the replay starts. Required.
	From Position
	// DryRun counts what would be replayed and changes nothing. Defaults
	// to false.
	DryRun bool
	// Runner, when set, processes the group in this process during the
	// replay, beside any process that already runs it; its durable is
	// created if missing. When nil, the group's own processes (the turn
	// runner's `baton worker`, a service running a custom group) do the
	// work and the replay waits for them; the durable must exist. Defaults
	// to nil.
	Runner Runner
	// Pool, when set, lets a dry run count the events of the range that
	// the group's inbox already holds. Defaults to nil (not counted).
	Pool *pgxpool.Pool
	// Progress, when set, receives the replay's progress every
	// ProgressInterval and once at the end. Defaults to none.
	Progress func(ReplayProgress)
	// ProgressInterval is how often progress is read and reported.
	// Defaults to 500ms.
	ProgressInterval time.Duration
	// StallWarning is how long a replay without Runner may see no progress
	// and no process pulling events before it reports Waiting. Defaults to
	// 10s.
	StallWarning time.Duration
	// Logger receives the replay's logs. Defaults to no logging.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy with every zero field set to its default.
func (c ReplayConfig) WithDefaults() ReplayConfig {
	c.Stream = c.Stream.WithDefaults()
	if c.ProgressInterval == 0 {
		c.ProgressInterval = DefaultReplayProgressInterval
	}
	if c.StallWarning == 0 {
		c.StallWarning = DefaultReplayStallWarning
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns an error naming the first setting that is wrong.
func (c ReplayConfig) Validate() error {
	if c.Group == "" {
		return errors.New("no group given: set --group, such as audit")
	}
	if c.ProgressInterval <= 0 || c.StallWarning <= 0 {
		return errors.New("group: ProgressInterval and StallWarning must be positive")
	}
	if err := c.From.Validate(); err != nil {
		return err
	}
	return c.Stream.Validate()
}

// ReplayProgress is where a replay stands.
type ReplayProgress struct {
	Group string
	// FirstSeq and LastSeq bound the replayed range; LastSeq is the
	// stream's last sequence when the replay started.
	FirstSeq uint64
	LastSeq  uint64
	// Total is the number of events in the range; Done how many of them
	// the group has settled (applied, found applied, or parked).
	Total uint64
	Done  uint64
	// Elapsed since processing started, Rate in events per second and
	// Remaining estimated from it (0 while unknown).
	Elapsed   time.Duration
	Rate      float64
	Remaining time.Duration
	// Waiting is set when the replay relies on the group's own processes
	// and none is pulling events.
	Waiting  bool
	Finished bool
}

// ReplayResult is the outcome of a replay.
type ReplayResult struct {
	ReplayProgress
	DryRun bool
	// AlreadyApplied counts, for a dry run with a Pool, the events of the
	// range the group's inbox already holds (by stream sequence): a replay
	// would skip them. -1 when not counted.
	AlreadyApplied int64
}

// Replay moves a group's durable consumer to the start position and
// processes every event up to the stream's last sequence at the start, then
// returns. It resets the durable in place (JetStream's consumer reset), so
// processes that run the group keep their subscription and take part. The
// group's inbox makes the replay of applied events a no-op; the turn
// runner's claim, which takes only pending rows, does the same for turns.
func Replay(ctx context.Context, cfg ReplayConfig) (ReplayResult, error) {
	if cfg.JetStream == nil {
		return ReplayResult{}, errors.New("group: ReplayConfig.JetStream is nil: give a JetStream context")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return ReplayResult{}, err
	}
	log := cfg.Logger.With().Str("group", cfg.Group).Logger()
	js, streamName := cfg.JetStream, cfg.Stream.Name
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return ReplayResult{}, fmt.Errorf("stream %s does not exist: start `baton relay` (it provisions the stream) or check --stream", streamName)
		}
		return ReplayResult{}, fmt.Errorf("read stream %s: %w", streamName, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("read stream %s: %w", streamName, err)
	}
	last := info.State.LastSeq
	start, err := startSeq(ctx, stream, info.State, cfg.From)
	if err != nil {
		return ReplayResult{}, err
	}
	p := ReplayProgress{Group: cfg.Group, FirstSeq: start, LastSeq: last}
	if last >= start {
		p.Total = last - start + 1
	}
	res := ReplayResult{DryRun: cfg.DryRun, AlreadyApplied: -1}
	if cfg.DryRun {
		if cfg.Pool != nil && p.Total > 0 {
			res.AlreadyApplied, err = schema.CountGroupApplied(ctx, cfg.Pool, cfg.Group, start, last)
			if err != nil {
				return ReplayResult{}, err
			}
		} else if cfg.Pool != nil {
			res.AlreadyApplied = 0
		}
		p.Finished = true
		res.ReplayProgress = p
		return res, nil
	}

	var durable jetstream.Consumer
	if cfg.Runner != nil {
		s, c := cfg.Runner.Durable()
		if c.Name != cfg.Group || s.WithDefaults().Name != streamName {
			return ReplayResult{}, fmt.Errorf("group: the runner consumes %s/%s, not %s/%s", s.WithDefaults().Name, c.Name, streamName, cfg.Group)
		}
		durable, err = batonnats.EnsureConsumer(ctx, js, s, c)
	} else {
		durable, err = js.Consumer(ctx, streamName, cfg.Group)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ReplayResult{}, fmt.Errorf("group %s has no consumer on stream %s: start its processes once (for turns, `baton worker`), or check --group", cfg.Group, streamName)
		}
	}
	if err != nil {
		return ReplayResult{}, err
	}
	if _, err := js.ResetConsumerToSequence(ctx, streamName, cfg.Group, max(start, 1)); err != nil {
		if errors.Is(err, jetstream.ErrConsumerInvalidReset) {
			return ReplayResult{}, fmt.Errorf("consumer %s on stream %s cannot be reset to sequence %d: its deliver policy must be 'all', as Baton creates it (delete the consumer and run the group again): %w", cfg.Group, streamName, start, err)
		}
		return ReplayResult{}, fmt.Errorf("reset consumer %s to sequence %d: %w", cfg.Group, start, err)
	}
	log.Info().Uint64("first_seq", start).Uint64("last_seq", last).Uint64("total", p.Total).Str("from", cfg.From.String()).Msg("group reset for replay")
	if p.Total == 0 {
		p.Finished = true
		report(cfg, p)
		res.ReplayProgress = p
		return res, nil
	}

	runCtx, stopRun := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	if cfg.Runner != nil {
		go func() { runErr <- cfg.Runner.Run(runCtx) }()
	} else {
		close(runErr)
	}
	stopRunner := func() error {
		stopRun()
		if cfg.Runner == nil {
			return nil
		}
		return <-runErr
	}

	began := time.Now()
	lastMove, lastDone := began, uint64(0)
	tick := time.NewTicker(cfg.ProgressInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = stopRunner()
			return ReplayResult{}, fmt.Errorf("replay of group %s stopped at %d of %d events: %w", cfg.Group, p.Done, p.Total, ctx.Err())
		case err := <-runErr:
			if cfg.Runner != nil {
				stopRun()
				if err == nil {
					err = errors.New("the group stopped")
				}
				return ReplayResult{}, fmt.Errorf("replay of group %s: %w", cfg.Group, err)
			}
			runErr = nil
			continue
		case <-tick.C:
		}
		ci, err := durable.Info(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn().Err(err).Msg("read replay progress")
			}
			continue
		}
		floor := ci.AckFloor.Stream
		if floor >= start {
			p.Done = min(floor-start+1, p.Total)
		}
		p.Elapsed = time.Since(began)
		if p.Done > 0 {
			p.Rate = float64(p.Done) / p.Elapsed.Seconds()
			p.Remaining = time.Duration(float64(p.Total-p.Done) / p.Rate * float64(time.Second))
		}
		if p.Done != lastDone {
			lastDone, lastMove = p.Done, time.Now()
		}
		p.Waiting = cfg.Runner == nil && ci.NumWaiting == 0 && time.Since(lastMove) > cfg.StallWarning
		if floor >= last {
			p.Done, p.Finished, p.Remaining = p.Total, true, 0
			if err := stopRunner(); err != nil {
				return ReplayResult{}, err
			}
			p.Elapsed = time.Since(began)
			report(cfg, p)
			log.Info().Uint64("total", p.Total).Dur("elapsed", p.Elapsed).Msg("replay finished")
			res.ReplayProgress = p
			return res, nil
		}
		report(cfg, p)
	}
}

func report(cfg ReplayConfig, p ReplayProgress) {
	if cfg.Progress != nil {
		cfg.Progress(p)
	}
}

// startSeq resolves a position into the first stream sequence to replay.
// A time is resolved by the server itself, through a short-lived ephemeral
// consumer that starts at that time, so no group's state changes.
func startSeq(ctx context.Context, stream jetstream.Stream, st jetstream.StreamState, from Position) (uint64, error) {
	first := max(st.FirstSeq, 1)
	switch {
	case from.All:
		return first, nil
	case from.Seq > 0:
		return max(from.Seq, first), nil
	}
	at := from.At
	if from.Since > 0 {
		at = time.Now().Add(-from.Since)
	}
	c, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "baton replay: find the first event at a time",
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &at,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return 0, fmt.Errorf("find the first event at %s: %w", at.Format(time.RFC3339Nano), err)
	}
	seq := c.CachedInfo().Delivered.Stream + 1
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// Left behind, it would expire after its inactive threshold anyway.
	_ = stream.DeleteConsumer(dctx, c.CachedInfo().Name)
	return max(seq, first), nil
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/schema"
)

// DefaultPruneEvery is how often the relay that holds the slot prunes.
const DefaultPruneEvery = 10 * time.Minute

// retentionFlags are the retention settings (schema.Retention), shared by
// `baton relay`, which prunes in the background, and `baton prune`, which
// runs one pass. A flag left out means the library's default.
type retentionFlags struct {
	OutboxRetention         time.Duration `name:"outbox-retention" env:"BATON_OUTBOX_RETENTION" setting:"Outbox" help:"How long done and failed outbox rows are kept once finished (messages are never pruned). Defaults to ${outbox_retention}."`
	RunRetention            time.Duration `name:"run-retention" env:"BATON_RUN_RETENTION" setting:"Runs" help:"How long a run is kept once it ended (a run whose tool calls belong to a message stays with it). Defaults to ${run_retention}."`
	OperationRetention      time.Duration `name:"operation-retention" env:"BATON_OPERATION_RETENTION" setting:"Operations" help:"How long the tool calls of a run that produced no reply are kept once the run ended. Defaults to ${operation_retention}."`
	OperatorActionRetention time.Duration `name:"operator-action-retention" env:"BATON_OPERATOR_ACTION_RETENTION" setting:"OperatorActions" help:"How long the console's record of what operators did and viewed (operator_actions) is kept. Defaults to ${operator_action_retention}."`
	InboxMargin             time.Duration `name:"inbox-margin" env:"BATON_INBOX_MARGIN" setting:"InboxMargin" help:"A group inbox row goes once its event is gone from the stream and it was applied this long before the oldest event the stream holds (clock skew, a late republication). Defaults to ${inbox_margin}."`
	PruneBatch              int           `name:"prune-batch" env:"BATON_PRUNE_BATCH" setting:"Batch" help:"Rows one delete statement removes at most. Defaults to ${prune_batch}."`
	PrunePassTime           time.Duration `name:"prune-pass-time" env:"BATON_PRUNE_PASS_TIME" setting:"PassTime" help:"Longest pass; a pass that has not caught up by then stops, and the next goes on. Defaults to ${prune_pass_time}."`
}

// retention returns the settings, checked, or a usage error naming the
// flag.
func (f retentionFlags) retention() (schema.Retention, error) {
	r := schema.Retention{
		Outbox: f.OutboxRetention, Runs: f.RunRetention, Operations: f.OperationRetention,
		InboxMargin: f.InboxMargin, Batch: f.PruneBatch, PassTime: f.PrunePassTime, OperatorActions: f.OperatorActionRetention,
	}
	if err := r.WithDefaults().Validate(); err != nil {
		return r, settingError(f, err)
	}
	return r, nil
}

type pruneCmd struct {
	config.Database `embed:""`
	config.NATS     `embed:""`
	config.Stream   `embed:""`
	retentionFlags  `embed:""`

	DryRun bool `name:"dry-run" help:"Print what a pass would delete, table by table, and delete nothing."`
}

// Run runs one pass, as the relay that holds the slot does every
// --prune-every. It connects as the relay does (the relay's database user
// and NATS user may prune): the outbox stream's first sequence decides
// which group inbox rows may go; without NATS those are kept.
func (c *pruneCmd) Run(ctx context.Context, env *Env) error {
	if err := c.NATS.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	if err := c.Stream.Check(); err != nil {
		return settingError(c, err)
	}
	ret, err := c.retention()
	if err != nil {
		return err
	}
	log := env.Log.With().Str("component", "prune").Logger()
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()

	stream := c.StreamConfig().WithDefaults().Name
	var floors []schema.StreamFloor
	opts := c.NATS.Options("relay")
	opts.Name = "baton prune"
	nc, err := connectNATS(opts, log, natsclient.Timeout(5*time.Second), natsclient.MaxReconnects(0))
	if err != nil {
		log.Warn().Err(err).Msg("NATS is not reachable: group inbox rows are kept this time")
	} else {
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		f, err := readStreamFloor(rctx, js, stream)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			log.Warn().Str("stream", stream).Msg("the outbox stream does not exist: group inbox rows are kept this time")
		case err != nil:
			return fmt.Errorf("read the outbox stream %s (its first sequence decides which group inbox rows may go): %w", stream, err)
		default:
			floors = []schema.StreamFloor{f}
		}
	}

	var res schema.PruneResult
	if c.DryRun {
		res, err = schema.PruneDryRun(ctx, pool, ret, floors)
	} else {
		res, err = schema.Prune(ctx, pool, ret, floors, nil)
	}
	if werr := writePruneResult(env.Stdout, ret.WithDefaults(), floors, res, c.DryRun); werr != nil && err == nil {
		err = werr
	}
	return err
}

// writePruneResult prints a pass, table by table.
func writePruneResult(w io.Writer, r schema.Retention, floors []schema.StreamFloor, res schema.PruneResult, dryRun bool) error {
	rules := map[string]string{
		schema.TableOperations:      fmt.Sprintf("operations attached to no message, of runs ended more than %s ago", r.Operations),
		schema.TableRuns:            fmt.Sprintf("runs ended more than %s ago, with no operation left", r.Runs),
		schema.TableOutbox:          fmt.Sprintf("done and failed outbox rows finished more than %s ago", r.Outbox),
		schema.TableInbox:           "group inbox rows of events the stream no longer holds",
		schema.TableOperatorActions: fmt.Sprintf("operators' actions recorded more than %s ago", r.OperatorActions),
	}
	if len(floors) == 0 {
		rules[schema.TableInbox] = "group inbox rows: kept, the outbox stream could not be read"
	} else {
		f := floors[0]
		rules[schema.TableInbox] = fmt.Sprintf("group inbox rows of events %s no longer holds (it starts at sequence %d), applied before %s",
			f.Stream, f.FirstSeq, f.FirstTime.Add(-r.InboxMargin).UTC().Format(time.RFC3339))
	}
	head := "pruned"
	if dryRun {
		head = "dry run: would delete (nothing was changed)"
	}
	var b strings.Builder
	fmt.Fprintln(&b, head)
	for _, t := range schema.PrunedTables {
		fmt.Fprintf(&b, "  %-16s %8d  %s\n", t, res.Rows[t], rules[t])
	}
	fmt.Fprintf(&b, "  %-13s %8d  %s\n", "files", res.Files, "files no message references any more")
	if !dryRun && !res.CaughtUp {
		fmt.Fprintf(&b, "the pass stopped after --prune-pass-time %s with rows left: run it again, or let the relay's pruner go on\n", r.PassTime)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// readStreamFloor reads where the stream starts (schema.StreamFloor).
func readStreamFloor(ctx context.Context, js jetstream.JetStream, name string) (schema.StreamFloor, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return schema.StreamFloor{}, err
	}
	info := s.CachedInfo()
	f := schema.StreamFloor{
		Stream: name, FirstSeq: info.State.FirstSeq, FirstTime: info.State.FirstTime,
		Created: info.Created, Outbox: true,
	}
	if info.State.Msgs == 0 {
		// Empty: whatever it stores next is newer than now.
		f.FirstSeq, f.FirstTime = info.State.LastSeq+1, time.Now()
	}
	return f, nil
}

// pruner is the background pruner of `baton relay`: every interval, when
// the relay holds the slot, one pass of schema.Prune. One relay streams
// at a time, so one pruner prunes at a time; standby relays prune nothing.
type pruner struct {
	pool      *pgxpool.Pool
	js        jetstream.JetStream
	stream    string
	retention schema.Retention
	every     time.Duration
	log       zerolog.Logger
	metrics   *pruneMetrics
	// passed, when set, sees every pass (tests wait on it).
	passed func(schema.PruneResult, error)
}

// newPruner returns the relay's background pruner, its metrics in reg.
func newPruner(pool *pgxpool.Pool, nc *natsclient.Conn, stream string, r schema.Retention, every time.Duration, reg prometheus.Registerer, log zerolog.Logger) (*pruner, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	m, err := newPruneMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &pruner{pool: pool, js: js, stream: stream, retention: r, every: every,
		log: log.With().Str("component", "pruner").Logger(), metrics: m}, nil
}

// pruneMetrics are the pruner's series, in the relay's registry.
type pruneMetrics struct {
	rows   *prometheus.CounterVec
	passes *prometheus.CounterVec
}

// Outcomes of a pass, as baton_prune_passes_total labels them.
const (
	passCaughtUp = "caught_up"
	passPartial  = "partial"
	passFailed   = "failed"
)

func newPruneMetrics(reg prometheus.Registerer) (*pruneMetrics, error) {
	m := &pruneMetrics{
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_prune_rows_total",
			Help: "Rows the relay's pruner deleted, by table (agent_outbox, agent_runs, operations, group_inbox).",
		}, []string{"table"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_prune_passes_total",
			Help: "Passes of the relay's pruner, by result: caught_up, partial (stopped at --prune-pass-time with rows left), failed.",
		}, []string{"result"}),
	}
	for _, t := range schema.PrunedTables {
		m.rows.WithLabelValues(t)
	}
	for _, r := range []string{passCaughtUp, passPartial, passFailed} {
		m.passes.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.rows, m.passes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// run prunes every interval while active says the relay holds the slot,
// until ctx ends.
func (p *pruner) run(ctx context.Context, active func() bool) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	var cursor schema.PruneCursor
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !active() {
			continue
		}
		res, err := p.pass(ctx, &cursor)
		if ctx.Err() != nil {
			return
		}
		if p.passed != nil {
			p.passed(res, err)
		}
	}
}

// pass runs one pass and records it.
func (p *pruner) pass(ctx context.Context, cursor *schema.PruneCursor) (schema.PruneResult, error) {
	var floors []schema.StreamFloor
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	f, err := readStreamFloor(rctx, p.js, p.stream)
	cancel()
	if err == nil {
		floors = []schema.StreamFloor{f}
	} else if ctx.Err() == nil {
		p.log.Warn().Err(err).Str("stream", p.stream).Msg("cannot read the outbox stream: group inbox rows are kept this pass")
	}
	began := time.Now()
	res, err := schema.Prune(ctx, p.pool, p.retention, floors, cursor)
	for t, n := range res.Rows {
		p.metrics.rows.WithLabelValues(t).Add(float64(n))
	}
	ev := p.log.Info()
	switch {
	case err != nil:
		p.metrics.passes.WithLabelValues(passFailed).Inc()
		if ctx.Err() != nil {
			return res, err
		}
		ev = p.log.Warn().Err(err)
	case res.CaughtUp:
		p.metrics.passes.WithLabelValues(passCaughtUp).Inc()
	default:
		p.metrics.passes.WithLabelValues(passPartial).Inc()
	}
	var total int64
	tables := make([]string, 0, len(res.Rows))
	for t, n := range res.Rows {
		total += n
		tables = append(tables, t)
	}
	if total == 0 && err == nil {
		return res, nil
	}
	sort.Strings(tables)
	d := zerolog.Dict()
	for _, t := range tables {
		d = d.Int64(t, res.Rows[t])
	}
	ev.Dict("rows", d).Bool("caught_up", res.CaughtUp).Dur("took", time.Since(began)).Msg("pruned")
	return res, err
}

// runWithPruner runs the relay and, when p is set, its pruner beside it,
// until ctx ends or the relay fails.
func runWithPruner(ctx context.Context, run func(context.Context) error, active func() bool, p *pruner) error {
	if p == nil {
		return run(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx, active) })
	err := run(ctx)
	cancel()
	wg.Wait()
	return err
}

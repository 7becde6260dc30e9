package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mattn/go-isatty"

	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/internal/setting"
	batonnats "github.com/batonhq/baton/nats"
)

type replayCmd struct {
	// Not config.Database, whose validation makes it required: replaying a
	// group that other processes run (turns) needs no database.
	DatabaseURL   string `name:"database-url" env:"BATON_DATABASE_URL" placeholder:"URL" help:"PostgreSQL connection URL; required for audit and webhook, optional otherwise (a dry run then counts what the group already applied)."`
	config.NATS   `embed:""`
	config.Stream `embed:""`

	Group   string        `name:"group" required:"" placeholder:"NAME" help:"Group to replay. audit and webhook are processed by this command (beside any running 'baton group run'); any other group, such as turns, is processed by its running processes ('baton worker'), which this command waits for."`
	All     bool          `name:"all" help:"Replay every event the stream retains."`
	FromSeq uint64        `name:"from-seq" placeholder:"N" help:"Replay from this stream sequence."`
	Since   time.Duration `name:"since" placeholder:"DURATION" help:"Replay the events stored within this long, such as 1h."`
	At      string        `name:"at" placeholder:"TIME" help:"Replay the events stored at or after this RFC 3339 time, such as 2026-01-02T15:04:05Z."`
	DryRun  bool          `name:"dry-run" help:"Count what would be replayed, and how much of it the group already applied; change nothing."`

	ProgressEvery time.Duration `name:"progress-every" default:"1s" help:"How often progress is shown on stdout: a bar on a terminal, a line otherwise."`
	groupFlags    `embed:""`
}

func (c *replayCmd) position() (group.Position, error) {
	p := group.Position{All: c.All, Seq: c.FromSeq, Since: c.Since}
	if c.At != "" {
		t, err := time.Parse(time.RFC3339, c.At)
		if err != nil {
			return p, fmt.Errorf("--at %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z: %w", c.At, err)
		}
		p.At = t
	}
	return p, p.Validate()
}

func (c *replayCmd) Run(ctx context.Context, env *Env) error {
	if err := c.NATS.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	if err := c.Stream.Check(); err != nil {
		return settingError(c, err)
	}
	from, err := c.position()
	if err != nil {
		return &UsageError{Err: err}
	}
	if c.ProgressEvery <= 0 {
		return &UsageError{Err: fmt.Errorf("--progress-every %s must be positive", c.ProgressEvery)}
	}
	builtin := builtinGroups[c.Group]
	var gcfg group.Config
	// A dry run handles nothing, so it needs no handler settings.
	if builtin && !c.DryRun {
		if gcfg, err = c.groupConfig(c.Group, c.StreamConfig()); err != nil {
			return err
		}
	}
	log := env.Log.With().Str("component", "replay").Logger()

	// The database holds a built-in group's effects; for another group it
	// only lets a dry run count what the group's inbox already holds.
	var pool *pgxpool.Pool
	if builtin || c.DatabaseURL != "" {
		if pool, err = openPool(ctx, config.Database{DatabaseURL: c.DatabaseURL}); err != nil {
			return err
		}
		defer pool.Close()
	}
	nc, js, err := connectJetStream(c.NATS.Options("replay"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// The stream is the relay's: read it as it is.
	stream, err := batonnats.JoinStream(ctx, js, c.StreamConfig())
	if err != nil {
		return settingError(c, setting.Within("Stream", err))
	}
	gcfg.Stream = stream

	rcfg := group.ReplayConfig{
		JetStream: js, Stream: stream, Group: c.Group, From: from, DryRun: c.DryRun,
		Pool: pool, ProgressInterval: min(c.ProgressEvery, 250*time.Millisecond), Logger: &log,
	}
	if builtin && !c.DryRun {
		g, err := newGroup(gcfg, pool, js, env.Log.With().Str("component", "group").Logger())
		if err != nil {
			return err
		}
		rcfg.Runner = g
	}
	// Progress goes to stdout, before the summary: stderr carries the
	// logs, which the group writes from its own goroutines.
	pr := newProgressPrinter(env.Stdout, c.ProgressEvery)
	if !c.DryRun {
		rcfg.Progress = pr.show
	}
	res, err := group.Replay(ctx, rcfg)
	pr.end()
	if err != nil {
		return err
	}
	return writeReplayResult(env.Stdout, from, res)
}

func writeReplayResult(w io.Writer, from group.Position, res group.ReplayResult) error {
	var err error
	switch {
	case res.DryRun && res.Total == 0:
		_, err = fmt.Fprintf(w, "dry run: group %s has no events to replay from %s (the stream's last sequence is %d); nothing was changed\n", res.Group, from, res.LastSeq)
	case res.DryRun:
		applied := ""
		if res.AlreadyApplied >= 0 {
			applied = fmt.Sprintf("; the group's inbox already holds %d of them (skipped on replay), %d new", res.AlreadyApplied, int64(res.Total)-res.AlreadyApplied)
		}
		_, err = fmt.Fprintf(w, "dry run: group %s would replay %d events, stream sequences %d to %d (from %s)%s; nothing was changed\n",
			res.Group, res.Total, res.FirstSeq, res.LastSeq, from, applied)
	case res.Total == 0:
		_, err = fmt.Fprintf(w, "group %s has no events to replay from %s; it continues after stream sequence %d\n", res.Group, from, res.LastSeq)
	default:
		_, err = fmt.Fprintf(w, "replayed group %s: %d events, stream sequences %d to %d, in %s\n",
			res.Group, res.Total, res.FirstSeq, res.LastSeq, res.Elapsed.Round(time.Millisecond))
	}
	return err
}

// progressPrinter shows replay progress: a bar redrawn in place on a
// terminal, a plain line every interval otherwise (logs, pipes, CI).
type progressPrinter struct {
	w        io.Writer
	terminal bool
	every    time.Duration
	last     time.Time
	drawn    bool
	warned   bool
}

func newProgressPrinter(w io.Writer, every time.Duration) *progressPrinter {
	f, ok := w.(*os.File)
	return &progressPrinter{w: w, every: every, terminal: ok && isatty.IsTerminal(f.Fd())}
}

func (p *progressPrinter) show(r group.ReplayProgress) {
	if r.Waiting && !p.warned {
		p.warned = true
		p.clear()
		fmt.Fprintf(p.w, "waiting: no process is pulling events of group %s; start it (for turns: baton worker)\n", r.Group)
	}
	if !r.Finished && time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	pct := 100.0
	if r.Total > 0 {
		pct = 100 * float64(r.Done) / float64(r.Total)
	}
	left := "-"
	if r.Remaining > 0 {
		left = r.Remaining.Round(time.Second).String()
	}
	if !p.terminal {
		fmt.Fprintf(p.w, "replay %s: %d/%d events (%.1f%%), %.0f/s, %s left\n", r.Group, r.Done, r.Total, pct, r.Rate, left)
		return
	}
	const width = 30
	filled := int(pct / 100 * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	if filled < width {
		bar = bar[:filled] + ">" + bar[filled+1:]
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s [%s] %d/%d %3.0f%% %.0f/s ETA %s", r.Group, bar, r.Done, r.Total, pct, r.Rate, left)
	p.drawn = true
}

// clear ends a drawn bar's line before other output.
func (p *progressPrinter) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\n")
		p.drawn = false
	}
}

func (p *progressPrinter) end() { p.clear() }

// Package cli is the baton command line: one binary, one type per
// subcommand, each with its flags, BATON_* variables and usage text. main
// only calls Run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/internal/logging"
)

// Version is set at build time with -ldflags "-X ...cli.Version=...".
var Version = "dev"

// ExitError carries a specific exit code (for example `baton status` when
// something needs attention) without being printed as a failure.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// UsageError is a mistake in the command line: exit code 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Env is what every subcommand receives besides its flags.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
	// Log is the base logger; services add their component field.
	Log zerolog.Logger
}

// root is the grammar of the command line.
type root struct {
	logging.Options

	Migrate    migrateCmd    `cmd:"" help:"Apply database migrations (or show their status)."`
	Token      tokenCmd      `cmd:"" help:"Manage API tokens."`
	AgentKey   agentKeyCmd   `cmd:"" name:"agent-key" help:"Manage the key pair that signs the worker's requests to external agents."`
	API        apiCmd        `cmd:"" name:"api" help:"Serve the HTTP API."`
	Relay      relayCmd      `cmd:"" help:"Relay outbox inserts from PostgreSQL logical replication to NATS JetStream."`
	Worker     workerCmd     `cmd:"" help:"Run agent turns from the outbox stream."`
	Status     statusCmd     `cmd:"" help:"Show the slot, the stream, consumer groups, outbox rows and leases; exit 3 when something needs attention."`
	Group      groupCmd      `cmd:"" help:"Run a built-in consumer group (audit, webhook) on the outbox stream."`
	Replay     replayCmd     `cmd:"" help:"Replay a consumer group from the stream's retention: --all, --from-seq, --since or --at; --dry-run counts."`
	Prune      pruneCmd      `cmd:"" help:"Delete what retention allows, one pass (the relay that holds the slot does it every --prune-every); --dry-run prints what it would delete."`
	Dev        devCmd        `cmd:"" help:"Run everything in one process, with a local PostgreSQL and NATS when none is configured."`
	NATSServer natsServerCmd `cmd:"" name:"nats-server" help:"Run an embedded NATS server with JetStream (a local cluster node for tests)."`
	Version    versionCmd    `cmd:"" help:"Print the version."`
	MCP        mcpCmd        `cmd:"" name:"mcp" help:"Manage MCP tools: accept a changed tool definition."`
	Console    consoleCmd    `cmd:"" help:"Serve the operator console: see and fix what Baton is doing, in a browser."`
}

type exitSentinel struct{ code int }

// Run parses args (without the program name) and runs the subcommand.
// Errors are returned for main to print and map to an exit code; see
// ExitCode.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	p, err := takeParser()
	if err != nil {
		return err
	}
	defer releaseParser(p)
	p.kong.Stdout, p.kong.Stderr = stdout, stderr
	defer func() {
		if v := recover(); v != nil {
			s, ok := v.(exitSentinel)
			if !ok {
				panic(v)
			}
			if s.code != 0 {
				err = &ExitError{Code: s.code}
			}
		}
	}()
	kctx, err := p.kong.Parse(args)
	if err != nil {
		return &UsageError{Err: err}
	}
	log, err := logging.New(p.root.Options, stderr)
	if err != nil {
		return &UsageError{Err: err}
	}
	warnSecretsOnCommandLine(args, log)
	env := &Env{Stdout: stdout, Stderr: stderr, Log: log}
	kctx.BindTo(ctx, (*context.Context)(nil))
	return kctx.Run(env)
}

// ExitCode maps an error returned by Run to a process exit code.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// openPool connects to PostgreSQL and checks the connection, so a wrong
// URL fails at start with a message that says so.
func openPool(ctx context.Context, db config.Database) (*pgxpool.Pool, error) {
	return openPoolSized(ctx, db, 0)
}

// openPoolSized is openPool with a pool of up to maxConns connections
// unless the URL names its own pool_max_conns (0: pgx's default, the
// larger of 4 and the number of CPUs).
func openPoolSized(ctx context.Context, db config.Database, maxConns int32) (*pgxpool.Pool, error) {
	cfg, pool, err := newPool(ctx, db, maxConns)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s:%d (database %q): %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// newPool makes the pool of db's URL, of up to maxConns connections unless
// the URL names its own pool_max_conns, without connecting yet; each of
// configure adjusts the pool's settings first.
func newPool(ctx context.Context, db config.Database, maxConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Config, *pgxpool.Pool, error) {
	if err := db.Validate(); err != nil {
		return nil, nil, &UsageError{Err: err}
	}
	cfg, err := pgxpool.ParseConfig(db.DatabaseURL)
	if err != nil {
		return nil, nil, &UsageError{Err: fmt.Errorf("--database-url / BATON_DATABASE_URL: %w", err)}
	}
	if maxConns > 0 && !strings.Contains(db.DatabaseURL, "pool_max_conns") {
		cfg.MaxConns = maxConns
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	return cfg, pool, err
}

// openServicePool is openPoolSized for a long-running component (worker,
// relay, API, group), which must ride out a database that is away: a
// server that cannot be reached yet (down, restarting, failing over) is
// logged and the pool returned all the same, to connect when it can (every
// use of a pgx pool connects on demand, and the component reports itself
// not ready meanwhile). Only what another try cannot change fails: a URL
// that does not parse, a refused login, a database that does not exist.
// Exiting instead would leave the component to a supervisor, which under
// Kubernetes holds back a container that keeps exiting for minutes.
func openServicePool(ctx context.Context, db config.Database, maxConns int32, log zerolog.Logger, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, pool, err := newPool(ctx, db, maxConns, configure...)
	if err != nil {
		return nil, err
	}
	err = pool.Ping(ctx)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000"):
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s:%d refused the connection (database %q): %w; check --database-url / BATON_DATABASE_URL", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	case ctx.Err() != nil:
		pool.Close()
		return nil, ctx.Err()
	default:
		log.Warn().Err(err).Str("host", cfg.ConnConfig.Host).Uint16("port", cfg.ConnConfig.Port).
			Msg("cannot reach PostgreSQL yet; starting anyway and connecting when it can")
	}
	return pool, nil
}

type versionCmd struct{}

func (versionCmd) Run(env *Env) error {
	_, err := fmt.Fprintln(env.Stdout, "baton", Version)
	return err
}

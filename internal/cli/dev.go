package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/internal/natsconn"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/jwtauth"
	"github.com/batonhq/baton/migrations"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

type devCmd struct {
	Database string `name:"database-url" env:"BATON_DATABASE_URL" help:"PostgreSQL URL; when empty, a local cluster is created under --dir." placeholder:"URL"`
	NATSURL  string `name:"nats-url" env:"BATON_NATS_URL" help:"NATS URL; when empty, an embedded NATS server with JetStream runs with its store under --dir." placeholder:"URL"`
	// How to log in to a NATS given by --nats-url.
	config.NATSAuth
	config.Stream
	config.Replication
	httpOptions
	Dir      string `name:"dir" env:"BATON_DEV_DIR" help:"Folder for the local PostgreSQL cluster, the NATS store, the dev token and the agent key pair." default:".baton" type:"path"`
	PGPort   int    `name:"pg-port" env:"BATON_DEV_PG_PORT" help:"Port of the local PostgreSQL cluster." default:"54329"`
	NATSPort int    `name:"nats-port" env:"BATON_DEV_NATS_PORT" help:"Port of the embedded NATS server." default:"4222"`
	User     string `name:"user" env:"BATON_DEV_USER" help:"User whose token is printed." default:"dev"`
}

func (c *devCmd) Run(ctx context.Context, env *Env) error {
	if err := c.httpOptions.validate(); err != nil {
		return &UsageError{Err: err}
	}
	if err := c.limitFlags.validate(); err != nil {
		return err
	}
	if err := c.Stream.Check(); err != nil {
		return settingError(c, err)
	}
	if err := c.Replication.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	// A sign-in setting that cannot work stops before anything starts.
	if _, err := apiSignIn(c, c.jwtFlags, c.CORSOrigins, api.Config{}, zerolog.Nop()); err != nil {
		return err
	}
	log := env.Log.With().Str("component", "dev").Logger()
	defer startTracing(ctx, "dev", log)()
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	agentKey, err := c.devAgentKey(log)
	if err != nil {
		return err
	}
	agentKeys, err := agentPublicKeys(append([]string{agentKey.path}, c.AgentPublicKeys...))
	if err != nil {
		return err
	}

	// Bind the HTTP port first: a busy port is the most common start-up
	// failure, and it should fail before anything else is started.
	ln, err := listen(c.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()

	dbURL := c.Database
	if dbURL == "" {
		cl, err := c.startPostgres(ctx, log)
		if err != nil {
			return err
		}
		// Stopped last, after every part that uses it.
		defer func() {
			log.Info().Msg("stopping local PostgreSQL")
			_ = cl.Stop(pgcluster.Fast)
		}()
		dbURL = cl.URL("baton")
	}
	natsOpts := c.NATSAuth.Options(c.NATSURL, "dev")
	natsURL := c.NATSURL
	if c.NATSURL == "" {
		ns, err := batonnats.StartEmbedded(batonnats.EmbeddedOptions{
			StoreDir: filepath.Join(c.Dir, "nats"), Port: c.NATSPort,
		})
		if err != nil {
			return fmt.Errorf("%w (or choose another with --nats-port / BATON_DEV_NATS_PORT)", err)
		}
		defer ns.Stop()
		natsOpts = natsconn.Options{URL: ns.ClientURL(), Name: "baton dev"}
		natsURL = ns.ClientURL()
		log.Info().Str("url", ns.ClientURL()).Str("store", filepath.Join(c.Dir, "nats")).Msg("embedded NATS with JetStream started")
	}

	pool, err := openPool(ctx, config.Database{DatabaseURL: dbURL})
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrations.Up(ctx, pool)
	if err != nil {
		return err
	}
	log.Info().Int64("version", res.Version).Int("applied", len(res.Applied)).Msg("database migrated")

	token, err := c.devToken(ctx, pool)
	if err != nil {
		return err
	}
	// One connection for the relay, the worker and the API's live events.
	// It never buffers publications while reconnecting: the relay must see
	// a failure at once, not after a buffer fills.
	nc, err := connectNATS(natsOpts, log, natsclient.RetryOnFailedConnect(true), natsclient.ReconnectBufSize(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// baton dev runs the relay and the API: it owns both streams.
	if _, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{Replicas: c.Replicas}, batonnats.ProvisionOptions{}); err != nil {
		return err
	}
	// One registry per run, served on --metrics-addr: every part's
	// metrics in one place.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerNATSConnected(reg, nc)
	apiLog := env.Log.With().Str("component", "api").Logger()
	apiCfg, err := apiSignIn(c, c.jwtFlags, c.CORSOrigins, c.withLimits(api.Config{
		MaxContentBytes: c.MaxContentBytes, Logger: &apiLog,
		Quotas: c.apiQuotas(), StreamRecheck: c.StreamRecheck, DoubleTexting: schema.DoubleTexting(c.DoubleTexting),
		Registerer: reg, Events: batonnats.EventsConfig{Replicas: c.Replicas},
	}), apiLog)
	if err != nil {
		return err
	}
	apiCfg.AgentKeys = agentKeys
	srv, err := api.New(apiCfg, pool, js)
	if err != nil {
		return err
	}
	logSignIn(ctx, srv, c.CORSOrigins, apiLog)
	logAgentKeys(agentKeys, apiLog)
	if c.MetricsAddr != "" {
		stop, err := serveMetrics(c.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveHTTP(gctx, ln, srv.HTTPServer()) })
	g.Go(func() error {
		return RunStack(gctx, StackConfig{
			Logger: &env.Log,
			Events: batonnats.EventsConfig{Replicas: c.Replicas},
			Relay: relay.Config{
				Stream: c.Stream.StreamConfig(), Slot: c.Slot, Publication: c.Publication,
				Registerer: reg,
			},
			// A development tool: the echo agent obeys /sleep, /fail and
			// /tool.
			Worker:     consumer.Config{Registerer: reg, Agent: consumer.Echo{Directives: true}},
			PruneEvery: DefaultPruneEvery,
		}, pool, nc)
	})

	envFile, dbShown, natsShown, err := c.writeDevEnv(dbURL, natsURL)
	if err != nil {
		return err
	}
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(env.Stdout, "\nBaton is running (echo agent).\n  open:     %s/#token=%s\n  API:      %s\n  token:    %s   (also in %s)\n  database: %s\n  NATS:     %s\n  agent key: %s   (%s; agents verify with %s/.well-known/jwks.json)\n  In another terminal, `source %s` and baton status, baton token create and the rest use them.\nPress Ctrl-C to stop (a second Ctrl-C stops at once).\n\n",
		base, token, base, token, filepath.Join(c.Dir, "dev-token"), dbShown, natsShown, agentKey.id, agentKey.path, base, envFile)
	err = g.Wait()
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		log.Info().Msg("shutting down")
		return nil
	}
	return err
}

// startPostgres creates (first time) and starts the local cluster, and
// makes sure the baton database exists.
func (c *devCmd) startPostgres(ctx context.Context, log zerolog.Logger) (*pgcluster.Cluster, error) {
	dataDir := filepath.Join(c.Dir, "pg")
	if uid, gid, asPostgres := pgcluster.ServerUser(); asPostgres {
		// The server runs as the postgres user and must reach its folder.
		abs, _ := filepath.Abs(c.Dir)
		_ = os.Chmod(abs, 0o755)
		if !pgcluster.Reachable(dataDir, uid, gid) {
			// A checkout under a private folder (such as /root): keep the
			// cluster where the postgres user can reach it, at a path
			// derived from --dir so that a restart finds it again.
			sum := sha256.Sum256([]byte(abs))
			home := os.TempDir()
			if u, err := user.Lookup("postgres"); err == nil && u.HomeDir != "" && pgcluster.Reachable(filepath.Join(u.HomeDir, "x"), uid, gid) {
				home = u.HomeDir
			}
			dataDir = filepath.Join(home, "baton-dev-"+hex.EncodeToString(sum[:6]), "pg")
			if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
				return nil, err
			}
			_ = os.Chmod(filepath.Dir(dataDir), 0o755)
			log.Info().Str("dir", dataDir).Msg("the postgres user cannot reach --dir; keeping the local cluster here instead")
		}
	}
	cl, err := pgcluster.New(pgcluster.Options{Dir: dataDir, Port: c.PGPort, Durable: true})
	if err != nil {
		return nil, err
	}
	if !cl.Initialized() {
		log.Info().Str("dir", cl.Dir()).Msg("creating local PostgreSQL cluster")
		if err := cl.Init(ctx); err != nil {
			return nil, err
		}
	}
	if err := cl.Start(ctx); err != nil {
		if strings.Contains(err.Error(), "busy") {
			return nil, fmt.Errorf("%w (--pg-port / BATON_DEV_PG_PORT)", err)
		}
		return nil, err
	}
	log.Info().Int("port", cl.Port()).Str("dir", cl.Dir()).Msg("local PostgreSQL started")
	conn, err := pgx.Connect(ctx, cl.URL("postgres"))
	if err != nil {
		_ = cl.Stop(pgcluster.Fast)
		return nil, err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'baton')`).Scan(&exists); err != nil {
		_ = cl.Stop(pgcluster.Fast)
		return nil, err
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE DATABASE baton`); err != nil {
			_ = cl.Stop(pgcluster.Fast)
			return nil, err
		}
	}
	return cl, nil
}

// devAgentKeyFiles is the dev agent key: its private key's file and its
// key id.
type devAgentKeyFiles struct{ path, id string }

// devAgentKey is the key pair under --dir whose private key a dev worker
// signs its requests to external agents with, and whose public key the
// API serves: made the first time, kept across restarts so that an agent
// keeps trusting it.
func (c *devCmd) devAgentKey(log zerolog.Logger) (devAgentKeyFiles, error) {
	priv, pub := filepath.Join(c.Dir, devAgentSigningKey), filepath.Join(c.Dir, devAgentPublicKey)
	if _, err := os.Stat(priv); errors.Is(err, fs.ErrNotExist) {
		// A public key left without its private key is stale: replaced.
		key, err := jwtauth.CreateKeyPair(priv, pub, true)
		if err != nil {
			return devAgentKeyFiles{}, err
		}
		log.Info().Str("key_id", key.KeyID()).Str("private_key", priv).Str("public_key", pub).Msg("agent signing key created")
		return devAgentKeyFiles{path: priv, id: key.KeyID()}, nil
	}
	key, err := jwtauth.LoadSigningKey(priv)
	if err != nil {
		return devAgentKeyFiles{}, fmt.Errorf("the dev agent signing key: %w (or delete it, and baton dev makes a new one)", err)
	}
	return devAgentKeyFiles{path: priv, id: key.KeyID()}, nil
}

// The files of the dev agent key pair, under --dir.
const (
	devAgentSigningKey = "agent-signing-key.pem"
	devAgentPublicKey  = "agent-public-key.pem"
)

// devToken reuses the token kept under --dir while it is still valid, so
// that a restart keeps the same link working; otherwise it creates one.
func (c *devCmd) devToken(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	path := filepath.Join(c.Dir, "dev-token")
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		if u, err := schema.Authenticate(ctx, pool, tok); err == nil && u.Name == c.User {
			return tok, nil
		}
	}
	tok, _, err := schema.CreateToken(ctx, pool, c.User)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return tok, nil
}

// writeDevEnv writes --dir/dev.env, which exports the database and NATS
// URLs, the slot and the stream that this run uses, so that `source`-ing
// it lets every other command (status, token create, replay) reach them.
// The local cluster trusts connections from 127.0.0.1 and the embedded
// NATS needs no login, so their URLs hold no secret. A URL given with a
// password or a token is not written (the variable that gave it is still
// set where it came from) and is shown redacted. It returns the file and
// the URLs as shown.
func (c *devCmd) writeDevEnv(dbURL, natsURL string) (path, dbShown, natsShown string, err error) {
	path = filepath.Join(c.Dir, "dev.env")
	var b strings.Builder
	b.WriteString("# Written by baton dev: `source` this file to reach its database and NATS from another terminal.\n")
	exports := []string{}
	dbShown, natsShown = dbURL, natsURL
	if secret, shown := dbPassword(dbURL); secret {
		dbShown = shown
		b.WriteString("# BATON_DATABASE_URL is yours (it holds a password, so it is not written here).\n")
	} else {
		exports = append(exports, "BATON_DATABASE_URL="+shellQuote(dbURL))
	}
	if redacted := natsconn.Redact(natsURL); redacted != natsURL {
		natsShown = redacted
		b.WriteString("# BATON_NATS_URL is yours (it holds a password or a token, so it is not written here).\n")
	} else {
		exports = append(exports, "BATON_NATS_URL="+shellQuote(natsURL))
	}
	exports = append(exports, "BATON_SLOT="+shellQuote(c.Slot), "BATON_STREAM="+shellQuote(c.StreamConfig().WithDefaults().Name))
	b.WriteString("export " + strings.Join(exports, " ") + "\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", "", "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, dbShown, natsShown, nil
}

// dbPassword reports whether a PostgreSQL URL holds a password, and
// returns it with the password hidden.
func dbPassword(u string) (bool, string) {
	p, err := url.Parse(u)
	if err != nil {
		// A key=value connection string.
		if strings.Contains(u, "password") {
			return true, "(a connection string with a password)"
		}
		return false, u
	}
	if _, ok := p.User.Password(); ok {
		p.User = url.UserPassword(p.User.Username(), "redacted")
		return true, p.String()
	}
	return false, u
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

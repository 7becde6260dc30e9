package floor

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/pgcluster"
)

// ChainOptions configure a Chain.
type ChainOptions struct {
	// DatabaseURL is a database without the chain's tables: an empty one,
	// or one with Baton's schema. Required.
	DatabaseURL string
	// NATSURL is the NATS server. Required.
	NATSURL string
	// ModelURL is the OpenAI-compatible API root the worker calls.
	// Required.
	ModelURL string
}

// Chain is the floor chain running as three processes (api, relay,
// worker), and a user with a token.
type Chain struct {
	bench.Client
	API, Relay, Worker *bench.Process
}

var chains atomic.Int64

// Start creates the chain's tables and a user's token in the database and
// starts the chain's processes, re-executing the running program, whose
// TestMain must hand over to Main when IsRole(os.Args). The processes stop
// when tb ends.
func Start(tb testing.TB, opts ChainOptions) *Chain {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, opts.DatabaseURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	n := chains.Add(1)
	token := fmt.Sprintf("floor-token-%d-%d", os.Getpid(), n)
	if _, err := conn.Exec(ctx, Schema); err != nil {
		tb.Fatalf("floor: create the schema: %v", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO floor_tokens (hash, user_id) VALUES ($1, 1)`, TokenHash(token)); err != nil {
		tb.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	prefix := fmt.Sprintf("floor%d_%d", os.Getpid(), n)
	common := []string{"--database-url", opts.DatabaseURL, "--nats-url", opts.NATSURL, "--prefix", prefix}
	start := func(role string, args ...string) *bench.Process {
		p := bench.Start(tb, "floor-"+role, exe, append(append([]string{"floor", role}, common...), args...)...)
		p.WaitLogged(tb, "floor "+role+" ready", time.Minute)
		return p
	}
	c := &Chain{}
	c.Relay = start("relay", "--slot", prefix)
	c.Worker = start("worker", "--model-url", opts.ModelURL)
	c.API = start("api", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port))
	c.Client = bench.Client{APIURL: fmt.Sprintf("http://127.0.0.1:%d", port), Token: token,
		HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	tb.Cleanup(c.HTTP.CloseIdleConnections)
	return c
}

// Stop stops the chain's processes, the worker first.
func (c *Chain) Stop() {
	for _, p := range []*bench.Process{c.Worker, c.API, c.Relay} {
		p.Stop()
	}
}

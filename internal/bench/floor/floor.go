// Package floor is the floor chain of Baton's benchmarks: the hops that a
// message's path cannot avoid, with none of Baton's logic, run as three
// processes like Baton's api, relay and worker, so that a benchmark can
// measure what Baton adds on top of them in the same run.
//
//   - api: an HTTP POST with a token lookup, then one transaction that
//     inserts the message and its outbox row; a server-sent events stream
//     per conversation, fed by NATS core subscriptions.
//   - relay: pgoutput decoded with pglogrepl, each outbox insert published
//     to JetStream with a message id, the slot confirmed once JetStream
//     acknowledged.
//   - worker: a pull consumer; one claim statement (the row claimed, the
//     history read), a streamed request to the model, each token published
//     on NATS core, one transaction (reply, row done), a NATS publication of
//     the reply, then the ack.
//
// It has no leases, no recovery, no retries and no limits: it is what a
// benchmark compares Baton with, never something to run.
package floor

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Schema creates the floor chain's tables and publication in an empty
// database. The tables have names of their own, so that the chain can share
// a database with Baton's schema in a test.
const Schema = `
CREATE TABLE floor_tokens (hash bytea PRIMARY KEY, user_id bigint NOT NULL);
CREATE TABLE floor_messages (
	seq bigserial PRIMARY KEY,
	conversation text NOT NULL,
	id text NOT NULL,
	role text NOT NULL,
	content text NOT NULL,
	UNIQUE (conversation, id)
);
CREATE INDEX ON floor_messages (conversation, seq);
CREATE TABLE floor_outbox (
	id bigserial PRIMARY KEY,
	conversation text NOT NULL,
	message_id text NOT NULL,
	status text NOT NULL DEFAULT 'pending'
);
CREATE PUBLICATION floor_outbox FOR TABLE floor_outbox WITH (publish = 'insert');
`

// TokenHash is how floor_tokens stores a token.
func TokenHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// Options are every role's settings, one flag each.
type Options struct {
	DatabaseURL string
	NATSURL     string
	// HTTPAddr is where the api serves.
	HTTPAddr string
	// ModelURL is the OpenAI-compatible API root the worker calls, such as
	// http://127.0.0.1:1234/v1.
	ModelURL string
	// Slot is the relay's replication slot, unique on the server.
	Slot string
	// Prefix starts every subject and names the stream and the consumer,
	// so that chains can share a NATS server.
	Prefix string
}

func (o Options) stream() string        { return o.Prefix + "_outbox" }
func (o Options) outboxSubject() string { return o.Prefix + ".outbox" }
func (o Options) conversationSubject(conversation string) string {
	return o.Prefix + ".conv." + conversation
}

// IsRole says whether args (os.Args) ask this program to run a role of
// the chain: a test binary that re-executes itself as the chain's
// processes calls Main from TestMain when it does.
func IsRole(args []string) bool { return len(args) > 1 && args[1] == "floor" }

// Main runs the role that args name (program, "floor", role, flags...)
// until SIGTERM or SIGINT, and returns the exit code.
func Main(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: floor api|relay|worker [flags]")
		return 2
	}
	var o Options
	fs := flag.NewFlagSet("floor "+args[2], flag.ContinueOnError)
	fs.StringVar(&o.DatabaseURL, "database-url", "", "PostgreSQL URL")
	fs.StringVar(&o.NATSURL, "nats-url", "", "NATS URL")
	fs.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:0", "api: address to serve on")
	fs.StringVar(&o.ModelURL, "model-url", "", "worker: OpenAI-compatible API root")
	fs.StringVar(&o.Slot, "slot", "floor", "relay: replication slot")
	fs.StringVar(&o.Prefix, "prefix", "floor", "subject prefix, stream and consumer name")
	fs.String("log-format", "", "ignored: the chain prints plain lines")
	if err := fs.Parse(args[3:]); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch args[2] {
	case "api":
		err = runAPI(ctx, o)
	case "relay":
		err = runRelay(ctx, o)
	case "worker":
		err = runWorker(ctx, o)
	default:
		err = fmt.Errorf("unknown role %q: want api, relay or worker", args[2])
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "floor %s: %v\n", args[2], err)
		return 1
	}
	return 0
}

// ready tells the process that started the role that it serves.
func ready(role string, detail string) {
	fmt.Printf("floor %s ready %s at %s\n", role, detail, time.Now().Format(time.RFC3339Nano))
}

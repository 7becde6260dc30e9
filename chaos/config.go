// Package chaos is the kill test of the reference's checklist, run against
// real processes: a PostgreSQL primary with a synchronous standby, a
// three-node NATS JetStream cluster, two relays, three workers and the API,
// each its own OS process. It drives conversations through the HTTP API
// while it kills workers at every crash point and at random moments, kills
// the active relay and NATS nodes, restarts PostgreSQL, fails it over to
// the standby, pauses the standby and wipes the stream once; then, once the
// system has settled, it judges from the database that nothing was lost and
// nothing happened twice.
package chaos

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/batonhq/baton/consumer"
)

// Defaults of a run, the size `make chaos` runs at.
const (
	DefaultConversations = 300
	DefaultMessages      = 5000
	DefaultFaults        = 60
	DefaultLoadDuration  = 4 * time.Minute
	DefaultSettleTimeout = 2 * time.Minute
	DefaultClients       = 24
	// DefaultLease is the workers' default: a dead worker is noticed by
	// its database session, not by its lease.
	DefaultLease = consumer.DefaultLease
)

// Config sizes and seeds a run.
type Config struct {
	// Binary is the baton binary every process runs. Required.
	Binary string
	// Seed makes the load and the fault schedule repeatable. Defaults to
	// one taken from the clock, printed at the start.
	Seed int64
	// Conversations the load spreads over. Defaults to 300.
	Conversations int
	// Messages the load sends, retries not counted. Defaults to 5000.
	Messages int
	// Faults injected at random moments of the load, at least one of each
	// kind. Ignored when Plan is set. Defaults to 60.
	Faults int
	// Plan, when set, is the exact list of faults, in order, each at a
	// random moment of the load.
	Plan []FaultKind
	// LoadDuration is how long the load and the fault schedule take.
	// Defaults to 4m.
	LoadDuration time.Duration
	// SettleTimeout bounds the wait, after the load and the faults, for
	// every outbox row to become done or error. Defaults to 2m.
	SettleTimeout time.Duration
	// Clients are the concurrent HTTP clients. Defaults to 24.
	Clients int
	// Lease is the workers' lease and ack wait: how long a worker that is
	// alive but cut off from PostgreSQL holds a conversation (a killed one
	// is noticed by its database session). Defaults to the workers'
	// default, 30s.
	Lease time.Duration
	// Dir holds the data and the logs of every process. Defaults to a new
	// temporary folder, removed after a passing run.
	Dir string
	// Out receives progress and the summary. Defaults to os.Stdout.
	Out io.Writer
	// Agents, when set, makes the workers answer turns with external
	// agents, the examples named here (AgentNames: mastra, ag-ui,
	// ai-sdk), each run with node in a namespace of its own behind a
	// recorder of the harness: worker i posts its steps to Agents[i mod
	// len]. The load asks the agents for replies, slow replies, calls of
	// the MCP server's tools and Stops, and the faults of AgentFaults
	// join the schedule. Defaults to none: the workers run the echo
	// agent.
	Agents []string
	// ExamplesDir is the repository's examples folder, where the agents
	// are, their packages installed. Defaults to "examples".
	ExamplesDir string
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Seed == 0 {
		c.Seed = time.Now().UnixNano() % 1_000_000_000
	}
	if c.Conversations == 0 {
		c.Conversations = DefaultConversations
	}
	if c.Messages == 0 {
		c.Messages = DefaultMessages
	}
	if c.Faults == 0 && len(c.Plan) == 0 {
		c.Faults = DefaultFaults
	}
	if c.LoadDuration == 0 {
		c.LoadDuration = DefaultLoadDuration
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = DefaultSettleTimeout
	}
	if c.Clients == 0 {
		c.Clients = DefaultClients
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.ExamplesDir == "" {
		c.ExamplesDir = "examples"
	}
	return c
}

// Validate names the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Binary == "":
		return errors.New("chaos: Binary is empty: build cmd/baton and give its path (--binary)")
	case c.Conversations < 10:
		return fmt.Errorf("chaos: %d conversations is too few: give at least 10 (--conversations)", c.Conversations)
	case c.Messages < c.Conversations:
		return fmt.Errorf("chaos: %d messages for %d conversations: give at least one message per conversation (--messages)", c.Messages, c.Conversations)
	case c.Faults < 0:
		return fmt.Errorf("chaos: faults %d is negative (--faults)", c.Faults)
	case len(c.Plan) == 0 && c.Faults < len(c.kinds()):
		return fmt.Errorf("chaos: %d faults cannot cover the %d kinds: give at least %d (--faults)", c.Faults, len(c.kinds()), len(c.kinds()))
	case c.LoadDuration < 5*time.Second:
		return fmt.Errorf("chaos: load duration %s is too short: give at least 5s (--duration)", c.LoadDuration)
	case c.SettleTimeout <= 0:
		return fmt.Errorf("chaos: settle timeout %s must be positive (--settle)", c.SettleTimeout)
	case c.Clients < 1:
		return fmt.Errorf("chaos: clients %d must be at least 1 (--clients)", c.Clients)
	case c.Lease < time.Second:
		return fmt.Errorf("chaos: lease %s is too short: give at least 1s (--lease)", c.Lease)
	}
	if _, err := os.Stat(c.Binary); err != nil {
		return fmt.Errorf("chaos: binary %s: %w", c.Binary, err)
	}
	return c.checkAgents()
}

package relay

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/setting"
	batonnats "github.com/batonhq/baton/nats"
)

// Defaults of the relay's own settings. The stream settings default in the
// nats package, the slot and publication names in internal/config, so that
// every subcommand shares them.
const (
	DefaultSlot              = "baton_outbox"
	DefaultPublication       = "baton_outbox"
	DefaultMaxInFlight       = 1024
	DefaultStatusInterval    = 10 * time.Second
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultSweepInterval     = 30 * time.Second
	DefaultSweepAge          = 60 * time.Second
	DefaultSweepBatch        = 1000
	DefaultAckTimeout        = 10 * time.Second
	DefaultStandbyRetry      = time.Second
	DefaultRetryMin          = 100 * time.Millisecond
	DefaultRetryMax          = 5 * time.Second
)

// Config configures a Relay. It holds settings only: the database pool and
// the NATS connection come to New.
type Config struct {
	// Stream is the JetStream stream the relay publishes to, and provisions
	// on start. Defaults to nats.StreamConfig's defaults.
	Stream batonnats.StreamConfig

	// Slot is the logical replication slot the relay reads. It is created
	// when missing and never dropped by the relay, except when PostgreSQL
	// invalidated it. Slot names are global to the PostgreSQL cluster.
	// Defaults to baton_outbox.
	Slot string

	// Publication is the publication of agent_outbox inserts the slot is
	// read through. Defaults to baton_outbox.
	Publication string

	// MaxInFlight bounds the events published and not yet acknowledged by
	// JetStream; the relay stops reading WAL while it is reached. Defaults
	// to 1024.
	MaxInFlight int

	// StatusInterval is how often the relay reports its confirmed position
	// to PostgreSQL. It must stay below the server's wal_sender_timeout
	// (60 s unless changed), or the server drops the connection. Defaults
	// to 10 s.
	StatusInterval time.Duration

	// HeartbeatInterval is how often the relay writes a non-transactional
	// heartbeat message into the WAL, so the slot can advance while the
	// outbox is idle and other tables are busy. Defaults to 10 s.
	HeartbeatInterval time.Duration

	// SweepInterval is how often the sweeper looks for pending rows that
	// nobody claimed in time. Defaults to 30 s.
	SweepInterval time.Duration

	// SweepAge is how long a row stays pending after its insert or last
	// announcement before the sweeper announces it again. It must be at
	// least SweepInterval, so no row is announced twice in one period.
	// Defaults to 60 s.
	SweepAge time.Duration

	// SweepBatch bounds the rows announced in one sweep transaction.
	// Defaults to 1000.
	SweepBatch int

	// AckTimeout is how long the relay waits for JetStream to acknowledge
	// one event before it gives the stream up and restarts from the slot.
	// Defaults to 10 s.
	AckTimeout time.Duration

	// StandbyRetry is how often a relay whose slot is held by another
	// relay tries to take it over. Defaults to 1 s.
	StandbyRetry time.Duration

	// RetryMin is the first delay of the exponential backoff after a
	// failure of PostgreSQL or NATS. Defaults to 100 ms.
	RetryMin time.Duration
	// RetryMax bounds the delays of that backoff. Defaults to 5 s.
	RetryMax time.Duration

	// AllowRetentionShrink lets the relay reduce the stream's max age or
	// replicas; without it, a configuration that would is refused at
	// start, since a shorter max age deletes older events at once.
	// Defaults to false.
	AllowRetentionShrink bool
	// Registerer receives the relay's Prometheus metrics. Nil gives the
	// relay a private registry, so several relays can run in one process.
	// Defaults to nil.
	Registerer prometheus.Registerer
	// Logger receives the relay's logs. Defaults to no logging.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its
// default.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	if c.Slot == "" {
		c.Slot = DefaultSlot
	}
	if c.Publication == "" {
		c.Publication = DefaultPublication
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SweepAge == 0 {
		c.SweepAge = DefaultSweepAge
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.StandbyRetry == 0 {
		c.StandbyRetry = DefaultStandbyRetry
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns an error naming the first setting that is wrong and how
// to fix it.
func (c Config) Validate() error {
	if err := c.Stream.Validate(); err != nil {
		return setting.Within("Stream", err)
	}
	switch {
	case !validName(c.Slot):
		return setting.Errorf("Slot", fmt.Sprintf("%q", c.Slot), "not a valid slot name: use lower-case letters, digits and underscores, at most 63")
	case !validName(c.Publication):
		return setting.Errorf("Publication", fmt.Sprintf("%q", c.Publication), "not a valid publication name: use lower-case letters, digits and underscores, at most 63")
	case c.MaxInFlight < 1:
		return setting.Errorf("MaxInFlight", c.MaxInFlight, "must be at least 1")
	case c.StatusInterval <= 0 || c.StatusInterval >= time.Minute:
		return setting.Errorf("StatusInterval", c.StatusInterval, "must be positive and under a minute, below wal_sender_timeout")
	case c.HeartbeatInterval <= 0:
		return setting.Errorf("HeartbeatInterval", c.HeartbeatInterval, "must be positive")
	case c.SweepInterval <= 0:
		return setting.Errorf("SweepInterval", c.SweepInterval, "must be positive")
	case c.SweepAge < c.SweepInterval:
		return setting.Errorf("SweepAge", c.SweepAge, "must be at least the sweep interval %s, or a row could be announced twice in one period", c.SweepInterval)
	case c.SweepBatch < 1:
		return setting.Errorf("SweepBatch", c.SweepBatch, "must be at least 1")
	case c.AckTimeout <= 0:
		return setting.Errorf("AckTimeout", c.AckTimeout, "must be positive")
	case c.StandbyRetry <= 0:
		return setting.Errorf("StandbyRetry", c.StandbyRetry, "must be positive")
	case c.RetryMin <= 0:
		return setting.Errorf("RetryMin", c.RetryMin, "must be positive")
	case c.RetryMax < c.RetryMin:
		return setting.Errorf("RetryMax", c.RetryMax, "is below the retry min %s", c.RetryMin)
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

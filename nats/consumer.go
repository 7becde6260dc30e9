package nats

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/setting"
)

// Defaults of a durable consumer group on the outbox stream.
const (
	DefaultConsumer = "turns"
	// DefaultAckWait is how long JetStream waits for an ack, or a progress
	// signal, before it redelivers a trigger to any worker.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is unlimited: Postgres caps attempts at a turn, so
	// a broker cap could only drop wake-ups (a trigger delayed many times
	// behind a long turn of its conversation would vanish) and never stop
	// poison work.
	DefaultMaxDeliver = -1
	// DefaultMaxAckPending bounds triggers held unacknowledged by all
	// workers of a group together. A worker holds the triggers of a
	// conversation until the turn that covers them commits, so the bound
	// follows the number of active conversations, not of running turns.
	DefaultMaxAckPending = 20000
)

// ConsumerConfig is a durable pull consumer of the outbox stream: one
// consumer group, shared by every process that runs with the same Name.
type ConsumerConfig struct {
	// Name of the durable consumer. Defaults to turns.
	Name string
	// Description shown by NATS tools.
	Description string
	// FilterSubject limits the group to some subjects. Defaults to every
	// subject of the stream.
	FilterSubject string
	// AckWait is how long a delivered trigger may stay unacknowledged
	// without a progress signal. Defaults to 30s.
	AckWait time.Duration
	// MaxDeliver caps deliveries of one trigger; -1 is unlimited. Defaults
	// to -1.
	MaxDeliver int
	// BackOff are the ack waits of successive deliveries after an ack
	// timeout. JetStream uses its first entry in place of AckWait, so it
	// must equal AckWait when set. Defaults to none (AckWait every time).
	BackOff []time.Duration
	// MaxAckPending bounds unacknowledged triggers across the group.
	// Defaults to 20000.
	MaxAckPending int
}

// WithDefaults returns a copy with every zero field set to its default.
func (c ConsumerConfig) WithDefaults() ConsumerConfig {
	if c.Name == "" {
		c.Name = DefaultConsumer
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	return c
}

// Validate returns a *setting.Error for the first setting that is wrong.
func (c ConsumerConfig) Validate() error {
	if c.Name == "" {
		return setting.Errorf("Name", `""`, "the consumer needs a name, such as %s", DefaultConsumer)
	}
	for _, r := range c.Name {
		if r == '.' || r == '*' || r == '>' || r == ' ' || r == '\t' || r == '/' || r == '\\' {
			return setting.Errorf("Name", fmt.Sprintf("%q", c.Name), "holds %q: use letters, digits, '-' and '_'", r)
		}
	}
	if c.AckWait < time.Second/10 {
		return setting.Errorf("AckWait", c.AckWait, "too short: give at least 100ms")
	}
	if c.MaxDeliver < -1 || c.MaxDeliver == 0 {
		return setting.Errorf("MaxDeliver", c.MaxDeliver, "must be -1 (unlimited) or positive")
	}
	if len(c.BackOff) > 0 {
		if c.BackOff[0] != c.AckWait {
			return setting.Errorf("BackOff", c.BackOff, "starts with %s but the ack wait is %s: JetStream uses the first backoff as the ack wait, so make them equal", c.BackOff[0], c.AckWait)
		}
		if c.MaxDeliver != -1 && len(c.BackOff) > c.MaxDeliver {
			return setting.Errorf("BackOff", c.BackOff, "%d steps exceed max deliver %d", len(c.BackOff), c.MaxDeliver)
		}
		for _, b := range c.BackOff {
			if b <= 0 {
				return setting.Errorf("BackOff", c.BackOff, "step %s must be positive", b)
			}
		}
	}
	if c.MaxAckPending < 1 {
		return setting.Errorf("MaxAckPending", c.MaxAckPending, "must be positive")
	}
	return nil
}

// JetStreamConfig is the consumer configuration sent to the server for the
// outbox stream s.
func (c ConsumerConfig) JetStreamConfig(s StreamConfig) jetstream.ConsumerConfig {
	filter := c.FilterSubject
	if filter == "" {
		filter = s.WithDefaults().SubjectPrefix + ".>"
	}
	return jetstream.ConsumerConfig{
		Durable:       c.Name,
		Description:   c.Description,
		FilterSubject: filter,
		// Explicit acks: a trigger is acknowledged only after the
		// transaction that covers it committed.
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		BackOff:       c.BackOff,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
}

// EnsureConsumer creates the durable consumer on stream s, or updates it to
// the configured settings. It is safe to call on every start from every
// process of the group.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, s StreamConfig, c ConsumerConfig) (jetstream.Consumer, error) {
	s = s.WithDefaults()
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, s.Name, c.JetStreamConfig(s))
	if err != nil {
		return nil, fmt.Errorf("provision consumer %s on stream %s: %w", c.Name, s.Name, err)
	}
	return cons, nil
}

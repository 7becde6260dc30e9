package nats

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/setting"
)

// Defaults of the outbox stream. Every subcommand that touches the stream
// uses the same names with the same defaults.
const (
	DefaultURL             = "nats://127.0.0.1:4222"
	DefaultStream          = "BATON_OUTBOX"
	DefaultSubjectPrefix   = "baton.outbox"
	DefaultReplicas        = 1
	DefaultMaxAge          = 7 * 24 * time.Hour
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultPartitions      = 16
)

// StreamConfig is the outbox stream as Baton provisions it.
type StreamConfig struct {
	// Name of the JetStream stream. Defaults to BATON_OUTBOX.
	Name string
	// SubjectPrefix; the stream takes "<prefix>.>". Defaults to baton.outbox.
	SubjectPrefix string
	// Replicas of the stream (1 for development, 3 in production).
	// Defaults to 1.
	Replicas int
	// MaxAge is how long events are retained, which bounds how far a group
	// can replay. Defaults to 7 days.
	MaxAge time.Duration
	// DuplicateWindow is JetStream's deduplication window for Nats-Msg-Id.
	// Defaults to 2 minutes.
	DuplicateWindow time.Duration
	// Partitions is the number of partition tokens in subjects. Defaults
	// to 16.
	Partitions int
}

// WithDefaults returns a copy with every zero field set to its default.
func (c StreamConfig) WithDefaults() StreamConfig {
	if c.Name == "" {
		c.Name = DefaultStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	return c
}

// Validate returns a *setting.Error for the first setting that is wrong.
func (c StreamConfig) Validate() error {
	if c.Name == "" {
		return setting.Errorf("Name", `""`, "the stream needs a name, such as %s", DefaultStream)
	}
	if err := ValidatePrefix(c.SubjectPrefix); err != nil {
		return setting.Errorf("SubjectPrefix", c.SubjectPrefix, "%v", err)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return setting.Errorf("Replicas", c.Replicas, "out of range: JetStream takes 1 to 5")
	}
	if c.MaxAge <= 0 {
		return setting.Errorf("MaxAge", c.MaxAge, "must be positive")
	}
	if c.DuplicateWindow <= 0 || c.DuplicateWindow > c.MaxAge {
		return setting.Errorf("DuplicateWindow", c.DuplicateWindow, "must be positive and no longer than the max age %s", c.MaxAge)
	}
	if c.Partitions < 1 || c.Partitions > 4096 {
		return setting.Errorf("Partitions", c.Partitions, "out of range 1..4096")
	}
	return nil
}

// Subjects returns the stream's subject filter.
func (c StreamConfig) Subjects() []string { return []string{c.SubjectPrefix + ".>"} }

// JetStreamConfig is the stream configuration sent to the server.
func (c StreamConfig) JetStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.Name,
		Description: "Baton outbox events: one trigger per outbox row, keyed by conversation",
		Subjects:    c.Subjects(),
		// Limits retention: every consumer group reads the same events and
		// any group can replay within MaxAge.
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   c.Replicas,
		MaxAge:     c.MaxAge,
		Duplicates: c.DuplicateWindow,
		Discard:    jetstream.DiscardOld,
	}
}

// EnsureStream creates the stream, or updates it to the configured
// settings. It is safe to call on every start from every process.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) (jetstream.Stream, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	want := c.JetStreamConfig()
	// Every process provisions on start; leave a stream that already has
	// the configured settings alone, so a restart does not update it while
	// others create consumers on it.
	if s, err := js.Stream(ctx, c.Name); err == nil {
		if have := s.CachedInfo().Config; sameStream(have, want) {
			return s, nil
		}
	}
	s, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("provision stream %s: %w", c.Name, err)
	}
	return s, nil
}

// sameStream reports whether have already holds every setting Baton
// provisions in want.
func sameStream(have, want jetstream.StreamConfig) bool {
	return slices.Equal(have.Subjects, want.Subjects) &&
		have.Description == want.Description &&
		have.Retention == want.Retention &&
		have.Storage == want.Storage &&
		have.Replicas == want.Replicas &&
		have.MaxAge == want.MaxAge &&
		have.Duplicates == want.Duplicates &&
		have.Discard == want.Discard
}

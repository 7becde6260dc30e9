package nats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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

// MetadataPartitions is the stream metadata key that records the partition
// count, so that every process reading the stream splits conversations the
// same way as the relay that publishes to it.
const MetadataPartitions = "baton.partitions"

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
		Metadata:   map[string]string{MetadataPartitions: strconv.Itoa(c.Partitions)},
	}
}

// StreamChange is one setting the owner of a stream changed on it.
type StreamChange struct {
	Setting  string
	Old, New string
}

func (c StreamChange) String() string { return c.Setting + " " + c.Old + " -> " + c.New }

// ShrinkError is the owner's refusal to reduce a stream's retention
// (max age, replicas) without being told explicitly: a shorter max age
// deletes every event older than it at once, fewer replicas lose copies.
type ShrinkError struct {
	Stream   string
	Setting  string
	Old, New string
}

func (e *ShrinkError) Error() string {
	return fmt.Sprintf("refusing to reduce the %s of stream %s from %s to %s: it %s; give the setting its current value, or allow it explicitly (--allow-retention-shrink / BATON_ALLOW_RETENTION_SHRINK)",
		e.Setting, e.Stream, e.Old, e.New, shrinkConsequence(e.Setting))
}

func shrinkConsequence(setting string) string {
	if setting == "replicas" {
		return "keeps fewer copies of every event"
	}
	return "deletes every event older than the new max age at once"
}

// ProvisionOptions say how the owner of a stream may change it.
type ProvisionOptions struct {
	// AllowShrink lets the owner reduce max age and replicas. Defaults to
	// false: a reduction is a *ShrinkError.
	AllowShrink bool
}

// ProvisionStream creates the outbox stream, or updates it to the
// configured settings, and returns what it changed. Only the stream's owner
// (the relay, or baton dev) calls it; every other process reads the stream
// as it is (JoinStream). A stream that already has the configured settings
// is left alone.
func ProvisionStream(ctx context.Context, js jetstream.JetStream, c StreamConfig, o ProvisionOptions) (jetstream.Stream, []StreamChange, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	return provision(ctx, js, c.JetStreamConfig(), o)
}

// provision creates the stream want, or updates it when it differs, and
// returns what it changed; it refuses to reduce retention unless allowed.
func provision(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, o ProvisionOptions) (jetstream.Stream, []StreamChange, error) {
	s, err := js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s, err = js.CreateStream(ctx, want)
		if err != nil {
			return nil, nil, fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		return s, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("read stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	// The first sequence is chosen when the stream is made; an update
	// keeps the one it has.
	want.FirstSeq = have.FirstSeq
	if sameStream(have, want) {
		return s, nil, nil
	}
	changes := streamChanges(have, want)
	if !o.AllowShrink {
		if want.MaxAge < have.MaxAge {
			return nil, nil, &ShrinkError{Stream: want.Name, Setting: "max age", Old: have.MaxAge.String(), New: want.MaxAge.String()}
		}
		if want.Replicas < have.Replicas {
			return nil, nil, &ShrinkError{Stream: want.Name, Setting: "replicas", Old: strconv.Itoa(have.Replicas), New: strconv.Itoa(want.Replicas)}
		}
	}
	s, err = js.UpdateStream(ctx, want)
	if err != nil {
		return nil, nil, fmt.Errorf("update stream %s: %w", want.Name, err)
	}
	return s, changes, nil
}

// streamChanges lists the settings want changes on have.
func streamChanges(have, want jetstream.StreamConfig) []StreamChange {
	var out []StreamChange
	add := func(setting, old, new string) {
		if old != new {
			out = append(out, StreamChange{Setting: setting, Old: old, New: new})
		}
	}
	add("subjects", strings.Join(have.Subjects, ","), strings.Join(want.Subjects, ","))
	add("replicas", strconv.Itoa(have.Replicas), strconv.Itoa(want.Replicas))
	add("max age", have.MaxAge.String(), want.MaxAge.String())
	add("duplicate window", have.Duplicates.String(), want.Duplicates.String())
	add("partitions", have.Metadata[MetadataPartitions], want.Metadata[MetadataPartitions])
	add("description", have.Description, want.Description)
	return out
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
		have.Discard == want.Discard &&
		have.MaxMsgsPerSubject == want.MaxMsgsPerSubject &&
		have.Metadata[MetadataPartitions] == want.Metadata[MetadataPartitions]
}

// ErrStreamMissing is JoinStream's answer when the stream does not exist
// (yet): its owner creates it.
var ErrStreamMissing = errors.New("stream does not exist")

// ReadStream returns the outbox stream's settings as the server holds
// them. A stream provisioned before partitions were recorded reads as the
// default partition count.
func ReadStream(ctx context.Context, js jetstream.JetStream, name string) (StreamConfig, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return StreamConfig{}, fmt.Errorf("%w: %s (its owner, baton relay, creates it; start it, or check --stream / BATON_STREAM)", ErrStreamMissing, name)
	}
	if err != nil {
		return StreamConfig{}, fmt.Errorf("read stream %s: %w", name, err)
	}
	have := s.CachedInfo().Config
	c := StreamConfig{
		Name:            have.Name,
		Replicas:        have.Replicas,
		MaxAge:          have.MaxAge,
		DuplicateWindow: have.Duplicates,
		Partitions:      DefaultPartitions,
	}
	if len(have.Subjects) == 1 && strings.HasSuffix(have.Subjects[0], ".>") {
		c.SubjectPrefix = strings.TrimSuffix(have.Subjects[0], ".>")
	} else {
		return StreamConfig{}, fmt.Errorf("stream %s has subjects %v, not one <prefix>.> filter: it was not provisioned by baton relay; check --stream / BATON_STREAM", name, have.Subjects)
	}
	if v, ok := have.Metadata[MetadataPartitions]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return StreamConfig{}, fmt.Errorf("stream %s records partitions %q, not a positive number", name, v)
		}
		c.Partitions = n
	}
	return c, nil
}

// JoinStream is how every process but the stream's owner starts: it reads
// the stream as it is, checks that every setting given explicitly (a
// non-zero field of given, other than Name) agrees with it, and returns
// the stream's settings. It never changes the stream. A disagreement is a
// *setting.Error on the field, naming both values.
func JoinStream(ctx context.Context, js jetstream.JetStream, given StreamConfig) (StreamConfig, error) {
	name := given.WithDefaults().Name
	have, err := ReadStream(ctx, js, name)
	if err != nil {
		return StreamConfig{}, err
	}
	disagree := func(field string, given, have any) error {
		return setting.Errorf(field, given, "the stream %s has %v, set by its owner (baton relay): leave the setting out to use the stream's value, or change it on the relay", name, have)
	}
	switch {
	case given.SubjectPrefix != "" && given.SubjectPrefix != have.SubjectPrefix:
		return StreamConfig{}, disagree("SubjectPrefix", given.SubjectPrefix, have.SubjectPrefix)
	case given.MaxAge != 0 && given.MaxAge != have.MaxAge:
		return StreamConfig{}, disagree("MaxAge", given.MaxAge, have.MaxAge)
	case given.Replicas != 0 && given.Replicas != have.Replicas:
		return StreamConfig{}, disagree("Replicas", given.Replicas, have.Replicas)
	case given.DuplicateWindow != 0 && given.DuplicateWindow != have.DuplicateWindow:
		return StreamConfig{}, disagree("DuplicateWindow", given.DuplicateWindow, have.DuplicateWindow)
	case given.Partitions != 0 && given.Partitions != have.Partitions:
		return StreamConfig{}, disagree("Partitions", given.Partitions, have.Partitions)
	}
	return have, nil
}

// Package config holds the settings that several subcommands share, so that
// one name means one thing everywhere: the same flag, the same BATON_*
// variable, the same default. Each group validates itself and names the
// setting in its errors.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
)

// Database locates PostgreSQL.
type Database struct {
	DatabaseURL string `name:"database-url" env:"BATON_DATABASE_URL" help:"PostgreSQL connection URL, e.g. postgres://user:pass@host:5432/baton." placeholder:"URL"`
}

// Validate checks that a URL was given and parses.
func (d Database) Validate() error {
	if d.DatabaseURL == "" {
		return errors.New("no database given: set --database-url or BATON_DATABASE_URL (for example postgres://postgres@127.0.0.1:5432/baton)")
	}
	u, err := url.Parse(d.DatabaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// Key/value connection strings are valid for pgx too.
		if !strings.Contains(d.DatabaseURL, "=") {
			return fmt.Errorf("--database-url / BATON_DATABASE_URL %q is not a postgres:// URL or a key=value connection string", redact(d.DatabaseURL))
		}
	}
	return nil
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// NATS locates the NATS server.
type NATS struct {
	NATSURL string `name:"nats-url" env:"BATON_NATS_URL" help:"NATS server URL(s), comma-separated." default:"${nats_url}" placeholder:"URL"`
}

// Validate checks the URL list.
func (n NATS) Validate() error {
	if strings.TrimSpace(n.NATSURL) == "" {
		return errors.New("no NATS server given: set --nats-url or BATON_NATS_URL (for example nats://127.0.0.1:4222)")
	}
	for _, part := range strings.Split(n.NATSURL, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || u.Host == "" {
			return fmt.Errorf("--nats-url / BATON_NATS_URL: %q is not a URL such as nats://127.0.0.1:4222", part)
		}
	}
	return nil
}

// Stream is the outbox stream, as every subcommand that touches it sees it.
type Stream struct {
	Stream          string        `name:"stream" env:"BATON_STREAM" help:"JetStream stream of outbox events." default:"${stream}"`
	SubjectPrefix   string        `name:"subject-prefix" env:"BATON_SUBJECT_PREFIX" help:"Subject prefix; events go to <prefix>.<partition>.<conversation>." default:"${subject_prefix}"`
	Replicas        int           `name:"replicas" env:"BATON_REPLICAS" help:"Stream replicas (1 for development, 3 in production)." default:"${replicas}"`
	MaxAge          time.Duration `name:"max-age" env:"BATON_MAX_AGE" help:"How long the stream keeps events; bounds replay." default:"${max_age}"`
	DuplicateWindow time.Duration `name:"duplicate-window" env:"BATON_DUPLICATE_WINDOW" help:"JetStream deduplication window for Nats-Msg-Id." default:"${duplicate_window}"`
	Partitions      int           `name:"partitions" env:"BATON_PARTITIONS" help:"Number of partitions in event subjects." default:"${partitions}"`
}

// StreamConfig converts the flags into the nats package's configuration.
func (s Stream) StreamConfig() batonnats.StreamConfig {
	return batonnats.StreamConfig{
		Name:            s.Stream,
		SubjectPrefix:   s.SubjectPrefix,
		Replicas:        s.Replicas,
		MaxAge:          s.MaxAge,
		DuplicateWindow: s.DuplicateWindow,
		Partitions:      s.Partitions,
	}
}

// Validate checks the stream settings.
func (s Stream) Validate() error { return s.StreamConfig().Validate() }

// Replication names the publication and slot the relay reads.
type Replication struct {
	Slot        string `name:"slot" env:"BATON_SLOT" help:"Logical replication slot the relay reads from." default:"${slot}"`
	Publication string `name:"publication" env:"BATON_PUBLICATION" help:"Publication of agent_outbox inserts." default:"${publication}"`
}

// Validate checks the names are valid PostgreSQL identifiers for slots.
func (r Replication) Validate() error {
	if !validSlotName(r.Slot) {
		return fmt.Errorf("--slot / BATON_SLOT %q is not a valid slot name: use lower-case letters, digits and underscores, at most 63", r.Slot)
	}
	if !validSlotName(r.Publication) {
		return fmt.Errorf("--publication / BATON_PUBLICATION %q is not valid: use lower-case letters, digits and underscores, at most 63", r.Publication)
	}
	return nil
}

func validSlotName(s string) bool {
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

// Defaults of the shared settings.
const (
	DefaultSlot        = relay.DefaultSlot
	DefaultPublication = relay.DefaultPublication
	DefaultHTTPAddr    = "127.0.0.1:8080"
)

// Vars are the kong variables behind the ${...} defaults above.
func Vars() map[string]string {
	return map[string]string{
		"nats_url":         batonnats.DefaultURL,
		"stream":           batonnats.DefaultStream,
		"subject_prefix":   batonnats.DefaultSubjectPrefix,
		"replicas":         fmt.Sprint(batonnats.DefaultReplicas),
		"max_age":          batonnats.DefaultMaxAge.String(),
		"duplicate_window": batonnats.DefaultDuplicateWindow.String(),
		"partitions":       fmt.Sprint(batonnats.DefaultPartitions),
		"slot":             DefaultSlot,
		"publication":      DefaultPublication,
		"http_addr":        DefaultHTTPAddr,
	}
}

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

	"github.com/batonhq/baton/internal/natsconn"
	"github.com/batonhq/baton/internal/setting"
	batonnats "github.com/batonhq/baton/nats"
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

// NATSAuth is how a process proves itself to NATS and checks that the
// server is the right one. Each file is read at start, so a missing or
// unreadable one fails at once; no secret is ever printed.
type NATSAuth struct {
	NATSCreds       string `name:"nats-creds" env:"BATON_NATS_CREDS" placeholder:"FILE" help:"A .creds file (user JWT and seed) for a NATS server in operator mode."`
	NATSNKeySeed    string `name:"nats-nkey-seed" env:"BATON_NATS_NKEY_SEED" placeholder:"FILE" help:"A file holding the nkey seed of this component's NATS user."`
	NATSTLSCA       string `name:"nats-tls-ca" env:"BATON_NATS_TLS_CA" placeholder:"FILE" help:"CA certificate (PEM) that signed the NATS servers' certificates; turns TLS on."`
	NATSTLSCert     string `name:"nats-tls-cert" env:"BATON_NATS_TLS_CERT" placeholder:"FILE" help:"Client certificate (PEM) for mutual TLS, with --nats-tls-key."`
	NATSTLSKey      string `name:"nats-tls-key" env:"BATON_NATS_TLS_KEY" placeholder:"FILE" help:"Client key (PEM) for mutual TLS, with --nats-tls-cert."`
	NATSInboxPrefix string `name:"nats-inbox-prefix" env:"BATON_NATS_INBOX_PREFIX" help:"Subject prefix of this process's reply inboxes, so that other NATS users cannot read its replies. Defaults to _INBOX_<component> (_INBOX_relay, _INBOX_worker, ...), as deploy/nats/accounts.conf allows."`
}

// NATS locates the NATS server and says how to log in to it.
type NATS struct {
	NATSURL  string `name:"nats-url" env:"BATON_NATS_URL" help:"NATS server URL(s), comma-separated; a user and password or a token may be given in it (prefer a file setting below, which ps does not show)." default:"${nats_url}" placeholder:"URL"`
	NATSAuth `embed:""`
}

// Options returns the connection options of component (relay, worker,
// api, ...), whose inbox prefix defaults to _INBOX_<component>.
func (n NATS) Options(component string) natsconn.Options {
	return n.NATSAuth.Options(n.NATSURL, component)
}

// Options returns the connection options for url.
func (a NATSAuth) Options(url, component string) natsconn.Options {
	o := natsconn.Options{
		URL: url, Name: "baton " + component,
		CredsFile: a.NATSCreds, NKeySeedFile: a.NATSNKeySeed,
		TLSCAFile: a.NATSTLSCA, TLSCertFile: a.NATSTLSCert, TLSKeyFile: a.NATSTLSKey,
		InboxPrefix: a.NATSInboxPrefix,
	}
	if o.InboxPrefix == "" && component != "" {
		o.InboxPrefix = natsconn.DefaultInboxPrefix + "_" + component
	}
	return o
}

// Validate checks the URL list and reads the files given; its errors name
// the setting and never quote a secret.
func (n NATS) Validate() error { return n.Options("").Validate() }

// Stream is the outbox stream, as every subcommand that touches it sees
// it. A flag left out means the library's default (nats.StreamConfig).
type Stream struct {
	Stream          string        `name:"stream" env:"BATON_STREAM" setting:"Stream.Name" help:"JetStream stream of outbox events. Defaults to ${stream}."`
	SubjectPrefix   string        `name:"subject-prefix" env:"BATON_SUBJECT_PREFIX" setting:"Stream.SubjectPrefix" help:"Subject prefix; events go to <prefix>.<partition>.<conversation>. Defaults to ${subject_prefix}."`
	Replicas        int           `name:"replicas" env:"BATON_REPLICAS" setting:"Stream.Replicas" help:"Stream replicas (1 for development, 3 in production). Defaults to ${replicas}."`
	MaxAge          time.Duration `name:"max-age" env:"BATON_MAX_AGE" setting:"Stream.MaxAge" help:"How long the stream keeps events; bounds replay. Defaults to ${max_age}."`
	DuplicateWindow time.Duration `name:"duplicate-window" env:"BATON_DUPLICATE_WINDOW" setting:"Stream.DuplicateWindow" help:"JetStream deduplication window for Nats-Msg-Id. Defaults to ${duplicate_window}."`
	Partitions      int           `name:"partitions" env:"BATON_PARTITIONS" setting:"Stream.Partitions" help:"Number of partitions in event subjects. Defaults to ${partitions}."`
}

// StreamConfig converts the flags into the nats package's configuration;
// zero fields take the library's defaults.
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

// Check checks the stream settings with the library's defaults filled
// in; errors are *setting.Error with the field under "Stream.".
func (s Stream) Check() error {
	if err := s.StreamConfig().WithDefaults().Validate(); err != nil {
		return setting.Within("Stream", err)
	}
	return nil
}

// Replication names the publication and slot the relay reads.
type Replication struct {
	Slot        string `name:"slot" env:"BATON_SLOT" setting:"Slot" help:"Logical replication slot the relay reads from." default:"${slot}"`
	Publication string `name:"publication" env:"BATON_PUBLICATION" setting:"Publication" help:"Publication of agent_outbox inserts." default:"${publication}"`
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

// DefaultHTTPAddr is where the API listens unless told otherwise.
const DefaultHTTPAddr = "127.0.0.1:8080"

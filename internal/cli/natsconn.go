package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/natsconn"
	"github.com/batonhq/baton/internal/setting"
	batonnats "github.com/batonhq/baton/nats"
)

// connectNATS connects a component through the one shared connect
// function (credentials, TLS, a private inbox prefix), reconnecting
// forever, and logs what a secured server refuses: a JetStream request
// that lacks a permission gets no answer and would otherwise look like a
// timeout; a connection attempt that fails while the component retries in
// the background (a wrong password, an unknown key, an untrusted
// certificate) would otherwise look like a server that is down. Nothing it
// logs or returns holds a secret.
func connectNATS(o natsconn.Options, log zerolog.Logger, extra ...natsclient.Option) (*natsclient.Conn, error) {
	// Causes of failed attempts logged since the last connection. The
	// client calls its handlers one at a time, from one goroutine.
	logged := map[string]bool{}
	opts := []natsclient.Option{
		natsclient.MaxReconnects(-1),
		// Forever means forever: a refused login is retried too, so a
		// component waits for its user to be added or its key to be
		// trusted instead of giving up for good after two refusals.
		natsclient.IgnoreAuthErrorAbort(),
		natsclient.ReconnectErrHandler(func(_ *natsclient.Conn, err error) {
			// Once per cause (and server) until a connection succeeds,
			// not at every attempt: servers that stay down would fill the
			// log.
			err = natsconn.Explain(o, err)
			if err == nil || logged[err.Error()] {
				return
			}
			logged[err.Error()] = true
			log.Error().Err(err).Msg("cannot connect to NATS; retrying")
		}),
		natsclient.ErrorHandler(func(_ *natsclient.Conn, sub *natsclient.Subscription, err error) {
			ev := log.Error().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			if errors.Is(err, natsclient.ErrPermissionViolation) {
				ev.Msg("the NATS server refused an operation: this component's NATS user lacks a permission (see deploy/nats/accounts.conf)")
				return
			}
			ev.Msg("NATS error")
		}),
		natsclient.DisconnectErrHandler(func(_ *natsclient.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("NATS disconnected; reconnecting")
			}
		}),
		natsclient.ReconnectHandler(func(c *natsclient.Conn) {
			clear(logged)
			log.Info().Str("url", c.ConnectedUrlRedacted()).Msg("NATS reconnected")
		}),
	}
	nc, err := natsconn.Connect(o, append(opts, extra...)...)
	if err != nil {
		return nil, err
	}
	return nc, nil
}

// connectJetStream connects a component that cannot work without NATS and
// returns its JetStream context. The caller closes the connection.
func connectJetStream(o natsconn.Options, log zerolog.Logger) (*natsclient.Conn, jetstream.JetStream, error) {
	nc, err := connectNATS(o, log)
	if errors.Is(err, natsclient.ErrNoServers) {
		// No server could be reached at start: it is waited for, as one
		// lost later is, and the process reports itself not connected
		// meanwhile. A refusal (credentials, TLS) still fails at once,
		// naming the setting to fix.
		log.Warn().Err(err).Msg("cannot reach NATS yet; starting anyway and connecting when it can")
		nc, err = connectNATS(o, log, natsclient.RetryOnFailedConnect(true), natsclient.ReconnectWait(500*time.Millisecond))
	}
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// joinStream waits until the outbox stream exists (its owner, the relay,
// creates it) and returns its settings, checked against those given
// explicitly. It never changes the stream.
func joinStream(ctx context.Context, js jetstream.JetStream, given batonnats.StreamConfig, log zerolog.Logger) (batonnats.StreamConfig, error) {
	waiting := false
	for backoff := 100 * time.Millisecond; ; backoff = min(backoff*2, 5*time.Second) {
		s, err := batonnats.JoinStream(ctx, js, given)
		if err == nil {
			return s, nil
		}
		if !natsUnavailable(err) {
			return batonnats.StreamConfig{}, setting.Within("Stream", err)
		}
		if !waiting {
			log.Warn().Err(err).Msg("waiting for the outbox stream")
			waiting = true
		}
		select {
		case <-ctx.Done():
			return batonnats.StreamConfig{}, fmt.Errorf("stopped while waiting for the outbox stream: %w", err)
		case <-time.After(backoff):
		}
	}
}

// connectLiveNATS connects to NATS for live conversation events. NATS being
// down must not stop a service whose main job is elsewhere (the API keeps
// accepting messages: they are safe in PostgreSQL), so the connection is
// retried in the background, and the events stream, which the API owns, is
// provisioned once NATS is reachable. stop ends that and closes the
// connection; call it before returning.
func connectLiveNATS(ctx context.Context, o natsconn.Options, events batonnats.EventsConfig, allowShrink bool, log zerolog.Logger) (nc *natsclient.Conn, js jetstream.JetStream, stop func(), err error) {
	nc, err = connectNATS(o, log, natsclient.RetryOnFailedConnect(true), natsclient.ReconnectWait(time.Second))
	if err != nil {
		return nil, nil, nil, err
	}
	js, err = jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for backoff := 200 * time.Millisecond; ; backoff = min(backoff*2, 10*time.Second) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, changes, err := batonnats.ProvisionEventsStream(pctx, js, events, batonnats.ProvisionOptions{AllowShrink: allowShrink})
			cancel()
			var shrink *batonnats.ShrinkError
			switch {
			case err == nil:
				for _, c := range changes {
					log.Warn().Str("stream", events.WithDefaults().Name).Str("setting", c.Setting).Str("from", c.Old).Str("to", c.New).Msg("changed a setting of the events stream")
				}
				return
			case ctx.Err() != nil:
				return
			case errors.As(err, &shrink):
				log.Error().Err(err).Msg("the events stream was left as it is; live events go on with its current settings")
				return
			}
			log.Warn().Err(err).Dur("retry_in", backoff).Msg("events stream not provisioned yet")
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
	}()
	return nc, js, func() { cancel(); <-done; nc.Close() }, nil
}

// natsUnavailable reports whether err is NATS or the outbox stream being
// away for now (not reachable yet, reconnecting, no JetStream leader, the
// stream not created yet by its owner), which waiting cures.
func natsUnavailable(err error) bool {
	for _, e := range []error{batonnats.ErrStreamMissing, context.DeadlineExceeded, natsclient.ErrTimeout,
		natsclient.ErrNoResponders, natsclient.ErrConnectionReconnecting, natsclient.ErrDisconnected, natsclient.ErrConnectionClosed,
		jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount} {
		if errors.Is(err, e) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	// 503 is JetStream's "not available": a cluster without a leader.
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

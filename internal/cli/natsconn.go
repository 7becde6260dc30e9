package cli

import (
	"context"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// connectLiveNATS connects to NATS for live conversation events. NATS being
// down must not stop a service whose main job is elsewhere (the API keeps
// accepting messages: they are safe in PostgreSQL), so the connection is
// retried in the background and the events stream is provisioned once it
// is reachable. stop ends that and closes the connection; call it before
// returning.
func connectLiveNATS(ctx context.Context, url, name string, events batonnats.EventsConfig, log zerolog.Logger) (nc *natsclient.Conn, js jetstream.JetStream, stop func(), err error) {
	nc, err = natsclient.Connect(url,
		natsclient.Name(name),
		natsclient.RetryOnFailedConnect(true),
		natsclient.MaxReconnects(-1),
		natsclient.ReconnectWait(time.Second),
		natsclient.DisconnectErrHandler(func(_ *natsclient.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("NATS disconnected; live events paused")
			}
		}),
		natsclient.ReconnectHandler(func(c *natsclient.Conn) {
			log.Info().Str("url", c.ConnectedUrl()).Msg("NATS reconnected")
		}),
	)
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
			_, err := batonnats.EnsureEventsStream(pctx, js, events)
			cancel()
			if err == nil || ctx.Err() != nil {
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

package relay

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// streamLoop runs observeStream every heartbeat interval until ctx ends,
// apart from the heartbeat, which a slow NATS must not hold back.
func (r *Relay) streamLoop(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.HeartbeatInterval)
	defer ticker.Stop()
	for {
		r.observeStream(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// observeStream reads the outbox stream's state and every durable
// consumer's position on it into the metrics, at each heartbeat. The relay
// owns the stream, and it runs whether or not the groups do: a group that
// stopped, with events waiting for it, shows here as pending events and an
// acknowledgement floor that stands still, which its own metrics, gone with
// it, cannot show.
//
// Listing the consumers needs the NATS permission
// $JS.API.CONSUMER.LIST.<stream>; without it the stream's own metrics are
// still kept, and the refusal is logged once.
//
// NATS away only leaves the last values: the relay says so elsewhere.
func (r *Relay) observeStream(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, r.cfg.AckTimeout)
	defer cancel()
	stream, err := r.api.Stream(ctx, r.cfg.Stream.Name)
	if err != nil {
		if !errors.Is(err, jetstream.ErrStreamNotFound) && ctx.Err() == nil {
			r.log.Debug().Err(err).Msg("read the outbox stream's state")
		}
		return
	}
	info := stream.CachedInfo()
	r.metrics.streamMessages.Set(float64(info.State.Msgs))
	r.metrics.streamFirstSeq.Set(float64(info.State.FirstSeq))
	r.metrics.streamLastSeq.Set(float64(info.State.LastSeq))

	seen := map[string]bool{}
	list := stream.ListConsumers(ctx)
	for ci := range list.Info() {
		if ci == nil || ci.Config.Durable == "" {
			continue
		}
		name := ci.Name
		seen[name] = true
		r.metrics.consumerPending.WithLabelValues(name).Set(float64(ci.NumPending))
		r.metrics.consumerAckPending.WithLabelValues(name).Set(float64(ci.NumAckPending))
		r.metrics.consumerAckFloor.WithLabelValues(name).Set(float64(ci.AckFloor.Stream))
	}
	if err := list.Err(); err != nil {
		if parent.Err() != nil {
			// The relay is stopping: nothing was refused.
			return
		}
		if !r.consumerListRefused {
			r.consumerListRefused = true
			r.log.Warn().Err(err).Str("stream", r.cfg.Stream.Name).
				Msg("cannot list the outbox stream's consumers, so their backlog is not exported (baton_stream_consumer_*): the relay's NATS user needs $JS.API.CONSUMER.LIST." + r.cfg.Stream.Name)
		}
		return
	}
	r.consumerListRefused = false
	// A consumer deleted since the last look has no backlog to show.
	for name := range r.consumersSeen {
		if !seen[name] {
			r.metrics.consumerPending.DeleteLabelValues(name)
			r.metrics.consumerAckPending.DeleteLabelValues(name)
			r.metrics.consumerAckFloor.DeleteLabelValues(name)
		}
	}
	r.consumersSeen = seen
}

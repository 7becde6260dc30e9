package relay

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series.
type metrics struct {
	published     *prometheus.CounterVec
	publishErrors prometheus.Counter
	inFlight      prometheus.Gauge
	confirmedLSN  prometheus.Gauge
	slotLag       prometheus.Gauge
	retainedWAL   prometheus.Gauge
	slotStalled   prometheus.Gauge
	ackLatency    prometheus.Histogram
	sweeps        prometheus.Counter
	rowsSwept     prometheus.Counter
	active        prometheus.Gauge

	// The outbox stream and the durable consumers on it (observeStream).
	streamMessages     prometheus.Gauge
	streamFirstSeq     prometheus.Gauge
	streamLastSeq      prometheus.Gauge
	consumerPending    *prometheus.GaugeVec
	consumerAckPending *prometheus.GaugeVec
	consumerAckFloor   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_relay_events_published_total",
			Help: "Outbox events acknowledged by JetStream, by reason (insert, retry, sweep).",
		}, []string{"reason"}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_relay_publish_errors_total",
			Help: "Publications that failed or were not acknowledged in time; each restarts the stream from the slot.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_relay_events_in_flight",
			Help: "Events published and not yet acknowledged by JetStream.",
		}),
		confirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_relay_confirmed_lsn",
			Help: "The LSN last confirmed to the replication slot, as a number.",
		}),
		slotLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_relay_slot_lag_bytes",
			Help: "WAL bytes between the server's current position and the slot's confirmed position.",
		}),
		retainedWAL: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_relay_retained_wal_bytes",
			Help: "WAL bytes the slot keeps the server from removing (from its restart position).",
		}),
		slotStalled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_relay_slot_stalled_seconds",
			Help: "How long the slot's confirmed position has stood still while WAL waited behind it (0 while it moves or nothing waits); alert when it passes a few minutes.",
		}),
		ackLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "baton_relay_commit_to_ack_seconds",
			Help:    "Time from a transaction's commit in PostgreSQL to JetStream's acknowledgement of its event.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_relay_sweeps_total",
			Help: "Sweeps run.",
		}),
		rowsSwept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_relay_rows_swept_total",
			Help: "Pending rows announced again by the sweeper.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_relay_active",
			Help: "1 while this relay streams from the slot, 0 while it stands by or retries.",
		}),
		streamMessages: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_stream_messages",
			Help: "Events the outbox stream holds, read by the relay at each heartbeat.",
		}),
		streamFirstSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_stream_first_seq",
			Help: "First sequence the outbox stream holds: a replay reaches back to it, and the pruner keeps the inbox rows of events from it on.",
		}),
		streamLastSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_stream_last_seq",
			Help: "Last sequence of the outbox stream.",
		}),
		consumerPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_stream_consumer_pending_events",
			Help: "Events of the outbox stream not yet delivered to a durable consumer (a consumer group, turns for the workers), read by the relay at each heartbeat, so it shows while the group's processes are down.",
		}, []string{"consumer"}),
		consumerAckPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_stream_consumer_ack_pending_events",
			Help: "Events delivered to a durable consumer and not yet acknowledged.",
		}, []string{"consumer"}),
		consumerAckFloor: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_stream_consumer_ack_floor_seq",
			Help: "Stream sequence up to which a durable consumer acknowledged every event: it moves while the group makes progress.",
		}, []string{"consumer"}),
	}
	for _, c := range []prometheus.Collector{
		m.published, m.publishErrors, m.inFlight, m.confirmedLSN, m.slotLag,
		m.retainedWAL, m.slotStalled, m.ackLatency, m.sweeps, m.rowsSwept, m.active,
		m.streamMessages, m.streamFirstSeq, m.streamLastSeq, m.consumerPending, m.consumerAckPending, m.consumerAckFloor,
	} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				return nil, errors.New("relay: metrics already registered: give each relay in a process its own Config.Registerer, or nil")
			}
			return nil, err
		}
	}
	return m, nil
}

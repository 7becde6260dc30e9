package consumer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of a worker, registered on Config.Registerer.
type metrics struct {
	turnsStarted   prometheus.Counter
	turnsFinished  *prometheus.CounterVec // by outcome: replied, stopped, interrupted, retried, failed, cancelled, abandoned, ...
	failures       *prometheus.CounterVec // failed attempts, by reason
	attempts       prometheus.Histogram
	insertToClaim  prometheus.Histogram
	insertToFinal  prometheus.Histogram
	recoveries     *prometheus.CounterVec // by outcome: retry, failed
	deduplicated   prometheus.Counter
	busy           prometheus.Counter
	waiting        prometheus.Counter
	inFlight       prometheus.Gauge
	operations     *prometheus.CounterVec // by tool and status
	triggersBroken prometheus.Counter
	statementTurns *prometheus.HistogramVec // by kind: claim, finalize
	alone          *prometheus.CounterVec   // by kind: claim, finalize
	sessionHeld    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	m := &metrics{
		turnsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_turns_started_total", Help: "Turns claimed by this worker.",
		}),
		turnsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_turns_finished_total", Help: "Turns ended by this worker, by outcome (replied, stopped, interrupted, waiting_for_approval, retried, failed, superseded, cancelled, abandoned, error).",
		}, []string{"outcome"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_turn_failures_total", Help: "Failed attempts of turns, retried or not, by reason (the agent's kind of failure: rate_limited, model_unavailable, model_auth, ...; turn_timeout; other).",
		}, []string{"reason"}),
		attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "baton_turn_attempts", Help: "Attempt number of each claimed turn.", Buckets: []float64{1, 2, 3, 4, 5, 10},
		}),
		insertToClaim: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "baton_turn_insert_to_claim_seconds", Help: "From the oldest outbox insert of a turn to its claim.", Buckets: latency,
		}),
		insertToFinal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "baton_turn_insert_to_finalize_seconds", Help: "From the oldest outbox insert of a turn to its finalize commit.", Buckets: latency,
		}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_recoveries_total", Help: "Runs recovered after their lease expired or at shutdown, by outcome (retry, failed, stopped).",
		}, []string{"outcome"}),
		deduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_triggers_deduplicated_total", Help: "Triggers acknowledged without a turn: their rows were already claimed or done (redeliveries, re-announcements).",
		}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_triggers_delayed_busy_total", Help: "Triggers delayed because another run owned the conversation, or another transaction held it past LockWait (or too many claims already waited for held conversations).",
		}),
		waiting: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_triggers_delayed_waiting_total", Help: "Triggers delayed because the model server asked the conversation to wait (Retry-After).",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_conversations_in_flight", Help: "Conversations with a turn running on this worker.",
		}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_operations_total", Help: "Tool calls journaled by this worker, by tool and status.",
		}, []string{"tool", "status"}),
		triggersBroken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_triggers_malformed_total", Help: "Events on the stream that are not triggers; terminated.",
		}),
		statementTurns: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "baton_worker_statement_turns", Help: "Turns carried by one claim or finalize statement, by kind (claim, finalize): 1 while the worker keeps up, more when turns wait for the statement before theirs.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"kind"}),
		sessionHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_worker_session_held", Help: "1 while this worker holds its database session (the lock that tells other workers it is alive) and may claim and finalize turns; 0 while it connects again.",
		}),
		alone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_worker_turns_alone_total", Help: "Turns claimed or finalized on their own, by kind (claim, finalize), because the shared statement would have waited for them: another transaction held the conversation, an expired run had to be recovered first, or a newer message superseded the turn.",
		}, []string{"kind"}),
	}
	// Every outcome is a series from the start, so that a failure rate
	// and a recovery panel exist before the first failure or recovery.
	for _, o := range []string{"replied", "stopped", "interrupted", "retried", "failed", "superseded", "cancelled", "abandoned", "error"} {
		m.turnsFinished.WithLabelValues(o)
	}
	for _, o := range []string{"retry", "failed", "stopped"} {
		m.recoveries.WithLabelValues(o)
	}
	for _, k := range []string{"claim", "finalize"} {
		m.alone.WithLabelValues(k)
	}
	for _, r := range []string{ReasonTurnTimeout, ReasonOther} {
		m.failures.WithLabelValues(r)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{m.turnsStarted, m.turnsFinished, m.failures, m.attempts, m.insertToClaim, m.insertToFinal,
		m.recoveries, m.deduplicated, m.busy, m.waiting, m.inFlight, m.operations, m.triggersBroken, m.statementTurns, m.alone, m.sessionHeld} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

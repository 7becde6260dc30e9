package consumer

import (
	natsclient "github.com/nats-io/nats.go"

	batonnats "github.com/batonhq/baton/nats"
)

// runningTurn is a turn running on this worker, as a stop notice or a
// snapshot request finds it.
type runningTurn struct {
	conversationID string
	live           *liveRun
	// stop ends the turn stopped (journal.stop).
	stop func()
}

// track registers a running turn until the returned function is called.
func (w *Worker) track(conversationID, runID string, live *liveRun, stop func()) func() {
	token := batonnats.RunToken(runID)
	w.runsMu.Lock()
	w.runs[token] = &runningTurn{conversationID: conversationID, live: live, stop: stop}
	w.runsMu.Unlock()
	return func() {
		w.runsMu.Lock()
		delete(w.runs, token)
		w.runsMu.Unlock()
	}
}

// running returns the turn this worker runs for a stop or snapshot subject
// under prefix, or nil.
func (w *Worker) running(prefix, subject string) *runningTurn {
	conversationID, token, err := batonnats.ParseRunSubject(prefix, subject)
	if err != nil {
		return nil
	}
	w.runsMu.Lock()
	defer w.runsMu.Unlock()
	rt := w.runs[token]
	if rt == nil || rt.conversationID != conversationID {
		return nil
	}
	return rt
}

// listen answers stop notices and snapshot requests for the turns this
// worker runs, on the connection of JetStream; the returned function ends
// that. Every worker hears every notice and request and acts on those of
// its own runs. Without them (a connection that may not subscribe), a
// stop still ends a turn at its next lease renewal, and a client that
// joins a run late waits for the reply instead of seeing it grow.
func (w *Worker) listen() func() {
	nc := w.js.Conn()
	var subs []*natsclient.Subscription
	for _, l := range []struct {
		prefix string
		handle func(*natsclient.Msg)
	}{
		{batonnats.StopPrefix, func(m *natsclient.Msg) {
			if rt := w.running(batonnats.StopPrefix, m.Subject); rt != nil {
				w.log.Debug().Str("conversation_id", rt.conversationID).Msg("stop notice")
				rt.stop()
			}
		}},
		{batonnats.SnapshotPrefix, func(m *natsclient.Msg) {
			if rt := w.running(batonnats.SnapshotPrefix, m.Subject); rt != nil && m.Reply != "" {
				rt.live.respond(m)
			}
		}},
	} {
		sub, err := nc.Subscribe(l.prefix+".>", l.handle)
		if err != nil {
			w.log.Warn().Err(err).Str("subject", l.prefix+".>").Msg("cannot listen for stop notices or snapshot requests; stops take effect at the next lease renewal")
			continue
		}
		subs = append(subs, sub)
	}
	return func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
}

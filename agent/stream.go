package agent

import (
	"encoding/json"
	"strings"

	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// Publisher sends a core NATS message; *nats.Conn is one.
type Publisher interface {
	Publish(subject string, data []byte) error
}

// live publishes the reply of one run as it is written, on the run's live
// subject. It keeps the text that stands (the steps that completed) apart
// from the text of the step in progress, so that a retried model call
// resets the subscribers to what stands. Live events are a preview: a
// failed publish is logged and forgotten, never a reason to fail a turn.
// A live with a nil publisher only keeps the text. Under a turn runner,
// show (the turn's consumer.Live) publishes instead, numbering the steps
// with the tool calls of its journal.
type live struct {
	show    func(batonnats.DeltaType, string)
	pub     Publisher
	subject string
	runID   string
	log     zerolog.Logger
	seq     int64
	// stands is the text of the completed steps; step is the text the
	// step in progress has published.
	stands strings.Builder
	step   strings.Builder
}

func newLive(pub Publisher, conversationID, runID string, log zerolog.Logger) *live {
	return &live{pub: pub, subject: batonnats.LiveSubject(conversationID, runID), runID: runID, log: log}
}

func (l *live) publish(t batonnats.DeltaType, text string) {
	if l.show != nil {
		l.show(t, text)
		return
	}
	if l.pub == nil {
		return
	}
	l.seq++
	data, err := json.Marshal(batonnats.LiveDelta{RunID: l.runID, Seq: l.seq, Type: t, Text: text})
	if err == nil {
		err = l.pub.Publish(l.subject, data)
	}
	if err != nil {
		l.log.Debug().Err(err).Str("subject", l.subject).Int64("seq", l.seq).Msg("publish live event")
	}
}

// delta appends text of the step in progress.
func (l *live) delta(text string) {
	if text == "" {
		return
	}
	l.step.WriteString(text)
	l.publish(batonnats.DeltaText, text)
}

// separate starts a step's text on its own paragraph when text stands
// before it; the separator is part of the reply, so it is published too.
func (l *live) separate() {
	if l.stands.Len() > 0 && l.step.Len() == 0 {
		l.delta("\n\n")
	}
}

// retry voids the step in progress, telling subscribers if they saw any
// of it.
func (l *live) retry() {
	if l.step.Len() == 0 {
		return
	}
	l.step.Reset()
	l.publish(batonnats.DeltaReset, l.stands.String())
}

// commit makes the step's text stand. text is the step's whole content as
// the model finally gave it; what streamed is replaced when it differs
// (a server that sent the content whole after fragments, or none).
func (l *live) commit(text string) {
	if text == "" {
		l.retry()
		return
	}
	streamed := l.step.String()
	sep := ""
	if l.stands.Len() > 0 {
		sep = "\n\n"
	}
	switch {
	case streamed == sep+text:
	case streamed == "" || strings.HasPrefix(sep+text, streamed):
		l.delta(strings.TrimPrefix(sep+text, streamed))
	default:
		l.step.Reset()
		l.publish(batonnats.DeltaReset, l.stands.String()+sep+text)
	}
	l.stands.WriteString(sep + text)
	l.step.Reset()
}

// restore makes the text a stopped turn had shown stand again, and shows
// it to subscribers.
func (l *live) restore(text string) {
	if text == "" {
		return
	}
	l.stands.WriteString(text)
	l.publish(batonnats.DeltaReset, text)
}

// text is the reply so far: the text of the completed steps.
func (l *live) text() string { return l.stands.String() }

// done tells subscribers the agent finished.
func (l *live) done() { l.publish(batonnats.DeltaDone, "") }

// failed voids everything the run showed: its attempt produced no reply.
func (l *live) failed() {
	if l.stands.Len() == 0 && l.step.Len() == 0 {
		return
	}
	l.stands.Reset()
	l.step.Reset()
	l.publish(batonnats.DeltaReset, "")
}

package consumer

import (
	"encoding/json"
	"strings"
	"sync"
	"unicode/utf8"

	natsclient "github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// ErrStopped ends a turn that was asked to stop (schema.StopTx): the turn's
// context ends with it as its cause, and the turn is finalized stopped with
// what it had shown so far. An agent that sees it in context.Cause returns
// without voiding what it showed.
var ErrStopped = schema.ErrStopRequested

// Publisher sends a core NATS message; *nats.Conn is one.
type Publisher interface {
	Publish(subject string, data []byte) error
}

// maxLiveToolOutput bounds the result of a tool call as live clients see
// it; the journal keeps it whole.
const maxLiveToolOutput = 32 << 10

// liveRun is the live reply of one run: what it published so far, and
// where. It publishes under its lock, so that the numbers of the deltas
// are in the order of their publication, and a snapshot covers exactly the
// deltas up to its Seq.
type liveRun struct {
	pub     Publisher
	subject string
	log     zerolog.Logger

	mu    sync.Mutex
	reply batonnats.LiveReply
}

func newLiveRun(pub Publisher, conversationID, runID string, log zerolog.Logger) *liveRun {
	return &liveRun{pub: pub, subject: batonnats.LiveSubject(conversationID, runID), log: log,
		reply: batonnats.LiveReply{RunID: runID, Parts: []batonnats.LivePart{}}}
}

// Show publishes one step of the text: batonnats.DeltaText appends
// text, DeltaReset replaces the text shown with text, DeltaDone says the
// agent finished writing.
func (l *liveRun) Show(t batonnats.DeltaType, text string) {
	if t == batonnats.DeltaText && text == "" {
		return
	}
	l.publish(batonnats.LiveDelta{Type: t, Text: text})
}

// toolInput shows a tool call that the journal started.
func (l *liveRun) toolInput(callID, tool string, input json.RawMessage) {
	if !json.Valid(input) || len(input) == 0 || input[0] != '{' {
		input = json.RawMessage(`{}`)
	}
	l.publish(batonnats.LiveDelta{Type: batonnats.DeltaToolInput, ToolCallID: callID, Tool: tool, Input: input})
}

// toolOutput shows the end of a tool call: its result, or that it failed.
func (l *liveRun) toolOutput(callID, result string, failed bool) {
	if failed {
		l.publish(batonnats.LiveDelta{Type: batonnats.DeltaToolError, ToolCallID: callID})
		return
	}
	if len(result) > maxLiveToolOutput {
		cut := maxLiveToolOutput
		for cut > 0 && !utf8.RuneStart(result[cut]) {
			cut--
		}
		result = result[:cut] + "\n[... the rest of the result is left out here ...]"
	}
	l.publish(batonnats.LiveDelta{Type: batonnats.DeltaToolOutput, ToolCallID: callID, Text: result})
}

// toolDenied shows a call that a person denied, or whose approval
// expired: it was never sent.
func (l *liveRun) toolDenied(callID, tool string, input json.RawMessage) {
	l.toolInput(callID, tool, input)
	l.publish(batonnats.LiveDelta{Type: batonnats.DeltaToolDenied, ToolCallID: callID})
}

func (l *liveRun) publish(d batonnats.LiveDelta) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d.RunID, d.Seq = l.reply.RunID, l.reply.Seq+1
	l.reply.Apply(d)
	if l.pub == nil {
		return
	}
	data, err := json.Marshal(d)
	if err == nil {
		err = l.pub.Publish(l.subject, data)
	}
	if err != nil {
		// A preview lost, never a reply.
		l.log.Debug().Err(err).Str("subject", l.subject).Int64("seq", d.Seq).Msg("publish live delta")
	}
}

// text is the text shown so far: a stopped turn's reply.
func (l *liveRun) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reply.Text()
}

// respond answers a snapshot request with the reply so far, under the
// lock: every delta up to the snapshot's Seq was published before it, and
// every later one after it.
func (l *liveRun) respond(m *natsclient.Msg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	data, err := json.Marshal(l.reply)
	if err == nil {
		err = m.Respond(data)
	}
	if err != nil {
		l.log.Debug().Err(err).Str("subject", m.Subject).Msg("answer a snapshot request")
	}
}

// stepLive is the StepLive of a turn's steps: it keeps the text that
// stands (the steps that completed) apart from the text of the step in
// progress, so that a step the agent tries again resets the live reply to
// what stands, and shows each step's text as its own paragraph.
type stepLive struct {
	run *liveRun

	mu sync.Mutex
	// stands is the text of the completed steps; step is the text the
	// step in progress has shown.
	stands strings.Builder
	step   strings.Builder
}

var _ StepLive = (*stepLive)(nil)

// Text implements StepLive.
func (l *stepLive) Text(delta string) {
	if delta == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stands.Len() > 0 && l.step.Len() == 0 {
		// The separator is part of the reply, so it is shown too.
		l.show(paragraph)
	}
	l.show(delta)
}

func (l *stepLive) show(text string) {
	l.step.WriteString(text)
	l.run.Show(batonnats.DeltaText, text)
}

// Retry implements StepLive.
func (l *stepLive) Retry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retry()
}

func (l *stepLive) retry() {
	if l.step.Len() == 0 {
		return
	}
	l.step.Reset()
	l.run.Show(batonnats.DeltaReset, l.stands.String())
}

// commit makes a step's text stand. text is the step's whole text as the
// agent finally gave it; what streamed is replaced when it differs (a
// server that sent the content whole after fragments, or none).
func (l *stepLive) commit(text string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if text == "" {
		l.retry()
		return
	}
	streamed := l.step.String()
	sep := ""
	if l.stands.Len() > 0 {
		sep = paragraph
	}
	switch {
	case streamed == sep+text:
	case streamed == "" || strings.HasPrefix(sep+text, streamed):
		l.show(strings.TrimPrefix(sep+text, streamed))
	default:
		l.run.Show(batonnats.DeltaReset, l.stands.String()+sep+text)
	}
	l.stands.WriteString(sep + text)
	l.step.Reset()
}

// restore makes the text a stopped turn had shown stand again, and shows
// it.
func (l *stepLive) restore(text string) {
	if text == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stands.WriteString(text)
	l.run.Show(batonnats.DeltaReset, text)
}

// text is the reply so far: the text of the completed steps.
func (l *stepLive) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stands.String()
}

// clear tells subscribers to drop what an earlier attempt showed.
func (l *stepLive) clear() { l.run.Show(batonnats.DeltaReset, "") }

// done tells subscribers the agent finished.
func (l *stepLive) done() { l.run.Show(batonnats.DeltaDone, "") }

// failed voids everything the run showed: its attempt produced no reply.
func (l *stepLive) failed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stands.Len() == 0 && l.step.Len() == 0 {
		return
	}
	l.stands.Reset()
	l.step.Reset()
	l.run.Show(batonnats.DeltaReset, "")
}

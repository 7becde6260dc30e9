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
// text, batonnats.DeltaReasoning appends reasoning, DeltaDone says the
// agent finished writing.
func (l *liveRun) Show(t batonnats.DeltaType, text string) {
	if (t == batonnats.DeltaText || t == batonnats.DeltaReasoning) && text == "" {
		return
	}
	l.publish(batonnats.LiveDelta{Type: t, Text: text})
}

// reset replaces the text and the reasoning shown with these.
func (l *liveRun) reset(text, reasoning string) {
	l.publish(batonnats.LiveDelta{Type: batonnats.DeltaReset, Text: text, Reasoning: reasoning})
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

// stopped is a stopped turn's reply: the text and the reasoning shown so
// far.
func (l *liveRun) stopped() Reply {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Reply{Content: l.reply.Text(), Reasoning: l.reply.Reasoning()}
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

// stepLive is the StepLive of a turn's steps: it keeps the text and the
// reasoning that stand (the steps that completed) apart from those of the
// step in progress, so that a step the agent tries again resets the live
// reply to what stands, and shows each step's text and reasoning as a
// paragraph of its own.
type stepLive struct {
	run *liveRun

	mu sync.Mutex
	// stands is the text of the completed steps; step is the text the
	// step in progress has shown. thought and stepThought are their
	// reasoning.
	stands, step         strings.Builder
	thought, stepThought strings.Builder
}

var _ StepLive = (*stepLive)(nil)

// Text implements StepLive.
func (l *stepLive) Text(delta string) {
	if delta == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.show(delta)
}

// Reasoning implements StepLive.
func (l *stepLive) Reasoning(delta string) {
	if delta == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.showReasoning(delta)
}

// show shows text of the step in progress, after the paragraph that
// separates it from the text that stands.
func (l *stepLive) show(text string) {
	if l.stands.Len() > 0 && l.step.Len() == 0 {
		// The separator is part of the reply, so it is shown too.
		text = paragraph + text
	}
	l.step.WriteString(text)
	l.run.Show(batonnats.DeltaText, text)
}

// showReasoning is show for reasoning.
func (l *stepLive) showReasoning(text string) {
	if l.thought.Len() > 0 && l.stepThought.Len() == 0 {
		text = paragraph + text
	}
	l.stepThought.WriteString(text)
	l.run.Show(batonnats.DeltaReasoning, text)
}

// Retry implements StepLive.
func (l *stepLive) Retry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retry()
}

func (l *stepLive) retry() {
	if l.step.Len() == 0 && l.stepThought.Len() == 0 {
		return
	}
	l.step.Reset()
	l.stepThought.Reset()
	l.run.reset(l.stands.String(), l.thought.String())
}

// commit makes a step's text and reasoning stand. They are the step's
// whole text and reasoning as the agent finally gave them; what streamed
// is completed when it begins them, and replaced when it does not (a
// server that sent the content whole after fragments, or none): the step
// is reset to what stands and shown again whole.
func (l *stepLive) commit(text, reasoning string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if text == "" && reasoning == "" {
		l.retry()
		return
	}
	want := func(stands *strings.Builder, s string) string {
		if stands.Len() > 0 && s != "" {
			return paragraph + s
		}
		return s
	}
	wantText, wantThought := want(&l.stands, text), want(&l.thought, reasoning)
	streamed, thought := l.step.String(), l.stepThought.String()
	restText, ok1 := strings.CutPrefix(wantText, streamed)
	restThought, ok2 := strings.CutPrefix(wantThought, thought)
	if !ok1 || !ok2 || restThought != "" && streamed != "" {
		// Reasoning that would follow the text it precedes is shown
		// again whole too.
		l.retry()
		restText, restThought = wantText, wantThought
	}
	if restThought != "" {
		l.stepThought.WriteString(restThought)
		l.run.Show(batonnats.DeltaReasoning, restThought)
	}
	if restText != "" {
		l.step.WriteString(restText)
		l.run.Show(batonnats.DeltaText, restText)
	}
	l.stands.WriteString(wantText)
	l.thought.WriteString(wantThought)
	l.step.Reset()
	l.stepThought.Reset()
}

// restore makes the text and the reasoning a stopped turn had shown stand
// again, and shows them.
func (l *stepLive) restore(text, reasoning string) {
	if text == "" && reasoning == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stands.WriteString(text)
	l.thought.WriteString(reasoning)
	l.run.reset(text, reasoning)
}

// text is the reply so far: the text of the completed steps.
func (l *stepLive) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stands.String()
}

// reasoning is the reasoning of the completed steps.
func (l *stepLive) reasoning() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.thought.String()
}

// clear tells subscribers to drop what an earlier attempt showed.
func (l *stepLive) clear() { l.run.reset("", "") }

// done tells subscribers the agent finished.
func (l *stepLive) done() { l.run.Show(batonnats.DeltaDone, "") }

// failed voids everything the run showed: its attempt produced no reply.
func (l *stepLive) failed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stands.Len() == 0 && l.step.Len() == 0 && l.thought.Len() == 0 && l.stepThought.Len() == 0 {
		return
	}
	l.stands.Reset()
	l.step.Reset()
	l.thought.Reset()
	l.stepThought.Reset()
	l.run.reset("", "")
}

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// The token estimate. Model servers count tokens with their model's own
// tokenizer, which a client cannot know; Baton estimates instead, on the
// safe side: a token per BytesPerToken bytes of UTF-8, rounded up, plus a
// fixed overhead per message, per tool call, per declared tool and per
// request for the roles, names and separators a chat template adds.
// English prose runs near 4 bytes a token and code near 3.5 with common
// tokenizers, so the estimate is above the real count for them; text in
// scripts of 3-byte characters runs near one token a character, which the
// estimate matches. Leave a margin below the model's context window for
// the answer (ContextTokens is the request's budget, not the window).
const (
	BytesPerToken     = 3
	TokensPerMessage  = 4
	TokensPerToolCall = 8
	TokensPerTool     = 8
	TokensPerRequest  = 3
)

// EstimateTokens is the estimated token count of text: its UTF-8 bytes
// divided by BytesPerToken, rounded up.
func EstimateTokens(text string) int {
	return (len(text) + BytesPerToken - 1) / BytesPerToken
}

// entry is a message of a request, with its estimated tokens.
type entry struct {
	role    string // "user", "assistant" or "tool"
	content string
	calls   []toolCall // an assistant's tool calls
	callID  string     // a tool result's call
	tokens  int
	// files are a user message's files, sent as content parts.
	files []entryFile
}

func newEntry(role, content string, calls []toolCall, callID string) entry {
	e := entry{role: role, content: content, calls: calls, callID: callID}
	e.tokens = TokensPerMessage + EstimateTokens(content) + EstimateTokens(callID)
	for _, c := range calls {
		e.tokens += TokensPerToolCall + EstimateTokens(c.ID) + EstimateTokens(c.Name) + EstimateTokens(c.Arguments)
	}
	return e
}

// with returns the entry with other content, and its files.
func (e entry) with(content string) entry {
	n := newEntry(e.role, content, e.calls, e.callID)
	n.files = e.files
	for _, f := range e.files {
		n.tokens += f.tokens
	}
	return n
}

func (e entry) param() openai.ChatCompletionMessageParamUnion {
	switch e.role {
	case "assistant":
		if len(e.calls) > 0 {
			return assistantMessage(e.content, e.calls)
		}
		return openai.AssistantMessage(e.content)
	case "tool":
		return openai.ToolMessage(e.content, e.callID)
	}
	return openai.UserMessage(e.content)
}

// round is a model step that asked for tools, and the tools' results.
type round struct {
	assistant entry
	results   []entry
}

func (r round) tokens() int {
	n := r.assistant.tokens
	for _, e := range r.results {
		n += e.tokens
	}
	return n
}

// window chooses what each request of a turn sends, within the budget of
// ContextTokens, without changing what is stored. In order of priority:
// the system prompt and the tool declarations; the turn's messages (the
// newest always; when the turn alone is over the budget, the oldest are
// cut first, with a marker); the newest history, up to a quarter of the
// budget; the turn's tool rounds (each result capped at
// MaxToolResultBytes; when they outgrow the budget, older results are left
// out, then older rounds, then the newest round's results are cut evenly);
// then as much more history as fits, newest first. History is read from
// Turn.History first and then, only while the budget has room, a page at a
// time through Turn.MoreHistory, so a long conversation is never loaded
// whole.
type window struct {
	budget    int
	maxResult int
	system    *entry
	tools     int

	turn   []entry
	rounds []round

	// history is the history read so far, newest first, without the
	// error messages (Baton's words, not the model's).
	history []entry
	// oldestSeq is the Seq of the oldest message read, the cursor of
	// MoreHistory; 0 when unknown.
	oldestSeq int64
	more      func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error)
	// complete is set once the history read reaches the conversation's
	// start.
	complete bool
	// loaded counts the messages read through MoreHistory.
	loaded int

	// media are the media types the model server takes as content parts
	// (Config.ModelMedia); open reads a file's bytes (Turn.OpenFile).
	media []string
	open  func(ctx context.Context, messageKey, sum string) (schema.StoredFile, error)
	// refused is the turn's file that the model server takes not: the
	// turn fails with it, visibly.
	refused error
	// bytes are the files read, by sha256, once per turn.
	bytes map[string][]byte
}

// request is what one request sends, with figures for the log.
type request struct {
	messages []openai.ChatCompletionMessageParamUnion
	tokens   int
	history  int
	// trimmed is set when anything of the turn was left out or cut.
	trimmed bool
}

func newWindow(cfg Config, turn consumer.Turn, tools []openai.ChatCompletionToolUnionParam) *window {
	w := &window{budget: cfg.ContextTokens, maxResult: cfg.MaxToolResultBytes, more: turn.MoreHistory}
	if cfg.SystemPrompt != "" {
		e := newEntry("system", cfg.SystemPrompt, nil, "")
		w.system = &e
	}
	w.tools = toolTokens(tools)
	w.media, w.open = cfg.ModelMedia, turn.OpenFile
	for _, m := range turn.Messages {
		e, err := userEntry(m, w.media)
		if err != nil && w.refused == nil {
			w.refused = err
		}
		w.turn = append(w.turn, e)
	}
	w.addHistory(turn.History)
	switch {
	case len(turn.History) > 0:
		w.oldestSeq = turn.History[0].Seq
	case len(turn.Messages) > 0:
		w.oldestSeq = turn.Messages[0].Seq
	}
	w.complete = w.more == nil || w.oldestSeq == 0
	return w
}

// toolTokens estimates the tool declarations of a request.
func toolTokens(tools []openai.ChatCompletionToolUnionParam) int {
	n := 0
	for _, t := range tools {
		b, _ := json.Marshal(t)
		n += TokensPerTool + EstimateTokens(string(b))
	}
	return n
}

// addHistory adds older messages, given oldest first.
func (w *window) addHistory(msgs []schema.Message) {
	for i := len(msgs) - 1; i >= 0; i-- {
		switch m := msgs[i]; m.Role {
		case schema.RoleUser:
			e, _ := userEntry(m, w.media)
			w.history = append(w.history, e)
		case schema.RoleAssistant:
			w.history = append(w.history, newEntry(m.Role, m.Content, nil, ""))
		}
	}
}

// addRound records a step's tool calls and their results.
func (w *window) addRound(content string, calls []toolCall, results []string) {
	r := round{assistant: newEntry("assistant", content, calls, "")}
	for i, c := range calls {
		r.results = append(r.results, newEntry("tool", cut(results[i], w.maxResult), nil, c.ID))
	}
	w.rounds = append(w.rounds, r)
}

// next returns the messages of the turn's next request.
func (w *window) next(ctx context.Context) (request, error) {
	if w.refused != nil {
		return request{}, w.refused
	}
	fixed := TokensPerRequest + w.tools
	if w.system != nil {
		fixed += w.system.tokens
	}
	avail := w.budget - fixed
	// The newest history, up to a quarter of the budget, goes before the
	// turn's tool rounds, so that many or long tool results never crowd
	// out what the turn's messages refer to; the rest of the history
	// fills what the rounds leave.
	reserved, err := w.fitHistory(ctx, avail/historyShare)
	if err != nil {
		return request{}, err
	}
	reserve := 0
	for _, e := range reserved {
		reserve += e.tokens
	}
	turn, rounds, turnTokens, trimmed := w.fitTurn(avail-reserve, avail)
	if turnTokens > avail {
		return request{}, &ModelError{Kind: ErrContextBudget, User: userTooLong, Message: fmt.Sprintf(
			"the turn does not fit BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens) of %d tokens even with its tool results left out and its messages cut (the system prompt and the tool declarations take %d): raise it, or shorten the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)",
			w.budget, fixed)}
	}
	history, err := w.fitHistory(ctx, avail-turnTokens)
	if err != nil {
		return request{}, err
	}
	req := request{tokens: fixed + turnTokens, history: len(history), trimmed: trimmed}
	msgs := make([]openai.ChatCompletionMessageParamUnion, 0, 1+len(history)+len(turn)+2*len(rounds))
	if w.system != nil {
		msgs = append(msgs, openai.SystemMessage(w.system.content))
	}
	for i := len(history) - 1; i >= 0; i-- {
		p, err := w.param(ctx, history[i])
		if err != nil {
			return request{}, err
		}
		msgs = append(msgs, p)
		req.tokens += history[i].tokens
	}
	for _, e := range turn {
		p, err := w.param(ctx, e)
		if err != nil {
			return request{}, err
		}
		msgs = append(msgs, p)
	}
	for _, r := range rounds {
		msgs = append(msgs, r.assistant.param())
		for _, e := range r.results {
			msgs = append(msgs, e.param())
		}
	}
	req.messages = msgs
	return req, nil
}

// fitTurn fits the turn's messages and rounds into avail tokens, leaving
// out or cutting, in this order: the results of older rounds, the older
// rounds, the newest round's results (cut evenly), the turn's messages
// (the oldest first, the newest last). The rounds give way down to
// roundsAvail (what the history's share leaves), the messages only down
// to avail. The caller checks the total, which exceeds avail only when
// nothing more can go.
func (w *window) fitTurn(roundsAvail, avail int) (turn []entry, rounds []round, total int, trimmed bool) {
	turn = w.turn
	rounds = w.rounds
	for _, e := range turn {
		total += e.tokens
	}
	for _, r := range rounds {
		total += r.tokens()
	}
	if total <= roundsAvail {
		return turn, rounds, total, false
	}
	trimmed = true
	// Copies: what is stored for the next request stays whole.
	rounds = append([]round(nil), rounds...)
	last := len(rounds) - 1
	// The results of older rounds, oldest first.
	for i := 0; i < last && total > roundsAvail; i++ {
		res := append([]entry(nil), rounds[i].results...)
		for j := range res {
			if total <= roundsAvail {
				break
			}
			short := res[j].with(leftOut(len(res[j].content)))
			total -= res[j].tokens - short.tokens
			res[j] = short
		}
		rounds[i].results = res
	}
	// Older rounds whole, oldest first.
	drop := 0
	for drop < last && total > roundsAvail {
		total -= rounds[drop].tokens()
		drop++
	}
	rounds = rounds[drop:]
	last -= drop
	// The newest round's results, cut to one size: the largest that fits.
	if last >= 0 && total > roundsAvail {
		r := rounds[last]
		rest := total
		for _, e := range r.results {
			rest -= e.tokens
		}
		// The search sizes by cutLen, which is what cut returns without
		// building it.
		fits := func(n int) bool {
			sum := rest
			for _, e := range r.results {
				sum += e.tokens - EstimateTokens(e.content) + (cutLen(len(e.content), n)+BytesPerToken-1)/BytesPerToken
			}
			return sum <= roundsAvail
		}
		lo, hi := 0, w.maxResult
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if fits(mid) {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		res := make([]entry, len(r.results))
		sum := 0
		for i, e := range r.results {
			res[i] = e.with(cut(e.content, lo))
			sum += res[i].tokens
		}
		r.results = res
		rounds[last] = r
		total = rest + sum
	}
	// The turn's messages, the oldest first.
	if total > avail {
		turn = append([]entry(nil), turn...)
		for i := range turn {
			if total <= avail {
				break
			}
			over := total - avail
			keep := max(EstimateTokens(turn[i].content)-over, 0) * BytesPerToken
			short := turn[i].with(cut(turn[i].content, keep))
			total -= turn[i].tokens - short.tokens
			turn[i] = short
		}
	}
	return turn, rounds, total, trimmed
}

// historyShare: the newest history up to 1/historyShare of the budget
// comes before the turn's tool rounds.
const historyShare = 4

// minCutTokens is the least room worth giving the newest earlier message
// when it does not fit whole.
const minCutTokens = 64

// fitHistory returns the newest history that fits room tokens, newest
// first, reading more while there is room.
func (w *window) fitHistory(ctx context.Context, room int) ([]entry, error) {
	used, n := 0, 0
	var cutNewest *entry
	for {
		if n == len(w.history) {
			if w.complete || room-used <= TokensPerMessage {
				break
			}
			if err := w.load(ctx, room-used); err != nil {
				return nil, err
			}
			if n == len(w.history) {
				break
			}
		}
		e := w.history[n]
		if used+e.tokens > room {
			if n == 0 && room >= minCutTokens {
				// The message just before the turn is the one it most
				// likely answers: cut rather than left out.
				short := e.with(cut(e.content, (room-TokensPerMessage)*BytesPerToken))
				if short.tokens <= room {
					cutNewest = &short
				}
			}
			break
		}
		used += e.tokens
		n++
	}
	out := w.history[:n]
	if cutNewest != nil {
		out = []entry{*cutNewest}
	}
	return out, nil
}

// load reads a page of older history through MoreHistory, sized to what
// room may still take.
func (w *window) load(ctx context.Context, room int) error {
	avg := 64
	if len(w.history) > 0 {
		sum := 0
		for _, e := range w.history {
			sum += e.tokens
		}
		avg = max(sum/len(w.history), TokensPerMessage+1)
	}
	limit := min(max(room/avg+1, 16), 256)
	msgs, err := w.more(ctx, w.oldestSeq, limit)
	if err != nil {
		return fmt.Errorf("load earlier messages: %w", err)
	}
	w.loaded += len(msgs)
	if len(msgs) < limit {
		w.complete = true
	}
	if len(msgs) == 0 {
		return nil
	}
	oldest := msgs[len(msgs)-1].Seq
	if oldest >= w.oldestSeq || oldest == 0 {
		// Not older than what was read: stop rather than loop.
		w.complete = true
	}
	w.oldestSeq = oldest
	for _, m := range msgs {
		switch m.Role {
		case schema.RoleUser:
			e, _ := userEntry(m, w.media)
			w.history = append(w.history, e)
		case schema.RoleAssistant:
			w.history = append(w.history, newEntry(m.Role, m.Content, nil, ""))
		}
	}
	return nil
}

// cut shortens s to at most n bytes when it is longer, keeping its start
// and its end at rune boundaries around a marker that says how much was
// left out. Below the marker's own length it is the marker alone.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	keep := n - len(marker(len(s)))
	if keep <= 0 {
		return leftOut(len(s))
	}
	head := keep / 2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	tail := len(s) - (keep - head)
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return s[:head] + marker(tail-head) + s[tail:]
}

// cutLen is the length of cut(s, n) for a string of size bytes, or a
// bound of it.
func cutLen(size, n int) int {
	switch {
	case size <= n:
		return size
	case n-len(marker(size)) <= 0:
		return len(leftOut(size))
	}
	return n
}

func marker(n int) string {
	return fmt.Sprintf("\n[... %d bytes left out to fit the model's context ...]\n", n)
}

// leftOut stands for a text of n bytes that was left out whole.
func leftOut(n int) string {
	return fmt.Sprintf("[%d bytes left out to fit the model's context]", n)
}

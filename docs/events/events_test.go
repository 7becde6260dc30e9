package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/docs/events"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// awkwardIDs are ids that existed before keys were server-chosen: anything
// a client sent, within the database's 1 to 200 characters.
var awkwardIDs = []string{
	"c_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6a",
	"Ünïcödé 会話 🙂",
	" leading and trailing ",
	"\tcontrol\x00chars\x1f\x7f\n",
	"a.b*c>d",
	"100% <b>&amp;</b> \"quoted\" \\",
	"line\u2028sep\u2029",
	"\u00a0nbsp\u3000ideographic space\u00a0",
	"bad utf8 \xff\xfe",
	strings.Repeat("ü", 200),
}

var created = time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)

// schemaDoc is a schema file as JSON.
func schemaDoc(t *testing.T, kind string) map[string]any {
	t.Helper()
	data, err := events.Schema(kind)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(data, &doc))
	return doc
}

// at walks a schema document along keys.
func at(t *testing.T, doc map[string]any, keys ...string) any {
	t.Helper()
	var v any = doc
	for _, k := range keys {
		m, ok := v.(map[string]any)
		require.True(t, ok, "schema has no object at %q", keys)
		v, ok = m[k]
		require.True(t, ok, "schema has nothing at %q", keys)
	}
	return v
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	list, ok := v.([]any)
	require.True(t, ok, "want a list of strings, got %v", v)
	out := make([]string, len(list))
	for i, x := range list {
		out[i], ok = x.(string)
		require.True(t, ok, "want a list of strings, got %v", v)
	}
	slices.Sort(out)
	return out
}

// jsonFields returns the JSON names of a struct's fields, sorted, and the
// ones encoding/json always writes (no omitempty).
func jsonFields(typ reflect.Type) (all, always []string) {
	for f := range typ.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		all = append(all, name)
		if !slices.Contains(strings.Split(opts, ","), "omitempty") {
			always = append(always, name)
		}
	}
	slices.Sort(all)
	slices.Sort(always)
	return all, always
}

var goTypes = map[string]reflect.Type{
	events.KindTrigger:           reflect.TypeFor[batonnats.Trigger](),
	events.KindConversationEvent: reflect.TypeFor[batonnats.ConversationEvent](),
	events.KindLiveDelta:         reflect.TypeFor[batonnats.LiveDelta](),
}

func TestSchemasAreDraft2020_12AndCompile(t *testing.T) {
	t.Parallel()
	for _, kind := range events.Kinds() {
		doc := schemaDoc(t, kind)
		require.Equal(t, "https://json-schema.org/draft/2020-12/schema", doc["$schema"], kind)
		require.Equal(t, false, doc["additionalProperties"], "the %s body is a closed format", kind)
		// Compiling checks each schema against the draft's meta-schema.
		require.NoError(t, events.ValidateSubject(kind, map[string]string{
			events.KindTrigger:           "baton.outbox.0.Yw",
			events.KindConversationEvent: "baton.events.Yw",
			events.KindLiveDelta:         "baton.live.Yw.run_1",
		}[kind]))
	}
}

// A field renamed, added or dropped on either side, or made optional, fails
// here: the schema's properties are the Go type's JSON fields, and its
// required ones those that encoding/json always writes.
func TestSchemaPropertiesAreTheGoTypesFields(t *testing.T) {
	t.Parallel()
	for _, kind := range events.Kinds() {
		doc := schemaDoc(t, kind)
		props, ok := at(t, doc, "properties").(map[string]any)
		require.True(t, ok)
		var names []string
		for name := range props {
			names = append(names, name)
		}
		slices.Sort(names)
		all, always := jsonFields(goTypes[kind])
		require.Equal(t, all, names, "the properties of %s are the JSON fields of %s", events.File(kind), goTypes[kind])
		require.Equal(t, always, strs(t, at(t, doc, "required")), "%s requires the fields %s always has", events.File(kind), goTypes[kind])
	}
}

// goConstants reads, from the nats package's source, the string constants
// declared with each of the given types: a value added to a Go enum must be
// added to the schema too.
func goConstants(t *testing.T, types ...string) map[string][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "nats", "*.go"))
	require.NoError(t, err)
	out := make(map[string][]string)
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				typ, ok := vs.Type.(*ast.Ident)
				if !ok || !slices.Contains(types, typ.Name) {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					require.True(t, ok && lit.Kind == token.STRING, "constant of type %s is a string literal", typ.Name)
					s, err := strconv.Unquote(lit.Value)
					require.NoError(t, err)
					out[typ.Name] = append(out[typ.Name], s)
				}
			}
		}
	}
	for _, typ := range types {
		require.NotEmpty(t, out[typ], "no constants of type %s found in nats", typ)
		slices.Sort(out[typ])
	}
	return out
}

func TestSchemaEnumsAreTheGoConstants(t *testing.T) {
	t.Parallel()
	consts := goConstants(t, "Reason", "EventType", "DeltaType")
	trigger := schemaDoc(t, events.KindTrigger)
	require.Equal(t, consts["Reason"], strs(t, at(t, trigger, "properties", "reason", "enum")))
	require.Equal(t, consts["Reason"], strs(t, at(t, trigger, "$defs", "headers", "properties", "Baton-Reason", "enum")))
	require.Equal(t, consts["EventType"], strs(t, at(t, schemaDoc(t, events.KindConversationEvent), "properties", "type", "enum")))
	require.Equal(t, consts["DeltaType"], strs(t, at(t, schemaDoc(t, events.KindLiveDelta), "properties", "type", "enum")))

	headers := at(t, trigger, "$defs", "headers", "properties").(map[string]any)
	var names []string
	for name := range headers {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{batonnats.HeaderMsgID, batonnats.HeaderOutboxID, batonnats.HeaderConversationID, batonnats.HeaderMessageID, batonnats.HeaderReason}
	slices.Sort(want)
	require.Equal(t, want, strs(t, at(t, trigger, "$defs", "headers", "required")), "every header nats names but the trace context is required")
	want = append(want, batonnats.HeaderTraceParent)
	slices.Sort(want)
	require.Equal(t, want, names, "the trigger's headers are the ones nats names")
}

// validTriggers are triggers as Baton writes them, for every reason, with
// every kind of id a conversation or message may still have.
func validTriggers() []batonnats.Trigger {
	var out []batonnats.Trigger
	reasons := []struct {
		reason       batonnats.Reason
		announcement string
	}{
		{batonnats.ReasonInsert, ""},
		{batonnats.ReasonRetry, "a3"},
		{batonnats.ReasonSweep, "s1700000000000000000"},
		{batonnats.ReasonUserRetry, "u1700000000000000001"},
	}
	for i, id := range awkwardIDs {
		r := reasons[i%len(reasons)]
		out = append(out, batonnats.Trigger{
			OutboxID: int64(i + 1), ConversationID: id, MessageID: awkwardIDs[len(awkwardIDs)-1-i],
			CreatedAt: created.In(time.FixedZone("x", i*1800)), Reason: r.reason, Announcement: r.announcement,
		})
	}
	out = append(out, batonnats.Trigger{OutboxID: 9223372036854775807, ConversationID: "c", MessageID: "m", CreatedAt: time.Time{}, Reason: batonnats.ReasonInsert})
	return out
}

func TestTriggerMsgMatchesTheSchema(t *testing.T) {
	t.Parallel()
	for _, tr := range validTriggers() {
		for _, partitions := range []int{1, 16} {
			m, err := tr.Msg(batonnats.DefaultSubjectPrefix, partitions)
			require.NoError(t, err)
			require.NoError(t, events.ValidateMessage(events.KindTrigger, m.Subject, m.Header, m.Data))
		}
	}
}

func TestSchemaRefusesTriggersBatonNeverWrites(t *testing.T) {
	t.Parallel()
	ok := batonnats.Trigger{OutboxID: 1, ConversationID: "c", MessageID: "m", CreatedAt: created, Reason: batonnats.ReasonInsert}
	for name, edit := range map[string]func(*batonnats.Trigger){
		"no outbox id":                  func(tr *batonnats.Trigger) { tr.OutboxID = 0 },
		"negative outbox id":            func(tr *batonnats.Trigger) { tr.OutboxID = -1 },
		"empty conversation id":         func(tr *batonnats.Trigger) { tr.ConversationID = "" },
		"empty message id":              func(tr *batonnats.Trigger) { tr.MessageID = "" },
		"conversation id of 201 chars":  func(tr *batonnats.Trigger) { tr.ConversationID = strings.Repeat("x", 201) },
		"no reason":                     func(tr *batonnats.Trigger) { tr.Reason = "" },
		"unknown reason":                func(tr *batonnats.Trigger) { tr.Reason = "again" },
		"insert with an announcement":   func(tr *batonnats.Trigger) { tr.Announcement = "a1" },
		"retry without an announcement": func(tr *batonnats.Trigger) { tr.Reason = batonnats.ReasonRetry },
		"sweep labelled as a retry":     func(tr *batonnats.Trigger) { tr.Reason, tr.Announcement = batonnats.ReasonSweep, "a1" },
		"announcement not a label":      func(tr *batonnats.Trigger) { tr.Reason, tr.Announcement = batonnats.ReasonRetry, "a-1" },
	} {
		tr := ok
		edit(&tr)
		m, err := tr.Msg(batonnats.DefaultSubjectPrefix, 16)
		require.NoError(t, err)
		require.Error(t, events.ValidateMessage(events.KindTrigger, m.Subject, m.Header, m.Data), "%s: %s must be refused", name, m.Data)
	}
	m, err := ok.Msg(batonnats.DefaultSubjectPrefix, 16)
	require.NoError(t, err)
	require.NoError(t, events.ValidateMessage(events.KindTrigger, m.Subject, m.Header, m.Data))

	// Headers written raw, or missing, or twice.
	for name, h := range map[string]natsclient.Header{
		"raw unicode id":         {batonnats.HeaderConversationID: {"Ünï"}},
		"raw leading space":      {batonnats.HeaderMessageID: {" m"}},
		"lowercase escape":       {batonnats.HeaderMessageID: {"%c3%bc"}},
		"bare percent":           {batonnats.HeaderMessageID: {"100%"}},
		"two values":             {batonnats.HeaderReason: {"insert", "insert"}},
		"unknown header":         {"Baton-Extra": {"x"}},
		"msg id of a sweep":      {batonnats.HeaderMsgID: {"outbox-1-s1"}},
		"outbox id not a number": {batonnats.HeaderOutboxID: {"1x"}},
	} {
		header := natsclient.Header{}
		for k, v := range m.Header {
			header[k] = v
		}
		for k, v := range h {
			header[k] = v
		}
		require.Error(t, events.ValidateHeader(events.KindTrigger, header), "%s: %v must be refused", name, header)
	}
	for _, name := range []string{batonnats.HeaderMsgID, batonnats.HeaderOutboxID, batonnats.HeaderConversationID, batonnats.HeaderMessageID, batonnats.HeaderReason} {
		header := natsclient.Header{}
		for k, v := range m.Header {
			if k != name {
				header[k] = v
			}
		}
		require.Error(t, events.ValidateHeader(events.KindTrigger, header), "headers without %s must be refused", name)
	}
	for _, s := range []string{"baton.outbox.1", "baton.outbox.x.Yw", "baton.outbox.01.Yw", "baton.outbox.1.Y=", "baton.outbox.1.Yw.x", "bat*n.outbox.1.Yw", "1.Yw"} {
		require.Error(t, events.ValidateSubject(events.KindTrigger, s), "subject %q must be refused", s)
	}
}

// Conversation events go through the publisher into a real events stream
// and are read back as a subscriber reads them.
func TestConversationEventsAsPublishedMatchTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testenv.StartNATS(t).Connect(t)
	cfg := batonnats.EventsConfig{Name: "EV_SCHEMA", SubjectPrefix: "ev.schema"}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Name, Subjects: []string{cfg.SubjectPrefix + ".>"}})
	require.NoError(t, err)
	pub := batonnats.NewEventPublisher(js, cfg, false)

	type published struct {
		ev    batonnats.ConversationEvent
		msgID string
	}
	var sent []published
	for _, cid := range awkwardIDs {
		run, turn, ids := "run_0192f5a0", "turn_9f86d081", []int64{1, 9223372036854775807}
		for _, ev := range []batonnats.ConversationEvent{
			{Type: batonnats.EventMessage, ConversationID: cid, MessageID: cid, OutboxIDs: ids[:1]},
			{Type: batonnats.EventProcessing, ConversationID: cid, RunID: run, TurnID: turn, OutboxIDs: ids},
			{Type: batonnats.EventPending, ConversationID: cid, RunID: run, TurnID: turn, OutboxIDs: ids},
			{Type: batonnats.EventPending, ConversationID: cid, OutboxIDs: ids},
			{Type: batonnats.EventReplied, ConversationID: cid, RunID: run, TurnID: turn, OutboxIDs: ids, MessageID: "m_reply"},
			{Type: batonnats.EventFailed, ConversationID: cid, RunID: run, TurnID: turn, OutboxIDs: ids, MessageID: "m_error"},
			{Type: batonnats.EventFailed, ConversationID: cid, RunID: run, TurnID: turn, MessageID: "m_error"},
			{Type: batonnats.EventCancelled, ConversationID: cid, RunID: run, TurnID: turn, OutboxIDs: ids},
			{Type: batonnats.EventDeleted, ConversationID: cid},
		} {
			// A Nats-Msg-Id like the publishers' own ("deleted-<key>"),
			// holding the conversation's key, and unique so that none is
			// deduplicated; a user's retry publishes without one.
			msgID := fmt.Sprintf("%s-%s-%d", ev.Type, cid, len(sent))
			if ev.Type == batonnats.EventPending && ev.RunID == "" {
				msgID = ""
			}
			require.NoError(t, pub.Publish(ctx, ev, msgID))
			sent = append(sent, published{ev, msgID})
		}
	}

	cons, err := js.OrderedConsumer(ctx, "EV_SCHEMA", jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for i, want := range sent {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err, "event %d of %d", i+1, len(sent))
		require.NoError(t, events.ValidateMessage(events.KindConversationEvent, msg.Subject(), msg.Headers(), msg.Data()))
		var got batonnats.ConversationEvent
		require.NoError(t, json.Unmarshal(msg.Data(), &got))
		require.Equal(t, cfg.WithDefaults().Subject(want.ev.ConversationID), msg.Subject())
		if utf8.ValidString(want.ev.ConversationID) {
			require.Equal(t, want.ev.ConversationID, got.ConversationID)
		}
		if want.msgID != "" {
			back, err := batonnats.DecodeHeaderValue(msg.Headers().Get(batonnats.HeaderMsgID))
			require.NoError(t, err)
			require.Equal(t, want.msgID, back, "Nats-Msg-Id decodes to the publisher's id")
		}
	}
}

func TestSchemaRefusesConversationEventsBatonNeverWrites(t *testing.T) {
	t.Parallel()
	for _, ev := range []batonnats.ConversationEvent{
		{Type: "renamed", ConversationID: "c", At: created},
		{Type: batonnats.EventDeleted, At: created},
		{Type: batonnats.EventMessage, ConversationID: "c", OutboxIDs: []int64{1}, At: created},
		{Type: batonnats.EventProcessing, ConversationID: "c", RunID: "r", OutboxIDs: []int64{1}, At: created},
		{Type: batonnats.EventReplied, ConversationID: "c", RunID: "r", TurnID: "t", OutboxIDs: []int64{1}, At: created},
		{Type: batonnats.EventFailed, ConversationID: "c", RunID: "r", TurnID: "t", At: created},
		{Type: batonnats.EventCancelled, ConversationID: "c", RunID: "r", TurnID: "t", OutboxIDs: []int64{0}, At: created},
		{Type: batonnats.EventDeleted, ConversationID: "c", RunID: "r", At: created},
	} {
		body, err := json.Marshal(ev)
		require.NoError(t, err)
		require.Error(t, events.Validate(events.KindConversationEvent, body), "%s must be refused", body)
	}
	require.Error(t, events.Validate(events.KindConversationEvent, []byte(`{"type":"deleted","conversation_id":"c","at":"yesterday"}`)), "at is a date-time")
	require.Error(t, events.Validate(events.KindConversationEvent, []byte(`{"type":"deleted","conversation_id":"c"}`)), "at is required")
	require.Error(t, events.ValidateHeader(events.KindConversationEvent, natsclient.Header{batonnats.HeaderMsgID: {"deleted- Ünï"}}), "a raw id in Nats-Msg-Id")
	require.NoError(t, events.ValidateHeader(events.KindConversationEvent, natsclient.Header{}), "Nats-Msg-Id is optional")
}

// Live deltas go over core NATS as the agent publishes them.
func TestLiveDeltasAsPublishedMatchTheSchema(t *testing.T) {
	t.Parallel()
	nc, _ := testenv.StartNATS(t).Connect(t)
	sub, err := nc.SubscribeSync(batonnats.LivePrefix + ".>")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	var sent []batonnats.LiveDelta
	for _, cid := range awkwardIDs {
		for _, run := range []string{"run_0192f5a0", "run with.dots*"} {
			for i, d := range []batonnats.LiveDelta{
				{Type: batonnats.DeltaReasoning, Text: "Thinking"},
				{Type: batonnats.DeltaText, Text: "Hel"},
				{Type: batonnats.DeltaText, Text: "\n\n"},
				{Type: batonnats.DeltaReset, Text: "He", Reasoning: "Thin"},
				{Type: batonnats.DeltaReset, Reasoning: "Thin"},
				{Type: batonnats.DeltaReset},
				{Type: batonnats.DeltaText, Text: cid},
				{Type: batonnats.DeltaToolInput, ToolCallID: "call_1", Tool: "lookup", Input: json.RawMessage(`{"text":"` + run + `"}`)},
				{Type: batonnats.DeltaToolOutput, ToolCallID: "call_1", Text: "found"},
				{Type: batonnats.DeltaToolOutput, ToolCallID: "call_1"},
				{Type: batonnats.DeltaToolInput, ToolCallID: "call_2", Tool: "notify", Input: json.RawMessage(`{}`)},
				{Type: batonnats.DeltaToolError, ToolCallID: "call_2"},
				{Type: batonnats.DeltaToolInput, ToolCallID: "call_3", Tool: "mail__send", Input: json.RawMessage(`{"to":"bob"}`)},
				{Type: batonnats.DeltaToolDenied, ToolCallID: "call_3"},
				{Type: batonnats.DeltaDone},
			} {
				d.RunID, d.Seq = run, int64(i+1)
				data, err := json.Marshal(d)
				require.NoError(t, err)
				require.NoError(t, nc.Publish(batonnats.LiveSubject(cid, run), data))
				sent = append(sent, d)
			}
		}
	}
	for i := range sent {
		msg, err := sub.NextMsg(10 * time.Second)
		require.NoError(t, err, "delta %d of %d", i+1, len(sent))
		require.NoError(t, events.ValidateMessage(events.KindLiveDelta, msg.Subject, msg.Header, msg.Data))
	}

	for _, bad := range []string{
		`{"run_id":"r","seq":1,"type":"delta"}`,
		`{"run_id":"r","seq":1,"type":"delta","text":""}`,
		`{"run_id":"r","seq":1,"type":"done","text":"x"}`,
		`{"run_id":"r","seq":1.5,"type":"done"}`,
		`{"run_id":"r","seq":1,"type":"tool_input","tool_call_id":"c","tool":"t"}`,
		`{"run_id":"r","seq":1,"type":"tool_output","text":"x"}`,
		`{"run_id":"r","seq":1,"type":"tool_error","tool_call_id":"c","text":"a cause"}`,
		`{"run_id":"r","seq":1,"type":"delta","text":"x","tool_call_id":"c"}`,
		`{"run_id":"r","seq":1,"type":"reasoning"}`,
		`{"run_id":"r","seq":1,"type":"reasoning","text":""}`,
		`{"run_id":"r","seq":1,"type":"delta","text":"x","reasoning":"y"}`,
		`{"run_id":"r","seq":1,"type":"reasoning","text":"x","reasoning":"y"}`,
		`{"run_id":"r","seq":1,"type":"tool_input","tool_call_id":"c","tool":"t","input":{},"reasoning":"y"}`,
	} {
		require.Error(t, events.Validate(events.KindLiveDelta, []byte(bad)), "%s must be refused", bad)
	}
	require.Error(t, events.ValidateHeader(events.KindLiveDelta, natsclient.Header{"X": {"y"}}), "live deltas have no headers")
	require.Error(t, events.ValidateSubject(events.KindLiveDelta, "baton.live.Yw.run.x"))
}

// Every body the nats package's parsers refuse, the schema refuses too:
// the schema is at least as strict as Baton's readers.
func TestSchemaRefusesWhatTheParsersRefuse(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		`not json`, `[]`, `{}`, `{"outbox_id":0,"conversation_id":"c"}`, `{"outbox_id":1,"conversation_id":""}`,
		`{"outbox_id":"1","conversation_id":"c"}`, `{"outbox_id":1.5,"conversation_id":"c"}`,
	} {
		_, err := batonnats.ParseTrigger([]byte(bad))
		require.Error(t, err, bad)
		require.Error(t, events.Validate(events.KindTrigger, []byte(bad)), "%s is refused by ParseTrigger and must be by the schema", bad)
	}
	for _, bad := range []string{
		`not json`, `{"run_id":"r","seq":1,"type":"shout"}`, `{"run_id":"","seq":1,"type":"done"}`,
		`{"run_id":"r","seq":0,"type":"done"}`, `{"seq":1,"type":"done"}`,
		`{"run_id":"r","seq":1,"type":"tool_input","tool_call_id":"c","input":{}}`, `{"run_id":"r","seq":1,"type":"tool_output"}`,
	} {
		_, err := batonnats.ParseLiveDelta([]byte(bad))
		require.Error(t, err, bad)
		require.Error(t, events.Validate(events.KindLiveDelta, []byte(bad)), "%s is refused by ParseLiveDelta and must be by the schema", bad)
	}
}

// A renamed, dropped or unknown field in a body Baton writes is refused.
func TestSchemaRefusesRenamedDroppedOrUnknownFields(t *testing.T) {
	t.Parallel()
	// The examples of a kind set every field between them (no live delta
	// has both text and a tool call's input).
	full := map[string][]any{
		events.KindTrigger: {batonnats.Trigger{OutboxID: 1, ConversationID: "c", MessageID: "m", CreatedAt: created, Reason: batonnats.ReasonRetry, Announcement: "a1"}},
		events.KindConversationEvent: {batonnats.ConversationEvent{Type: batonnats.EventWaiting, ConversationID: "c", RunID: "r", TurnID: "t",
			MessageID: "m", OutboxIDs: []int64{1}, NotBefore: &created, At: created,
			ApprovalID: "ap_1", Tool: "s__t", ExpiresAt: &created, Decision: "approved"}},
		events.KindLiveDelta: {
			batonnats.LiveDelta{RunID: "r", Seq: 1, Type: batonnats.DeltaText, Text: "x"},
			batonnats.LiveDelta{RunID: "r", Seq: 1, Type: batonnats.DeltaReasoning, Text: "x"},
			batonnats.LiveDelta{RunID: "r", Seq: 1, Type: batonnats.DeltaReset, Text: "x", Reasoning: "y"},
			batonnats.LiveDelta{RunID: "r", Seq: 2, Type: batonnats.DeltaToolInput, ToolCallID: "call_1", Tool: "clock", Input: json.RawMessage(`{"zone":"UTC"}`)},
			batonnats.LiveDelta{RunID: "r", Seq: 3, Type: batonnats.DeltaToolError, ToolCallID: "call_1"},
		},
	}
	for _, kind := range events.Kinds() {
		set := map[string]bool{}
		for _, example := range full[kind] {
			for _, field := range requireRefusesEdits(t, kind, example) {
				set[field] = true
			}
		}
		all, _ := jsonFields(goTypes[kind])
		require.Len(t, set, len(all), "the %s examples set every field", kind)
	}
}

// requireRefusesEdits checks that the body of example is valid and that
// each of its fields renamed or of the wrong type, or an unknown field
// added, is refused; it returns the fields the body has.
func requireRefusesEdits(t *testing.T, kind string, example any) []string {
	t.Helper()
	{
		data, err := json.Marshal(example)
		require.NoError(t, err)
		require.NoError(t, events.Validate(kind, data))
		var body map[string]any
		require.NoError(t, json.Unmarshal(data, &body))
		var fields []string
		for field := range body {
			fields = append(fields, field)
			for _, renamed := range []string{field + "s", strings.ReplaceAll(field, "_", ""), strings.ToUpper(field[:1]) + field[1:]} {
				if renamed == field {
					continue // a one-word name has no underscore to drop
				}
				edited := clone(body)
				edited[renamed] = edited[field]
				delete(edited, field)
				requireRefused(t, kind, edited, field+" renamed to "+renamed)
			}
			edited := clone(body)
			edited[field] = []any{edited[field]}
			requireRefused(t, kind, edited, field+" of the wrong type")
		}
		edited := clone(body)
		edited["extra"] = "x"
		requireRefused(t, kind, edited, "an unknown field")
		return fields
	}
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func requireRefused(t *testing.T, kind string, body map[string]any, what string) {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	require.Error(t, events.Validate(kind, data), "%s body with %s must be refused: %s", kind, what, data)
}

func TestValidateRefusesWhatIsNotAnEvent(t *testing.T) {
	t.Parallel()
	_, err := events.Schema("nope")
	require.ErrorIs(t, err, events.ErrUnknownKind)
	require.ErrorIs(t, events.Validate("nope", []byte(`{}`)), events.ErrUnknownKind)
	require.ErrorIs(t, events.ValidateHeader("nope", nil), events.ErrUnknownKind)
	body := []byte(`{"run_id":"r","seq":1,"type":"done"}`)
	require.NoError(t, events.Validate(events.KindLiveDelta, body))
	for _, bad := range [][]byte{nil, []byte(`{"run_id":"r","seq":1,"type":"done"} {}`), []byte(`{"run_id":"r\xff","seq":1,"type":"done"}`)} {
		require.Error(t, events.Validate(events.KindLiveDelta, bad), "%q must be refused", bad)
	}
}

// Whatever the ids, the headers Trigger.Msg writes match the schema's
// encodedId, and the body matches when the ids fit the database.
func FuzzTriggerMsgMatchesTheSchema(f *testing.F) {
	for _, id := range awkwardIDs {
		f.Add(id, "m")
	}
	f.Add("%", " ")
	f.Fuzz(func(t *testing.T, conversationID, messageID string) {
		tr := batonnats.Trigger{OutboxID: 1, ConversationID: conversationID, MessageID: messageID, CreatedAt: created, Reason: batonnats.ReasonInsert}
		m, err := tr.Msg(batonnats.DefaultSubjectPrefix, 16)
		if err != nil {
			t.Fatal(err)
		}
		fits := func(id string) bool { n := utf8.RuneCountInString(id); return n >= 1 && n <= 200 }
		if !fits(conversationID) || !fits(messageID) {
			return
		}
		if err := events.ValidateMessage(events.KindTrigger, m.Subject, m.Header, m.Data); err != nil {
			t.Fatal(err)
		}
	})
}

package agent_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// sendFiles stores a user message with files, as the API does.
func (s *stack) sendFiles(conversationID, messageID, content string, files ...schema.FileIn) {
	s.t.Helper()
	ctx := context.Background()
	_, err := s.db.Pool.Exec(ctx, `INSERT INTO conversations (id, public_id, owner_id) VALUES ($1, $1, $2) ON CONFLICT DO NOTHING`, conversationID, s.owner)
	require.NoError(s.t, err)
	err = pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: s.owner, ConversationID: conversationID, MessageID: messageID, Content: content, Files: files})
		return err
	})
	require.NoError(s.t, err)
}

func tinyPNG(t *testing.T) []byte {
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, 3, 3))))
	return buf.Bytes()
}

// contentParts returns the parts of a recorded message's content, or nil
// when it is text.
func contentParts(t *testing.T, m agenttest.Message) []map[string]any {
	t.Helper()
	parts, ok := m.Content.([]any)
	if !ok {
		return nil
	}
	out := make([]map[string]any, len(parts))
	for i, p := range parts {
		out[i] = p.(map[string]any)
	}
	return out
}

// TestTheBuiltInLoopSendsAnImageAsAnImageURLPart: a message with an image
// and a text file, run by the real worker, reaches the model server as
// one user message of content parts: its text, the image as image_url
// with the stored bytes in a data URL, and the text file as text (the
// server takes images only, by default). A PDF, which it does not take,
// fails the turn with a visible error that names the file.
func TestTheBuiltInLoopSendsAnImageAsAnImageURLPart(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	model := agenttest.NewServer(t, agenttest.Response{Content: "A grey square."})
	s.startWorker(newAgent(t, model, nil), agent.NewRegistry(), nil)
	img := tinyPNG(t)
	s.sendFiles("conv-image", "m1", "what is in the picture?",
		schema.FileIn{Filename: "square.png", MediaType: "image/png", Data: img},
		schema.FileIn{Filename: "notes.txt", MediaType: "text/plain", Data: []byte("grey, 3 by 3\n")})
	replied := s.await("conv-image", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventReplied, replied.Type)

	reqs := model.Requests()
	require.Len(t, reqs, 1)
	last := reqs[0].Messages[len(reqs[0].Messages)-1]
	require.Equal(t, "user", last.Role)
	parts := contentParts(t, last)
	require.Len(t, parts, 3, "text, image, text file: %s", last.Text())
	require.Equal(t, map[string]any{"type": "text", "text": "what is in the picture?"}, parts[0])
	require.Equal(t, "image_url", parts[1]["type"])
	require.Equal(t, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(img), parts[1]["image_url"].(map[string]any)["url"])
	require.Equal(t, map[string]any{"type": "text", "text": "[file notes.txt]\ngrey, 3 by 3\n"}, parts[2])

	s.sendFiles("conv-pdf", "m2", "summarize", schema.FileIn{Filename: "report.pdf", MediaType: "application/pdf", Data: []byte("%PDF-1.4\n%%EOF\n")})
	failed := s.await("conv-pdf", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventFailed, failed.Type)
	var shown string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE conversation_id = 'conv-pdf' AND role = 'error'`).Scan(&shown))
	require.Contains(t, shown, `report.pdf`, "the visible error names the file")
	require.Len(t, model.Requests(), 1, "the PDF never reached the model server")
}

// TestTheModelMediaSettingSendsAPDFAsAFilePart: with application/pdf in
// ModelMedia, a PDF goes as a file part, its bytes in file_data.
func TestTheModelMediaSettingSendsAPDFAsAFilePart(t *testing.T) {
	t.Parallel()
	model := agenttest.NewServer(t, agenttest.Response{Content: "ok"})
	a := newAgent(t, model, func(c *agent.Config) { c.ModelMedia = []string{"image/*", "application/pdf"} })
	pdf := []byte("%PDF-1.4\n%%EOF\n")
	turn := turnOf("summarize")
	turn.Messages[0].Key = "m1"
	turn.Messages[0].Files = []schema.File{{SHA256: "ab", MediaType: "application/pdf", Filename: "r.pdf", Size: int64(len(pdf))}}
	turn.OpenFile = func(_ context.Context, key, sum string) (schema.StoredFile, error) {
		require.Equal(t, "m1", key)
		return schema.StoredFile{MediaType: "application/pdf", Size: int64(len(pdf)), Data: pdf}, nil
	}
	_, err := run(context.Background(), a, turn, newExecutor(agent.NewRegistry()))
	require.NoError(t, err)
	parts := contentParts(t, model.Requests()[0].Messages[0])
	require.Len(t, parts, 2)
	b, _ := json.Marshal(parts[1])
	require.JSONEq(t, `{"type":"file","file":{"filename":"r.pdf","file_data":"data:application/pdf;base64,`+base64.StdEncoding.EncodeToString(pdf)+`"}}`, string(b))
}

// TestAnExternalAgentGetsFilesAsSignedLinks: an AG-UI or AI SDK agent
// gets a user message's file as a part whose url is the link the worker
// signs (consumer.Turn.FileLink), never the bytes; without links (no
// --files-url) the text says the file was left out.
func TestAnExternalAgentGetsFilesAsSignedLinks(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(w.text("a1", "A cat.", 1))}, agenttest.AgentReply{Frames: w.step(w.text("a2", "A cat.", 1))})
		turn := turnOf("what is this?")
		turn.Messages[0].Key = "m_key"
		cat := schema.File{SHA256: "0a", MediaType: "image/png", Filename: "cat.png", Size: 10}
		turn.Messages[0].Files = []schema.File{cat}
		turn.FileLink = func(_ context.Context, key string, f schema.File) (string, error) {
			require.Equal(t, "m_key", key)
			return "https://baton.example/v1/files/" + f.SHA256 + "?u=x&e=1&s=y", nil
		}
		x := newExternal(t, w.protocol, srv, nil)
		_, err := run(context.Background(), x, turn, newExecutor(agent.NewRegistry()))
		require.NoError(t, err)
		turn.FileLink = nil
		_, err = run(context.Background(), x, turn, newExecutor(agent.NewRegistry()))
		require.NoError(t, err)

		var linked, unlinked struct {
			Messages []map[string]any `json:"messages"`
		}
		srv.Requests()[0].Decode(t, &linked)
		srv.Requests()[1].Decode(t, &unlinked)
		link := "https://baton.example/v1/files/0a?u=x&e=1&s=y"
		if w.protocol == agent.ProtocolAISDK {
			require.Equal(t, []any{
				map[string]any{"type": "file", "mediaType": "image/png", "filename": "cat.png", "url": link},
				map[string]any{"type": "text", "text": "what is this?"},
			}, linked.Messages[0]["parts"])
			require.Contains(t, unlinked.Messages[0]["parts"].([]any)[0].(map[string]any)["text"], "cat.png: a image/png file, left out")
			return
		}
		require.Equal(t, []any{
			map[string]any{"type": "text", "text": "what is this?"},
			map[string]any{"type": "binary", "mimeType": "image/png", "filename": "cat.png", "url": link},
		}, linked.Messages[0]["content"])
		require.Contains(t, unlinked.Messages[0]["content"], "cat.png: a image/png file, left out")
	})
}

// TestAnA2AAgentGetsFilesAsURLParts: an A2A agent (the SDK's own server)
// gets a user message's file as a file part by URL, the link the worker
// signs, beside the message's text part, which it answers as usual.
func TestAnA2AAgentGetsFilesAsURLParts(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, nil)
	a := newA2A(t, proxy, nil)
	turn := a2aTurn("c_files", "reply A cat.")
	turn.Messages[0].Key = "m_key"
	turn.Messages[0].Files = []schema.File{{SHA256: "0a", MediaType: "image/png", Filename: "cat.png", Size: 10}}
	link := "https://baton.example/v1/files/0a?u=x&e=1&s=y"
	turn.FileLink = func(context.Context, string, schema.File) (string, error) { return link, nil }
	step, err := a.Step(context.Background(), consumer.StepRequest{Turn: turn, Live: &recordLive{}})
	require.NoError(t, err)
	require.Equal(t, "A cat.", step.Text)
	var sent struct {
		Message struct {
			Parts []map[string]any `json:"parts"`
		} `json:"message"`
	}
	for _, c := range proxy.calls() {
		if c.method == "SendStreamingMessage" {
			require.NoError(t, json.Unmarshal(c.params, &sent))
		}
	}
	require.Len(t, sent.Message.Parts, 2, "%v", sent.Message.Parts)
	require.Equal(t, link, sent.Message.Parts[0]["url"])
	require.Equal(t, "image/png", sent.Message.Parts[0]["mediaType"])
	require.Equal(t, "cat.png", sent.Message.Parts[0]["filename"])
	require.Equal(t, "reply A cat.", sent.Message.Parts[1]["text"])
}

// TestAnImageCountsAgainstTheRequestBudget: an image of the history is
// sent while the budget has room for it (an image counts TokensPerImage)
// and left out, with its message, when it has not; the turn's own image
// is always sent.
func TestAnImageCountsAgainstTheRequestBudget(t *testing.T) {
	t.Parallel()
	img := tinyPNG(t)
	open := func(_ context.Context, _, _ string) (schema.StoredFile, error) {
		return schema.StoredFile{MediaType: "image/png", Size: int64(len(img)), Data: img}, nil
	}
	withImage := func(key, text string) schema.Message {
		return schema.Message{ID: key, Key: key, ConversationID: "conv", Role: schema.RoleUser, Content: text, Seq: 1,
			Files: []schema.File{{SHA256: key, MediaType: "image/png", Filename: key + ".png", Size: int64(len(img))}}}
	}
	images := func(budget int) (history, turn int) {
		model := agenttest.NewServer(t, agenttest.Response{Content: "ok"})
		a := newAgent(t, model, func(c *agent.Config) { c.ContextTokens = budget })
		tr := turnOf("and this one?", withImage("h1", "look"), schema.Message{ID: "h2", Role: schema.RoleAssistant, Content: "A square.", Seq: 2})
		tr.Messages[0] = withImage("m1", "and this one?")
		tr.Messages[0].Seq = 3
		tr.OpenFile = open
		_, err := run(context.Background(), a, tr, newExecutor(agent.NewRegistry()))
		require.NoError(t, err)
		msgs := model.Requests()[0].Messages
		for i, m := range msgs {
			for _, p := range contentParts(t, m) {
				if p["type"] == "image_url" {
					if i == len(msgs)-1 {
						turn++
					} else {
						history++
					}
				}
			}
		}
		return history, turn
	}
	h, tu := images(32000)
	require.Equal(t, [2]int{1, 1}, [2]int{h, tu}, "room for both images")
	h, tu = images(2200)
	require.Equal(t, [2]int{0, 1}, [2]int{h, tu}, "the history's image does not fit what the turn's leaves of 2,200 tokens")
}

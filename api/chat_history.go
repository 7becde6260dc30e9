package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/batonhq/baton/schema"
)

// uiMessage is a message as the AI SDK's UIMessage: what useChat takes as
// its initial messages.
type uiMessage struct {
	ID       string         `json:"id"`
	Role     string         `json:"role"`
	Metadata *replyMetadata `json:"metadata,omitempty"`
	Parts    []uiPart       `json:"parts"`
}

// uiPart is a part of a UIMessage: text, reasoning, the start of a step,
// or a tool call (dynamic: Baton's tools are the server's, not the
// client's).
type uiPart struct {
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	State      string          `json:"state,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
	Output     *string         `json:"output,omitempty"`
	ErrorText  string          `json:"errorText,omitempty"`
	Approval   *uiApproval     `json:"approval,omitempty"`
}

// uiApproval is a tool part's approval: the call waited for the user, who
// decided.
type uiApproval struct {
	ID       string `json:"id"`
	Approved bool   `json:"approved"`
}

// toUIMessage is m as a UIMessage. A reply's parts are a step, its
// reasoning, its tool calls (the journal keeps no place of a call in the
// text), then its text; a failed turn's visible error is an assistant
// message with its text, marked failed.
func toUIMessage(m schema.ChatMessage) uiMessage {
	out := uiMessage{ID: m.ID, Role: "assistant", Metadata: metadataOf(m)}
	if m.Role == schema.RoleUser {
		out.Role = "user"
		out.Parts = []uiPart{{Type: "text", Text: m.Content}}
		return out
	}
	out.Parts = append(out.Parts, uiPart{Type: "step-start"})
	if m.Reasoning != "" {
		out.Parts = append(out.Parts, uiPart{Type: "reasoning", Text: m.Reasoning, State: "done"})
	}
	for _, t := range m.Tools {
		p := uiPart{Type: "dynamic-tool", ToolName: t.Tool, ToolCallID: t.CallID, Input: t.Input}
		if len(p.Input) == 0 {
			p.Input = json.RawMessage(`{}`)
		}
		switch t.Status {
		case "completed":
			out := t.Output
			p.State, p.Output = "output-available", &out
		case "failed":
			p.State, p.ErrorText = "output-error", toolFailedText
		case "denied":
			// Never sent: denied, expired, or stopped before it was.
			p.State, p.ErrorText = "output-error", toolDeniedText
			if t.ApprovalID != "" {
				p.State, p.ErrorText, p.Approval = "output-denied", "", &uiApproval{ID: t.ApprovalID}
			}
		default:
			p.State, p.ErrorText = "output-error", toolUnendedText
		}
		out.Parts = append(out.Parts, p)
	}
	if m.Content != "" {
		out.Parts = append(out.Parts, uiPart{Type: "text", Text: m.Content, State: "done"})
	}
	return out
}

// chatHistory answers a chat's messages as UIMessages for useChat's initial
// messages: the newest page (?limit=, default 100, at most 1000), oldest
// first, and with ?before=<next_before> (an opaque cursor of the chat's)
// the page before it. Replies that a
// regenerated one replaced are left out; the turn that runs has no reply
// here yet (GET /v1/chat/{id}/stream streams it).
func (s *Server) chatHistory(w http.ResponseWriter, r *http.Request) {
	chatID := r.PathValue("id")
	if err := schema.ValidateID("chat", chatID); err != nil {
		writeError(w, http.StatusBadRequest, "bad_id", err.Error())
		return
	}
	q := r.URL.Query()
	limit := schema.DefaultChatPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > schema.MaxChatPage {
			writeError(w, http.StatusBadRequest, "bad_limit", fmt.Sprintf("limit must be a number from 1 to %d", schema.MaxChatPage))
			return
		}
		limit = n
	}
	msgs, next, err := schema.ChatHistory(r.Context(), s.pool, userFrom(r.Context()).ID, chatID, q.Get("before"), limit)
	if errors.Is(err, schema.ErrBadCursor) {
		writeError(w, http.StatusBadRequest, "bad_cursor", `before must be the "next_before" of a page of this chat`)
		return
	}
	if errors.Is(err, schema.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no chat "+strconv.Quote(chatID)+" for this user")
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	body := map[string]any{}
	out := make([]uiMessage, len(msgs))
	for i, m := range msgs {
		out[i] = toUIMessage(m)
	}
	body["messages"] = out
	if next != "" {
		body["next_before"] = next
	}
	writeJSON(w, http.StatusOK, body)
}

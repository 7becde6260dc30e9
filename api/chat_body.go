package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Limits of a chat request's body. useChat sends the chat's whole history
// with each message: the body is read as a stream, keeping one message at
// a time, and only the last one (the new message) is used; Baton has the
// history already.
const (
	// DefaultMaxChatBodyBytes is the largest body POST /v1/chat reads.
	DefaultMaxChatBodyBytes = 8 << 20
	// DefaultMaxChatMessages is the most messages it reads from a body.
	DefaultMaxChatMessages = 10000
)

// chatRequest is what POST /v1/chat takes from useChat's default
// transport's body: the chat's id, the trigger, the message to regenerate,
// and the last message of the list. Every other field is ignored.
type chatRequest struct {
	ChatID    string
	Trigger   string
	MessageID string
	// Last is the last message of the list; Count how many there were.
	Last  *uiMessageIn
	Count int
	// RepeatWrites, with regenerate, answers again a turn that made
	// writes: regenerate({body: {repeat_writes: true}}) puts it in the
	// body.
	RepeatWrites bool
}

// uiMessageIn is a message of the list as far as Baton reads it.
type uiMessageIn struct {
	ID    string     `json:"id"`
	Role  string     `json:"role"`
	Parts []uiPartIn `json:"parts"`
}

// uiPartIn is a part of a message as far as Baton reads it: text,
// reasoning, or a tool call with its state and, once the user answered
// it, its approval.
type uiPartIn struct {
	Type       string          `json:"type"`
	Text       *string         `json:"text"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	State      string          `json:"state"`
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output"`
	Approval   *struct {
		ID       string `json:"id"`
		Approved *bool  `json:"approved"`
	} `json:"approval"`
}

// isTool reports whether p is a tool call: "dynamic-tool" or "tool-<name>".
func (p uiPartIn) isTool() bool {
	return p.Type == "dynamic-tool" || strings.HasPrefix(p.Type, "tool-")
}

// Triggers of useChat's requests.
const (
	triggerSubmit     = "submit-message"
	triggerRegenerate = "regenerate-message"
)

// chatBodyError is a body POST /v1/chat refuses, with its answer.
type chatBodyError struct {
	status  int
	code    string
	message string
}

func (e *chatBodyError) Error() string { return e.message }

func badChat(format string, args ...any) *chatBodyError {
	return &chatBodyError{status: http.StatusBadRequest, code: "bad_chat_request", message: fmt.Sprintf(format, args...)}
}

// readChatRequest reads a chat request from body, which must be one JSON
// object, within maxMessages messages; over maxBytes its reader fails (an
// http.MaxBytesReader).
func readChatRequest(body io.Reader, maxMessages int) (chatRequest, error) {
	var req chatRequest
	dec := json.NewDecoder(body)
	if err := expectDelim(dec, '{'); err != nil {
		return req, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return req, jsonProblem(err)
		}
		key, _ := tok.(string)
		switch key {
		case "id":
			err = decodeString(dec, "id", &req.ChatID)
		case "trigger":
			err = decodeString(dec, "trigger", &req.Trigger)
		case "messageId":
			err = decodeString(dec, "messageId", &req.MessageID)
		case "messages":
			err = readMessages(dec, maxMessages, &req)
		case "repeat_writes":
			err = decodeBool(dec, "repeat_writes", &req.RepeatWrites)
		default:
			err = skipValue(dec)
		}
		if err != nil {
			return req, err
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return req, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return req, jsonProblem(err)
		}
		return req, badChat("the request body holds more than one JSON value: send exactly one object")
	}
	return req, nil
}

func readMessages(dec *json.Decoder, maxMessages int, req *chatRequest) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonProblem(err)
	}
	if tok == nil {
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return badChat(`"messages" must be an array of messages`)
	}
	for dec.More() {
		req.Count++
		if req.Count > maxMessages {
			return &chatBodyError{status: http.StatusRequestEntityTooLarge, code: "too_many_messages",
				message: fmt.Sprintf(`"messages" holds more than %d messages, the most read: send fewer (the server keeps the history; only the last message is new)`, maxMessages)}
		}
		var m uiMessageIn
		if err := dec.Decode(&m); err != nil {
			if readErr := bodyProblem(err); readErr != nil {
				return readErr
			}
			return badChat("message %d of \"messages\" is not a message: %s", req.Count, jsonErrorMessage(err))
		}
		req.Last = &m
	}
	_, err = dec.Token() // ']'
	return jsonProblem(err)
}

func decodeString(dec *json.Decoder, field string, into *string) error {
	var v *string
	if err := dec.Decode(&v); err != nil {
		if readErr := bodyProblem(err); readErr != nil {
			return readErr
		}
		return badChat("%q must be a string: %s", field, jsonErrorMessage(err))
	}
	if v != nil {
		*into = *v
	}
	return nil
}

func decodeBool(dec *json.Decoder, field string, into *bool) error {
	var v *bool
	if err := dec.Decode(&v); err != nil {
		if readErr := bodyProblem(err); readErr != nil {
			return readErr
		}
		return badChat("%q must be true or false: %s", field, jsonErrorMessage(err))
	}
	if v != nil {
		*into = *v
	}
	return nil
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonProblem(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return badChat("the request body must be a JSON object, as useChat sends")
	}
	return nil
}

// skipValue reads past one value of any size without keeping it.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return jsonProblem(err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// jsonProblem says what is wrong with a body that does not parse; a body
// over its limit, one that came too slowly and one whose text Baton does
// not take keep their own errors.
func jsonProblem(err error) error {
	if err == nil {
		return nil
	}
	if readErr := bodyProblem(err); readErr != nil {
		return readErr
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return badChat("%s", jsonErrorMessage(err))
}

// bodyProblem returns err when reading the body failed, rather than
// parsing it: over its limit (413), too slow (408), text Baton does not
// take (400 bad_text). Each has an answer of its own, never "malformed
// JSON".
func bodyProblem(err error) error {
	var mbe *http.MaxBytesError
	var bte *bodyTimeoutError
	var te *textError
	if errors.As(err, &mbe) || errors.As(err, &bte) || errors.As(err, &te) {
		return err
	}
	return nil
}

// newMessage returns the id and the content of the request's new message,
// the last of the list: the user's, of text parts only.
func (req chatRequest) newMessage(maxContent int) (id, content string, err error) {
	m := req.Last
	if m == nil {
		return "", "", badChat(`"messages" is missing or empty: send the chat's messages, the new one last`)
	}
	if m.Role != "user" {
		return "", "", badChat("the last message is the %s's: the last message must be the user's new message", m.Role)
	}
	var texts []string
	for _, p := range m.Parts {
		if p.Type != "text" || p.Text == nil {
			return "", "", &chatBodyError{status: http.StatusUnprocessableEntity, code: "unsupported_part",
				message: fmt.Sprintf("the new message has a part of type %q: only text parts are taken for now", p.Type)}
		}
		texts = append(texts, *p.Text)
	}
	content = strings.Join(texts, "\n\n")
	switch {
	case strings.TrimSpace(content) == "":
		return "", "", badChat("the new message has no text")
	case len(content) > maxContent:
		return "", "", &chatBodyError{status: http.StatusRequestEntityTooLarge, code: "content_too_large",
			message: fmt.Sprintf("the new message is %d bytes; the limit is %d bytes", len(content), maxContent)}
	}
	if terr := checkText("the new message's text", content); terr != nil {
		return "", "", terr
	}
	return m.ID, content, nil
}

// approvalResponse is the user's answer to an approval, as useChat sends
// it: addToolApprovalResponse marks the tool part of the reply
// "approval-responded" with the approval's id and the answer, and the next
// request carries that reply as its last message.
type approvalResponse struct {
	ApprovalID string
	Approved   bool
}

// approvalResponses returns the answers to approvals that the request's
// last message, the assistant's reply, carries, and the reply's parts as
// the client shows them (text, reasoning and tool calls, in order), which
// the stream that continues the reply does not send again.
func (req chatRequest) approvalResponses() ([]approvalResponse, []batonnats.LivePart, error) {
	m := req.Last
	var out []approvalResponse
	var shown []batonnats.LivePart
	for _, p := range m.Parts {
		switch {
		case (p.Type == "text" || p.Type == "reasoning") && p.Text != nil:
			kind := batonnats.PartText
			if p.Type == "reasoning" {
				kind = batonnats.PartReasoning
			}
			// Consecutive parts of a kind are one, as a live reply folds
			// them.
			if n := len(shown); n > 0 && shown[n-1].Type == kind {
				shown[n-1].Text += *p.Text
			} else if *p.Text != "" {
				shown = append(shown, batonnats.LivePart{Type: kind, Text: *p.Text})
			}
		case p.isTool() && p.ToolCallID != "":
			tool := batonnats.LivePart{Type: batonnats.PartTool, ToolCallID: p.ToolCallID, Tool: p.ToolName, Input: p.Input,
				State: batonnats.ToolInputAvailable}
			switch p.State {
			case "output-available":
				tool.State = batonnats.ToolOutputAvailable
				var text string
				if json.Unmarshal(p.Output, &text) == nil {
					tool.Output = text
				}
			case "output-error":
				tool.State = batonnats.ToolOutputError
			case "output-denied":
				tool.State = batonnats.ToolOutputDenied
			}
			shown = append(shown, tool)
		}
		if p.State != "approval-responded" {
			continue
		}
		if p.Approval == nil || p.Approval.ID == "" || p.Approval.Approved == nil {
			return nil, nil, badChat(`a tool part in state "approval-responded" needs "approval": {"id", "approved"}, as addToolApprovalResponse sets it`)
		}
		if err := schema.ValidateID("approval", p.Approval.ID); err != nil {
			return nil, nil, &chatBodyError{status: http.StatusBadRequest, code: "bad_id", message: "a tool part's approval id: " + err.Error()}
		}
		out = append(out, approvalResponse{ApprovalID: p.Approval.ID, Approved: *p.Approval.Approved})
	}
	if len(out) == 0 {
		return nil, nil, badChat("the last message is the assistant's and answers no approval: send the user's new message last, or answer an approval with addToolApprovalResponse")
	}
	return out, shown, nil
}

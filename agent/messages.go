package agent

import (
	"encoding/json"

	"github.com/openai/openai-go/v3"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// messages is the request's conversation: the system prompt, the history
// and the turn's user messages. An error message in the history is what
// Baton told the user when a turn failed; it was never the model's, so it
// is not sent as if the model had said it.
func messages(systemPrompt string, turn consumer.Turn) []openai.ChatCompletionMessageParamUnion {
	var out []openai.ChatCompletionMessageParamUnion
	if systemPrompt != "" {
		out = append(out, openai.SystemMessage(systemPrompt))
	}
	for _, m := range turn.History {
		switch m.Role {
		case schema.RoleUser:
			out = append(out, openai.UserMessage(m.Content))
		case schema.RoleAssistant:
			out = append(out, openai.AssistantMessage(m.Content))
		}
	}
	for _, m := range turn.Messages {
		out = append(out, openai.UserMessage(m.Content))
	}
	return out
}

// assistantMessage is a model step that asked for tools, as the next
// request repeats it.
func assistantMessage(content string, calls []toolCall) openai.ChatCompletionMessageParamUnion {
	var m openai.ChatCompletionAssistantMessageParam
	if content != "" {
		m.Content.OfString = openai.String(content)
	}
	for _, c := range calls {
		args := c.Arguments
		if !json.Valid([]byte(args)) {
			// Some servers refuse a history that holds arguments they
			// cannot parse; the tool's error quotes them to the model.
			args = "{}"
		}
		m.ToolCalls = append(m.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID: c.ID,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
					Name:      c.Name,
					Arguments: args,
				},
			},
		})
	}
	return openai.ChatCompletionMessageParamUnion{OfAssistant: &m}
}

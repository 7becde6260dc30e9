package agent

import (
	"encoding/json"

	"github.com/openai/openai-go/v3"
)

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

package agent

import (
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"strings"

	"github.com/openai/openai-go/v3"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// A user message's files go to the model as content parts of its
// message: an image as image_url, any other file the model server takes
// (Config.ModelMedia) as file, both with the bytes in a data URL. A text
// file the server takes not is sent as text; any other file it takes not
// fails the turn with a visible error when the turn's message has it, and
// is left out, with a note, from the history.

// TokensPerImage is the estimate of an image part: above what OpenAI
// counts for a 2048×2048 image at high detail (1105), on the safe side
// like the rest of the estimate.
const TokensPerImage = 1200

// DefaultModelMedia are the media types a model server takes as parts by
// default: images.
var DefaultModelMedia = []string{"image/*"}

// entryFile is a file of a user message's entry.
type entryFile struct {
	key  string // the message's server key
	file schema.File
	// asText sends a text file as text: the server takes no such file.
	asText bool
	tokens int
}

// takes reports whether media, a list of media types or "type/*",
// holds mediaType.
func takes(media []string, mediaType string) bool {
	for _, m := range media {
		if m == mediaType || strings.HasSuffix(m, "/*") && strings.HasPrefix(mediaType, strings.TrimSuffix(m, "*")) {
			return true
		}
	}
	return false
}

// userEntry is a user message with its files; err is the first file the
// model server takes not, which the entry leaves out with a note.
func userEntry(m schema.Message, media []string) (entry, error) {
	content := m.Content
	var files []entryFile
	var err error
	for _, f := range m.Files {
		ef := entryFile{key: m.Key, file: f}
		switch {
		case takes(media, f.MediaType) && strings.HasPrefix(f.MediaType, "image/"):
			ef.tokens = TokensPerImage
		case takes(media, f.MediaType):
			ef.tokens = EstimateTokens(strings.Repeat(" ", int(f.Size)))
		case f.MediaType == "text/plain":
			ef.asText = true
			ef.tokens = int((f.Size+BytesPerToken-1)/BytesPerToken) + EstimateTokens(textFileHeader(f))
		default:
			if err == nil {
				err = &ModelError{Kind: ErrUnsupportedFile, User: fmt.Sprintf("The model cannot read the file %q (%s).", displayName(f), f.MediaType), Message: fmt.Sprintf(
					"the message has the file %q of type %s, which the model server takes not (BATON_MODEL_MEDIA, --model-media: %s): add the type if the model reads it, or send an image or a text file", displayName(f), f.MediaType, strings.Join(media, ","))}
			}
			content += fmt.Sprintf("\n\n[%s: a %s file the model cannot read, left out]", displayName(f), f.MediaType)
			continue
		}
		files = append(files, ef)
	}
	e := newEntry("user", content, nil, "")
	e.files = files
	for _, f := range files {
		e.tokens += f.tokens
	}
	return e, err
}

func displayName(f schema.File) string {
	if f.Filename != "" {
		return path.Base(f.Filename)
	}
	return f.SHA256[:12]
}

func textFileHeader(f schema.File) string { return "[file " + displayName(f) + "]\n" }

// param is the entry as a request's message; a user message with files
// reads their bytes, once per turn.
func (w *window) param(ctx context.Context, e entry) (openai.ChatCompletionMessageParamUnion, error) {
	if len(e.files) == 0 {
		return e.param(), nil
	}
	var parts []openai.ChatCompletionContentPartUnionParam
	if e.content != "" {
		parts = append(parts, openai.TextContentPart(e.content))
	}
	for _, f := range e.files {
		data, err := w.read(ctx, f)
		if err != nil {
			return openai.ChatCompletionMessageParamUnion{}, err
		}
		switch {
		case f.asText:
			parts = append(parts, openai.TextContentPart(textFileHeader(f.file)+string(data)))
		case strings.HasPrefix(f.file.MediaType, "image/"):
			parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: dataURL(f.file.MediaType, data)}))
		default:
			parts = append(parts, openai.FileContentPart(openai.ChatCompletionContentPartFileFileParam{
				Filename: openai.String(displayName(f.file)), FileData: openai.String(dataURL(f.file.MediaType, data))}))
		}
	}
	return openai.UserMessage(parts), nil
}

func (w *window) read(ctx context.Context, f entryFile) ([]byte, error) {
	if b, ok := w.bytes[f.file.SHA256]; ok {
		return b, nil
	}
	if w.open == nil {
		return nil, fmt.Errorf("the turn has files and no way to read them (consumer.Turn.OpenFile)")
	}
	sf, err := w.open(ctx, f.key, f.file.SHA256)
	if err != nil {
		return nil, fmt.Errorf("read the file %s of a message: %w", f.file.SHA256, err)
	}
	if w.bytes == nil {
		w.bytes = map[string][]byte{}
	}
	w.bytes[f.file.SHA256] = sf.Data
	return sf.Data, nil
}

func dataURL(mediaType string, data []byte) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(data)
}

// fileLink is a file of a message as an external agent gets it: a link
// it fetches without a token (consumer.Turn.FileLink), or none when the
// worker has no FilesURL.
type fileLink struct {
	file schema.File
	url  string
}

// fileLinksOf signs the links to the files of the turn's conversation as
// an external agent is given it, by message key.
func fileLinksOf(ctx context.Context, t *consumer.Turn) (map[string][]fileLink, error) {
	var out map[string][]fileLink
	for _, ms := range [][]schema.Message{t.History, t.Messages} {
		for _, m := range ms {
			for _, f := range m.Files {
				l := fileLink{file: f}
				if t.FileLink != nil {
					u, err := t.FileLink(ctx, m.Key, f)
					if err != nil {
						return nil, fmt.Errorf("agent: sign a link to a file: %w", err)
					}
					l.url = u
				}
				if out == nil {
					out = map[string][]fileLink{}
				}
				out[m.Key] = append(out[m.Key], l)
			}
		}
	}
	return out, nil
}

// leftOutNote is what an agent reads of a file it got no link to.
func leftOutNote(f schema.File) string {
	return fmt.Sprintf("[%s: a %s file, left out: the worker has no --files-url to link it]", displayName(f), f.MediaType)
}

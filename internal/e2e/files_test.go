package e2e_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// redSquare is a PNG of 16×16 red pixels.
func redSquare(t *testing.T) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 16, 16))
	for x := range 16 {
		for y := range 16 {
			img.Set(x, y, color.RGBA{255, 0, 0, 255})
		}
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return buf.Bytes()
}

// TestBrowserShowsAMessagesImageAndLinksItsOtherFiles: a message sent with
// an image and a text file shows the image, loaded by <img> through its
// signed link (no token), and a link to the text file.
func TestBrowserShowsAMessagesImageAndLinksItsOtherFiles(t *testing.T) {
	p := startPage(t)
	p.newConversation("pictures")
	var cid string
	require.NoError(t, p.db.Pool.QueryRow(t.Context(), `SELECT public_id FROM conversations WHERE title = 'pictures'`).Scan(&cid))
	body, err := json.Marshal(map[string]any{"id": "with-files", "content": "look at this", "files": []map[string]any{
		{"mediaType": "image/png", "filename": "red.png", "url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(redSquare(t))},
		{"mediaType": "text/plain", "filename": "notes.txt", "url": "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte("a red square\n"))},
	}})
	require.NoError(t, err)
	req, err := http.NewRequest("POST", "http://"+p.addr+"/v1/conversations/"+cid+"/messages", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)

	p.waitJS("the image, loaded", `[...document.querySelectorAll('.msg[data-role=user] a.attachment img')].some(i => i.complete && i.naturalWidth === 16)`, 20*time.Second)
	p.waitJS("the link to the text file", `[...document.querySelectorAll('.msg[data-role=user] a.attachment')].some(a => a.textContent === "notes.txt (text/plain)" && a.href.includes("/v1/files/"))`, 5*time.Second)
	p.screenshot("attachments")
}

// filesResult is what read.mjs prints for the files scenarios.
type filesResult struct {
	Sent   []string `json:"sent"`
	First  string   `json:"first"`
	Second string   `json:"second"`
	Files  []struct {
		Message     string `json:"message"`
		MediaType   string `json:"mediaType"`
		Filename    string `json:"filename"`
		Status      int    `json:"status"`
		ContentType string `json:"contentType"`
		NoSniff     string `json:"nosniff"`
		Same        bool   `json:"same"`
	} `json:"files"`
}

// TestUseChatSendsAnImageTheModelSeesAndTheHistoryLinksIt: the AI SDK's
// Chat (useChat's core) of ai 6 and ai 7 sends an image with
// sendMessage({files}); the built-in model loop sends it to the model
// server as an image_url part (the fake model answers with its size);
// the next message, whose request carries the whole history again (data
// URL and all) or, with the guide's prepareSendMessagesRequest, only
// itself, is answered without storing the image twice; the chat's
// history gives the image as a file part whose link loads the same
// bytes without a token, with its media type and nosniff.
func TestUseChatSendsAnImageTheModelSeesAndTheHistoryLinksIt(t *testing.T) {
	t.Parallel()
	s := startSDKStack(t)
	img := redSquare(t)
	for _, version := range []string{"v6", "v7"} {
		for _, scenario := range []string{"files", "files-last"} {
			chat := scenario + "-" + version
			var res filesResult
			s.run(t, &res, version, scenario, chat, "what is this?", "data:image/png;base64,"+base64.StdEncoding.EncodeToString(img))
			require.Equal(t, []string{"file", "text"}, res.Sent, "%s %s: the Chat's message has the file part", version, scenario)
			require.Equal(t, fmt.Sprintf("I see an image of %d bytes.", len(img)), res.First, "%s %s: the model got the image", version, scenario)
			require.Equal(t, "echo: and once more", res.Second, "%s %s", version, scenario)
			require.Len(t, res.Files, 1, "%s %s: one file in the history", version, scenario)
			f := res.Files[0]
			require.Equal(t, "image/png", f.MediaType)
			require.Equal(t, "red square.png", f.Filename)
			require.Equal(t, http.StatusOK, f.Status, "%s %s: the link loads without a token", version, scenario)
			require.Equal(t, "image/png", f.ContentType)
			require.Equal(t, "nosniff", f.NoSniff)
			require.True(t, f.Same, "%s %s: the link serves the bytes sent", version, scenario)
		}
	}
	var files, refs int
	require.NoError(t, s.db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM files WHERE owner_id = $1), (SELECT count(*) FROM message_files WHERE owner_id = $1)`, s.user).Scan(&files, &refs))
	require.Equal(t, 1, files, "the same image, sent four times, is stored once")
	require.Equal(t, 4, refs, "one reference for each message that sent it; none for the follow-ups")
}

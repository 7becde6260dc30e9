package agenttest_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestSteadyStreamsOneNumberedWordPerChunkAndCountsThem: the slow model
// sends "w1 ", "w2 ", ... one chunk at a time, and a test can wait until
// it got as far as it needs.
func TestSteadyStreamsOneNumberedWordPerChunkAndCountsThem(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewServer(t, agenttest.Steady(5, 20*time.Millisecond))
	res, err := http.Post(srv.BaseURL()+"/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer res.Body.Close()
	srv.WaitChunks(t, 2, 10*time.Second)
	var got []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &chunk))
		if c := chunk.Choices[0].Delta.Content; c != "" {
			got = append(got, c)
		}
	}
	require.Equal(t, []string{"w1 ", "w2 ", "w3 ", "w4 ", "w5"}, got)
	require.EqualValues(t, 5, srv.Chunks())
}

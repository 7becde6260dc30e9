package consumer

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// noTools fails every tool call: the echo agent without directives never
// makes one.
type noTools struct{}

func (noTools) Call(context.Context, ToolCall) (string, error) {
	return "", errors.New("no tool may run")
}

func TestEchoObeysDirectivesOnlyWhenTheyAreEnabled(t *testing.T) {
	t.Parallel()
	turn := Turn{Messages: []schema.Message{{Content: "/sleep 1000h\n/fail\n/tool notify hello\nplain"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply, err := Echo{}.Run(ctx, turn, noTools{})
	require.NoError(t, err, "without directives nothing sleeps, fails or calls a tool")
	require.Equal(t, "echo: /sleep 1000h\n/fail\n/tool notify hello\nplain", reply.Content)

	_, err = Echo{Directives: true}.Run(ctx, Turn{Messages: []schema.Message{{Content: "/fail"}}}, noTools{})
	require.ErrorIs(t, err, ErrEchoFail, "with directives, /fail fails")
}

// TestADeployedDefaultWorkerEchoesDirectivesAsText runs `baton worker` as
// it is deployed, without --echo-directives: a user who sends /sleep 1000h
// gets it echoed at once instead of holding a turn for 1000 hours.
func TestADeployedDefaultWorkerEchoesDirectivesAsText(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	b := setup(t)
	b.Conversation("c")
	cmd := exec.Command(bin, "worker",
		"--database-url", b.DB.URL,
		"--nats-url", b.NATS.URL,
		"--stream", b.Stream.Name,
		"--subject-prefix", b.Stream.SubjectPrefix,
		"--partitions", strconv.Itoa(b.Stream.Partitions),
		"--debounce", "0",
		"--log-format", "json")
	logPath := filepath.Join(t.TempDir(), "worker.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close()
	cmd.Stderr = logFile
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	b.Send("c", "m1", "/sleep 1000h")
	b.Eventually(60*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND content = 'echo: /sleep 1000h'`) == 1
	}, "the worker echoes /sleep 1000h as text (its log: %s)", logPath)
	b.Send("c", "m2", "/tool notify hello\n/fail")
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND content = E'echo: /tool notify hello\n/fail'`) == 1
	}, "the worker echoes /tool and /fail as text")
	require.Zero(t, b.Count(`SELECT count(*) FROM operations`), "no tool ran")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`), "no turn failed")
}

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// statusReport is the part of `baton status --json` the run checks.
type statusReport struct {
	Database struct {
		Server   string `json:"server"`
		Timeline int64  `json:"timeline"`
		Standbys []struct {
			Name      string `json:"name"`
			State     string `json:"state"`
			SyncState string `json:"sync_state"`
		} `json:"standbys"`
	} `json:"database"`
	Slot struct {
		Name   string `json:"name"`
		Exists bool   `json:"exists"`
		Active bool   `json:"active"`
	} `json:"slot"`
	Attention []string `json:"attention"`
}

// checkStatus runs `baton status` on the run's multi-host URL, as an
// operator would after the run, until it reads the current primary, finds
// the relay's slot read there and the standby synchronous, and needs no
// attention, or within passes. It returns what the last report said and,
// on a failure, why.
func (s *system) checkStatus(ctx context.Context, within time.Duration) (said, problem string) {
	deadline := time.Now().Add(within)
	for {
		said, problem = s.statusOnce(ctx)
		if problem == "" || time.Now().After(deadline) || ctx.Err() != nil {
			return said, problem
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (s *system) statusOnce(ctx context.Context) (said, problem string) {
	args := append([]string{"status", "--json", "--database-url", s.dbURL, "--nats-url", s.natsURL}, s.streamFlags()...)
	var stdout, stderr bytes.Buffer
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, s.cfg.Binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return "", "baton status: " + err.Error()
	}
	var rep statusReport
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		return "", fmt.Sprintf("baton status exited %d without a report: %s", code, firstLine(strings.TrimSpace(stderr.String())))
	}
	server := fmt.Sprintf("127.0.0.1:%d", s.pg.Port())
	slot := "slot not read"
	if rep.Slot.Active {
		slot = "slot " + rep.Slot.Name + " read by a relay"
	}
	standby := "no standby"
	for _, sb := range rep.Database.Standbys {
		if sb.Name == s.standbyName {
			standby = fmt.Sprintf("standby %s %s %s", sb.Name, sb.State, sb.SyncState)
		}
	}
	said = fmt.Sprintf("exit %d, server %s (%s), timeline %d, %s, %s, %d attention items",
		code, rep.Database.Server, s.pgName, rep.Database.Timeline, slot, standby, len(rep.Attention))
	switch {
	case rep.Database.Server != server:
		problem = fmt.Sprintf("read server %s, but the primary is %s at %s", rep.Database.Server, s.pgName, server)
	case !rep.Slot.Exists || !rep.Slot.Active:
		problem = fmt.Sprintf("slot %s exists=%v active=%v on the primary", rep.Slot.Name, rep.Slot.Exists, rep.Slot.Active)
	case s.standby != nil && standby != fmt.Sprintf("standby %s streaming sync", s.standbyName):
		problem = fmt.Sprintf("the primary's standby %s is not a streaming synchronous standby: %s", s.standbyName, standby)
	case len(rep.Attention) > 0 || code != 0:
		problem = fmt.Sprintf("exit %d, attention: %s", code, strings.Join(rep.Attention, "; "))
	}
	return said, problem
}

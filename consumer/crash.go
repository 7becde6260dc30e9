package consumer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Crash points, where BATON_CRASH_AT makes a worker process die at once,
// like SIGKILL: no deferred function, no rollback, no ack. Fault tests kill
// real processes at each of them and check that a fresh worker finishes the
// turn once, or fails it visibly.
const (
	CrashBeforeClaim            = "before_claim"
	CrashAfterClaim             = "after_claim"
	CrashDuringModel            = "during_model"
	CrashAfterTool              = "after_tool"
	CrashBeforeFinalize         = "before_finalize"
	CrashAfterFinalizeBeforeAck = "after_finalize_before_ack"
)

// CrashEnv is the variable that arms a crash point:
// BATON_CRASH_AT=<point>[:<probability>], for example during_model:0.5.
const CrashEnv = "BATON_CRASH_AT"

var crashPoints = []string{CrashBeforeClaim, CrashAfterClaim, CrashDuringModel, CrashAfterTool, CrashBeforeFinalize, CrashAfterFinalizeBeforeAck}

// crasher is an armed crash point. A nil *crasher costs one comparison.
type crasher struct {
	point       string
	probability float64
}

// parseCrash reads BATON_CRASH_AT's value; empty disarms.
func parseCrash(v string) (*crasher, error) {
	if v == "" {
		return nil, nil
	}
	point, p, hasP := strings.Cut(v, ":")
	c := &crasher{point: point, probability: 1}
	known := false
	for _, k := range crashPoints {
		known = known || k == point
	}
	if !known {
		return nil, fmt.Errorf("%s=%q: unknown crash point; use one of %s, optionally with :<probability>", CrashEnv, v, strings.Join(crashPoints, ", "))
	}
	if hasP {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, fmt.Errorf("%s=%q: probability must be a number from 0 to 1", CrashEnv, v)
		}
		c.probability = f
	}
	return c, nil
}

// at kills the process when point is the armed one, with the armed
// probability.
func (c *crasher) at(point string) {
	if c == nil || c.point != point {
		return
	}
	if c.probability < 1 && rand.Float64() >= c.probability {
		return
	}
	c.kill(point)
}

// always kills the process when point is the armed one, whatever the
// probability.
func (c *crasher) always(point string) {
	if c == nil || c.point != point {
		return
	}
	c.kill(point)
}

func (c *crasher) kill(point string) {
	fmt.Fprintf(os.Stderr, "baton: crash point %s reached, killing the process\n", point)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	os.Exit(137)
}

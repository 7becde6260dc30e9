package consumer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
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
// It is for fault tests only, which run real worker processes with it set:
// New reads it when it creates a worker, and no Config field or flag sets
// it.
const CrashEnv = "BATON_CRASH_AT"

// PauseEnv is the variable that arms a pause point, in CrashEnv's format:
// the turn that reaches it waits there until the process is sent SIGCONT,
// while the rest of the process runs on (its session, its other turns,
// its fetches). Fault tests use it to hold a worker at a moment of their
// choosing, such as its finalize, while they cut its link, let another
// worker take its turn over and heal the link. Like CrashEnv it is for
// fault tests only, read by New, and it cannot be set with CrashEnv.
const PauseEnv = "BATON_PAUSE_AT"

var crashPoints = []string{CrashBeforeClaim, CrashAfterClaim, CrashDuringModel, CrashAfterTool, CrashBeforeFinalize, CrashAfterFinalizeBeforeAck}

// crasher is an armed crash point, or pause point. A nil *crasher costs
// one comparison.
type crasher struct {
	point       string
	probability float64
	// pause holds the turn at the point instead of killing the process.
	pause bool
	// cont receives SIGCONT, once a pause point is armed.
	cont chan os.Signal
}

// armFromEnv reads CrashEnv and PauseEnv through getenv (os.Getenv, or a
// test's own) and returns the point they arm, nil when neither is set.
func armFromEnv(getenv func(string) string) (*crasher, error) {
	crashAt, pauseAt := getenv(CrashEnv), getenv(PauseEnv)
	switch {
	case crashAt != "" && pauseAt != "":
		return nil, fmt.Errorf("%s and %s are both set: arm a crash point or a pause point, not both; unset one", CrashEnv, PauseEnv)
	case pauseAt != "":
		return parsePause(pauseAt)
	}
	return parseCrash(crashAt)
}

// parseCrash reads BATON_CRASH_AT's value; empty disarms.
func parseCrash(v string) (*crasher, error) {
	return parsePoint(CrashEnv, v)
}

// parsePause reads BATON_PAUSE_AT's value; empty disarms.
func parsePause(v string) (*crasher, error) {
	c, err := parsePoint(PauseEnv, v)
	if c != nil {
		c.pause = true
	}
	return c, err
}

// listen starts receiving SIGCONT for an armed pause point.
func (c *crasher) listen() {
	if c != nil && c.pause && c.cont == nil {
		c.cont = make(chan os.Signal, 1)
		signal.Notify(c.cont, syscall.SIGCONT)
	}
}

func parsePoint(env, v string) (*crasher, error) {
	kind := "crash"
	if env == PauseEnv {
		kind = "pause"
	}
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
		return nil, fmt.Errorf("%s=%q: unknown %s point; use one of %s, optionally with :<probability>", env, v, kind, strings.Join(crashPoints, ", "))
	}
	if hasP {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, fmt.Errorf("%s=%q: probability must be a number from 0 to 1", env, v)
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
// probability. Only the chaosbroken build's split finalize calls it.
func (c *crasher) always(point string) {
	if c == nil || c.point != point {
		return
	}
	c.kill(point)
}

func (c *crasher) kill(point string) {
	if c.pause {
		// Held here until SIGCONT; then the turn goes on as if nothing
		// happened, as one whose thread was not scheduled would.
		fmt.Fprintf(os.Stderr, "baton: pause point %s reached, holding the turn until SIGCONT\n", point)
		<-c.cont
		fmt.Fprintf(os.Stderr, "baton: pause point %s: SIGCONT received, the turn goes on\n", point)
		return
	}
	fmt.Fprintf(os.Stderr, "baton: crash point %s reached, killing the process\n", point)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	os.Exit(137)
}

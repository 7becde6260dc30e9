package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// BatonBinary builds cmd/baton once per test package (with -race when the
// tests run with it) and returns its path, for tests that run Baton as real
// processes and kill them. BATON_TEST_BINARY names a prebuilt binary
// instead.
func BatonBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		return p
	}
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-bin-")
		if err != nil {
			binaryErr = err
			return
		}
		binaryPath = filepath.Join(dir, "baton")
		_, file, _, _ := runtime.Caller(0)
		repo := filepath.Join(filepath.Dir(file), "..", "..")
		args := []string{"build", "-o", binaryPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "./cmd/baton")
		cmd := exec.Command("go", args...)
		cmd.Dir = repo
		out, err := cmd.CombinedOutput()
		if err != nil {
			binaryErr = &buildError{out: string(out), err: err}
		}
	})
	if binaryErr != nil {
		t.Fatalf("testenv: build baton: %v", binaryErr)
	}
	return binaryPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

var (
	plainOnce sync.Once
	plainDir  string
	plainPath string
	plainErr  error
)

// StartPlainBatonBuild starts building the binary PlainBatonBinary
// returns in the background, so that a test's other setup (a NATS
// cluster, PostgreSQL) overlaps with the build.
func StartPlainBatonBuild() { go buildPlain() }

// PlainBatonBinary builds cmd/baton once per test package without the
// race detector, whatever the tests run with, and returns its path. It is
// for tests that run dozens of Baton's processes on a machine other tests
// share and judge them by what they do and print, not by races inside one
// of them (the packages' own tests run with -race); the chaos harness
// makes the same build, so one of them finds it in the build cache. The
// binary's folder is open to every user, for processes that run as an
// unprivileged one. BATON_TEST_BINARY names a prebuilt binary instead.
// Main removes the binary.
func PlainBatonBinary(t testing.TB) string {
	t.Helper()
	buildPlain()
	if plainErr != nil {
		t.Fatalf("testenv: build baton: %v", plainErr)
	}
	return plainPath
}

func buildPlain() {
	plainOnce.Do(func() {
		if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
			plainPath = p
			return
		}
		plainDir, plainErr = os.MkdirTemp("", "baton-plain-bin-")
		if plainErr != nil {
			return
		}
		if plainErr = os.Chmod(plainDir, 0o755); plainErr != nil {
			return
		}
		plainPath = filepath.Join(plainDir, "baton")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", plainPath, "./cmd/baton")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			plainErr = &buildError{out: string(out), err: err}
		}
	})
}

// removePlainBinary removes the binary of PlainBatonBinary once no build
// runs any more.
func removePlainBinary() {
	plainOnce.Do(func() {})
	if plainDir != "" {
		_ = os.RemoveAll(plainDir)
	}
}

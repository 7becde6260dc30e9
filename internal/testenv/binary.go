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

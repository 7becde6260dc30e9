package testenv

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// A build is one way of building cmd/baton for tests that run it as real
// processes. Each is made at most once per test package, and once per
// `make test`: the Makefile builds every one before the tests and names
// it in the build's variable. Without the variable (go test run by hand)
// the first package that needs a build makes it in bin/test, under a
// lock, and the others find it there: go build relinks only when a
// source changed, so the binary is always the sources'. Each package
// copies the binary into a folder of its own, so that a build made while
// it runs (a source edited meanwhile) does not change the binary under
// it.
type build struct {
	// env names a prebuilt binary of this build (the Makefile sets it).
	env string
	// file is the binary's name in bin/test.
	file string
	// flags are go build's, besides -o.
	flags []string
	// open says the binary's folder is open to every user, for processes
	// that run as an unprivileged one.
	open bool

	once sync.Once
	dir  string // the package's own folder, removed by Main
	path string
	err  error
}

var (
	raceBuild = &build{env: "BATON_TEST_RACE_BINARY", file: "baton-race", flags: []string{"-race"}}
	// plainBuild is without the race detector, whatever the tests run
	// with.
	plainBuild       = &build{env: "BATON_TEST_PLAIN_BINARY", file: "baton", open: true}
	chaosBrokenBuild = &build{env: "BATON_TEST_CHAOSBROKEN_BINARY", file: "baton-chaosbroken", flags: []string{"-tags", "chaosbroken"}}

	builds = []*build{raceBuild, plainBuild, chaosBrokenBuild}
)

// BatonBinary returns the path of cmd/baton built with -race when the
// tests run with it, for tests that run Baton as real processes and kill
// them. BATON_TEST_BINARY names a prebuilt binary instead (`make bench`).
func BatonBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		return p
	}
	if raceEnabled {
		return raceBuild.binary(t)
	}
	return plainBuild.binary(t)
}

// StartPlainBatonBuild starts making the binary PlainBatonBinary returns
// in the background, so that a test's other setup (a NATS cluster,
// PostgreSQL) overlaps with the build.
func StartPlainBatonBuild() {
	if os.Getenv("BATON_TEST_BINARY") == "" {
		go plainBuild.make()
	}
}

// PlainBatonBinary returns the path of cmd/baton built without the race
// detector, whatever the tests run with. It is for tests that run dozens
// of Baton's processes on a machine other tests share and judge them by
// what they do and print, not by races inside one of them (the packages'
// own tests run with -race). The binary's folder is open to every user,
// for processes that run as an unprivileged one. BATON_TEST_BINARY names
// a prebuilt binary instead.
func PlainBatonBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		return p
	}
	return plainBuild.binary(t)
}

// ChaosBrokenBatonBinary returns the path of cmd/baton built with the
// chaosbroken tag, without the race detector: the worker that breaks the
// rules the kill test checks, for the test that proves the kill test
// fails it.
func ChaosBrokenBatonBinary(t testing.TB) string {
	t.Helper()
	return chaosBrokenBuild.binary(t)
}

func (b *build) binary(t testing.TB) string {
	t.Helper()
	b.make()
	if b.err != nil {
		t.Fatalf("testenv: build baton (%s): %v", b.file, b.err)
	}
	return b.path
}

func (b *build) make() {
	b.once.Do(func() { b.path, b.err = b.get() })
}

func (b *build) get() (string, error) {
	prebuilt := os.Getenv(b.env)
	if prebuilt != "" && !b.open {
		return prebuilt, nil
	}
	dir, err := os.MkdirTemp("", "baton-bin-")
	if err != nil {
		return "", err
	}
	b.dir = dir
	if b.open {
		if err := os.Chmod(dir, 0o755); err != nil {
			return "", err
		}
	}
	path := filepath.Join(dir, "baton")
	if prebuilt != "" {
		return path, copyBinary(prebuilt, path)
	}
	return path, b.buildShared(path)
}

// buildShared brings bin/test's binary of b up to date, under a lock that
// other test packages take too, and copies it to out.
func (b *build) buildShared(out string) error {
	repo := repoRoot()
	dir := filepath.Join(repo, "bin", "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	bin := filepath.Join(dir, b.file)
	args := append(append([]string{"build", "-o", bin}, b.flags...), "./cmd/baton")
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return copyBinary(bin, out)
}

func copyBinary(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// removeBinaries removes the package's copies of the binaries, once no
// build runs any more.
func removeBinaries() {
	for _, b := range builds {
		b.once.Do(func() {})
		if b.dir != "" {
			_ = os.RemoveAll(b.dir)
		}
	}
}

// repoRoot is the root of this repository.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

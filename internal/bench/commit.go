package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Binary is the baton binary of this tree: BATON_TEST_BINARY when set
// (`make bench` builds bin/baton first), else one built for the run.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			tb.Fatal(err)
		}
		return abs
	}
	dir := tb.TempDir()
	bin := filepath.Join(dir, "baton")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/baton")
	build.Dir = repoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("bench: build baton: %v\n%s", err, out)
	}
	return bin
}

// BinaryAt builds cmd/baton as it was at commit, from a git worktree of
// this repository in a temporary folder, and returns its path. A binary
// built before for the same commit and Go version is reused from the user
// cache folder: a commit's source does not change. It skips tb, saying
// why, when the repository's history is not at hand (a source archive, a
// shallow clone without the commit).
func BinaryAt(tb testing.TB, commit string) string {
	tb.Helper()
	root := repoRoot()
	full, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
	if err != nil {
		tb.Skipf("bench: the reference is the binary of commit %s, and this checkout's git history does not have it "+
			"(a source archive or a shallow clone): run `make bench` in a full clone", commit)
	}
	hash := strings.TrimSpace(string(full))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "baton-bench", hash+"-"+runtime.Version(), "baton")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	tmp, err := os.MkdirTemp("", "baton-bench-src-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", src, hash).CombinedOutput(); err != nil {
		tb.Fatalf("bench: git worktree add %s: %v\n%s", commit, err, out)
	}
	defer func() {
		_ = exec.Command("git", "-C", root, "worktree", "remove", "--force", src).Run()
		_ = exec.Command("git", "-C", root, "worktree", "prune").Run()
	}()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		tb.Fatal(err)
	}
	part := bin + ".part"
	build := exec.Command("go", "build", "-trimpath", "-o", part, "./cmd/baton")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
	tb.Logf("building the reference binary of commit %s (once; kept in %s)", hash[:12], filepath.Dir(bin))
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("bench: build baton at %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(part, bin); err != nil {
		tb.Fatal(err)
	}
	return bin
}

// repoRoot is the root of this repository.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

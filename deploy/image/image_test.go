package image_test

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"

	v1tarball "github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/batonhq/baton/deploy/image"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const (
	version = "v9.9.9-test"
	root    = "../.."
)

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// standInImage builds, once for the package's tests, the image of a small
// static program that stands in for cmd/baton (testdata/standin): the
// image's layout, user and entrypoint are Build's, whatever the binary,
// and a static build of all of Baton takes minutes on a cold build cache,
// which only a release needs. `make image-check` checks the image of the
// real binary (TestTheReleaseImage...).
func standInImage(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-image-test-")
		if err != nil {
			buildErr = err
			return
		}
		testenv.AfterAll(func() { _ = os.RemoveAll(dir) })
		bin := filepath.Join(dir, "baton")
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+version, "-o", bin, "./deploy/image/testdata/standin")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build the stand-in: %w\n%s", err, out)
			return
		}
		built = filepath.Join(dir, "baton-image.tar")
		buildErr = image.Build(image.Options{Binary: bin, Version: version}, built)
	})
	require.NoError(t, buildErr, "build the image")
	return built
}

// layerFiles reads the image's one layer: each file's header and content.
func layerFiles(t *testing.T, path string) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	img, err := v1tarball.ImageFromPath(path, nil)
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1, "the image is one layer on an empty base")
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	headers, contents := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		headers[h.Name] = h
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		contents[h.Name] = b
	}
	return headers, contents
}

func TestTheImageRunsTheStaticBinaryAsAnUnprivilegedUserWithoutAShell(t *testing.T) {
	t.Parallel()
	checkImage(t, standInImage(t), version)
}

// TestTheReleaseImageRunsBatonStaticAsAnUnprivilegedUserWithoutAShell
// checks the image `make image` wrote, of the static cmd/baton: `make
// image-check` runs it, naming the tarball and its version.
func TestTheReleaseImageRunsBatonStaticAsAnUnprivilegedUserWithoutAShell(t *testing.T) {
	path := os.Getenv("BATON_IMAGE_TARBALL")
	if path == "" {
		t.Skip("make image-check builds the release image and checks it here (BATON_IMAGE_TARBALL, BATON_IMAGE_VERSION)")
	}
	v := os.Getenv("BATON_IMAGE_VERSION")
	require.NotEmpty(t, v, "BATON_IMAGE_VERSION: the version the image was built with")
	checkImage(t, path, v)
}

// checkImage checks the image tarball at path, whose binary was built
// with version: what it holds, as which user it runs, and that its binary
// runs there.
func checkImage(t *testing.T, path, version string) {
	t.Helper()
	// The tarball names the image as the manifests do.
	tag := image.Name + ":" + version
	img, err := v1tarball.ImageFromPath(path, nil)
	require.NoError(t, err)
	manifest, err := v1tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	require.NoError(t, err)
	require.Len(t, manifest, 1)
	require.Equal(t, []string{tag}, manifest[0].RepoTags, "the tarball's image is named %s", tag)

	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "linux", cf.OS)
	require.Equal(t, []string{image.Binary}, cf.Config.Entrypoint, "the entrypoint is the binary: the manifests give only its subcommand")
	require.Empty(t, cf.Config.Cmd, "no default command: a container says which component it runs")
	require.Equal(t, strconv.Itoa(image.UID)+":"+strconv.Itoa(image.GID), cf.Config.User, "the image runs as an unprivileged user, by number, so that runAsNonRoot can check it")
	require.NotEqual(t, 0, image.UID)
	require.Equal(t, version, cf.Config.Labels["org.opencontainers.image.version"], "the version is in the labels")

	headers, contents := layerFiles(t, path)
	var files []string
	for name, h := range headers {
		if h.Typeflag == tar.TypeReg {
			files = append(files, name)
		}
		require.NotEqual(t, byte(tar.TypeSymlink), h.Typeflag, "%s: no links in the image", name)
		require.Zero(t, h.Uid, "%s belongs to root: the user cannot change it", name)
	}
	slices.Sort(files)
	require.Equal(t, []string{"etc/group", "etc/passwd", "etc/ssl/certs/ca-certificates.crt", "usr/local/bin/baton"}, files,
		"the image holds the binary, its CA certificates and its user, and nothing else: no shell")
	require.Equal(t, int64(0o755), headers["usr/local/bin/baton"].Mode)
	require.Contains(t, string(contents["etc/passwd"]), image.User+":x:"+strconv.Itoa(image.UID)+":"+strconv.Itoa(image.GID)+":")

	// The binary is static: an empty base has no C library or loader.
	// In a folder the image's user can reach.
	binDir, err := os.MkdirTemp("", "baton-image-bin-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(binDir) })
	require.NoError(t, os.Chmod(binDir, 0o755))
	bin := filepath.Join(binDir, "baton")
	require.NoError(t, os.WriteFile(bin, contents["usr/local/bin/baton"], 0o755))
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary asks for a dynamic loader, which the image does not have: build it with CGO_ENABLED=0")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "the binary needs shared libraries the image does not have")

	// It runs, as the image's user, and says its version.
	cmd := exec.Command(bin, "version")
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: image.UID, Gid: image.GID}}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "baton "+version+"\n", string(out))
}

// container is one container of a manifest, with its pod's security
// context.
type container struct {
	where string
	c     corev1.Container
	pod   *corev1.PodSecurityContext
}

func containers(t *testing.T) []container {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "deploy", "kubernetes", "*.yaml"))
	require.NoError(t, err)
	var out []container
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			var meta struct{ Kind string }
			require.NoError(t, yaml.Unmarshal([]byte(doc), &meta))
			var spec *corev1.PodSpec
			switch meta.Kind {
			case "Deployment":
				var d appsv1.Deployment
				require.NoError(t, yaml.Unmarshal([]byte(doc), &d))
				spec = &d.Spec.Template.Spec
			case "Job":
				var j batchv1.Job
				require.NoError(t, yaml.Unmarshal([]byte(doc), &j))
				spec = &j.Spec.Template.Spec
			default:
				continue
			}
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				out = append(out, container{where: filepath.Base(f) + ": " + c.Name, c: c, pod: spec.SecurityContext})
			}
		}
	}
	require.NotEmpty(t, out, "no container found in deploy/kubernetes")
	return out
}

func TestTheManifestsAndTheDocsNameTheImageAndItsEntrypoint(t *testing.T) {
	t.Parallel()
	for _, c := range containers(t) {
		require.Equal(t, image.Name, c.c.Image, "%s: the manifests name the image `make image` builds (kustomize sets its registry and tag)", c.where)
		require.Empty(t, c.c.Command, "%s: the image's entrypoint is the binary; a container gives only its subcommand in args", c.where)
		require.NotEmpty(t, c.c.Args, "%s: a container says which component it runs", c.where)
		require.NotNil(t, c.pod, "%s: no pod security context", c.where)
		require.NotNil(t, c.pod.RunAsUser, "%s: runAsUser", c.where)
		require.Equal(t, int64(image.UID), *c.pod.RunAsUser, "%s: the pod runs as the image's user", c.where)
		require.Equal(t, int64(image.GID), *c.pod.RunAsGroup, "%s: the pod runs as the image's group", c.where)
	}

	var kustomization struct {
		Images []struct{ Name string } `json:"images"`
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "kustomization.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &kustomization))
	require.Len(t, kustomization.Images, 1)
	require.Equal(t, image.Name, kustomization.Images[0].Name, "kustomization.yaml sets the image the manifests name")

	guide, err := os.ReadFile(filepath.Join(root, "docs", "guides", "deploying.md"))
	require.NoError(t, err)
	for _, want := range []string{"make image", "bin/baton-image.tar", image.Binary, "kustomize edit set image " + image.Name + "=", strconv.Itoa(image.UID)} {
		require.Contains(t, string(guide), want, "docs/guides/deploying.md tells how to build and name the image")
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^image:`, string(makefile), "the Makefile has an image target")
	require.Contains(t, string(makefile), "bin/baton-image.tar", "make image writes the tarball the guide names")
	require.Regexp(t, `(?m)^image-check:`, string(makefile), "the Makefile has the target that checks the release image")
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^make image-check$`, string(ci), "CI checks the release image, which make test leaves out")
}

// Package image builds Baton's OCI image with Go alone, no container
// engine: one layer on an empty base holding the static binary, the CA
// certificates it needs to reach TLS servers, and the passwd and group
// entries of the user it runs as (not root), so that the image has no
// shell and nothing else to run. The result is an image tarball in the
// format `docker save` writes, which `docker load`, `podman load` and
// `crane push` read.
package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const (
	// Name is the image's repository name, the one the Kubernetes
	// manifests (deploy/kubernetes) name.
	Name = "baton"
	// Binary is where the binary lies in the image, and the entrypoint:
	// the manifests give only the subcommand (args: ["worker"]).
	Binary = "/usr/local/bin/baton"
	// UID and GID are the user the image runs as, the one the manifests'
	// securityContext names.
	UID = 65532
	GID = 65532
	// User is the user's name in the image's /etc/passwd.
	User = "baton"
	// DefaultCACertificates is where Debian keeps the CA bundle the image
	// carries, and where Go looks for it on Linux.
	DefaultCACertificates = "/etc/ssl/certs/ca-certificates.crt"
)

// Options say what goes into the image.
type Options struct {
	// Binary is the path of a static baton binary (CGO_ENABLED=0).
	// Required.
	Binary string
	// Version is the binary's version, shown in the image's labels.
	// Required.
	Version string
	// Tag names the image in the tarball. Defaults to baton:<Version>.
	Tag string
	// CACertificates is the CA bundle copied into the image. Defaults to
	// DefaultCACertificates.
	CACertificates string
	// Created is the image's and its files' time: a fixed time keeps
	// builds of the same binary identical. Defaults to the Unix epoch.
	Created time.Time
}

// Build writes the image tarball to out.
func Build(opts Options, out string) error {
	if opts.Binary == "" || opts.Version == "" {
		return errors.New("image: a binary and its version are required")
	}
	if opts.Tag == "" {
		opts.Tag = Name + ":" + opts.Version
	}
	if opts.CACertificates == "" {
		opts.CACertificates = DefaultCACertificates
	}
	if opts.Created.IsZero() {
		opts.Created = time.Unix(0, 0).UTC()
	}
	ref, err := name.NewTag(opts.Tag)
	if err != nil {
		return fmt.Errorf("image: tag %q: %w", opts.Tag, err)
	}
	bin, err := os.ReadFile(opts.Binary)
	if err != nil {
		return fmt.Errorf("image: the binary: %w", err)
	}
	certs, err := os.ReadFile(opts.CACertificates)
	if err != nil {
		return fmt.Errorf("image: the CA certificates (install Debian's ca-certificates, or give another bundle): %w", err)
	}
	layerTar, err := rootFS(bin, certs, opts.Created)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: opts.Created}
	cf.Config = v1.Config{
		Entrypoint: []string{Binary},
		User:       fmt.Sprintf("%d:%d", UID, GID),
		WorkingDir: "/",
		Env: []string{
			"PATH=/usr/local/bin",
			"SSL_CERT_FILE=" + DefaultCACertificates,
		},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "baton",
			"org.opencontainers.image.description": "Baton: a durable backend for AI-agent conversations.",
			"org.opencontainers.image.version":     opts.Version,
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// rootFS is the image's one layer, as a tar stream.
func rootFS(bin, certs []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(path string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: path, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
	}
	file := func(path string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/", "usr/", "usr/local/", "usr/local/bin/"} {
		if err := dir(d); err != nil {
			return nil, err
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:/:/sbin/nologin\n", User, UID, GID, User)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", User, GID)
	for _, f := range []struct {
		path string
		mode int64
		data []byte
	}{
		{"etc/passwd", 0o644, []byte(passwd)},
		{"etc/group", 0o644, []byte(group)},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, certs},
		{Binary[1:], 0o755, bin},
	} {
		if err := file(f.path, f.mode, f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BuildBinary builds cmd/baton of the repository at root as a static
// binary (CGO_ENABLED=0, so the empty base needs no C library) with
// version in it, to out.
func BuildBinary(root, out, version string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/batonhq/baton/internal/cli.Version="+version, "-o", out, "./cmd/baton")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/baton: %w\n%s", err, b)
	}
	return nil
}

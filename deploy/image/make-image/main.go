// Command make-image builds Baton's OCI image tarball with Go alone (`make
// image`): it builds cmd/baton as a static binary with the version in it,
// and writes the image (deploy/image) to --out. Run it from the
// repository's root.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/batonhq/baton/deploy/image"
)

func main() {
	version := flag.String("version", "", "the version, in the binary and the image's labels (required)")
	tag := flag.String("tag", "", "the image's name and tag in the tarball (default baton:<version>)")
	out := flag.String("out", "bin/baton-image.tar", "the image tarball to write")
	certs := flag.String("ca-certificates", image.DefaultCACertificates, "the CA bundle the image carries")
	flag.Parse()
	if err := run(*version, *tag, *out, *certs); err != nil {
		fmt.Fprintln(os.Stderr, "make-image:", err)
		os.Exit(1)
	}
}

func run(version, tag, out, certs string) error {
	if version == "" {
		return fmt.Errorf("--version is required")
	}
	dir, err := os.MkdirTemp("", "baton-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "baton")
	if err := image.BuildBinary(".", bin, version); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := image.Build(image.Options{Binary: bin, Version: version, Tag: tag, CACertificates: certs}, out); err != nil {
		return err
	}
	fmt.Println("wrote", out)
	return nil
}

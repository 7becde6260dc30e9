// Command docgen writes the generated parts of Baton's reference pages
// (the commands and settings, the metrics) from the code, run from the
// repository's root: `make docs`.
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/batonhq/baton/internal/docgen"
)

func main() {
	if err := run("."); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	for _, p := range docgen.Pages {
		text, err := p.Render(root)
		if err != nil {
			return fmt.Errorf("%s: %w", p.Path, err)
		}
		path := filepath.Join(root, p.Path)
		old, _ := os.ReadFile(path)
		if bytes.Equal(old, text) {
			continue
		}
		if err := os.WriteFile(path, text, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", p.Path)
	}
	return nil
}

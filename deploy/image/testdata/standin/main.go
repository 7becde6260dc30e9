// Command standin stands in for cmd/baton in the image that `make test`
// builds: a small static binary that prints its version as `baton
// version` does, so that the image's layout, user and entrypoint are
// checked without building Baton a third way. `make image-check` checks
// the image of the real binary.
package main

import (
	"fmt"
	"os"
)

// version is set at build time, as cmd/baton's is.
var version = "dev"

func main() {
	if len(os.Args) != 2 || os.Args[1] != "version" {
		fmt.Fprintln(os.Stderr, "usage: baton version")
		os.Exit(2)
	}
	fmt.Println("baton", version)
}

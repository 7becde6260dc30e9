// Command make-nkeys makes the nkey users of Baton's NATS cluster: a seed
// file per component and nkeys.env with their public keys for the servers.
//
//	go run ./deploy/nats/make-nkeys /etc/baton/nats
package main

import (
	"fmt"
	"os"
	"path/filepath"

	natsdeploy "github.com/batonhq/baton/deploy/nats"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: make-nkeys FOLDER\n\nWrites FOLDER/<user>.nk (a seed per user, mode 0600) and FOLDER/nkeys.env\n(the public keys, for every NATS server's environment). See deploy/nats/README.md.")
		os.Exit(2)
	}
	dir := os.Args[1]
	if err := natsdeploy.WriteNKeys(dir); err != nil {
		fmt.Fprintln(os.Stderr, "make-nkeys:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s (public keys, for every NATS server) and a seed per user:\n", filepath.Join(dir, natsdeploy.EnvFile))
	for _, u := range natsdeploy.Users {
		if u.InboxPrefix == "" {
			fmt.Printf("  %-14s %-40s (system account, for operators)\n", u.Name, filepath.Join(dir, natsdeploy.SeedFile(u.Name)))
			continue
		}
		fmt.Printf("  %-14s %-40s BATON_NATS_INBOX_PREFIX=%s\n", u.Name, filepath.Join(dir, natsdeploy.SeedFile(u.Name)), u.InboxPrefix)
	}
}

// Package natsdeploy makes the credentials of Baton's NATS cluster
// (deploy/nats): one nkey user per component. Its tests start a three-node
// cluster from the configuration files next to it.
package natsdeploy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// User is one NATS user of accounts.conf.
type User struct {
	// Name of the user, and of its seed file (<Name>.nk).
	Name string
	// Env is the variable through which the servers learn the user's
	// public key (accounts.conf: nkey: $<Env>).
	Env string
	// InboxPrefix is the only inbox the user may subscribe to; the
	// component connects with it (BATON_NATS_INBOX_PREFIX). Empty for the
	// system user, which has no restrictions.
	InboxPrefix string
}

// Users are the users accounts.conf declares, in its order.
var Users = []User{
	{Name: "relay", Env: "BATON_NATS_NKEY_RELAY", InboxPrefix: "_INBOX_relay"},
	{Name: "worker", Env: "BATON_NATS_NKEY_WORKER", InboxPrefix: "_INBOX_worker"},
	{Name: "api", Env: "BATON_NATS_NKEY_API", InboxPrefix: "_INBOX_api"},
	{Name: "group-audit", Env: "BATON_NATS_NKEY_GROUP_AUDIT", InboxPrefix: "_INBOX_audit"},
	{Name: "group-webhook", Env: "BATON_NATS_NKEY_GROUP_WEBHOOK", InboxPrefix: "_INBOX_webhook"},
	{Name: "replay", Env: "BATON_NATS_NKEY_REPLAY", InboxPrefix: "_INBOX_replay"},
	{Name: "status", Env: "BATON_NATS_NKEY_STATUS", InboxPrefix: "_INBOX_status"},
	{Name: "console", Env: "BATON_NATS_NKEY_CONSOLE", InboxPrefix: "_INBOX_console"},
	{Name: "sys", Env: "BATON_NATS_NKEY_SYS"},
}

// EnvFile is the name of the file with the users' public keys that
// WriteNKeys writes beside the seeds, for the servers' environment.
const EnvFile = "nkeys.env"

// SeedFile is the name of a user's seed file.
func SeedFile(user string) string { return user + ".nk" }

// WriteNKeys makes a new nkey for every user: <dir>/<user>.nk holds the
// seed (mode 0600; it goes to the component that connects as the user, and
// nowhere else), and <dir>/nkeys.env the public keys as variables for the
// servers (not secret). It refuses to overwrite a file: replacing a key
// locks the component that holds the old seed out.
func WriteNKeys(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	names := []string{EnvFile}
	for _, u := range Users {
		names = append(names, SeedFile(u.Name))
	}
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(dir, n)); err == nil {
			return fmt.Errorf("%s already exists: new keys would lock out the components that hold the old seeds; move the old files away or choose another folder", filepath.Join(dir, n))
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	var env strings.Builder
	env.WriteString("# Public nkeys of Baton's NATS users, for the environment of every NATS\n")
	env.WriteString("# server (accounts.conf). Not secret; the seeds are the <user>.nk files.\n")
	for _, u := range Users {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return fmt.Errorf("make the nkey of %s: %w", u.Name, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return err
		}
		seed, err := kp.Seed()
		if err != nil {
			return err
		}
		err = writeNew(filepath.Join(dir, SeedFile(u.Name)), append(seed, '\n'), 0o600)
		wipe(seed)
		kp.Wipe()
		if err != nil {
			return err
		}
		fmt.Fprintf(&env, "%s=%s\n", u.Env, pub)
	}
	return writeNew(filepath.Join(dir, EnvFile), []byte(env.String()), 0o644)
}

// writeNew creates path with mode perm; O_EXCL keeps a file that appeared
// since the check, and the mode applies from the first byte, so a seed is
// never readable by others, not even for a moment.
func writeNew(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}

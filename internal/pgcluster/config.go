package pgcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// defaultsFile holds the settings that follow from Options.Durable. They
// live in a file rather than on the command line because a command-line
// setting cannot be changed by ALTER SYSTEM, and a primary with a
// synchronous standby must turn synchronous_commit back on while it runs.
const defaultsFile = "pgcluster.conf"

var includeDefaults = "include_if_exists = '" + defaultsFile + "'"

// writeConfig writes, before each start, what the options say about the
// server's files: the defaults file, pg_hba.conf and the TLS files.
func (c *Cluster) writeConfig() error {
	if err := c.writeDefaults(); err != nil {
		return err
	}
	if err := c.writeHBA(); err != nil {
		return err
	}
	if c.opts.TLS {
		if err := c.ensureTLS(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) writeDefaults() error {
	conf := filepath.Join(c.opts.Dir, "postgresql.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		return fmt.Errorf("pgcluster: read %s (run Init first): %w", conf, err)
	}
	if !strings.Contains(string(b), includeDefaults) {
		// Appended last, so that it wins over initdb's lines; ALTER SYSTEM
		// (postgresql.auto.conf, read after this file) still wins over it.
		f, err := os.OpenFile(conf, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(f, "\n# Settings that Baton's pgcluster rewrites at every start.\n%s\n", includeDefaults)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("pgcluster: append the include of %s to %s: %w", defaultsFile, conf, err)
		}
	}
	var sb strings.Builder
	sb.WriteString("# Written by Baton's pgcluster at every start from Options.Durable; ALTER SYSTEM overrides it.\n")
	if !c.opts.Durable {
		sb.WriteString("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
	}
	return c.writeFile(filepath.Join(c.opts.Dir, defaultsFile), []byte(sb.String()), 0o600)
}

// superuserHBA lets the harness in whatever Options.HBA says: the
// superuser postgres, from 127.0.0.1, without TLS, without a password.
// Connections over TLS go through the caller's lines, so a test can still
// require a password or TLS of every other role, and of postgres over TLS.
var superuserHBA = []string{
	"hostnossl all         postgres 127.0.0.1/32 trust",
	"hostnossl replication postgres 127.0.0.1/32 trust",
}

func (c *Cluster) writeHBA() error {
	if c.opts.HBA == nil {
		return nil
	}
	var sb strings.Builder
	sb.WriteString("# Written by Baton's pgcluster at every start from Options.HBA.\n")
	for _, l := range superuserHBA {
		sb.WriteString(l + "\n")
	}
	for _, l := range c.opts.HBA {
		sb.WriteString(l + "\n")
	}
	return c.writeFile(filepath.Join(c.opts.Dir, "pg_hba.conf"), []byte(sb.String()), 0o600)
}

// writeFile writes a file of the data directory, owned by the server user
// with the given mode, whatever it was before.
func (c *Cluster) writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("pgcluster: write %s: %w", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	return c.chown(path)
}

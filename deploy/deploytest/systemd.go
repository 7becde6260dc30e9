// Package deploytest reads the deployment files of deploy/ as the programs
// that use them do: systemd's units, drop-ins and environment files, and
// PostgreSQL's settings and pg_hba.conf. The tests of deploy/ check those
// files with it and run Baton from them.
package deploytest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Unit is a systemd unit file's settings, in order, drop-ins included.
type Unit struct {
	// Name is the unit's name, with the instance of a template filled in
	// (baton-group@audit.service).
	Name string
	// Instance is a template's instance (audit), or "".
	Instance string
	// Settings are the Key=Value lines of every section, in the order
	// systemd reads them: the unit file, then its drop-ins by name.
	Settings [][2]string
}

// All returns the values of every line that sets key, in order.
func (u Unit) All(key string) []string {
	var out []string
	for _, kv := range u.Settings {
		if kv[0] == key {
			out = append(out, kv[1])
		}
	}
	return out
}

// ReadUnit reads file of dir and the drop-ins of the unit
// (<unit>.d/*.conf), with %i replaced by instance, which names the
// instance of a template (file holds "@."; instance is ignored
// otherwise).
func ReadUnit(dir, file, instance string) (Unit, error) {
	name := file
	if strings.Contains(file, "@.") {
		name = strings.Replace(file, "@.", "@"+instance+".", 1)
	} else {
		instance = ""
	}
	u := Unit{Name: name, Instance: instance}
	paths := []string{filepath.Join(dir, file)}
	dropins, err := filepath.Glob(filepath.Join(dir, name+".d", "*.conf"))
	if err != nil {
		return Unit{}, err
	}
	sort.Strings(dropins)
	for _, p := range append(paths, dropins...) {
		b, err := os.ReadFile(p)
		if err != nil {
			return Unit{}, err
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") || strings.HasPrefix(line, "[") {
				continue
			}
			if strings.HasSuffix(line, `\`) {
				return Unit{}, fmt.Errorf("%s: %q continues on the next line, which this reader does not follow", p, line)
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return Unit{}, fmt.Errorf("%s: %q is not Key=Value", p, line)
			}
			u.Settings = append(u.Settings, [2]string{strings.TrimSpace(k), strings.ReplaceAll(strings.TrimSpace(v), "%i", instance)})
		}
		if err := sc.Err(); err != nil {
			return Unit{}, err
		}
	}
	return u, nil
}

// Units reads the units (*.service) of dir, a template once per instance.
func Units(dir string, instances ...string) ([]Unit, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.service"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Unit
	for _, f := range files {
		file := filepath.Base(f)
		if !strings.Contains(file, "@.") {
			u, err := ReadUnit(dir, file, "")
			if err != nil {
				return nil, err
			}
			out = append(out, u)
			continue
		}
		for _, instance := range instances {
			u, err := ReadUnit(dir, file, instance)
			if err != nil {
				return nil, err
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// ReadEnvFile reads the KEY=VALUE lines of an environment file, as
// systemd's EnvironmentFile= does: blank lines and lines starting with #
// or ; are skipped, and quotes around a value are removed.
func ReadEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not KEY=VALUE", path, line)
		}
		out[strings.TrimSpace(k)] = unquote(strings.TrimSpace(v))
	}
	return out, nil
}

// Assignments splits the value of an Environment= line into its
// KEY=VALUE assignments: several, separated by spaces, each maybe in
// double quotes.
func Assignments(value string) ([]string, error) {
	var out []string
	for value = strings.TrimSpace(value); value != ""; value = strings.TrimSpace(value) {
		var a string
		if value[0] == '"' {
			end := strings.IndexByte(value[1:], '"')
			if end < 0 {
				//lint:ignore ST1005 the message starts with the systemd key, spelt as in the unit
				return nil, fmt.Errorf("Environment=%s: an unterminated quote", value)
			}
			a, value = value[1:end+1], value[end+2:]
		} else {
			a, value, _ = strings.Cut(value, " ")
		}
		if !strings.Contains(a, "=") {
			//lint:ignore ST1005 the message starts with the systemd key, spelt as in the unit
			return nil, fmt.Errorf("Environment=: %q is not KEY=VALUE", a)
		}
		out = append(out, a)
	}
	return out, nil
}

func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		return v[1 : len(v)-1]
	}
	return v
}

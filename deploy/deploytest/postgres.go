package deploytest

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// HBANetwork is the example network of deploy/postgres/pg_hba.conf, which
// an operator replaces with the addresses Baton's machines connect from,
// and a test with the loopback address.
const HBANetwork = "10.0.0.0/8"

// ReadConf reads the name = value lines of a postgresql.conf include
// (deploy/postgres/baton.conf, tls.conf).
func ReadConf(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not name = value", path, line)
		}
		value = strings.TrimSpace(value)
		if strings.HasPrefix(value, "'") {
			end := strings.Index(value[1:], "'")
			if end < 0 {
				return nil, fmt.Errorf("%s: %q has an unterminated quote", path, line)
			}
			value = value[1 : end+1]
		} else if i := strings.Index(value, "#"); i >= 0 {
			value = strings.TrimSpace(value[:i])
		}
		out[strings.TrimSpace(name)] = value
	}
	return out, sc.Err()
}

// ReadHBA returns the lines of a pg_hba.conf that are not comments, with
// the example network (HBANetwork) replaced by the loopback address, and,
// when databases are given, Baton's database (baton) replaced by them.
// A file without the example network is an error: the replacement would
// not take place.
func ReadHBA(path string, databases ...string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(b), HBANetwork) {
		return nil, fmt.Errorf("%s does not use the example network %s that is replaced", path, HBANetwork)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(databases) > 0 && len(fields) > 1 && fields[1] == "baton" {
			line = strings.Replace(line, " baton ", " "+strings.Join(databases, ",")+" ", 1)
		}
		out = append(out, strings.ReplaceAll(line, HBANetwork, "127.0.0.1/32"))
	}
	return out, nil
}

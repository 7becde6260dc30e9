package cli

import (
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/natsconn"
)

// secretFlags are the settings that may hold a secret. Each can also come
// from a file named by its variable with _FILE appended
// (BATON_DATABASE_URL_FILE, ...), which is how systemd credentials and
// Kubernetes secrets hand them over; and each given on the command line,
// where the process list shows it, is warned about.
var secretFlags = map[string]bool{
	"database-url":   true,
	"nats-url":       true,
	"model-api-key":  true,
	"webhook-secret": true,
}

// maxSecretFile bounds what is read from a secret file: a URL or a key,
// never megabytes.
const maxSecretFile = 64 << 10

// secretFiles resolves a secret flag from the file its <VAR>_FILE variable
// names, when the flag is not on the command line. Setting both the
// variable and its _FILE is refused: one of them would be ignored. A
// trailing newline, which editors add, is not part of the secret.
func secretFiles() kong.Resolver {
	return kong.ResolverFunc(func(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
		if !secretFlags[flag.Name] {
			return nil, nil
		}
		for _, env := range flag.Tag.Envs {
			path, ok := os.LookupEnv(env + "_FILE")
			if !ok {
				continue
			}
			if _, both := os.LookupEnv(env); both {
				return nil, fmt.Errorf("%s and %s_FILE are both set: keep one", env, env)
			}
			f, err := os.Open(path)
			if err != nil {
				return nil, fmt.Errorf("%s_FILE: cannot read the secret file: %w", env, err)
			}
			defer f.Close()
			b := make([]byte, maxSecretFile+1)
			n, _ := f.Read(b)
			for n <= maxSecretFile {
				m, err := f.Read(b[n:])
				n += m
				if err != nil || m == 0 {
					break
				}
			}
			if n > maxSecretFile {
				return nil, fmt.Errorf("%s_FILE: %s is over %d bytes: it should hold only the secret", env, path, maxSecretFile)
			}
			v := strings.TrimRight(string(b[:n]), "\r\n")
			if v == "" {
				return nil, fmt.Errorf("%s_FILE: %s is empty", env, path)
			}
			return v, nil
		}
		return nil, nil
	})
}

// warnSecretsOnCommandLine warns about each secret given as a plain flag:
// it is accepted, but every user of the machine can read it in the
// process list. The warning never shows the secret.
func warnSecretsOnCommandLine(args []string, log zerolog.Logger) {
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !secretFlags[name] {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		if !holdsSecret(name, value) {
			continue
		}
		env := "BATON_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		log.Warn().Str("flag", "--"+name).
			Msgf("a secret was given on the command line, where the process list shows it: use %s_FILE (a file holding it) or %s instead", env, env)
	}
}

// holdsSecret reports whether a value of the secret flag name holds a
// secret: a URL only when it carries a password or token.
func holdsSecret(name, value string) bool {
	switch name {
	case "database-url":
		if u, err := url.Parse(value); err == nil && u.User != nil {
			_, has := u.User.Password()
			return has
		}
		// A key=value connection string may hold password=.
		return strings.Contains(value, "password=")
	case "nats-url":
		return natsconn.Redact(value) != value
	}
	return value != ""
}

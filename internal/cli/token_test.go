package cli_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// createToken runs `baton token create` and returns the token (the last
// line) and its id (from the first).
func createToken(t *testing.T, url, user string, args ...string) (token, id string) {
	t.Helper()
	out, stderr, code := run(t, append([]string{"token", "create", "--user", user, "--database-url", url}, args...)...)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	m := regexp.MustCompile(`created token (\d+) for user`).FindStringSubmatch(lines[0])
	require.NotNil(t, m, "the first line names the token's id: %q", out)
	return lines[len(lines)-1], m[1]
}

// tokenRow returns the line of `baton token list` for the token with id.
func tokenRow(t *testing.T, url, user, id string) []string {
	t.Helper()
	out, stderr, code := run(t, "token", "list", "--user", user, "--database-url", url)
	require.Equal(t, 0, code, stderr)
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == id {
			return f
		}
	}
	t.Fatalf("no token %s in the list:\n%s", id, out)
	return nil
}

func TestTokenListShowsEachTokensLifeAndRevokeRefusesItAtOnce(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()

	forever, foreverID := createToken(t, db.URL, "alice", "--expires-in", "0")
	monthly, monthlyID := createToken(t, db.URL, "alice")
	hourly, hourlyID := createToken(t, db.URL, "alice", "--expires-in", "1h")

	out, stderr, code := run(t, "token", "list", "--user", "alice", "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "ID")
	require.Contains(t, out, "LAST USED")
	for _, tok := range []string{forever, monthly, hourly} {
		require.NotContains(t, out, tok, "the list never shows a token")
		secret := tok[len("baton_12345678_"):]
		require.NotContains(t, out, secret[:12], "nor any of its secret part")
	}

	// ID NAME STATE CREATED EXPIRES REVOKED LAST_USED
	row := tokenRow(t, db.URL, "alice", foreverID)
	require.Equal(t, "active", row[2])
	require.Equal(t, "never", row[4], "--expires-in 0 never expires")
	require.Equal(t, "never", row[6], "not used yet")
	require.True(t, strings.HasPrefix(forever, strings.TrimSuffix(row[1], "...")), "the name is how the token starts: %s", row[1])

	row = tokenRow(t, db.URL, "alice", monthlyID)
	expires, err := time.Parse(time.RFC3339, row[4])
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(720*time.Hour), expires, time.Minute, "the default expiry is 30 days")
	row = tokenRow(t, db.URL, "alice", hourlyID)
	expires, err = time.Parse(time.RFC3339, row[4])
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), expires, time.Minute)

	_, err = schema.Authenticate(ctx, db.Pool, monthly)
	require.NoError(t, err)
	row = tokenRow(t, db.URL, "alice", monthlyID)
	_, err = time.Parse(time.RFC3339, row[6])
	require.NoError(t, err, "the list shows when the token was last used: %v", row)

	out, stderr, code = run(t, "token", "revoke", monthlyID, "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "revoked")
	require.NotContains(t, out, monthly)
	_, err = schema.Authenticate(ctx, db.Pool, monthly)
	require.ErrorIs(t, err, schema.ErrTokenRevoked, "refused at once")
	row = tokenRow(t, db.URL, "alice", monthlyID)
	require.Equal(t, "revoked", row[2])
	_, err = time.Parse(time.RFC3339, row[5])
	require.NoError(t, err, "the list shows when it was revoked: %v", row)
	_, err = schema.Authenticate(ctx, db.Pool, forever)
	require.NoError(t, err, "the user's other tokens still work")

	// Revoking again changes nothing.
	_, stderr, code = run(t, "token", "revoke", monthlyID, "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, row, tokenRow(t, db.URL, "alice", monthlyID))
}

func TestTokenCommandsSayWhatWasWrong(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	_, stderr, code := run(t, "token", "create", "--user", "alice", "--expires-in", "-1h", "--database-url", db.URL)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--expires-in")

	_, stderr, code = run(t, "token", "revoke", "424242", "--database-url", db.URL)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "no token with id 424242")
	require.Contains(t, stderr, "baton token list")

	_, stderr, code = run(t, "token", "list", "--user", "nobody", "--database-url", db.URL)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `no user "nobody"`)
}

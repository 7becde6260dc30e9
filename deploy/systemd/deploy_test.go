package systemd_test

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// copyDeployFiles copies the deploy files the test deploys (deploy/postgres,
// deploy/nats and deploy/systemd) into a folder of the test's.
func copyDeployFiles(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, sub := range []string{"postgres", "nats", "systemd"} {
		require.NoError(t, os.CopyFS(filepath.Join(dir, sub), os.DirFS(filepath.Join("..", sub))))
	}
	return dir
}

// TestTheShippedDeploymentWorks deploys the files as shipped, as the
// deploying guide (docs/guides/deploying.md) says, and sees it work: a message posted through the API gets
// the model's reply, the audit group records its event and the webhook
// group delivers it signed, every connection to PostgreSQL is over TLS
// (the relay's replication included), baton status finds nothing wrong,
// the relay's heartbeat goes through, every service stops cleanly, and no
// output holds a password, a seed, the model's key, the webhook's secret or
// the API token.
func TestTheShippedDeploymentWorks(t *testing.T) {
	t.Parallel()
	require.NoError(t, newDeployment(t, copyDeployFiles(t)).deploy())
}

// TestTheDeployTestFailsWhenADeployFileBreaks changes one thing in a copy
// of the deploy files and expects the deployment to fail, saying what
// broke: a grant that roles.sql no longer makes, which a component finds
// refused as it runs, and a variable renamed, which the rewrite table
// catches before anything starts, and, once the table is made to pass
// it, the component that no longer finds its setting.
func TestTheDeployTestFailsWhenADeployFileBreaks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, from, to string
		// table are entries added to the run's rewrite table.
		table map[string]rule
		// want are the parts of the error.
		want []string
	}{
		{
			name: "a grant taken from roles.sql",
			file: "postgres/roles.sql",
			from: "TO baton_api, baton_worker, baton_relay', f);",
			to:   "TO baton_api, baton_worker', f);",
			want: []string{`baton-relay.service wrote "permission denied"`, "pg_logical_emit_message"},
		},
		{
			name: "a variable renamed in an environment file",
			file: "systemd/env/worker.env",
			from: "BATON_MODEL=",
			to:   "BATON_MODEL_NAME=",
			want: []string{"env/worker.env sets BATON_MODEL_NAME, which the deploy test neither keeps nor rewrites"},
		},
		{
			name: "a variable renamed in a unit",
			file: "systemd/baton-api.service",
			from: "Environment=BATON_DATABASE_URL_FILE=",
			to:   "Environment=BATON_DATABASE_FILE=",
			want: []string{"baton-api.service sets BATON_DATABASE_FILE, which the deploy test neither keeps nor rewrites"},
		},
		{
			name:  "a variable renamed in a unit and passed by the table",
			file:  "systemd/baton-api.service",
			from:  "Environment=BATON_DATABASE_URL_FILE=",
			to:    "Environment=BATON_DATABASE_FILE=",
			table: map[string]rule{"BATON_DATABASE_FILE": keep},
			want:  []string{"baton-api.service exited", "no database given"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := copyDeployFiles(t)
			path := filepath.Join(files, tc.file)
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Contains(t, string(b), tc.from, "deploy/%s holds %q", tc.file, tc.from)
			require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(b), tc.from, tc.to, 1)), 0o644))

			d := newDeployment(t, files)
			maps.Copy(d.variables, tc.table)
			err = d.deploy()
			require.Error(t, err, "the deployment works with %q in place of %q in deploy/%s", tc.to, tc.from, tc.file)
			t.Logf("the deployment failed, as it should:\n%v", err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w, "the failure names what broke")
			}
		})
	}
}

package deploytest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadUnitReadsATemplateWithItsDropIns: an instance of a template is
// read with %i filled in, and its drop-ins after the unit, in order of
// their names.
func TestReadUnitReadsATemplateWithItsDropIns(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644))
	}
	write("x@.service", "# comment\n[Service]\nExecStart=/bin/x run %i\nEnvironment=A=1\n")
	write("x@b.service.d/2.conf", "[Service]\nEnvironment=C=3\n")
	write("x@b.service.d/1.conf", "; comment\n[Service]\nEnvironment=B=%i\n")
	write("y.service", "[Service]\nExecStart=/bin/y\n")

	units, err := Units(dir, "a", "b")
	require.NoError(t, err)
	require.Len(t, units, 3)
	require.Equal(t, "x@a.service", units[0].Name)
	require.Equal(t, []string{"A=1"}, units[0].All("Environment"))
	require.Equal(t, "x@b.service", units[1].Name)
	require.Equal(t, "b", units[1].Instance)
	require.Equal(t, []string{"/bin/x run b"}, units[1].All("ExecStart"))
	require.Equal(t, []string{"A=1", "B=b", "C=3"}, units[1].All("Environment"))
	require.Equal(t, "y.service", units[2].Name)
	require.Empty(t, units[2].Instance)

	write("z.service", "[Service]\nExecStart=/bin/z \\\n  --flag\n")
	_, err = ReadUnit(dir, "z.service", "")
	require.ErrorContains(t, err, "continues on the next line")
}

func TestAssignmentsSplitsAnEnvironmentLine(t *testing.T) {
	got, err := Assignments(`A=1 "B=two words" C=%d/x`)
	require.NoError(t, err)
	require.Equal(t, []string{"A=1", "B=two words", "C=%d/x"}, got)
	_, err = Assignments(`"A=1`)
	require.ErrorContains(t, err, "unterminated quote")
	_, err = Assignments(`A`)
	require.ErrorContains(t, err, "not KEY=VALUE")
}

func TestReadEnvFileAndReadHBA(t *testing.T) {
	dir := t.TempDir()
	env := filepath.Join(dir, "x.env")
	require.NoError(t, os.WriteFile(env, []byte("# c\n; c\nA=1\nB=\"two words\"\n\nC='3'\n"), 0o644))
	kv, err := ReadEnvFile(env)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"A": "1", "B": "two words", "C": "3"}, kv)

	hba := filepath.Join(dir, "pg_hba.conf")
	require.NoError(t, os.WriteFile(hba, []byte("# c\nhostssl baton baton_api "+HBANetwork+" scram-sha-256\nhost all all 0.0.0.0/0 reject\n"), 0o644))
	lines, err := ReadHBA(hba, "b1", "b2")
	require.NoError(t, err)
	require.Equal(t, []string{"hostssl b1,b2 baton_api 127.0.0.1/32 scram-sha-256", "host all all 0.0.0.0/0 reject"}, lines)
	require.NoError(t, os.WriteFile(hba, []byte("host all all 0.0.0.0/0 reject\n"), 0o644))
	_, err = ReadHBA(hba)
	require.ErrorContains(t, err, "does not use the example network")
}

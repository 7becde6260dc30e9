package relay

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) {
	code := testenv.Main(m)
	if code == 0 {
		if err := goleak.Find(
			// pgx pools close their background health checks asynchronously.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).triggerHealthCheck.func1"),
		); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

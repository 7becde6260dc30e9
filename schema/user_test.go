package schema_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestEnsureUserMakesOneUserOnFirstSightEvenWhenRequestsRace: eight first
// requests of a JWT's user at once make one user, and each gets it; a
// name of 512 characters fits and one of 513 is refused with nothing
// written.
func TestEnsureUserMakesOneUserOnFirstSightEvenWhenRequestsRace(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	const name = "https://tenant.example.com/|auth0|64f1c2"
	ids := make(chan int64, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := schema.EnsureUser(ctx, db.Pool, name)
			if err != nil {
				t.Errorf("EnsureUser: %v", err)
				return
			}
			ids <- u.ID
		}()
	}
	wg.Wait()
	close(ids)
	first := int64(0)
	for id := range ids {
		if first == 0 {
			first = id
		}
		require.Equal(t, first, id, "every racing first request gets the same user")
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM users WHERE name = $1`, name).Scan(&n))
	require.Equal(t, 1, n)

	longest := "https://i.example/|" + strings.Repeat("é", schema.MaxUserNameLength-len("https://i.example/|"))
	_, err := schema.EnsureUser(ctx, db.Pool, longest)
	require.NoError(t, err, "a name of %d characters fits users.name", schema.MaxUserNameLength)
	_, err = schema.EnsureUser(ctx, db.Pool, longest+"x")
	require.ErrorContains(t, err, "1 to 512 characters")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM users`).Scan(&n))
	require.Equal(t, 2, n, "the name too long wrote nothing")
}

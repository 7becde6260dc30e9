package cli

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A parser is reused from one Run to the next: a flag given to one Run
// must not count for the next, which would then run without a required
// flag.
func TestARunSeesNothingOfTheFlagsOfTheRunBefore(t *testing.T) {
	p, err := takeParser()
	require.NoError(t, err)
	releaseParser(p)

	var out, errb bytes.Buffer
	err = Run(context.Background(), []string{"nats-server", "--store-dir", t.TempDir(), "--help"}, &out, &errb)
	require.NoError(t, err, "--help exits 0")
	require.Contains(t, out.String(), "--store-dir")

	out.Reset()
	err = Run(context.Background(), []string{"nats-server"}, &out, &errb)
	var usage *UsageError
	require.ErrorAs(t, err, &usage, "a Run without the required --store-dir is a usage error, whatever the Run before gave")
	require.Contains(t, err.Error(), "--store-dir")

	q, err := takeParser()
	require.NoError(t, err)
	defer releaseParser(q)
	require.Same(t, p, q, "the Runs reused one parser")
}

// Runs at the same time each parse with a parser of their own.
func TestConcurrentRunsParseTheirOwnArguments(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	outs := make([]string, len(errs))
	for i := range errs {
		wg.Go(func() {
			var out, errb bytes.Buffer
			args := []string{"nats-server"}
			if i%2 == 0 {
				args = append(args, "--store-dir", "/nonexistent", "--help")
			}
			errs[i] = Run(context.Background(), args, &out, &errb)
			outs[i] = out.String()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 {
			require.NoError(t, err, "run %d asked for help", i)
			require.Contains(t, outs[i], "Usage: baton nats-server", "run %d prints its own help", i)
			continue
		}
		var usage *UsageError
		require.ErrorAs(t, err, &usage, "run %d lacks --store-dir", i)
	}
}

package floor_test

import (
	"os"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/bench/floor"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) {
	// The chain's processes are this program, run again with a role.
	if floor.IsRole(os.Args) {
		os.Exit(floor.Main(os.Args))
	}
	os.Exit(testenv.Main(m))
}

// The floor chain is what BenchmarkFloor measures Baton against: this runs
// it once, small, so that it cannot rot between benchmark runs.
func TestFloorChainTakesAMessageToTheModelAndTheReplyAndItsTokensToTheClient(t *testing.T) {
	t.Parallel()
	c := newChats(t)
	chain := floor.Start(t, floor.ChainOptions{DatabaseURL: testenv.Database(t).URL, NATSURL: testenv.StartNATS(t).URL, ModelURL: c.model.BaseURL()})
	f := &target{name: "floor", client: chain.Client, prepare: noPrepare}
	s := shape{tokens: 3, every: time.Millisecond}
	prepare(t, []*target{f}, "lone", 2, 1, 5)
	one := c.lone(t, "lone", []*target{f}, 2, s)["floor"]
	many := c.many(t, []*target{f}, 1, 5, 10*time.Millisecond, s)["floor"]
	for name, p := range map[string]*paths{"one chat at a time": one, "five at once": many} {
		turns := 2
		if p == many {
			turns = 5
		}
		if len(p.postToModel) != turns || len(p.modelToCommit) != turns {
			t.Errorf("%s: %d model calls and %d replied events reached the clients; want %d of each", name, len(p.postToModel), len(p.modelToCommit), turns)
		}
		if len(p.tokenToChunk) != turns*s.tokens {
			t.Errorf("%s: %d tokens reached the clients; want %d", name, len(p.tokenToChunk), turns*s.tokens)
		}
	}
}

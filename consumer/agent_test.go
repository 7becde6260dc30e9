package consumer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestAStepKeyIsTheSameForEveryPostOfAStepAndNoOtherStepAnywhere: the key
// that an agent takes as the step's run id and Idempotency-Key is the same
// for every post of one step, and differs for another step, epoch or turn,
// and for the turn of the same id in another conversation, as the first
// turns of two databases are (a turn's id derives from outbox ids, which
// every database numbers from 1): an agent that serves two deployments
// never takes a step of one for a step of the other.
func TestAStepKeyIsTheSameForEveryPostOfAStepAndNoOtherStepAnywhere(t *testing.T) {
	t.Parallel()
	first := schema.TurnID([]int64{1})
	step := func(conversation, turn string, epoch, index int) string {
		return StepRequest{Turn: &Turn{ConversationID: conversation, TurnID: turn, Epoch: epoch}, Index: index}.Key()
	}
	key := step("c_one", first, 0, 1)
	require.Regexp(t, `^step_[0-9a-f]{32}$`, key)
	require.Equal(t, key, step("c_one", first, 0, 1), "every post of a step has its key")
	seen := map[string]string{key: "the step"}
	for name, other := range map[string]string{
		"another step":               step("c_one", first, 0, 0),
		"another epoch":              step("c_one", first, 1, 1),
		"another turn":               step("c_one", schema.TurnID([]int64{2}), 0, 1),
		"the same turn id elsewhere": step("c_two", first, 0, 1),
	} {
		require.NotContains(t, seen, other, "%s has the key of %s", name, seen[other])
		seen[other] = name
	}
}

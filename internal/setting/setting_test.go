package setting_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/setting"
)

func TestErrorCarriesFieldValueAndProblemThroughNesting(t *testing.T) {
	t.Parallel()
	err := setting.Within("Consumer", setting.Errorf("AckWait", 50*time.Millisecond, "too short: give at least %s", 100*time.Millisecond))
	var se *setting.Error
	require.True(t, errors.As(err, &se))
	require.Equal(t, "Consumer.AckWait", se.Field)
	require.Equal(t, 50*time.Millisecond, se.Value)
	require.Equal(t, "Consumer.AckWait 50ms: too short: give at least 100ms", err.Error())

	plain := errors.New("not a setting")
	require.Same(t, plain, setting.Within("Consumer", plain), "other errors pass through unchanged")
}

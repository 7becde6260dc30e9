package keyedlimit

import (
	"os"
	"testing"

	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

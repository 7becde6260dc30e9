// Package logging builds Baton's zerolog loggers.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Options choose the level and the format.
type Options struct {
	LogLevel  string `name:"log-level" env:"BATON_LOG_LEVEL" help:"Log level: debug, info, warn, error." default:"info"`
	LogFormat string `name:"log-format" env:"BATON_LOG_FORMAT" help:"Log format: json, console, or auto (console on a terminal)." default:"auto" enum:"auto,json,console"`
}

// New returns a logger writing to w.
func New(o Options, w io.Writer) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(strings.ToLower(o.LogLevel))
	if err != nil || o.LogLevel == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level / BATON_LOG_LEVEL %q is not one of debug, info, warn, error", o.LogLevel)
	}
	console := o.LogFormat == "console"
	if o.LogFormat == "auto" || o.LogFormat == "" {
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			console = true
		}
	}
	if _, ok := w.(*os.File); !ok {
		// Services log from many goroutines; a file takes each write whole,
		// but a writer such as a bytes.Buffer must get one at a time.
		w = zerolog.SyncWriter(w)
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger(), nil
}

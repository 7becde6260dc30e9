// Command baton is a durable backend for AI-agent conversations.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/batonhq/baton/internal/cli"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first signal starts a graceful shutdown; a second one aborts it.
		<-sigs
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "baton: second signal, exiting at once")
		os.Exit(130)
	}()
	err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if code := cli.ExitCode(err); code != 0 {
		var ee *cli.ExitError
		if err != nil && !(asExit(err, &ee) && ee.Err == nil) {
			fmt.Fprintln(os.Stderr, "baton:", err)
		}
		os.Exit(code)
	}
}

func asExit(err error, target **cli.ExitError) bool {
	e, ok := err.(*cli.ExitError)
	if ok {
		*target = e
	}
	return ok
}

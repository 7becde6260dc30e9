// Command chaos runs the kill test against real processes and exits 1 when
// an invariant failed, 2 when the harness itself could not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/batonhq/baton/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg chaos.Config
	var plan string
	fs.StringVar(&cfg.Binary, "binary", "bin/baton", "baton binary every process runs (build it without -race)")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed of the load and the fault schedule; 0 takes one from the clock")
	fs.IntVar(&cfg.Conversations, "conversations", chaos.DefaultConversations, "conversations the load spreads over")
	fs.IntVar(&cfg.Messages, "messages", chaos.DefaultMessages, "messages the load sends")
	fs.IntVar(&cfg.Faults, "faults", chaos.DefaultFaults, "faults injected, at least one of each kind")
	fs.StringVar(&plan, "plan", "", "exact comma-separated list of faults instead of --faults, such as relay_kill,stream_wipe")
	fs.DurationVar(&cfg.LoadDuration, "duration", chaos.DefaultLoadDuration, "how long the load and the faults take")
	fs.DurationVar(&cfg.SettleTimeout, "settle", chaos.DefaultSettleTimeout, "longest wait for the system to settle after the load")
	fs.IntVar(&cfg.Clients, "clients", chaos.DefaultClients, "concurrent HTTP clients")
	fs.DurationVar(&cfg.Lease, "lease", chaos.DefaultLease, "workers' lease and ack wait")
	fs.StringVar(&cfg.Dir, "dir", "", "folder for data and logs; default a temporary one, removed when the run passes")
	var agents string
	fs.StringVar(&agents, "agents", "", "external agents the workers post their steps to, one per worker in turn, such as mastra,mastra,ai-sdk (one of "+strings.Join(chaos.AgentNames(), ", ")+"); default none: the echo agent")
	fs.StringVar(&cfg.ExamplesDir, "examples", "examples", "the repository's examples folder, where the agents are")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if agents != "" {
		for _, name := range strings.Split(agents, ",") {
			cfg.Agents = append(cfg.Agents, strings.TrimSpace(name))
		}
	}
	if plan != "" {
		for _, name := range strings.Split(plan, ",") {
			k, err := chaos.ParseFault(strings.TrimSpace(name))
			if err != nil {
				fmt.Fprintln(stderr, "chaos: --plan:", err)
				return 2
			}
			cfg.Plan = append(cfg.Plan, k)
		}
	}
	cfg.Out = stdout
	res, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	res.WriteSummary(stdout)
	if !res.Passed() {
		return 1
	}
	return 0
}

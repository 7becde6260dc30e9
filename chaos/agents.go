package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// agentKind is an example agent the workers can run against: served by
// node from its folder under examples/, speaking protocol (the worker's
// --agent) on route.
type agentKind struct {
	name, protocol, dir, route string
}

// The example agents a run may use (Config.Agents).
var agentKinds = []agentKind{
	{name: "mastra", protocol: "ag-ui", dir: "agent-mastra", route: "/api/agent"},
	{name: "ag-ui", protocol: "ag-ui", dir: "agent-ag-ui", route: "/api/agent"},
	{name: "ai-sdk", protocol: "ai-sdk", dir: "agent-ai-sdk", route: "/api/chat"},
}

// AgentNames lists the agents a run may use, by name.
func AgentNames() []string {
	out := make([]string, len(agentKinds))
	for i, k := range agentKinds {
		out[i] = k.name
	}
	return out
}

func agentKindOf(name string) (agentKind, bool) {
	for _, k := range agentKinds {
		if k.name == name {
			return k, true
		}
	}
	return agentKind{}, false
}

// agentSlowDelay is the pause between the words of a slow reply ("think
// slowly"), short enough that the load's slow replies take a second or
// two, long enough that a stop finds them streaming.
const agentSlowDelay = 60 * time.Millisecond

// agentNode is one agent process, in a network namespace of its own,
// and the recorder in front of it, where the workers post their steps.
type agentNode struct {
	*process
	kind agentKind
	rec  *stepRecorder
}

// agentKeyFiles are the key pair whose private half the workers sign the
// agents' tokens with and whose public half the API serves.
func (s *system) agentKeyFiles() (private, public string) {
	return filepath.Join(s.dir, "agent-signing-key.pem"), filepath.Join(s.dir, "agent-public-key.pem")
}

// prepareAgents makes the agents' key pair and, for each agent the
// workers use, its namespace and its recorder, so that the workers and
// the API can be given their addresses; startAgents starts them.
func (s *system) prepareAgents(ctx context.Context) error {
	if len(s.cfg.Agents) == 0 {
		return nil
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return fmt.Errorf("the external agents run with node, which is not installed: run make chaos-agents (or scripts/install-deps.sh node): %w", err)
	}
	private, public := s.agentKeyFiles()
	if err := s.runOnce(ctx, "agent-key create", "agent-key", "create", "--private-key", private, "--public-key", public); err != nil {
		return err
	}
	ports, err := freePorts(len(s.cfg.Agents))
	if err != nil {
		return err
	}
	for i, name := range s.cfg.Agents {
		if slices.ContainsFunc(s.agents, func(a *agentNode) bool { return a.kind.name == name }) {
			continue
		}
		kind, _ := agentKindOf(name)
		n, err := s.net.Add(fmt.Sprintf("agent%d", len(s.agents)+1))
		if err != nil {
			return err
		}
		target := fmt.Sprintf("http://%s:%d", n.IP, ports[i])
		rec, err := startStepRecorder(kind.name, s.net.HostIP(), target, s.pool)
		if err != nil {
			return err
		}
		p := newProcess(n.Name, node, filepath.Join(s.logs, n.Name+".log"), filepath.Join(s.cfg.ExamplesDir, kind.dir, "server.js"))
		p.node = n
		p.baseEnv = []string{
			"HOST=" + n.IP, "PORT=" + strconv.Itoa(ports[i]),
			// The workers reach the agent through its recorder: the
			// tokens are for the recorder's origin.
			"AGENT_AUDIENCE=" + rec.url,
			"AGENT_SLOW_DELAY_MS=" + strconv.Itoa(int(agentSlowDelay/time.Millisecond)),
		}
		s.agents = append(s.agents, &agentNode{process: p, kind: kind, rec: rec})
	}
	return nil
}

// agentOf is the agent worker i posts to.
func (s *system) agentOf(i int) *agentNode {
	name := s.cfg.Agents[i%len(s.cfg.Agents)]
	for _, a := range s.agents {
		if a.kind.name == name {
			return a
		}
	}
	return nil
}

// agentWorkerFlags are the flags of worker i in a run with agents: its
// agent, through the recorder, and timeouts short enough that a cut
// link is noticed within seconds (the defaults wait a minute).
func (s *system) agentWorkerFlags(i int) []string {
	a := s.agentOf(i)
	private, _ := s.agentKeyFiles()
	return []string{"--agent", a.kind.protocol, "--agent-url", a.rec.url + a.kind.route, "--agent-signing-key", private,
		"--agent-first-byte-timeout", agentFirstByte.String(), "--agent-idle-timeout", agentIdle.String()}
}

// The workers' waits for an agent's first byte and between its events.
const (
	agentFirstByte = 5 * time.Second
	agentIdle      = 5 * time.Second
)

// startAgents starts every agent, with the API's keys, and waits until
// each listens.
func (s *system) startAgents() error {
	for _, a := range s.agents {
		a.baseEnv = append(a.baseEnv, "BATON_JWKS_URL="+s.apiURL+"/.well-known/jwks.json")
		for _, w := range s.workers {
			a.rec.worker(w.node.IP, w.name)
		}
		if err := a.supervise(); err != nil {
			return err
		}
		if err := a.waitReady(`"message":"listening"`, 60*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// agentRequests returns every step request the recorders received.
func (s *system) agentRequests() []stepRequest {
	var out []stepRequest
	for _, a := range s.agents {
		out = append(out, a.rec.received()...)
	}
	return out
}

// checkAgents names the first agent setting that cannot work.
func (c Config) checkAgents() error {
	if len(c.Agents) == 0 {
		for _, k := range c.Plan {
			if slices.Contains(AgentFaults, k) {
				return fmt.Errorf("chaos: fault %s needs external agents: give --agents", k)
			}
		}
		return nil
	}
	for _, name := range c.Agents {
		kind, ok := agentKindOf(name)
		if !ok {
			return fmt.Errorf("chaos: unknown agent %q: use one of %s (--agents)", name, strings.Join(AgentNames(), ", "))
		}
		dir := filepath.Join(c.ExamplesDir, kind.dir)
		if _, err := os.Stat(filepath.Join(dir, "server.js")); err != nil {
			return fmt.Errorf("chaos: agent %s: %s has no server.js: give the repository's examples folder (--examples): %w", name, dir, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err != nil {
			return fmt.Errorf("chaos: agent %s: the packages of %s are not installed: run make chaos-agents-deps (or npm ci --prefix %s)", name, dir, dir)
		}
	}
	return nil
}

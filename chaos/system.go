package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/pgcluster"
)

// Names the system under test is set up with.
const (
	streamName    = "CHAOS_OUTBOX"
	subjectPrefix = "chaos.outbox"
	natsCluster   = "baton-chaos"
	relayCount    = 2
	workerCount   = 3
	natsCount     = 3
)

// system is every process of one run: a PostgreSQL primary and its
// synchronous standby, a three-node NATS cluster, two relays, three workers
// and the API.
type system struct {
	cfg  Config
	dir  string
	logs string

	// pg is the primary and standby its synchronous standby, both named
	// (pgName, standbyName) pg1, pg2, ... in the order they were made; a
	// failover promotes the standby and makes a new one on the dead
	// primary's port. standby is nil only when making one failed.
	pg          *pgcluster.Cluster
	pgName      string
	standby     *pgcluster.Cluster
	standbyName string
	pgNodes     int
	pgMu        sync.Mutex // held while a Postgres fault runs
	dbURL       string     // both ports, target_session_attrs=read-write
	pool        *pgxpool.Pool
	natsURL     string
	// procDBURL is dbURL as the processes reach it, from their namespaces.
	procDBURL string
	// pgPorts are the two ports the servers listen on, whichever is the
	// primary.
	pgPorts []int

	// net is the run's network: every process but PostgreSQL in a
	// namespace of its own.
	net *netns.Network

	nats      []*natsNode
	relays    []*process
	relayMets []string // metrics URL of each relay
	workers   []*process
	api       *process
	// mcp is the MCP server whose tools the workers' turns call.
	mcp *mcpServer
	// agents are the external agents the workers post their steps to,
	// when the run has agents (Config.Agents).
	agents []*agentNode
	apiURL string
	token  string
}

type natsNode struct {
	*process
	store       string
	port        int
	clusterPort int
}

// freePorts returns n distinct free ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for len(out) < n {
		p, err := pgcluster.FreePort()
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// startSystem brings every process up and waits until each is ready.
func startSystem(ctx context.Context, cfg Config, dir string) (*system, error) {
	s := &system{cfg: cfg, dir: dir, logs: filepath.Join(dir, "logs")}
	if err := os.MkdirAll(s.logs, 0o755); err != nil {
		return nil, err
	}
	// PostgreSQL runs as the postgres user when the harness is root: it
	// must be able to reach its data folder.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	network, err := netns.New()
	if err != nil {
		return nil, err
	}
	s.net = network
	if err := s.startPostgresPair(ctx); err != nil {
		return s, err
	}
	if err := s.createDatabase(ctx); err != nil {
		return s, err
	}

	ports, err := freePorts(2*natsCount + relayCount + 1)
	if err != nil {
		return s, err
	}
	natsNodes := make([]*netns.Node, natsCount)
	var routes []string
	for i := range natsCount {
		if natsNodes[i], err = s.net.Add(fmt.Sprintf("nats%d", i+1)); err != nil {
			return s, err
		}
		routes = append(routes, fmt.Sprintf("nats://%s:%d", natsNodes[i].IP, ports[natsCount+i]))
	}
	var urls []string
	for i := range natsCount {
		n := &natsNode{store: filepath.Join(dir, fmt.Sprintf("nats%d", i+1)), port: ports[i], clusterPort: ports[natsCount+i]}
		n.process = newProcess(fmt.Sprintf("nats%d", i+1), cfg.Binary, filepath.Join(s.logs, fmt.Sprintf("nats%d.log", i+1)),
			"nats-server", "--host", natsNodes[i].IP, "--port", strconv.Itoa(ports[i]), "--store-dir", n.store,
			"--name", fmt.Sprintf("n%d", i+1), "--cluster", natsCluster,
			"--cluster-port", strconv.Itoa(ports[natsCount+i]), "--routes", strings.Join(routes, ","),
			"--log-format", "json")
		n.node = natsNodes[i]
		s.nats = append(s.nats, n)
		urls = append(urls, fmt.Sprintf("nats://%s:%d", natsNodes[i].IP, ports[i]))
	}
	s.natsURL = strings.Join(urls, ",")
	for _, n := range s.nats {
		if err := n.supervise(); err != nil {
			return s, err
		}
	}
	if err := s.waitJetStream(ctx, 60*time.Second); err != nil {
		return s, err
	}

	if err := s.runOnce(ctx, "migrate", "migrate", "--database-url", s.dbURL); err != nil {
		return s, err
	}
	out, err := s.output(ctx, "token", "create", "--database-url", s.dbURL, "--user", "chaos")
	if err != nil {
		return s, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	s.token = strings.TrimSpace(lines[len(lines)-1])

	streamFlags := s.streamFlags()
	common := []string{"--database-url", s.procDBURL, "--nats-url", s.natsURL, "--log-format", "json"}
	for i := range relayCount {
		node, err := s.net.Add(fmt.Sprintf("relay%d", i+1))
		if err != nil {
			return s, err
		}
		addr := fmt.Sprintf("%s:%d", node.IP, ports[2*natsCount+i])
		args := append([]string{"relay"}, common...)
		args = append(args, streamFlags...)
		args = append(args, "--metrics-addr", addr,
			"--sweep-interval", "2s", "--sweep-age", "5s", "--heartbeat", "1s",
			"--status-interval", "500ms", "--ack-timeout", "3s")
		p := newProcess(fmt.Sprintf("relay%d", i+1), cfg.Binary, filepath.Join(s.logs, fmt.Sprintf("relay%d.log", i+1)), args...)
		p.node = node
		s.relays = append(s.relays, p)
		s.relayMets = append(s.relayMets, "http://"+addr+"/metrics")
		if err := p.supervise(); err != nil {
			return s, err
		}
		if i == 0 {
			// The first relay creates the publication, the slot and the
			// stream; the second then waits as a standby.
			if err := p.waitLogged("connected; streaming", 60*time.Second); err != nil {
				return s, err
			}
		}
	}
	// The workers' MCP server, on the harness's end of the network, where
	// PostgreSQL listens too.
	if s.mcp, err = startMCPServer(s.net.HostIP(), s.pool, cfg.Seed); err != nil {
		return s, err
	}
	if err := s.prepareAgents(ctx); err != nil {
		return s, err
	}
	for i := range workerCount {
		args := append([]string{"worker"}, common...)
		args = append(args, streamFlags...)
		args = append(args, "--consumer", "turns", "--lease", cfg.Lease.String(), "--ack-wait", cfg.Lease.String(),
			"--debounce", "50ms", "--max-attempts", "3", "--concurrency", "32")
		if len(cfg.Agents) > 0 {
			args = append(args, s.agentWorkerFlags(i)...)
		} else {
			// The load sends /sleep, /fail and /tool lines, some of them
			// for the tools of the MCP server.
			args = append(args, "--echo-directives")
		}
		args = append(args, s.mcpFlags()...)
		p := newProcess(fmt.Sprintf("worker%d", i+1), cfg.Binary, filepath.Join(s.logs, fmt.Sprintf("worker%d.log", i+1)), args...)
		if p.node, err = s.net.Add(p.name); err != nil {
			return s, err
		}
		s.mcp.worker(p.node.IP, p.name)
		s.workers = append(s.workers, p)
		if err := p.supervise(); err != nil {
			return s, err
		}
		if err := p.waitReady("worker started", 90*time.Second); err != nil {
			return s, err
		}
	}
	apiNode, err := s.net.Add("api")
	if err != nil {
		return s, err
	}
	apiAddr := fmt.Sprintf("%s:%d", apiNode.IP, ports[2*natsCount+relayCount])
	s.apiURL = "http://" + apiAddr
	apiArgs := []string{"api", "--database-url", s.procDBURL, "--nats-url", s.natsURL, "--http-addr", apiAddr, "--replicas", "3", "--log-format", "json",
		// One user sends the whole load, far above what one person types.
		"--messages-per-minute", "1000000", "--message-burst", "100000",
		// The one user holds the load's live event streams, three dozen.
		"--max-streams-per-user", "64"}
	if len(cfg.Agents) > 0 {
		// The agents check the workers' tokens against the keys the API
		// serves.
		_, public := s.agentKeyFiles()
		apiArgs = append(apiArgs, "--agent-public-key", public)
	}
	s.api = newProcess("api", cfg.Binary, filepath.Join(s.logs, "api.log"), apiArgs...)
	s.api.node = apiNode
	if err := s.api.supervise(); err != nil {
		return s, err
	}
	if err := s.api.waitReady("serving HTTP API", 60*time.Second); err != nil {
		return s, err
	}
	if _, err := s.activeRelay(ctx); err != nil {
		return s, err
	}
	if err := s.startAgents(); err != nil {
		return s, err
	}
	return s, nil
}

// streamFlags name the run's stream to a baton command.
func (s *system) streamFlags() []string {
	return []string{"--stream", streamName, "--subject-prefix", subjectPrefix, "--replicas", strconv.Itoa(natsCount)}
}

// createDatabase creates the run's database and its pool.
func (s *system) createDatabase(ctx context.Context) error {
	admin, err := pgxpool.New(ctx, s.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE baton"); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	// Every process and the harness's own pool reach whichever of the
	// two ports is the primary, before and after a failover.
	s.dbURL = pgcluster.MultiHostURL("baton", s.pg, s.standby)
	s.procDBURL = strings.ReplaceAll(s.dbURL, "127.0.0.1:", s.net.HostIP()+":")
	s.pool, err = pgxpool.New(ctx, s.dbURL)
	return err
}

// runOnce runs a baton subcommand to its end.
func (s *system) runOnce(ctx context.Context, name string, args ...string) error {
	_, err := s.output(ctx, args...)
	if err != nil {
		return fmt.Errorf("baton %s: %w", name, err)
	}
	return nil
}

func (s *system) output(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, s.cfg.Binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("baton %s: %w\n%s", args[0], err, stderr.String())
	}
	return stdout.String(), nil
}

// waitJetStream polls until the cluster has a JetStream meta leader (the
// account info request answers), so that streams can be created.
func (s *system) waitJetStream(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	nc, err := natsclient.Connect(s.natsURL, natsclient.RetryOnFailedConnect(true), natsclient.MaxReconnects(-1), natsclient.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("JetStream cluster not ready within %s: %w", within, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitStreamHealthy polls until the outbox stream has a leader and every
// replica is current, or within passes. It reports the last state seen and
// whether it got there.
func (s *system) waitStreamHealthy(ctx context.Context, within time.Duration) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	nc, err := natsclient.Connect(s.natsURL, natsclient.RetryOnFailedConnect(true), natsclient.MaxReconnects(-1), natsclient.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return err.Error(), false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err.Error(), false
	}
	state := ""
	for {
		info, err := streamInfo(ctx, js)
		switch {
		case err != nil:
			state = err.Error()
		case info.Cluster == nil:
			state = "no cluster information"
		default:
			state = "leader " + info.Cluster.Leader
			healthy := info.Cluster.Leader != "" && len(info.Cluster.Replicas) == natsCount-1
			for _, r := range info.Cluster.Replicas {
				state += fmt.Sprintf(", %s current=%v offline=%v", r.Name, r.Current, r.Offline)
				healthy = healthy && r.Current && !r.Offline
			}
			if healthy {
				return state, true
			}
		}
		select {
		case <-ctx.Done():
			return state, false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func streamInfo(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, streamName)
	if err != nil {
		return nil, err
	}
	return st.Info(ctx)
}

// activeRelay returns the index of the relay that streams from the slot,
// from each relay's baton_relay_active gauge, polling until one does.
func (s *system) activeRelay(ctx context.Context) (int, error) {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		for i, u := range s.relayMets {
			if !s.relays[i].running() {
				continue
			}
			if v, err := scrapeGauge(ctx, client, u, "baton_relay_active"); err == nil && v == 1 {
				return i, nil
			}
		}
		if time.Now().After(deadline) {
			return -1, errors.New("no relay became active within 60s")
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func scrapeGauge(ctx context.Context, client *http.Client, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
		}
	}
	return 0, fmt.Errorf("%s not in %s", name, url)
}

// processes lists every process of Baton's and the agents.
func (s *system) processes() []*process {
	var out []*process
	out = append(out, s.relays...)
	out = append(out, s.workers...)
	if s.api != nil {
		out = append(out, s.api)
	}
	for _, a := range s.agents {
		out = append(out, a.process)
	}
	return out
}

// allRunning reports whether every process is up.
func (s *system) allRunning() bool {
	for _, p := range s.processes() {
		if !p.running() {
			return false
		}
	}
	for _, n := range s.nats {
		if !n.running() {
			return false
		}
	}
	return s.pg != nil && s.pg.Running() && (s.standby == nil || s.standby.Running())
}

// unexpectedExits counts, per process, exits the harness did not cause.
func (s *system) unexpectedExits() map[string]int64 {
	out := map[string]int64{}
	for _, p := range s.processes() {
		if n := p.unexpected.Load(); n > 0 {
			out[p.name] = n
		}
	}
	for _, n := range s.nats {
		if u := n.unexpected.Load(); u > 0 {
			out[n.name] = u
		}
	}
	return out
}

// stop shuts everything down: baton processes first, then NATS, then
// PostgreSQL.
func (s *system) stop() {
	var wg sync.WaitGroup
	for _, p := range s.processes() {
		wg.Go(func() { p.close(15 * time.Second) })
	}
	wg.Wait()
	for _, n := range s.nats {
		wg.Go(func() { n.close(10 * time.Second) })
	}
	wg.Wait()
	if s.mcp != nil {
		s.mcp.close()
	}
	for _, a := range s.agents {
		a.rec.close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	s.pgMu.Lock()
	defer s.pgMu.Unlock()
	// The primary first: its fast shutdown sends the end of WAL to the
	// standby.
	if s.pg != nil {
		_ = s.pg.Stop(pgcluster.Fast)
	}
	if s.standby != nil {
		_ = s.standby.Stop(pgcluster.Fast)
	}
	if s.net != nil {
		s.net.Close()
	}
}

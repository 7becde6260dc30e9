package prometheus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const (
	alertsFile    = "alerts.yml"
	dashboardFile = "../grafana/baton.json"
)

// promtool is Prometheus's own checker, from Debian's prometheus package
// (scripts/install-deps.sh installs it for the tests).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is missing: install Debian's prometheus package (scripts/install-deps.sh prometheus, which make test runs)")
	return p
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(b, &rf))
	return rf
}

// dashboardExprs returns every PromQL expression of the dashboard, with
// Grafana's own variables replaced by what Grafana puts in their place.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q has a target without an expression", p.Title)
			out = append(out, strings.ReplaceAll(tg.Expr, "$__rate_interval", "5m"))
		}
	}
	require.NotEmpty(t, out)
	return out
}

var metricName = regexp.MustCompile(`\bbaton_[a-z0-9_]+\b`)

// namesIn returns the Baton series named in the expressions.
func namesIn(exprs []string) []string {
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			seen[n] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func alertExprs(t *testing.T) []string {
	var out []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

func TestTheAlertRulesAndTheDashboardsExpressionsParse(t *testing.T) {
	t.Parallel()
	tool := promtool(t)
	out, err := exec.Command(tool, "check", "rules", alertsFile).CombinedOutput()
	require.NoError(t, err, "promtool check rules %s:\n%s", alertsFile, out)
	out, err = exec.Command(tool, "check", "config", "scrape.yml").CombinedOutput()
	require.NoError(t, err, "promtool check config scrape.yml:\n%s", out)

	// promtool parses the expressions of a rule file: the dashboard's go
	// into one as recording rules.
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, e := range dashboardExprs(t) {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:expr_%d", i), Expr: e})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	out, err = exec.Command(tool, "check", "rules", f).CombinedOutput()
	require.NoError(t, err, "an expression of %s does not parse:\n%s", dashboardFile, out)
}

// series is one sample of a scrape: a name and its labels.
type series struct {
	name   string
	labels map[string]string
}

func (s series) key() string {
	keys := make([]string, 0, len(s.labels))
	for k := range s.labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(s.name + "{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%s=%q", k, s.labels[k])
	}
	b.WriteString("}")
	return b.String()
}

// scrape is what one /metrics answered: every sample by its series.
type scrape map[string]sampled

type sampled struct {
	series
	value float64
}

// parseExposition reads Prometheus's text format.
func parseExposition(r io.Reader) (scrape, error) {
	out := scrape{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := series{labels: map[string]string{}}
		i := strings.IndexAny(line, "{ ")
		if i < 0 {
			return nil, fmt.Errorf("line %q has no value", line)
		}
		s.name = line[:i]
		rest := line[i:]
		if rest[0] == '{' {
			j := 1
			for rest[j] != '}' {
				eq := strings.IndexByte(rest[j:], '=')
				name := strings.TrimLeft(rest[j:j+eq], ",")
				j += eq + 1
				val, n, err := unquote(rest[j:])
				if err != nil {
					return nil, fmt.Errorf("line %q: %w", line, err)
				}
				s.labels[name] = val
				j += n
				if rest[j] == ',' {
					j++
				}
			}
			rest = rest[j+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("line %q has no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		out[s.key()] = sampled{series: s, value: v}
	}
	return out, sc.Err()
}

// unquote reads a quoted label value at the start of s and returns it and
// how many bytes it took.
func unquote(s string) (string, int, error) {
	if s == "" || s[0] != '"' {
		return "", 0, fmt.Errorf("label value is not quoted: %q", s)
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
		case '"':
			return b.String(), i + 1, nil
		default:
			b.WriteByte(s[i])
		}
	}
	return "", 0, fmt.Errorf("unterminated label value: %q", s)
}

// names are the sample names of a scrape.
func (s scrape) names() map[string]bool {
	out := map[string]bool{}
	for _, v := range s {
		out[v.name] = true
	}
	return out
}

// value sums the samples of name whose labels include want.
func (s scrape) value(name string, want map[string]string) (float64, bool) {
	var sum float64
	found := false
	for _, v := range s {
		if v.name != name {
			continue
		}
		match := true
		for k, w := range want {
			if v.labels[k] != w {
				match = false
			}
		}
		if match {
			sum += v.value
			found = true
		}
	}
	return sum, found
}

// process is one running baton process of the test.
type process struct {
	name, job string
	metrics   string
	cmd       *exec.Cmd
	logs      *testenv.SyncBuffer
	done      chan struct{}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// start runs `baton args...` with its metrics on a free port, and waits
// until they answer.
func start(t *testing.T, bin string, env []string, name, job string, args ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	p := &process{name: name, job: job, metrics: "http://" + addr + "/metrics", logs: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append(args, "--metrics-addr", addr)...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := p.scrape(); err == nil {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("%s ended before serving its metrics:\n%s", name, p.logs)
		default:
		}
		require.True(t, time.Now().Before(deadline), "%s serves no metrics within 60s:\n%s", name, p.logs)
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the process as a supervisor does (SIGTERM) and waits for it.
func (p *process) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop within 30s of SIGTERM:\n%s", p.name, p.logs)
	}
}

func (p *process) scrape() (scrape, error) {
	resp, err := http.Get(p.metrics)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", p.metrics, resp.Status)
	}
	return parseExposition(resp.Body)
}

func (p *process) mustScrape(t *testing.T) scrape {
	t.Helper()
	s, err := p.scrape()
	require.NoError(t, err, "scrape %s", p.name)
	return s
}

// until scrapes p until cond holds.
func (p *process) until(t *testing.T, what string, cond func(scrape) bool) scrape {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := p.scrape()
		if err == nil && cond(s) {
			return s
		}
		require.True(t, time.Now().Before(deadline), "%s: %s not seen within 60s:\n%s", p.name, what, p.logs)
		time.Sleep(20 * time.Millisecond)
	}
}

// system is every kind of Baton process against one database and NATS.
type system struct {
	t                                  *testing.T
	db                                 *testenv.DB
	nats                               *testenv.NATS
	relay, worker, api, audit, webhook *process
	apiURL, alice, flood               string
	conversations                      int
}

func startSystem(t *testing.T) *system {
	t.Helper()
	ctx := context.Background()
	s := &system{t: t, db: testenv.Database(t), nats: testenv.StartNATS(t)}
	bin := testenv.BatonBinary(t)
	var err error
	s.alice, _, err = schema.CreateToken(ctx, s.db.Pool, "alice")
	require.NoError(t, err)
	s.flood, _, err = schema.CreateToken(ctx, s.db.Pool, "flood")
	require.NoError(t, err)
	// A webhook receiver that refuses every event: the webhook group parks
	// each one at once.
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not today", http.StatusBadRequest)
	}))
	t.Cleanup(refuse.Close)

	env := []string{"BATON_DATABASE_URL=" + s.db.URL, "BATON_NATS_URL=" + s.nats.URL, "BATON_LOG_FORMAT=json"}
	s.relay = start(t, bin, env, "relay", "baton-relay", "relay", "--slot", fmt.Sprintf("obs_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6),
		"--heartbeat", "100ms", "--status-interval", "1s", "--prune-every", "1s")
	s.relay.until(t, "the relay streaming", func(sc scrape) bool {
		v, _ := sc.value("baton_relay_active", nil)
		return v == 1
	})
	s.worker = start(t, bin, env, "worker", "baton-worker", "worker", "--echo-directives", "--max-attempts", "1", "--debounce", "0")
	httpAddr := freeAddr(t)
	s.apiURL = "http://" + httpAddr
	s.api = start(t, bin, env, "api", "baton-api", "api", "--http-addr", httpAddr, "--messages-per-minute", "600", "--message-burst", "5")
	s.audit = start(t, bin, env, "audit", "baton-group", "group", "run", "audit")
	s.webhook = start(t, bin, append(env, "BATON_WEBHOOK_SECRET=test-secret"), "webhook", "baton-group",
		"group", "run", "webhook", "--webhook-url", refuse.URL+"/hook", "--max-attempts", "1")
	return s
}

func (s *system) processes() []*process {
	return []*process{s.relay, s.worker, s.api, s.audit, s.webhook}
}

func (s *system) post(token, path, body string) int {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.apiURL+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// turn posts one message in a conversation of its own.
func (s *system) turn(content string) {
	s.t.Helper()
	s.conversations++
	id := fmt.Sprintf("c%d", s.conversations)
	require.Equal(s.t, http.StatusCreated, s.post(s.alice, "/v1/conversations", fmt.Sprintf(`{"id":%q}`, id)))
	require.Equal(s.t, http.StatusAccepted, s.post(s.alice, "/v1/conversations/"+id+"/messages", fmt.Sprintf(`{"id":%q,"content":%q}`, "m-"+id, content)))
}

func counter(sc scrape, name string, labels map[string]string) float64 {
	v, _ := sc.value(name, labels)
	return v
}

func TestDashboardAndAlertsAgainstRealProcesses(t *testing.T) {
	tool := promtool(t)
	s := startSystem(t)

	// Traffic that makes every series exist: replies, a tool call, a
	// failed turn, parked webhook events, a refused flood, a wrong method.
	s.turn("hello")
	s.turn("/tool lookup observability")
	s.turn("/fail")
	for range 8 {
		s.post(s.flood, "/v1/conversations", `{"id":"flood"}`)
	}
	s.worker.until(t, "three turns ended", func(sc scrape) bool {
		return counter(sc, "baton_turns_finished_total", map[string]string{"outcome": "replied"}) == 2 &&
			counter(sc, "baton_turns_finished_total", map[string]string{"outcome": "failed"}) == 1
	})
	s.webhook.until(t, "dead letters", func(sc scrape) bool {
		v, _ := sc.value("baton_group_dead_letters", nil)
		return v > 0
	})
	s.relay.until(t, "every consumer's backlog", func(sc scrape) bool {
		for _, c := range []string{"turns", "audit", "webhook"} {
			if _, ok := sc.value("baton_stream_consumer_ack_floor_seq", map[string]string{"consumer": c}); !ok {
				return false
			}
		}
		return true
	})
	require.Equal(t, http.StatusTooManyRequests, func() int {
		code := 0
		for range 20 {
			if code = s.post(s.flood, "/v1/conversations/flood/messages", fmt.Sprintf(`{"id":"f%d","content":"x"}`, time.Now().UnixNano())); code == http.StatusTooManyRequests {
				break
			}
		}
		return code
	}(), "the flood is refused by the message rate")

	t.Run("every series the dashboard and the alerts name is exported", func(t *testing.T) {
		exported := map[string][]string{}
		for _, p := range append(s.processes(), startAgentWorker(t)) {
			for n := range p.mustScrape(t).names() {
				exported[n] = append(exported[n], p.name)
			}
		}
		names := namesIn(append(dashboardExprs(t), alertExprs(t)...))
		require.NotEmpty(t, names)
		var missing []string
		for _, n := range names {
			if len(exported[n]) > 0 {
				continue
			}
			// A histogram named by itself is its _count and the rest.
			if len(exported[n+"_count"]) > 0 {
				continue
			}
			missing = append(missing, n)
		}
		require.Empty(t, missing, "named in %s or %s but exported by no process", dashboardFile, alertsFile)
	})

	t.Run("the alerts fire on the conditions they watch", func(t *testing.T) {
		fireAlerts(t, tool, s)
	})
}

// startAgentWorker starts a worker with an external agent (--agent
// ag-ui), which exports the baton_agent_* series from its start, on a
// database and NATS of its own: it takes no turn of the system's, and the
// system's alerts never see it.
func startAgentWorker(t *testing.T) *process {
	t.Helper()
	db, ns := testenv.Database(t), testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionStream(context.Background(), js, batonnats.StreamConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	dir := t.TempDir()
	key := filepath.Join(dir, "agent-signing-key.pem")
	_, err = jwtauth.CreateKeyPair(key, filepath.Join(dir, "agent-signing-key.pub"), false)
	require.NoError(t, err)
	env := []string{"BATON_DATABASE_URL=" + db.URL, "BATON_NATS_URL=" + ns.URL, "BATON_LOG_FORMAT=json"}
	return start(t, testenv.BatonBinary(t), env, "agent-worker", "baton-worker", "worker",
		"--agent", "ag-ui", "--agent-url", "http://"+freeAddr(t)+"/agent", "--agent-signing-key", key)
}

// fireAlerts creates the conditions of the alerts on the real processes
// (a stopped group with a growing backlog, failing turns, parked events, a
// stopped relay, NATS gone), scrapes every process once per step, and
// hands the scrapes to promtool's rule tests as one sample a minute: the
// alert rules, evaluated over those samples, must fire as written.
func fireAlerts(t *testing.T, tool string, s *system) {
	wanted := map[string]bool{}
	for _, n := range namesIn(alertExprs(t)) {
		wanted[n] = true
	}
	type step map[*process]scrape
	var steps []step
	take := func() {
		st := step{}
		for _, p := range s.processes() {
			if sc, err := p.scrape(); err == nil {
				st[p] = sc
			}
		}
		steps = append(steps, st)
	}

	// The audit group stops; every step then adds events it does not read,
	// and a failed turn beside a replied one.
	s.audit.stop(t)
	const withRelay = 16
	floor := -1.0
	for i := range withRelay {
		before := counter(s.worker.mustScrape(t), "baton_turns_finished_total", map[string]string{"outcome": "failed"})
		pending := counter(s.relay.mustScrape(t), "baton_stream_consumer_pending_events", map[string]string{"consumer": "audit"})
		s.turn(fmt.Sprintf("hello %d", i))
		s.turn("/fail")
		s.worker.until(t, "the failed turn", func(sc scrape) bool {
			return counter(sc, "baton_turns_finished_total", map[string]string{"outcome": "failed"}) > before
		})
		sc := s.relay.until(t, "audit's backlog growing", func(sc scrape) bool {
			return counter(sc, "baton_stream_consumer_pending_events", map[string]string{"consumer": "audit"}) >= pending+2
		})
		f := counter(sc, "baton_stream_consumer_ack_floor_seq", map[string]string{"consumer": "audit"})
		if floor >= 0 {
			require.Equal(t, floor, f, "the stopped group's acknowledgement floor stands still")
		}
		floor = f
		take()
	}
	// The relay stops: no relay streams.
	s.relay.stop(t)
	for range 3 {
		take()
	}
	// NATS goes away: every process still running says so.
	s.nats.Stop()
	for _, p := range []*process{s.worker, s.api, s.webhook} {
		p.until(t, "NATS disconnected", func(sc scrape) bool {
			v, ok := sc.value("baton_nats_connected", nil)
			return ok && v == 0
		})
	}
	for range 8 {
		take()
	}

	// The scrapes as promtool's input series, one step a minute; a series
	// whose process stopped goes stale, as Prometheus marks a target that
	// no longer answers.
	values := map[string][]string{}
	for i, st := range steps {
		for p, sc := range st {
			for _, v := range sc {
				if !wanted[v.name] && !wanted[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(v.name, "_bucket"), "_sum"), "_count")] {
					continue
				}
				ls := map[string]string{"job": p.job, "instance": p.name}
				for k, lv := range v.labels {
					ls[k] = lv
				}
				key := series{name: v.name, labels: ls}.key()
				if values[key] == nil {
					values[key] = slices.Repeat([]string{"_"}, len(steps))
				}
				values[key][i] = strconv.FormatFloat(v.value, 'f', -1, 64)
			}
		}
	}
	var input []map[string]string
	for key, vs := range values {
		for i := 1; i < len(vs); i++ {
			if vs[i] == "_" && vs[i-1] != "_" && vs[i-1] != "stale" {
				vs[i] = "stale"
			}
		}
		input = append(input, map[string]string{"series": key, "values": strings.Join(vs, " ")})
	}
	sort.Slice(input, func(i, j int) bool { return input[i]["series"] < input[j]["series"] })

	rules := map[string]map[string]string{}
	labelsOf := map[string]map[string]string{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r.Annotations
			labelsOf[r.Alert] = r.Labels
		}
	}
	expect := func(alert string, at time.Duration, labels ...map[string]string) map[string]any {
		exp := []map[string]any{}
		for _, l := range labels {
			all := map[string]string{}
			for k, v := range labelsOf[alert] {
				all[k] = v
			}
			ann := map[string]string{}
			for k, v := range rules[alert] {
				for lk, lv := range l {
					v = strings.ReplaceAll(v, "{{ $labels."+lk+" }}", lv)
				}
				ann[k] = v
			}
			for k, v := range l {
				all[k] = v
			}
			exp = append(exp, map[string]any{"exp_labels": all, "exp_annotations": ann})
		}
		return map[string]any{"eval_time": fmt.Sprintf("%dm", int(at.Minutes())), "alertname": alert, "exp_alerts": exp}
	}
	relayGone := withRelay // the step at which the relay no longer answers
	natsGone := withRelay + 3
	tests := []map[string]any{
		// The audit group: events waiting, its floor still, 5 minutes.
		expect("BatonGroupStalled", 8*time.Minute, map[string]string{"consumer": "audit"}),
		// The webhook group parked every event.
		expect("BatonDeadLetters", 8*time.Minute, map[string]string{"group": "webhook"}),
		// Half of the turns fail, for 10 minutes.
		expect("BatonTurnFailureRate", time.Duration(withRelay-1)*time.Minute, map[string]string{}),
		// Not before the relay stopped; 2 minutes after.
		expect("BatonNoRelayStreaming", time.Duration(relayGone-1)*time.Minute),
		expect("BatonNoRelayStreaming", time.Duration(relayGone+2)*time.Minute, map[string]string{}),
		// Every process still running lost NATS.
		expect("BatonNATSUnreachable", time.Duration(natsGone-1)*time.Minute),
		expect("BatonNATSUnreachable", time.Duration(len(steps)-1)*time.Minute,
			map[string]string{"job": "baton-api", "instance": "api"},
			map[string]string{"job": "baton-group", "instance": "webhook"},
			map[string]string{"job": "baton-worker", "instance": "worker"}),
	}
	abs, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	doc := map[string]any{
		"rule_files":          []string{abs},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":        "1m",
			"input_series":    input,
			"alert_rule_test": tests,
		}},
	}
	b, err := yaml.Marshal(doc)
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "alerts_test.yml")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	out, err := exec.Command(tool, "test", "rules", f).CombinedOutput()
	if err != nil {
		_ = os.WriteFile(filepath.Join(os.TempDir(), "baton-alerts-test.yml"), b, 0o600)
	}
	require.NoError(t, err, "promtool test rules on the scraped samples (kept in %s):\n%s", filepath.Join(os.TempDir(), "baton-alerts-test.yml"), out)
}

// TestTheSlotAlertFiresOnAStallWhileWALGrowsAndOnlyThen feeds promtool the
// series a standby relay exports while the streaming relay hangs: the
// stall that baton_relay_slot_stalled_seconds measures takes minutes to
// reach the alert's threshold, longer than a test against real processes
// should wait, so the samples are written here, a minute apart, as a
// relay's gauges would read them. The alert fires once the slot stood
// still for more than 5 minutes, and 5 more, while the retained WAL grows;
// a slot that stands still with no WAL behind it (an idle database) never
// fires it.
func TestTheSlotAlertFiresOnAStallWhileWALGrowsAndOnlyThen(t *testing.T) {
	t.Parallel()
	tool := promtool(t)
	var stalled, growing, flat []string
	for m := range 16 {
		stalled = append(stalled, strconv.Itoa(m*60))
		growing = append(growing, strconv.Itoa(1_000_000+m*5_000_000))
		flat = append(flat, "1000000")
	}
	labels := `{job="baton-relay", instance="relay2"}`
	alert := func(wal []string, at time.Duration, fires bool) map[string]any {
		var rule map[string]string
		var ruleLabels map[string]string
		for _, g := range readRules(t).Groups {
			for _, r := range g.Rules {
				if r.Alert == "BatonSlotNotAdvancing" {
					rule, ruleLabels = r.Annotations, r.Labels
				}
			}
		}
		require.NotNil(t, rule, "the alert is in %s", alertsFile)
		exp := []map[string]any{}
		if fires {
			exp = append(exp, map[string]any{"exp_labels": ruleLabels, "exp_annotations": rule})
		}
		return map[string]any{
			"interval": "1m",
			"input_series": []map[string]string{
				{"series": "baton_relay_slot_stalled_seconds" + labels, "values": strings.Join(stalled, " ")},
				{"series": "baton_relay_retained_wal_bytes" + labels, "values": strings.Join(wal, " ")},
			},
			"alert_rule_test": []map[string]any{{
				"eval_time": fmt.Sprintf("%dm", int(at.Minutes())), "alertname": "BatonSlotNotAdvancing", "exp_alerts": exp,
			}},
		}
	}
	abs, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	b, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{abs},
		"evaluation_interval": "1m",
		"tests": []any{
			// Stalled past 300 s at minute 6; pending 5 minutes more.
			alert(growing, 10*time.Minute, false),
			alert(growing, 12*time.Minute, true),
			// No WAL waits: an idle database's slot stands still too.
			alert(flat, 15*time.Minute, false),
		},
	})
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "slot_alert_test.yml")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	out, err := exec.Command(tool, "test", "rules", f).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s\n%s", b, out)
}

// TestTheAgentAlertFiresWhenMostStepRequestsFailAndOnlyThen feeds promtool
// the series a worker with an external agent exports, a minute apart: an
// agent that refuses every connection for ten minutes and then answers
// again, and one that fails one request in seven. The alert fires after
// five minutes of the first, clears once its answers outweigh its
// failures, and never fires for the second.
func TestTheAgentAlertFiresWhenMostStepRequestsFailAndOnlyThen(t *testing.T) {
	t.Parallel()
	tool := promtool(t)
	var rule, ruleLabels map[string]string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "BatonAgentFailing" {
				rule, ruleLabels = r.Annotations, r.Labels
			}
		}
	}
	require.NotNil(t, rule, "the alert is in %s", alertsFile)
	// Counters a minute apart: step per minute for the first minutes,
	// then after per minute.
	counter := func(step, after, minutes, switchAt int) string {
		var vs []string
		v := 0
		for m := range minutes {
			vs = append(vs, strconv.Itoa(v))
			if m < switchAt {
				v += step
			} else {
				v += after
			}
		}
		return strings.Join(vs, " ")
	}
	const minutes = 30
	labels := func(protocol, kind, value string) string {
		return fmt.Sprintf(`{job="baton-worker", instance="worker", protocol=%q, %s=%q}`, protocol, kind, value)
	}
	input := []map[string]string{
		// ag-ui: refused for 10 minutes (3 requests a minute, each failing), then answering.
		{"series": "baton_agent_requests_total" + labels("ag-ui", "class", "transport"), "values": counter(3, 0, minutes, 10)},
		{"series": "baton_agent_errors_total" + labels("ag-ui", "reason", "agent_unavailable"), "values": counter(3, 0, minutes, 10)},
		{"series": "baton_agent_requests_total" + labels("ag-ui", "class", "2xx"), "values": counter(0, 60, minutes, 10)},
		// ai-sdk: one 5xx, retried, in seven requests.
		{"series": "baton_agent_requests_total" + labels("ai-sdk", "class", "2xx"), "values": counter(60, 60, minutes, 0)},
		{"series": "baton_agent_requests_total" + labels("ai-sdk", "class", "5xx"), "values": counter(10, 10, minutes, 0)},
		{"series": "baton_agent_errors_total" + labels("ai-sdk", "reason", "agent_unavailable"), "values": counter(10, 10, minutes, 0)},
	}
	ann := map[string]string{}
	for k, v := range rule {
		ann[k] = strings.ReplaceAll(v, "{{ $labels.protocol }}", "ag-ui")
	}
	firing := map[string]any{"exp_labels": map[string]string{"severity": ruleLabels["severity"], "protocol": "ag-ui"}, "exp_annotations": ann}
	at := func(m int, alerts ...map[string]any) map[string]any {
		if alerts == nil {
			alerts = []map[string]any{}
		}
		return map[string]any{"eval_time": fmt.Sprintf("%dm", m), "alertname": "BatonAgentFailing", "exp_alerts": alerts}
	}
	abs, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	b, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{abs},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": input,
			"alert_rule_test": []map[string]any{
				// Failing since the first minute: pending, not firing yet.
				at(4),
				// Five minutes of failures.
				at(8, firing),
				// Answering again from minute 10: the 5-minute rate turns.
				at(16),
				// ai-sdk, failing one request in seven, never fires.
				at(minutes - 1),
			},
		}},
	})
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "agent_alert_test.yml")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	out, err := exec.Command(tool, "test", "rules", f).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s\n%s", b, out)
}

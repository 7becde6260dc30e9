// Package netns gives the fault tests a network of their own, made of
// Linux network namespaces: each process runs in a namespace with one
// address and one link (a veth pair) to a bridge that the test controls,
// so that a link can be taken down, cut from some addresses, made to
// lose packets or delayed (delay.go), while every process stays alive. It
// needs root, ip, nft and iptables; New says which is missing.
package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Network is a test's own network, made of Linux network namespaces:
// each process of the test (in the kill test every NATS node, relay,
// worker and the API) runs in a namespace of its own, with one address,
// joined to a bridge by a link (a veth pair) that the test controls. The
// bridge lives in a namespace of its own too (the hub), which one more
// link joins to the test's namespace, where the servers the processes
// share (PostgreSQL) run and the test drives the load. Nothing is routed out:
// the addresses come from 198.18.0.0/15, the range set aside for
// benchmark networks, and the bridge has no uplink.
//
// Deleting a namespace deletes its end of every link, and a link goes with
// either end, so Close, which deletes every namespace the run made, leaves
// nothing behind. A run that was killed before it could close is cleaned
// up by the next one: every namespace's name carries the process id of
// the test that made it.
type Network struct {
	// id names the network's namespaces (baton-net-<pid>-<k>-...).
	id     string
	subnet int // the third byte of 198.18.<subnet>.0/24
	// hostIf is the test's end of its link to the hub.
	hostIf string

	mu    sync.Mutex
	nodes []*Node
	made  []string // namespaces made, hub first
	next  int      // last host byte handed out
}

// Node is one process's namespace and its link to the bridge.
type Node struct {
	// Name is the process's name, such as worker1.
	Name string
	// NS is the namespace's name, for ip netns exec.
	NS string
	// IP is the node's address.
	IP string
	// link is the hub's end of the node's link, on the bridge.
	link string
}

const netnsPrefix = "baton-net-"

// made counts the networks this process made, to name each apart.
var made atomic.Int64

// ErrNotRoot is why a test that is not root cannot make its network.
var ErrNotRoot = errors.New("network faults need root: the processes run in network namespaces of their own (ip netns) so that their links can be cut, slowed and made to drop packets; run as root")

// New makes the hub and the test's link to it. It fails, saying
// what is missing, when the test is not root or lacks ip, nft or
// iptables.
func New() (*Network, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	for _, tool := range []string{"ip", "nft", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("network faults need %s to make and cut the network (install it: scripts/install-deps.sh chaos): %w", tool, err)
		}
	}
	cleanStaleNamespaces()
	pid := os.Getpid()
	k := made.Add(1)
	n := &Network{id: fmt.Sprintf("%s%d-%d", netnsPrefix, pid, k), hostIf: hostLink(pid, k)}
	// A subnet no other run on this machine uses now.
	used := map[int]bool{}
	if out, err := exec.Command("ip", "-o", "-4", "addr", "show").Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if s, ok := strings.CutPrefix(f, "198.18."); ok {
				if b, _, ok := strings.Cut(s, "."); ok {
					v, _ := strconv.Atoi(b)
					used[v] = true
				}
			}
		}
	}
	n.subnet = -1
	for i := range 250 {
		if c := (pid + i) % 250; !used[c] {
			n.subnet = c
			break
		}
	}
	if n.subnet < 0 {
		return nil, errors.New("no free subnet in 198.18.0.0/16 for the run's network")
	}
	hub := n.id + "-hub"
	steps := [][]string{
		{"netns", "add", hub},
		{"-n", hub, "link", "add", "br0", "type", "bridge"},
		{"-n", hub, "link", "set", "br0", "up"},
		{"-n", hub, "link", "set", "lo", "up"},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", "host", "netns", hub},
		{"-n", hub, "link", "set", "host", "master", "br0", "up"},
		{"addr", "add", n.HostIP() + "/24", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
	}
	n.made = append(n.made, hub)
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// HostIP is the test's address, where PostgreSQL listens for the
// processes.
func (n *Network) HostIP() string { return fmt.Sprintf("198.18.%d.1", n.subnet) }

// CIDR is the run's subnet.
func (n *Network) CIDR() string { return fmt.Sprintf("198.18.%d.0/24", n.subnet) }

// Add makes a namespace for the process name, with its link to the bridge.
func (n *Network) Add(name string) (*Node, error) {
	n.mu.Lock()
	n.next++
	i := n.next
	n.mu.Unlock()
	node := &Node{Name: name, NS: n.id + "-" + name, IP: fmt.Sprintf("198.18.%d.%d", n.subnet, 10+i), link: fmt.Sprintf("n%d", i)}
	hub := n.id + "-hub"
	n.mu.Lock()
	n.made = append(n.made, node.NS)
	n.mu.Unlock()
	for _, s := range [][]string{
		{"netns", "add", node.NS},
		{"-n", node.NS, "link", "set", "lo", "up"},
		{"-n", hub, "link", "add", node.link, "type", "veth", "peer", "name", "eth0", "netns", node.NS},
		{"-n", hub, "link", "set", node.link, "master", "br0", "up"},
		{"-n", node.NS, "addr", "add", node.IP + "/24", "dev", "eth0"},
		{"-n", node.NS, "link", "set", "eth0", "up"},
	} {
		if err := ipCmd(s...); err != nil {
			return nil, fmt.Errorf("namespace of %s: %w", name, err)
		}
	}
	n.mu.Lock()
	n.nodes = append(n.nodes, node)
	n.mu.Unlock()
	return node, nil
}

// Command runs bin with args in the node's namespace: ip netns exec
// execs the program, so the process is bin itself, with its own pid.
func (node *Node) Command(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", node.NS, bin}, args...)
}

// Do runs f on a thread that has entered the node's namespace: a socket
// f makes belongs to the namespace, whichever thread uses it later.
func (node *Node) Do(f func() error) error {
	done := make(chan error, 1)
	go func() {
		// If the thread cannot come back to its namespace, it stays
		// locked and ends with this goroutine.
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer self.Close()
		target, err := os.Open("/var/run/netns/" + node.NS)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter %s: %w", node.NS, err)
			return
		}
		err = f()
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// SetLink takes the node's link down or up: with it down, nothing reaches
// the node or leaves it, and its connections see silence, not a refusal.
func (n *Network) SetLink(node *Node, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ipCmd("-n", n.id+"-hub", "link", "set", node.link, state)
}

// Filter replaces the node's packet filter (nftables, in the node's
// namespace) with rules, each an nft rule of the input or output chain
// ("in ..." or "out ..."); no rules heals it.
func (node *Node) Filter(rules ...string) error {
	var b strings.Builder
	b.WriteString("table inet chaos\ndelete table inet chaos\n")
	if len(rules) > 0 {
		b.WriteString("table inet chaos {\n")
		b.WriteString("  chain in { type filter hook input priority 0; policy accept;\n")
		for _, r := range rules {
			if s, ok := strings.CutPrefix(r, "in "); ok {
				b.WriteString("    " + s + "\n")
			}
		}
		b.WriteString("  }\n  chain out { type filter hook output priority 0; policy accept;\n")
		for _, r := range rules {
			if s, ok := strings.CutPrefix(r, "out "); ok {
				b.WriteString("    " + s + "\n")
			}
		}
		b.WriteString("  }\n}\n")
	}
	cmd := exec.Command("ip", "netns", "exec", node.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s", node.NS, err, bytes.TrimSpace(out))
	}
	return nil
}

// CutFrom drops every packet between the node and the addresses, on the
// ports given (every port when none), both ways.
func CutFrom(ips []string, ports ...int) []string {
	set := "{ " + strings.Join(ips, ", ") + " }"
	if len(ports) == 0 {
		return []string{"in ip saddr " + set + " drop", "out ip daddr " + set + " drop"}
	}
	ps := make([]string, len(ports))
	for i, p := range ports {
		ps[i] = strconv.Itoa(p)
	}
	pset := "{ " + strings.Join(ps, ", ") + " }"
	return []string{"in ip saddr " + set + " tcp sport " + pset + " drop", "out ip daddr " + set + " tcp dport " + pset + " drop"}
}

// Loss drops percent of the packets in the given direction ("in", "out"
// or both).
func Loss(percent int, directions ...string) []string {
	var out []string
	for _, d := range directions {
		out = append(out, fmt.Sprintf("%s numgen random mod 100 < %d drop", d, percent))
	}
	return out
}

// Close deletes every namespace the run made, and with them every link.
func (n *Network) Close() {
	n.mu.Lock()
	made := n.made
	n.made = nil
	n.mu.Unlock()
	for i := len(made) - 1; i >= 0; i-- {
		_ = ipCmd("netns", "delete", made[i])
	}
	// The test's end goes with the hub's; this only reports a leftover.
	_ = exec.Command("ip", "link", "delete", n.hostIf).Run()
}

// cleanStaleNamespaces deletes the namespaces of runs whose harness is
// gone (killed before it could clean up).
func cleanStaleNamespaces() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, netnsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || processAlive(pid) {
			continue
		}
		_ = ipCmd("netns", "delete", name)
		if hub, ok := strings.CutSuffix(rest, "-hub"); ok {
			_, kText, _ := strings.Cut(hub, "-")
			if k, err := strconv.ParseInt(kText, 10, 64); err == nil {
				_ = exec.Command("ip", "link", "delete", hostLink(pid, k)).Run()
			}
		}
	}
}

// hostLink names the test's end of the link to the hub of network k of
// process pid (at most 15 characters, as the kernel requires).
func hostLink(pid int, k int64) string { return fmt.Sprintf("bc%dn%d", pid, k) }

func processAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

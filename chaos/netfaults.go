package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/netns"
)

// network injects a network fault: it spoils a link for a while, then
// heals it and records when. Every process stays alive: what the fault
// tests is that each rides it out, and that a worker cut off while it
// holds turns never writes after another took them over.
func (in *injector) network(ctx context.Context, r *faultRecord) {
	s := in.sys
	hold := time.Duration(3000+in.rng.IntN(3000)) * time.Millisecond
	var node *netns.Node
	var rules []string
	linkDown := false
	var delay time.Duration
	var natsIPs []string
	for _, n := range s.nats {
		natsIPs = append(natsIPs, n.node.IP)
	}
	pg := netns.CutFrom([]string{s.net.HostIP()}, s.pgPorts...)
	switch r.kind {
	case FaultNATSPartition:
		i := in.rng.IntN(len(s.nats))
		node = s.nats[i].node
		var others []string
		for j, n := range s.nats {
			if j != i {
				others = append(others, n.node.IP)
			}
		}
		rules = netns.CutFrom(others)
		r.note = "cut from the other two NATS nodes (clients still reach it)"
	case FaultNATSLeaderCut:
		i := s.streamLeader(ctx)
		if i < 0 {
			i = in.rng.IntN(len(s.nats))
			r.note = "stream leader not found; "
		}
		node = s.nats[i].node
		linkDown = true
		r.note += "the stream leader's link down"
	case FaultRelayCutNATS, FaultRelayCutPostgres:
		i, err := s.activeRelay(ctx)
		if err != nil {
			i = in.rng.IntN(len(s.relays))
			r.note = "no active relay found; "
		}
		node = s.relays[i].node
		if r.kind == FaultRelayCutNATS {
			rules = netns.CutFrom(natsIPs)
			r.note += "the active relay cut from NATS"
		} else {
			rules = pg
			r.note += "the active relay cut from PostgreSQL"
		}
	case FaultWorkerCutPostgres:
		// Longer than the server takes to find the connections dead (its
		// TCP keepalives, about 11 s): the other workers take the cut-off
		// worker's turns over, and it must write nothing of them once its
		// link is back.
		hold = time.Duration(14000+in.rng.IntN(4000)) * time.Millisecond
		w := s.busiestWorker(ctx)
		node = w.node
		rules = pg
		r.note = "a worker holding turns cut from PostgreSQL"
	case FaultAPICutNATS:
		node = s.api.node
		rules = netns.CutFrom(natsIPs)
		r.note = "the API cut from NATS"
	case FaultLinkDelay:
		node = in.lossTarget()
		rules = netns.Loss(5, "in", "out")
		delay = linkDelay
		hold = time.Duration(8000+in.rng.IntN(4000)) * time.Millisecond
		r.note = fmt.Sprintf("every packet held %s each way and 5%% dropped both ways", linkDelay)
	case FaultOneWayLoss:
		node = in.lossTarget()
		rules = netns.Loss(50, "in")
		hold = time.Duration(6000+in.rng.IntN(4000)) * time.Millisecond
		r.note = "50% of incoming packets dropped, none outgoing"
	case FaultWorkerCutAgent:
		// Longer than the workers wait for an agent's first byte or its
		// next event: the steps in flight time out and are posted again.
		hold = time.Duration(6000+in.rng.IntN(3000)) * time.Millisecond
		node = s.busiestAgentWorker().node
		var ports []int
		for _, a := range s.agents {
			ports = append(ports, a.rec.port())
		}
		rules = netns.CutFrom([]string{s.net.HostIP()}, ports...)
		r.note = "a worker with steps in flight cut from its agent"
	case FaultAgentLinkDelay:
		node = s.agents[in.rng.IntN(len(s.agents))].node
		rules = netns.Loss(5, "in", "out")
		delay = linkDelay
		hold = time.Duration(8000+in.rng.IntN(4000)) * time.Millisecond
		r.note = fmt.Sprintf("every packet of an agent held %s each way and 5%% dropped both ways", linkDelay)
	case FaultAgentCut:
		node = s.agents[in.rng.IntN(len(s.agents))].node
		linkDown = true
		r.note = "an agent's link down"
	}
	r.target = node.Name
	var err error
	var delayed *netns.Delay
	if linkDown {
		err = s.net.SetLink(node, false)
	} else {
		err = node.Filter(rules...)
	}
	if err == nil && delay > 0 {
		delayed, err = node.Delay(delay)
	}
	r.at = time.Now()
	if err != nil {
		_ = node.Filter()
		r.failed = true
		r.note += "; COULD NOT SPOIL THE LINK: " + firstLine(err.Error())
		return
	}
	in.sleep(ctx, hold)
	if linkDown {
		err = s.net.SetLink(node, true)
	} else {
		err = node.Filter()
	}
	if delayed != nil {
		if derr := delayed.Stop(); err == nil {
			err = derr
		}
	}
	r.healed = time.Now()
	if err != nil {
		r.failed = true
		r.note += "; COULD NOT HEAL THE LINK: " + firstLine(err.Error())
		return
	}
	r.note += fmt.Sprintf(" for %s, then healed", r.healed.Sub(r.at).Round(time.Millisecond))
	if strings.HasPrefix(string(r.kind), "nats_") || strings.HasPrefix(node.Name, "nats") {
		if state, ok := s.waitStreamHealthy(ctx, 20*time.Second); !ok {
			r.note += "; stream replicas not current within 20s: " + state
		}
	}
}

// linkDelay is how long link_delay holds each packet, each way.
const linkDelay = 200 * time.Millisecond

// lossTarget is a NATS node or a worker, at random.
func (in *injector) lossTarget() *netns.Node {
	s := in.sys
	if in.rng.IntN(2) == 0 {
		return s.nats[in.rng.IntN(len(s.nats))].node
	}
	return s.workers[in.rng.IntN(len(s.workers))].node
}

// streamLeader returns the index of the NATS node that leads the outbox
// stream, or -1.
func (s *system) streamLeader(ctx context.Context) int {
	state, _ := s.waitStreamHealthy(ctx, 5*time.Second)
	leader, _, _ := strings.Cut(strings.TrimPrefix(state, "leader "), ",")
	for i := range s.nats {
		if leader == fmt.Sprintf("n%d", i+1) {
			return i
		}
	}
	return -1
}

// busiestWorker is the worker running the most turns now (by the process
// id its default name ends in), or the first.
func (s *system) busiestWorker(ctx context.Context) *process {
	best, most := s.workers[0], -1
	for _, w := range s.workers {
		w.mu.Lock()
		cmd := w.cmd
		w.mu.Unlock()
		if cmd == nil || cmd.Process == nil {
			continue
		}
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM agent_runs WHERE status = 'running' AND worker LIKE '%-' || $1::text`,
			cmd.Process.Pid).Scan(&n); err == nil && n > most {
			best, most = w, n
		}
	}
	return best
}

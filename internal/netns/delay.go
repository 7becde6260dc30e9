package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A delayed link holds every packet that enters or leaves a node's
// namespace through its link for a fixed time before the kernel lets it
// go on, both ways, so a round trip over the link takes twice the delay
// longer. The kernel of the build machine has no netem queueing
// discipline (nor fq, whose pacing could do it), so the delay is made in
// user space: a rule of iptables in the node's namespace (the NFQUEUE
// target, nft's own queue statement is not built into that kernel either)
// hands each packet to a netfilter queue, which this process reads over
// netlink and answers, once the packet's time has come, with the verdict
// that lets it through.
//
// What it is: a real delay of every IP packet of the link, in both
// directions, TCP handshakes, acknowledgements and keepalives included,
// in the order the packets came (no reordering), below TCP, so the
// processes' TCP sees a longer round trip and paces and retransmits
// accordingly. What it is not: no jitter, no reordering, no bandwidth
// limit; a packet that arrives while the queue holds QueueMax packets is
// let through at once (fail-open) rather than dropped. Loss comes from the
// node's nft filter (Loss), which acts apart from the delay.

// nfnetlink and nfqueue constants (linux/netfilter/nfnetlink_queue.h).
const (
	nfnlSubsysQueue     = 3
	nfqnlMsgPacket      = 0
	nfqnlMsgVerdictBat  = 3
	nfqnlMsgConfig      = 2
	nfqaCfgCmd          = 1
	nfqaCfgParams       = 2
	nfqaCfgQueueMaxlen  = 3
	nfqaCfgMask         = 4
	nfqaCfgFlags        = 5
	nfqaPacketHdr       = 1
	nfqaVerdictHdr      = 2
	nfqnlCfgCmdBind     = 1
	nfqnlCopyMeta       = 1
	nfqaCfgFFailOpen    = 1
	nfAccept            = 1
	netlinkNoENOBUFS    = 5
	delayQueueNum       = 0
	delayQueueMax       = 1 << 16
	delayReceiveTimeout = 100 * time.Millisecond
)

// Delay is a delayed link (see above); Stop ends it.
type Delay struct {
	node  *Node
	by    time.Duration
	fd    int
	rules [][]string

	stop     chan struct{}
	wg       sync.WaitGroup
	held     chan heldPacket
	stopOnce sync.Once
	mu       sync.Mutex
	err      error // the first error the queue met
}

type heldPacket struct {
	id  uint32
	due time.Time
}

// Delay delays every packet of the node's link by d, both ways, until
// Stop. It needs iptables (scripts/install-deps.sh chaos).
func (node *Node) Delay(d time.Duration) (*Delay, error) {
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil, fmt.Errorf("a delayed link needs iptables, whose NFQUEUE target hands the packets over (install it: scripts/install-deps.sh chaos): %w", err)
	}
	fd, err := node.netlinkSocket()
	if err != nil {
		return nil, err
	}
	dl := &Delay{node: node, by: d, fd: fd, stop: make(chan struct{}), held: make(chan heldPacket, delayQueueMax)}
	if err := dl.configure(); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netfilter queue in %s: %w", node.NS, err)
	}
	dl.wg.Add(2)
	go dl.read()
	go dl.release()
	// The queue is read before any packet goes to it; with
	// --queue-bypass a packet would pass undelayed, never stall, if it
	// were not.
	for _, chain := range [][]string{{"INPUT", "-i"}, {"OUTPUT", "-o"}} {
		rule := []string{chain[0], chain[1], "eth0", "-j", "NFQUEUE", "--queue-num", fmt.Sprint(delayQueueNum), "--queue-bypass"}
		if err := node.iptables(append([]string{"-A"}, rule...)...); err != nil {
			_ = dl.Stop()
			return nil, err
		}
		dl.rules = append(dl.rules, rule)
	}
	return dl, nil
}

// Stop takes the rules away, lets every held packet go on at once and
// closes the queue. It returns the first error the queue met.
func (dl *Delay) Stop() error {
	var err error
	dl.stopOnce.Do(func() {
		for _, rule := range dl.rules {
			if e := dl.node.iptables(append([]string{"-D"}, rule...)...); e != nil && err == nil {
				err = e
			}
		}
		close(dl.stop)
		dl.wg.Wait()
		unix.Close(dl.fd)
		dl.mu.Lock()
		defer dl.mu.Unlock()
		if err == nil {
			err = dl.err
		}
	})
	return err
}

func (node *Node) iptables(args ...string) error {
	out, err := exec.Command("ip", append([]string{"netns", "exec", node.NS, "iptables", "-w"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s in %s: %w: %s", strings.Join(args, " "), node.NS, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// netlinkSocket opens a netfilter netlink socket in the node's namespace:
// a socket belongs to the namespace it was made in, whichever thread
// uses it later.
func (node *Node) netlinkSocket() (int, error) {
	fd := -1
	err := node.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("netlink socket in %s: %w", node.NS, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, netlinkNoENOBUFS, 1)
	tv := unix.NsecToTimeval(delayReceiveTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// configure binds the queue and asks for the packets' metadata only (the
// id is all a verdict needs), a long queue and fail-open.
func (dl *Delay) configure() error {
	cmd := []byte{nfqnlCfgCmdBind, 0, 0, 0} // command, pad, protocol family (any)
	if err := dl.request(nfqnlMsgConfig, attr(nfqaCfgCmd, cmd)); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	params := binary.BigEndian.AppendUint32(nil, 0) // copy range
	params = append(params, nfqnlCopyMeta)
	var body []byte
	body = append(body, attr(nfqaCfgParams, params)...)
	body = append(body, attr(nfqaCfgQueueMaxlen, binary.BigEndian.AppendUint32(nil, delayQueueMax))...)
	body = append(body, attr(nfqaCfgMask, binary.BigEndian.AppendUint32(nil, nfqaCfgFFailOpen))...)
	body = append(body, attr(nfqaCfgFlags, binary.BigEndian.AppendUint32(nil, nfqaCfgFFailOpen))...)
	if err := dl.request(nfqnlMsgConfig, body); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}

// request sends a configuration message and waits for its acknowledgement.
func (dl *Delay) request(msgType uint16, attrs []byte) error {
	if err := dl.send(msgType, unix.NLM_F_REQUEST|unix.NLM_F_ACK, attrs); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(dl.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					return unix.Errno(-code)
				}
				return nil
			}
		}
	}
	return errors.New("no acknowledgement within 5s")
}

// send writes one nfqueue message for the delay's queue.
func (dl *Delay) send(msgType uint16, flags uint16, attrs []byte) error {
	msg := make([]byte, unix.NLMSG_HDRLEN+4, unix.NLMSG_HDRLEN+4+len(attrs))
	msg = append(msg, attrs...)
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], nfnlSubsysQueue<<8|msgType)
	binary.NativeEndian.PutUint16(msg[6:8], flags)
	// nfgenmsg: family (unspecified), version 0, the queue number.
	binary.BigEndian.PutUint16(msg[unix.NLMSG_HDRLEN+2:], delayQueueNum)
	return unix.Sendto(dl.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// attr encodes one netlink attribute, padded to four bytes.
func attr(typ uint16, data []byte) []byte {
	b := make([]byte, 4, 4+len(data)+3)
	binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(data)))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// read takes each queued packet's id and holds it until it is due.
func (dl *Delay) read() {
	defer dl.wg.Done()
	defer close(dl.held)
	buf := make([]byte, 1<<16)
	for {
		select {
		case <-dl.stop:
			return
		default:
		}
		n, _, err := unix.Recvfrom(dl.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
			continue
		}
		if err != nil {
			dl.fail(err)
			return
		}
		now := time.Now()
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			dl.fail(err)
			return
		}
		for _, m := range msgs {
			if m.Header.Type != nfnlSubsysQueue<<8|nfqnlMsgPacket || len(m.Data) < 4 {
				continue
			}
			if id, ok := packetID(m.Data[4:]); ok {
				dl.held <- heldPacket{id: id, due: now.Add(dl.by)}
			}
		}
	}
}

// packetID reads the packet id from a packet message's attributes.
func packetID(attrs []byte) (uint32, bool) {
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs[0:2]))
		typ := binary.NativeEndian.Uint16(attrs[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < 4 || l > len(attrs) {
			return 0, false
		}
		if typ == nfqaPacketHdr && l >= 8 {
			return binary.BigEndian.Uint32(attrs[4:8]), true
		}
		attrs = attrs[min((l+3)&^3, len(attrs)):]
	}
	return 0, false
}

// release lets packets go on in the order they came, each once it is due:
// one batch verdict accepts every packet up to an id.
func (dl *Delay) release() {
	defer dl.wg.Done()
	for p := range dl.held {
		dl.waitUntil(p.due)
		last := p.id
		for q, ok := dl.next(); ok; q, ok = dl.next() {
			if time.Now().Before(q.due) {
				dl.accept(last)
				dl.waitUntil(q.due)
			}
			last = q.id
		}
		dl.accept(last)
	}
}

// next returns the next held packet if one is there now.
func (dl *Delay) next() (heldPacket, bool) {
	select {
	case q, ok := <-dl.held:
		return q, ok
	default:
		return heldPacket{}, false
	}
}

// waitUntil waits until t, or not at all once the delay stops.
func (dl *Delay) waitUntil(t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-dl.stop:
	}
}

// accept lets every queued packet up to id go on.
func (dl *Delay) accept(id uint32) {
	hdr := binary.BigEndian.AppendUint32(nil, nfAccept)
	hdr = binary.BigEndian.AppendUint32(hdr, id)
	if err := dl.send(nfqnlMsgVerdictBat, unix.NLM_F_REQUEST, attr(nfqaVerdictHdr, hdr)); err != nil {
		dl.fail(err)
	}
}

func (dl *Delay) fail(err error) {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.err == nil {
		dl.err = err
	}
}

package bench

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Wire is a TCP proxy in front of PostgreSQL that counts what its clients
// ask of the server, read off the frontend/backend protocol, whatever the
// client library and whichever binary: it measures a process that cannot
// be instrumented, such as a binary built from an earlier commit. Clients
// must not use TLS (sslmode=disable), or there is nothing to read.
type Wire struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	statements, control, roundTrips, transactions atomic.Int64
}

// WireCounts is what clients asked of the server through a Wire.
type WireCounts struct {
	// Statements are executed statements, without transaction control
	// (BEGIN, COMMIT, ROLLBACK).
	Statements int64
	// Control are BEGIN, COMMIT and ROLLBACK.
	Control int64
	// RoundTrips are requests a client sent and then waited for the
	// server's answer to (a Sync or a simple query after the connection
	// was idle), statement preparations included.
	RoundTrips int64
	// Transactions are transactions that ran a statement: explicit
	// blocks and single statements alike.
	Transactions int64
}

// Sub returns c minus o.
func (c WireCounts) Sub(o WireCounts) WireCounts {
	return WireCounts{c.Statements - o.Statements, c.Control - o.Control, c.RoundTrips - o.RoundTrips, c.Transactions - o.Transactions}
}

// NewWire listens on a free port of 127.0.0.1 and forwards every
// connection to target (host:port), until tb ends.
func NewWire(tb testing.TB, target string) *Wire {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	w := &Wire{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	w.wg.Go(w.accept)
	tb.Cleanup(w.close)
	return w
}

// Addr is the proxy's host:port.
func (w *Wire) Addr() string { return w.ln.Addr().String() }

// Counts returns the counts so far.
func (w *Wire) Counts() WireCounts {
	return WireCounts{w.statements.Load(), w.control.Load(), w.roundTrips.Load(), w.transactions.Load()}
}

func (w *Wire) close() {
	_ = w.ln.Close()
	w.mu.Lock()
	for c := range w.conns {
		_ = c.Close()
	}
	w.conns = nil
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *Wire) track(c net.Conn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conns == nil {
		return false
	}
	w.conns[c] = struct{}{}
	return true
}

func (w *Wire) accept() {
	for {
		client, err := w.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", w.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !w.track(client) || !w.track(server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		c := newWireConn(w)
		w.wg.Go(func() {
			c.pipe(client, server, &c.client)
			_ = server.Close()
		})
		w.wg.Go(func() {
			c.pipe(server, client, &c.server)
			_ = client.Close()
		})
	}
}

// wireConn is one proxied connection's protocol state.
type wireConn struct {
	w *Wire
	// sslAsked: the client asked for TLS (or GSS) and the server's
	// one-byte answer is next.
	sslAsked atomic.Bool
	// idle: the server's last message was ReadyForQuery, so the client's
	// next message starts a round trip.
	idle atomic.Bool
	// ran: a statement ran since the last ReadyForQuery outside a
	// transaction block.
	ran atomic.Bool
	// startup: the client has not sent its startup message yet, and its
	// packets have no type byte. Only the client's reader uses it.
	startup bool

	client, server messages
}

func newWireConn(w *Wire) *wireConn {
	c := &wireConn{w: w, startup: true}
	c.client = messages{untyped: func() bool { return c.startup }, rawByte: func() bool { return false }, onMsg: c.clientMessage}
	c.server = messages{untyped: func() bool { return false }, rawByte: c.sslAsked.Load, onMsg: c.serverMessage}
	return c
}

// Startup packet codes that precede the startup message.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
	cancelRequest = 80877102
)

func (c *wireConn) clientMessage(typ byte, body []byte) {
	if typ == 0 {
		if len(body) >= 4 {
			switch binary.BigEndian.Uint32(body[:4]) {
			case sslRequest, gssEncRequest:
				c.sslAsked.Store(true)
				return
			case cancelRequest:
				return
			}
		}
		c.startup = false
		return
	}
	if c.idle.CompareAndSwap(true, false) {
		c.w.roundTrips.Add(1)
	}
	switch typ {
	case 'E': // Execute
		c.w.statements.Add(1)
		c.ran.Store(true)
	case 'Q': // simple query
		if isControl(body) {
			c.w.control.Add(1)
		} else {
			c.w.statements.Add(1)
		}
		c.ran.Store(true)
	}
}

func (c *wireConn) serverMessage(typ byte, body []byte) {
	switch typ {
	case '!': // the one-byte answer to a TLS request
		c.sslAsked.Store(false)
	case 'Z': // ReadyForQuery, with the transaction status
		if len(body) > 0 && body[0] == 'I' && c.ran.Swap(false) {
			c.w.transactions.Add(1)
		}
		c.idle.Store(true)
	}
}

// isControl reports whether a simple query is transaction control or a
// connection check rather than a statement of the application.
func isControl(body []byte) bool {
	q := strings.ToLower(strings.TrimSpace(strings.TrimRight(string(body), "\x00")))
	for _, p := range []string{"begin", "commit", "rollback", "start transaction", "end", "-- ping", ";"} {
		if q == p || strings.HasPrefix(q, p+" ") || strings.HasPrefix(q, p+";") {
			return true
		}
	}
	return q == ""
}

// pipe copies from src to dst, showing every chunk to parse before it
// goes on, so that state an answer depends on is set before the answer
// can come.
func (c *wireConn) pipe(src, dst net.Conn, parse *messages) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			parse.feed(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// messages splits a byte stream into protocol messages: a type byte (none
// for startup packets) and a length that counts itself, then the body.
type messages struct {
	untyped func() bool // the next message has no type byte
	rawByte func() bool // the next message is one byte (TLS answer)
	onMsg   func(typ byte, body []byte)

	head    [5]byte
	headN   int
	headLen int
	body    []byte // kept prefix of the body
	left    int    // body bytes still to come
	inBody  bool
}

const keptBody = 32

func (m *messages) feed(p []byte) {
	for len(p) > 0 {
		if m.inBody {
			take := min(m.left, len(p))
			if room := keptBody - len(m.body); room > 0 {
				m.body = append(m.body, p[:min(room, take)]...)
			}
			m.left -= take
			p = p[take:]
			if m.left == 0 {
				m.inBody = false
				typ := byte(0)
				if m.headLen == 5 {
					typ = m.head[0]
				}
				m.onMsg(typ, m.body)
			}
			continue
		}
		if m.headN == 0 {
			switch {
			case m.rawByte():
				m.onMsg('!', p[:1])
				p = p[1:]
				continue
			case m.untyped():
				m.headLen = 4
			default:
				m.headLen = 5
			}
		}
		take := min(m.headLen-m.headN, len(p))
		copy(m.head[m.headN:], p[:take])
		m.headN += take
		p = p[take:]
		if m.headN < m.headLen {
			continue
		}
		size := int(binary.BigEndian.Uint32(m.head[m.headLen-4 : m.headLen]))
		m.headN = 0
		m.body = m.body[:0]
		m.left = size - 4
		if m.left <= 0 {
			typ := byte(0)
			if m.headLen == 5 {
				typ = m.head[0]
			}
			m.onMsg(typ, nil)
			continue
		}
		m.inBody = true
	}
}

package api

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The defaults of the HTTP edge's limits: what a chat product would pick.
const (
	// DefaultHeaderTimeout is how long a client may take to send a
	// request's headers.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout is how long a client may take to send a request's
	// body, from the end of its headers.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout is how long a response may take, from the end of
	// the request's headers; event streams are exempt (each of their
	// writes gets this long instead).
	DefaultWriteTimeout = 30 * time.Second
	// DefaultIdleTimeout is how long a keep-alive connection may wait for
	// its next request.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxHeaderBytes is the largest request line and headers
	// accepted; larger gets 431.
	DefaultMaxHeaderBytes = 16 << 10
	// DefaultMessagesPerMinute is how many messages a user may post per
	// minute, sustained.
	DefaultMessagesPerMinute = 60
	// DefaultMessageBurst is how many messages a user may post at once
	// after a quiet spell.
	DefaultMessageBurst = 20
	// DefaultMaxStreamsPerUser is how many live event streams one user may
	// hold open (each open conversation in each browser tab holds one).
	DefaultMaxStreamsPerUser = 8
	// DefaultMaxStreams is how many live event streams one API process
	// holds open.
	DefaultMaxStreams = 10000
)

// streamRetryAfter is what a client refused by the process-wide stream cap
// is told to wait: streams end all the time, so a slot frees up soon.
const streamRetryAfter = 5 * time.Second

// limitError is a request that a limit refused: the status, code and
// message it is answered with, and when to try again.
type limitError struct {
	status     int
	code       string
	message    string
	retryAfter time.Duration
}

func (e *limitError) Error() string { return e.message }

func (e *limitError) write(w http.ResponseWriter) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(e.retryAfter.Seconds()))))
	}
	writeError(w, e.status, e.code, e.message)
}

// refuse answers a request that err refused: a limit with its own answer,
// anything else as an internal error.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var le *limitError
	if errors.As(err, &le) {
		le.write(w)
		return
	}
	s.internalError(w, r, err)
}

// HTTPServer returns the http.Server that serves s with its limits: what
// `baton api` and `baton dev` run. Shutting it down ends the open event
// streams.
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.cfg.HeaderTimeout,
		// No ReadTimeout: the body's deadline is set per request (see
		// limitRequest), so that the events route can lift it.
		WriteTimeout:   s.cfg.WriteTimeout,
		IdleTimeout:    s.cfg.IdleTimeout,
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
	}
	hs.RegisterOnShutdown(s.Close)
	return hs
}

// limitRequest applies the limits every request shares, before routing:
// the size of its headers and the deadline of its body.
//
// net/http refuses headers over MaxHeaderBytes only past a slack of a few
// KiB, with a plain-text 431; the check here makes the limit exact and the
// answer JSON. The body's read deadline means that a client that declares
// a body and sends it slowly, or never, holds its connection for
// ReadTimeout at most, authenticated or not.
func (s *Server) limitRequest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := headerBytes(r); n > s.cfg.MaxHeaderBytes {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestHeaderFieldsTooLarge, "headers_too_large",
				fmt.Sprintf("the request line and headers are %d bytes; the limit is %d: send fewer or shorter headers", n, s.cfg.MaxHeaderBytes))
			return
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		body := &deadlineBody{ReadCloser: r.Body, timeout: s.cfg.ReadTimeout}
		r.Body = body
		guard := &bodyGuard{ResponseWriter: w, body: body}
		next.ServeHTTP(guard, r)
		if guard.closing {
			// net/http reads what is left of the body when the request
			// ends, even on a connection it closes next: stop that read
			// at once.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
	})
}

// headerBytes is the size of the request line and headers as sent.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	if r.Host != "" {
		n += len("Host: \r\n") + len(r.Host)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// bodyTimeoutError is a request body that did not arrive within the read
// timeout.
type bodyTimeoutError struct{ timeout time.Duration }

func (e *bodyTimeoutError) Error() string {
	return fmt.Sprintf("the request body did not arrive within %s: send the whole body at once", e.timeout)
}

// deadlineBody turns the read deadline's timeout into a bodyTimeoutError
// and notes whether the body was read to its end.
type deadlineBody struct {
	io.ReadCloser
	timeout time.Duration
	mu      sync.Mutex
	eof     bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return n, &bodyTimeoutError{timeout: b.timeout}
	}
	return n, err
}

func (b *deadlineBody) done() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.eof
}

// bodyGuard closes the connection after an error answered before the
// request's body was read: net/http would otherwise read and discard the
// rest of the body first, holding the connection (and the answer) until
// the client sent it or the read deadline passed.
type bodyGuard struct {
	http.ResponseWriter
	body        *deadlineBody
	wroteHeader bool
	closing     bool
}

func (g *bodyGuard) WriteHeader(code int) {
	if !g.wroteHeader {
		g.wroteHeader = true
		if code >= 400 && !g.body.done() {
			g.closing = true
			g.Header().Set("Connection", "close")
		}
	}
	g.ResponseWriter.WriteHeader(code)
}

func (g *bodyGuard) Write(p []byte) (int, error) {
	if !g.wroteHeader {
		g.WriteHeader(http.StatusOK)
	}
	return g.ResponseWriter.Write(p)
}

// FlushError lets http.ResponseController flush through the guard.
func (g *bodyGuard) FlushError() error {
	if !g.wroteHeader {
		g.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(g.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (g *bodyGuard) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// liveStream exempts a long-lived event stream from the request's
// deadlines: it has no body to wait for, and it writes for hours. Each of
// its writes gets the write timeout instead, so a client that stops
// reading is dropped rather than held forever.
func (s *Server) liveStream(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusBadRequest, "unexpected_body", "the events endpoint takes no request body")
			return
		}
		rc := http.NewResponseController(w)
		// The server reads on in the background to notice a client that
		// hangs up; a read deadline would end the stream.
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		h(&streamWriter{ResponseWriter: w, rc: rc, timeout: s.cfg.WriteTimeout}, r)
	}
}

// streamWriter gives every write and flush of an event stream its own
// write deadline.
type streamWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	_ = sw.rc.SetWriteDeadline(time.Now().Add(sw.timeout))
	return sw.ResponseWriter.Write(p)
}

// FlushError is what http.ResponseController.Flush calls.
func (sw *streamWriter) FlushError() error {
	_ = sw.rc.SetWriteDeadline(time.Now().Add(sw.timeout))
	return sw.rc.Flush()
}

// Flush implements http.Flusher.
func (sw *streamWriter) Flush() { _ = sw.FlushError() }

// Unwrap lets http.ResponseController reach the connection.
func (sw *streamWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// limitMessages refuses a user's message with 429 while their bucket is
// empty.
func (s *Server) limitMessages(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if wait := s.messages.Take(userFrom(r.Context()).ID, time.Now()); wait > 0 {
			s.metrics.limited.WithLabelValues("messages").Inc()
			(&limitError{
				status: http.StatusTooManyRequests, code: "rate_limited", retryAfter: wait,
				message: fmt.Sprintf("too many messages: at most %d a minute, %d at once; try again in %s",
					s.cfg.MessagesPerMinute, s.cfg.MessageBurst, wait.Round(time.Second)),
			}).write(w)
			return
		}
		h(w, r)
	}
}

// streamLimiter counts open event streams per user and in the process.
type streamLimiter struct {
	maxPerUser, max int

	mu      sync.Mutex
	perUser map[int64]int
	total   int
}

func newStreamLimiter(maxPerUser, max int) *streamLimiter {
	return &streamLimiter{maxPerUser: maxPerUser, max: max, perUser: make(map[int64]int)}
}

// acquireStream takes one of the user's and one of the process's event
// stream slots; release gives them back (once, however often it is
// called). When a cap is reached it returns a *limitError to answer with:
// 429 for the user's cap, 503 for the process's.
func (s *Server) acquireStream(userID int64) (release func(), err error) {
	l := s.streams
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.perUser[userID] >= l.maxPerUser:
		s.metrics.limited.WithLabelValues("streams_per_user").Inc()
		return nil, &limitError{
			status: http.StatusTooManyRequests, code: "too_many_streams", retryAfter: streamRetryAfter,
			message: fmt.Sprintf("this user already has %d live event streams open, the most allowed: close one (each open conversation in each tab holds one)", l.maxPerUser),
		}
	case l.total >= l.max:
		s.metrics.limited.WithLabelValues("streams").Inc()
		return nil, &limitError{
			status: http.StatusServiceUnavailable, code: "too_many_streams", retryAfter: streamRetryAfter,
			message: fmt.Sprintf("the server holds %d live event streams, its limit: try again shortly", l.max),
		}
	}
	l.perUser[userID]++
	l.total++
	s.metrics.streams.Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.perUser[userID]--; l.perUser[userID] <= 0 {
				delete(l.perUser, userID)
			}
			l.total--
			s.metrics.streams.Dec()
		})
	}, nil
}

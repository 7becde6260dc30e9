package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3/option"
)

// A model call is judged by its progress, not by its length: it fails when
// nothing arrives within FirstByteTimeout of the request (the first chunk
// of a stream, or the whole response of a request that does not stream),
// or when a stream pauses for longer than IdleTimeout. A stream that keeps
// producing runs until RequestTimeout, the overall cap.
//
// watch is the state of one call. Its middleware sits between the OpenAI
// client and the HTTP client: it starts the first-byte timer when the
// request leaves, wraps the response body so that every read that returns
// data rearms the idle timer, and classifies what the client would
// otherwise blur: an error status (whatever its body), an answer that is
// not of the type asked for, and a transport failure.
type watch struct {
	firstByte time.Duration
	idle      time.Duration
	streaming bool
	cancel    context.CancelCauseFunc

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	started time.Time
	// progressed is set by the first read that returned data.
	progressed bool
}

// timeoutError is the cause of a call cut short by its watch or its cap.
type timeoutError struct {
	// what is "first byte", "idle" or "cap".
	what string
	// after is the limit that was reached; streamed is how long the call
	// had been receiving when it was.
	after, streamed time.Duration
}

func (e *timeoutError) Error() string {
	return "model call " + e.what + " timeout after " + e.after.String()
}

func newWatch(firstByte, idle time.Duration, streaming bool, cancel context.CancelCauseFunc) *watch {
	return &watch{firstByte: firstByte, idle: idle, streaming: streaming, cancel: cancel}
}

func (w *watch) option() option.RequestOption { return option.WithMiddleware(w.middleware) }

func (w *watch) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.started = time.Now()
	w.timer = time.AfterFunc(w.firstByte, func() {
		w.cancel(&timeoutError{what: "first byte", after: w.firstByte})
	})
}

// progress rearms the idle timer after a read that returned data.
func (w *watch) progress() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.timer == nil {
		return
	}
	if !w.progressed {
		w.progressed = true
		w.timer.Stop()
		started := w.started
		w.timer = time.AfterFunc(w.idle, func() {
			w.cancel(&timeoutError{what: "idle", after: w.idle, streamed: time.Since(started)})
		})
		return
	}
	w.timer.Reset(w.idle)
}

func (w *watch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// maxErrorBody bounds what is read of an error response.
const maxErrorBody = 64 << 10

func (w *watch) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	w.start()
	res, err := next(req)
	if err != nil {
		w.stop()
		return nil, &transportError{err: err}
	}
	body := &watchedBody{rc: res.Body, w: w}
	if res.StatusCode >= 400 {
		b, err := io.ReadAll(io.LimitReader(body, maxErrorBody))
		_ = body.Close()
		if err != nil {
			return nil, err
		}
		return nil, &statusError{status: res.StatusCode, header: res.Header, body: b}
	}
	ct := res.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	switch {
	case w.streaming && mt != "text/event-stream" && ct != "":
		_ = body.Close()
		return nil, &protocolError{msg: fmt.Sprintf("it answered a streaming request with %q instead of server-sent events", truncate(ct, 80))}
	case !w.streaming && mt != "application/json" && !strings.HasSuffix(mt, "+json"):
		_ = body.Close()
		return nil, &protocolError{msg: fmt.Sprintf("it answered with %q instead of JSON", truncate(ct, 80))}
	}
	res.Body = body
	return res, nil
}

// watchedBody is a response body whose reads are watched.
type watchedBody struct {
	rc io.ReadCloser
	w  *watch
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.w.progress()
	}
	switch {
	case err == io.EOF:
		b.w.stop()
	case err != nil:
		err = &transportError{err: err}
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.w.stop()
	return b.rc.Close()
}

// transportError is a failure below HTTP: a refused dial, a dropped
// connection, a body cut short.
type transportError struct{ err error }

func (e *transportError) Error() string {
	// A *url.Error names the URL, which may carry credentials: only its
	// cause is shown.
	var ue *url.Error
	if errors.As(e.err, &ue) {
		return ue.Err.Error()
	}
	return e.err.Error()
}

func (e *transportError) Unwrap() error { return e.err }

// statusError is an answer with an error status, whatever its body.
type statusError struct {
	status int
	header http.Header
	body   []byte
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%d %s", e.status, http.StatusText(e.status))
}

// protocolError is an answer that does not speak the chat completions
// protocol.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"time"
)

// a2aTransport sits between the A2A client (a2aclient) and the HTTP
// client, as watch's middleware does for the model's client, and gives
// the requests of an A2A step what the other external agents' requests
// have, which the A2A client does not do itself:
//
//   - each request is judged by its progress (FirstByteTimeout,
//     IdleTimeout) and each answer is read up to MaxStepBytes;
//   - an answer with a status other than 2xx comes back as a
//     *statusError with its status, headers and body, so that a 429's
//     Retry-After, a 401 or a 5xx is classified as for the other agents
//     (the client would only say "unexpected HTTP status");
//   - a JSON answer to a streaming request (a JSON-RPC error sent before
//     any stream, as the A2A JavaScript SDK answers a request without
//     A2A-Version) is handed to the client as a stream of that one event,
//     which it reads as the error it is; it would otherwise read no event
//     and no error;
//   - a failure below HTTP is a *transportError, whose text does not name
//     the URL.
//
// A request whose context has no a2aCall (see withA2ACall) goes through
// as it is.
type a2aTransport struct {
	next http.RoundTripper
}

// a2aCall is what a2aTransport needs of the step request in flight.
type a2aCall struct {
	firstByte, idle time.Duration
	maxBytes        int64
	// cancel ends the request's context with the watch's cause.
	cancel context.CancelCauseFunc
}

type a2aCallKey struct{}

// withA2ACall gives the requests made with ctx their call's limits.
func withA2ACall(ctx context.Context, c *a2aCall) context.Context {
	return context.WithValue(ctx, a2aCallKey{}, c)
}

func (t *a2aTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, ok := req.Context().Value(a2aCallKey{}).(*a2aCall)
	if !ok {
		return t.next.RoundTrip(req)
	}
	w := newWatch(c.firstByte, c.idle, true, c.cancel)
	w.start()
	res, err := t.next.RoundTrip(req)
	if err != nil {
		w.stop()
		return nil, &transportError{err: err}
	}
	body := &watchedBody{rc: res.Body, w: w}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(body, maxErrorBody))
		_ = body.Close()
		return nil, &statusError{status: res.StatusCode, header: res.Header, body: b}
	}
	capped := &capBody{r: &capReader{r: body, max: c.maxBytes}, c: body}
	ct := res.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	streaming := req.Header.Get("Accept") == "text/event-stream"
	switch {
	case streaming && mt == "application/json":
		b, err := io.ReadAll(capped)
		_ = capped.Close()
		if err != nil {
			return nil, err
		}
		var one bytes.Buffer
		one.WriteString("data: ")
		if err := json.Compact(&one, b); err != nil {
			return nil, malformedf("it answered a streaming request with JSON that does not parse (%s): %q", err, truncate(string(b), 60))
		}
		one.WriteString("\n\n")
		capped = &capBody{r: &one}
	case streaming && ct != "" && mt != "text/event-stream":
		_ = capped.Close()
		return nil, malformedf("it answered a streaming request with %q instead of server-sent events", truncate(ct, 80))
	case !streaming && ct != "" && mt != "application/json" && !isJSONSuffix(mt):
		_ = capped.Close()
		return nil, malformedf("it answered with %q instead of JSON", truncate(ct, 80))
	}
	res.Body = capped
	return res, nil
}

func isJSONSuffix(mt string) bool { return len(mt) > 5 && mt[len(mt)-5:] == "+json" }

// capBody reads r and closes c.
type capBody struct {
	r io.Reader
	c io.Closer
}

func (b *capBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *capBody) Close() error {
	if b.c == nil {
		return nil
	}
	return b.c.Close()
}

package api

import (
	"bytes"
	"net/http"
	"strings"
)

// sseWriter writes one response in the text/event-stream format, which
// both of the API's live protocols are: Baton's conversation events and
// the AI SDK's UI message stream. Its first failed write or flush sticks,
// so that the stream's steps need not check each write: once done, the
// follower stops.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// err is the first write or flush that failed; closed is set once the
	// stream has said all it will.
	err    error
	closed bool
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (o *sseWriter) header() http.Header { return o.w.Header() }

// open answers 200 as an event stream. X-Accel-Buffering keeps a proxy
// (nginx) from holding events back until its buffer fills.
func (o *sseWriter) open() {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
}

// send writes one event. data must not contain newlines (JSON here).
func (o *sseWriter) send(id, name, data string) {
	o.frame(sseFrame(id, name, data))
}

// frame writes an event built before: the hub builds a live delta's once
// for all the streams that get it.
func (o *sseWriter) frame(b []byte) {
	if o.err == nil && !o.closed {
		_, o.err = o.w.Write(b)
	}
}

// comment writes a line that clients ignore.
func (o *sseWriter) comment(text string) {
	o.frame([]byte(": " + text + "\n\n"))
}

// keepAlive keeps an idle stream alive through proxies, and lets a client
// notice a dead connection.
func (o *sseWriter) keepAlive() { o.comment("keep-alive") }

func (o *sseWriter) flush() {
	if o.err == nil {
		o.err = o.rc.Flush()
	}
}

// close ends the stream: nothing more is written to it.
func (o *sseWriter) close() { o.closed = true }

// done says whether the stream is over: closed, or its client gone.
func (o *sseWriter) done() bool { return o.closed || o.err != nil }

// sseFrame is one event in the text/event-stream format.
func sseFrame(id, event, data string) []byte {
	var b bytes.Buffer
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	if event != "" {
		b.WriteString("event: " + event + "\n")
	}
	b.WriteString("data: " + strings.ReplaceAll(data, "\n", "") + "\n\n")
	return b.Bytes()
}

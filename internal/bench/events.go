package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Event is one server-sent event a client read from a conversation's
// events stream.
type Event struct {
	// ID is the event's id: its sequence in the events stream; 0 for a
	// live delta.
	ID uint64
	// Name is the event's name: "delta" for a live delta, "ready" when the
	// stream opened, "end"; empty for a conversation event.
	Name string
	Data []byte
	// At is when the client had read the event.
	At time.Time
}

// Follow opens the events stream of conversation (GET
// /v1/conversations/{cid}/events) with the stack's token on client, and
// returns once the API has said it is live ("ready"): nothing committed
// after that is missed. A goroutine hands on to each event that follows,
// until ctx ends or the stream does; wait waits for it.
func (s *Client) Follow(ctx context.Context, client *http.Client, conversation string, on func(Event)) (wait func(), err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.APIURL+"/v1/conversations/"+url.PathEscape(conversation)+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	res, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("open the events of %s: %w", conversation, err)
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return nil, fmt.Errorf("open the events of %s: status %d", conversation, res.StatusCode)
	}
	r := bufio.NewReaderSize(res.Body, 64<<10)
	if ev, err := readEvent(r); err != nil || ev.Name != "ready" {
		res.Body.Close()
		return nil, fmt.Errorf("the events of %s did not open with ready (%q, %v)", conversation, ev.Name, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer res.Body.Close()
		for {
			ev, err := readEvent(r)
			if err != nil {
				return
			}
			on(ev)
		}
	}()
	return func() { <-done }, nil
}

// readEvent reads the next event, skipping comments.
func readEvent(r *bufio.Reader) (Event, error) {
	var ev Event
	seen := false
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return ev, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if seen {
				ev.At = time.Now()
				return ev, nil
			}
		case bytes.HasPrefix(line, []byte("id: ")):
			ev.ID, _ = strconv.ParseUint(string(line[4:]), 10, 64)
			seen = true
		case bytes.HasPrefix(line, []byte("event: ")):
			ev.Name = string(line[7:])
			seen = true
		case bytes.HasPrefix(line, []byte("data: ")):
			ev.Data = append(ev.Data, line[6:]...)
			seen = true
		}
	}
}

package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	batonnats "github.com/batonhq/baton/nats"
)

// liveStream is one client of GET /v1/conversations/{cid}/events, open
// for the whole run as a browser tab would be: when its connection ends
// it connects again with Last-Event-ID, which the API's contract
// (api/events.go) answers with every event after it, or with "reset"
// when that point is gone from the events stream. What it received is
// judged against the events stream once the run is over: every event of
// its conversation since its last "ready" or "reset", once, in order.
type liveStream struct {
	conv string

	mu sync.Mutex
	// epochs start at each "ready" or "reset" event, whose id is the
	// stream position after which the events follow.
	epochs []*streamEpoch
	lastID string
	// connects counts connections, the first one included.
	connects int
	// refused counts answers other than 200 (503 while the API cannot
	// follow the events stream).
	refused int
	// ended is the reason of an "end" event, or 404 once the
	// conversation is gone; the stream does not connect again.
	ended string
	// repeats are events received twice, or out of order, in one epoch.
	repeats []string
}

type streamEpoch struct {
	kind  string // ready or reset
	after uint64
	seqs  []uint64
}

// openStreams starts a live stream on each of convs until ctx ends.
func openStreams(ctx context.Context, base, token string, convs []string) ([]*liveStream, *sync.WaitGroup) {
	var wg sync.WaitGroup
	// No timeout: a stream lives as long as the run; each read is bounded
	// by the API's heartbeat instead (watch).
	hc := &http.Client{}
	var out []*liveStream
	for _, c := range convs {
		ls := &liveStream{conv: c}
		out = append(out, ls)
		wg.Go(func() { ls.run(ctx, hc, base, token) })
	}
	return out, &wg
}

// run connects, reads, and connects again, until ctx ends or the
// conversation is gone.
func (ls *liveStream) run(ctx context.Context, hc *http.Client, base, token string) {
	for ctx.Err() == nil {
		gone := ls.connect(ctx, hc, base, token)
		if gone {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// connect reads one connection to its end; true when the stream must not
// connect again.
func (ls *liveStream) connect(ctx context.Context, hc *http.Client, base, token string) bool {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, base+"/v1/conversations/"+ls.conv+"/events", nil)
	if err != nil {
		return true
	}
	req.Header.Set("Authorization", "Bearer "+token)
	ls.mu.Lock()
	ls.connects++
	if ls.lastID != "" {
		req.Header.Set("Last-Event-ID", ls.lastID)
	}
	ls.mu.Unlock()
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		ls.mu.Lock()
		ls.ended = "404"
		ls.mu.Unlock()
		return true
	default:
		ls.mu.Lock()
		ls.refused++
		ls.mu.Unlock()
		return false
	}
	// A connection silent for longer than two of the API's 15 s
	// heartbeats is dead: connect again.
	alive := make(chan struct{}, 1)
	go func() {
		t := time.NewTimer(35 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-alive:
				t.Reset(35 * time.Second)
			case <-t.C:
				cancel()
				return
			}
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var id, event string
	for sc.Scan() {
		select {
		case alive <- struct{}{}:
		default:
		}
		line := sc.Text()
		switch {
		case line == "":
			if done := ls.frame(id, event); done {
				return true
			}
			id, event = "", ""
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		}
	}
	return false
}

// frame records one event; true when it ends the stream for good.
func (ls *liveStream) frame(id, event string) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch event {
	case "end":
		ls.ended = "end"
		return true
	case "ready", "reset":
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			ls.repeats = append(ls.repeats, fmt.Sprintf("%s with id %q", event, id))
			return false
		}
		ls.epochs = append(ls.epochs, &streamEpoch{kind: event, after: n})
		ls.lastID = id
		return false
	case "":
	default:
		return false // deltas and the like carry no id
	}
	if id == "" {
		return false
	}
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || len(ls.epochs) == 0 {
		ls.repeats = append(ls.repeats, fmt.Sprintf("event %q before ready", id))
		return false
	}
	e := ls.epochs[len(ls.epochs)-1]
	if n <= e.after || (len(e.seqs) > 0 && n <= e.seqs[len(e.seqs)-1]) {
		ls.repeats = append(ls.repeats, fmt.Sprintf("event %d again or out of order (after %d)", n, max(e.after, lastOf(e.seqs))))
	}
	e.seqs = append(e.seqs, n)
	ls.lastID = id
	return false
}

func lastOf(s []uint64) uint64 {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}

// lastSeq is the last event id the stream received, and whether it has
// an epoch at all.
func (ls *liveStream) lastSeq() (uint64, bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.epochs) == 0 {
		return 0, false
	}
	e := ls.epochs[len(ls.epochs)-1]
	return max(e.after, lastOf(e.seqs)), true
}

// streamsReport is what the live streams saw, for the summary.
type streamsReport struct {
	Open, Connects, Refused, Resets, Ended, Events int
}

func (r streamsReport) String() string {
	return fmt.Sprintf("%d open, %d events received, %d connections (%d refused while the API could not follow the events stream), %d resets, %d ended by a deletion",
		r.Open, r.Events, r.Connects, r.Refused, r.Resets, r.Ended)
}

// judgeStreams waits (for at most within) until every live stream has
// received its conversation's last event in the events stream, stops
// them, and checks each: since its last "ready" or "reset", every event
// of its conversation that the events stream holds was received, once and
// in order.
func judgeStreams(ctx context.Context, pool *pgxpool.Pool, natsURL string, streams []*liveStream, stop func(), within time.Duration) (streamsReport, *Check) {
	check := &Check{Name: CheckLiveStreams}
	var rep streamsReport
	defer stop()
	nc, err := natsclient.Connect(natsURL, natsclient.RetryOnFailedConnect(true), natsclient.MaxReconnects(-1))
	if err != nil {
		check.add("read the events stream: %v", err)
		return rep, check
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		check.add("read the events stream: %v", err)
		return rep, check
	}
	cfg := batonnats.EventsConfig{}.WithDefaults()
	// The events of each conversation, by its key.
	want := map[string][]uint64{}
	keys := map[string]string{}
	for _, ls := range streams {
		var key string
		if err := pool.QueryRow(ctx, `SELECT id FROM conversations WHERE public_id = $1`, ls.conv).Scan(&key); err == nil {
			keys[ls.conv] = key
		}
	}
	read := func() error {
		for conv, key := range keys {
			seqs, err := subjectSeqs(ctx, js, cfg.Name, cfg.Subject(key))
			if err != nil {
				return err
			}
			want[conv] = seqs
		}
		return nil
	}
	deadline := time.Now().Add(within)
	for {
		err := read()
		caughtUp := err == nil
		for _, ls := range streams {
			if ls.endedReason() != "" {
				continue
			}
			last, ok := ls.lastSeq()
			if !ok || (len(want[ls.conv]) > 0 && last < lastOf(want[ls.conv])) {
				caughtUp = false
			}
		}
		if caughtUp || time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				check.add("read the events stream: %v", err)
				return rep, check
			}
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	stop()
	rep.Open = len(streams)
	for _, ls := range streams {
		ls.mu.Lock()
		rep.Connects += ls.connects
		rep.Refused += ls.refused
		if ls.ended != "" {
			rep.Ended++
		}
		for _, e := range ls.epochs {
			rep.Events += len(e.seqs)
			if e.kind == "reset" {
				rep.Resets++
			}
		}
		for _, r := range ls.repeats {
			check.add("stream of %s: %s", ls.conv, r)
		}
		if len(ls.epochs) == 0 {
			if ls.ended == "" {
				check.add("stream of %s: never opened (%d connections, %d refused)", ls.conv, ls.connects, ls.refused)
			}
			ls.mu.Unlock()
			continue
		}
		e := ls.epochs[len(ls.epochs)-1]
		got := map[uint64]bool{}
		for _, s := range e.seqs {
			got[s] = true
		}
		var missing []string
		for _, s := range want[ls.conv] {
			// A stream that ended at a deletion saw everything up to it.
			if s > e.after && !got[s] && (ls.ended == "" || s <= lastOf(e.seqs)) {
				missing = append(missing, strconv.FormatUint(s, 10))
			}
		}
		if len(missing) > 0 {
			check.add("stream of %s: %d events of the events stream never received since its %s at %d (%d connections): %s",
				ls.conv, len(missing), e.kind, e.after, ls.connects, strings.Join(missing[:min(len(missing), 10)], ", "))
		}
		ls.mu.Unlock()
	}
	return rep, check
}

func (ls *liveStream) endedReason() string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ended
}

// subjectSeqs reads the stream sequences of every message on subject.
func subjectSeqs(ctx context.Context, js jetstream.JetStream, stream, subject string) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, err
	}
	n := info.State.Subjects[subject]
	if n == 0 {
		return nil, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	var out []uint64
	for uint64(len(out)) < n {
		batch, err := cons.FetchNoWait(int(min(n-uint64(len(out)), 500)))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			if md, err := m.Metadata(); err == nil {
				out = append(out, md.Sequence.Stream)
			}
			got++
		}
		if got == 0 {
			if err := batch.Error(); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("read %s: %w", subject, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// streamedConversations picks the conversations that get a live stream:
// up to three dozen, spread over the list.
func streamedConversations(convs []string) []string {
	var out []string
	for i := 0; i < len(convs) && len(out) < 36; i += max(1, len(convs)/36) {
		out = append(out, convs[i])
	}
	return out
}

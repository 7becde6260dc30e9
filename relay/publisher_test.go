package relay

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestAckError(t *testing.T) {
	t.Parallel()
	good := []string{
		`{"stream":"BATON_OUTBOX","seq":1}`,
		`{"stream":"BATON_OUTBOX","seq":18446744073709551615,"duplicate":true}`,
		`{"stream":"S","domain":"hub","seq":7}`,
		// Not the usual shape: decoded in full, still good.
		`{ "stream": "S", "seq": 2 }`,
		`{"stream":"S","seq":3,"batch":"b","count":1}`,
		`{"stream":"a\"b","seq":3}`,
	}
	for _, body := range good {
		require.NoError(t, ackError(&natsclient.Msg{Data: []byte(body)}), body)
	}
	bad := []string{
		`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"S","seq":0}`,
		`{"stream":"S","seq":1,"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}`,
		`{"stream":"","seq":1}`,
		`{"seq":1}`,
		`{"stream":"S","seq":1`,
		`not json`,
		`{"stream":"S","seq":-1}`,
	}
	for _, body := range bad {
		require.Error(t, ackError(&natsclient.Msg{Data: []byte(body)}), body)
	}
	var apiErr *jetstream.APIError
	require.ErrorAs(t, ackError(&natsclient.Msg{Data: []byte(bad[0])}), &apiErr)
	require.Equal(t, jetstream.ErrorCode(10077), apiErr.ErrorCode)

	noResponders := &natsclient.Msg{Header: natsclient.Header{"Status": []string{"503"}}}
	require.ErrorIs(t, ackError(noResponders), jetstream.ErrNoStreamResponse)
	require.ErrorIs(t, ackError(&natsclient.Msg{}), jetstream.ErrInvalidJSAck)
}

// TestTheShortcutReadsTheAcknowledgementsTheServerSends: a stored message's
// acknowledgement and a duplicate's, as nats-server writes them, take the
// shortcut, not the JSON decoder.
func TestTheShortcutReadsTheAcknowledgementsTheServerSends(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"stream":"BATON_OUTBOX","seq":12}`,
		`{"stream":"BATON_OUTBOX","seq":12,"duplicate": true}`,
		`{"stream":"BATON_OUTBOX","domain":"hub","seq":12,"duplicate": true}`,
	} {
		require.True(t, plainPubAck([]byte(body)), body)
	}
}

// FuzzPlainPubAck checks that the shortcut for acknowledgements never
// accepts what the JSON decoder would refuse or read as a failure.
func FuzzPlainPubAck(f *testing.F) {
	for _, s := range []string{
		`{"stream":"S","seq":1}`, `{"stream":"S","seq":1,"duplicate":true}`, `{"stream":"S","seq":1,"duplicate": true}`, `{"stream":"S","domain":"d","seq":1}`,
		`{"stream":"S","seq":1,"error":{"code":1}}`, `{"stream":"S","seq":}`, `{"stream":"","seq":1}`,
		"{\"stream\":\"\x1c\"}", `{"stream":"S","seq":01}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !plainPubAck(data) {
			return
		}
		var pa struct {
			Stream string              `json:"stream"`
			Seq    uint64              `json:"seq"`
			Error  *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(data, &pa); err != nil || pa.Error != nil || pa.Stream == "" {
			t.Fatalf("plainPubAck accepted %q: %+v, %v", data, pa, err)
		}
	})
}

// fakeStream stands in for JetStream on a subject, holding its replies
// until the test sends them.
type fakeStream struct {
	nc   *natsclient.Conn
	mu   sync.Mutex
	msgs []*natsclient.Msg
}

func newFakeStream(t *testing.T, url, subject string) *fakeStream {
	nc, err := natsclient.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	f := &fakeStream{nc: nc}
	_, err = nc.Subscribe(subject, func(m *natsclient.Msg) {
		f.mu.Lock()
		f.msgs = append(f.msgs, m)
		f.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return f
}

func (f *fakeStream) waitFor(t *testing.T, n int) []*natsclient.Msg {
	t.Helper()
	var got []*natsclient.Msg
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = append([]*natsclient.Msg(nil), f.msgs...)
		return len(got) >= n
	}, 5*time.Second, time.Millisecond)
	return got
}

func (f *fakeStream) reply(t *testing.T, m *natsclient.Msg, body string) {
	t.Helper()
	require.NoError(t, f.nc.Publish(m.Reply, []byte(body)))
	require.NoError(t, f.nc.Flush())
}

type ackLog struct {
	mu   sync.Mutex
	ids  []int64
	fail int
}

func (a *ackLog) acked(ev *inflight, _ time.Time) {
	a.mu.Lock()
	a.ids = append(a.ids, ev.trigger.OutboxID)
	a.mu.Unlock()
}

func (a *ackLog) got() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int64(nil), a.ids...)
}

func testPublisher(t *testing.T, max int, timeout time.Duration) (*publisher, *fakeStream, *ackLog) {
	n := testenv.StartNATS(t)
	nc, err := natsclient.Connect(n.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	stream := newFakeStream(t, n.URL, "test.>")
	log := &ackLog{}
	rebuild := func(tr *batonnats.Trigger) (*natsclient.Msg, error) { return eventMsg(tr, "test", 4) }
	p, err := newPublisher(nc, max, timeout, rebuild, log.acked, func() {
		log.mu.Lock()
		log.fail++
		log.mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(p.close)
	return p, stream, log
}

func publishRow(t *testing.T, p *publisher, e *eventBuilder, id int64, cancel <-chan struct{}) error {
	t.Helper()
	tr := batonnats.Trigger{OutboxID: id, ConversationID: "c", MessageID: "m", Reason: batonnats.ReasonInsert}
	msg, err := e.build(&tr)
	require.NoError(t, err)
	return p.publish(msg, &txn{}, &tr, nil, cancel)
}

func TestPublisherBoundsInFlightAndTakesAcksInAnyOrder(t *testing.T) {
	p, stream, log := testPublisher(t, 3, time.Minute)
	e := newEventBuilder("test", 4)
	for id := int64(1); id <= 3; id++ {
		require.NoError(t, publishRow(t, p, e, id, nil))
	}
	msgs := stream.waitFor(t, 3)
	for i, m := range msgs {
		require.Equal(t, "outbox-"+string(rune('1'+i)), m.Header.Get(batonnats.HeaderMsgID), "one message per row, with its headers")
	}

	// The bound is reached: the fourth waits for an acknowledgement.
	fourth := make(chan error, 1)
	go func() { fourth <- publishRow(t, p, e, 4, nil) }()
	select {
	case err := <-fourth:
		t.Fatalf("publish returned %v with 3 of 3 in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	stream.reply(t, msgs[2], `{"stream":"S","seq":3}`)
	require.NoError(t, <-fourth)
	stream.reply(t, msgs[0], `{"stream":"S","seq":1,"duplicate":true}`)
	stream.reply(t, msgs[1], `{"stream":"S","seq":2}`)
	require.Eventually(t, func() bool { return len(log.got()) == 3 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []int64{3, 1, 2}, log.got())

	// A late or repeated reply counts once.
	stream.reply(t, msgs[1], `{"stream":"S","seq":2}`)
	msgs = stream.waitFor(t, 4)
	drained := p.drained()
	stream.reply(t, msgs[3], `{"stream":"S","seq":4}`)
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("drained not closed with nothing in flight")
	}
	require.Equal(t, []int64{3, 1, 2, 4}, log.got())

	// A publication waiting for room gives up when cancelled.
	for id := int64(5); id <= 7; id++ {
		require.NoError(t, publishRow(t, p, e, id, nil))
	}
	cancel := make(chan struct{})
	close(cancel)
	require.ErrorIs(t, publishRow(t, p, e, 8, cancel), errPublishCancelled)
}

func TestPublisherFailsOnANegativeAck(t *testing.T) {
	p, stream, log := testPublisher(t, 8, time.Minute)
	e := newEventBuilder("test", 4)
	require.NoError(t, publishRow(t, p, e, 1, nil))
	require.NoError(t, publishRow(t, p, e, 2, nil))
	msgs := stream.waitFor(t, 2)
	stream.reply(t, msgs[0], `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`)
	select {
	case <-p.failed:
	case <-time.After(5 * time.Second):
		t.Fatal("a negative acknowledgement did not fail the publisher")
	}
	require.ErrorContains(t, p.err, "outbox row 1")
	var apiErr *jetstream.APIError
	require.ErrorAs(t, p.err, &apiErr)
	require.Empty(t, log.got(), "a refused event is never counted as acknowledged")
	log.mu.Lock()
	require.Equal(t, 1, log.fail)
	log.mu.Unlock()
}

func TestPublisherTimesOut(t *testing.T) {
	p, stream, log := testPublisher(t, 8, 300*time.Millisecond)
	e := newEventBuilder("test", 4)
	start := time.Now()
	require.NoError(t, publishRow(t, p, e, 1, nil))
	stream.waitFor(t, 1)
	select {
	case <-p.failed:
	case <-time.After(5 * time.Second):
		t.Fatal("an event never acknowledged did not fail the publisher")
	}
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.ErrorIs(t, p.err, jetstream.ErrAsyncPublishTimeout)
	require.ErrorContains(t, p.err, "outbox row 1")
	require.Empty(t, log.got())
}

func TestPublisherRetriesThenFailsWithoutAStream(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, err := natsclient.Connect(n.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	var resent sync.WaitGroup
	resent.Add(noResponderRetries)
	rebuild := func(tr *batonnats.Trigger) (*natsclient.Msg, error) {
		resent.Done()
		return eventMsg(tr, "nowhere", 4)
	}
	p, err := newPublisher(nc, 8, time.Minute, rebuild, func(*inflight, time.Time) { t.Error("acknowledged without a stream") }, nil)
	require.NoError(t, err)
	defer p.close()
	e := newEventBuilder("nowhere", 4)
	require.NoError(t, publishRow(t, p, e, 1, nil))
	select {
	case <-p.failed:
	case <-time.After(10 * time.Second):
		t.Fatal("no failure without a stream")
	}
	resent.Wait()
	require.True(t, errors.Is(p.err, jetstream.ErrNoStreamResponse), "%v", p.err)
}

package group

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// receiver is a webhook endpoint that deduplicates on the event ID, the way
// the webhook group asks receivers to. Per event, its first request hangs
// past the sender's timeout and its second applies the event but answers
// 500, as if the response were lost: the sender must try a third time, and
// the receiver must recognize that delivery as a duplicate.
type receiver struct {
	secret string
	// rejected is the key of the conversation whose events it refuses.
	rejected string

	mu         sync.Mutex
	requests   map[string]int
	applied    map[string]int
	duplicates int
	badSig     int
	bodies     map[string]WebhookPayload
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	id := r.Header.Get(HeaderWebhookEventID)
	var p WebhookPayload
	if !VerifyWebhook(rc.secret, body, r.Header.Get(HeaderWebhookSignature)) || json.Unmarshal(body, &p) != nil || p.EventID != id {
		rc.mu.Lock()
		rc.badSig++
		rc.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	if p.ConversationID == rc.rejected {
		http.Error(w, "this receiver does not take that conversation", http.StatusUnprocessableEntity)
		return
	}
	rc.mu.Lock()
	rc.requests[id]++
	n := rc.requests[id]
	if n == 1 {
		rc.mu.Unlock()
		<-r.Context().Done() // the sender gives up
		return
	}
	if rc.applied[id] == 0 {
		rc.applied[id]++
		rc.bodies[id] = p
	} else {
		rc.duplicates++
	}
	rc.mu.Unlock()
	if n == 2 {
		http.Error(w, "applied, but the answer is lost", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func TestWebhookReceiverFailingTwiceGetsEverySignedEventAndAppliesNoneTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.RelayStreaming()
	rc := &receiver{secret: "s3cret", rejected: b.Conversation("rejected"), requests: map[string]int{}, applied: map[string]int{}, bodies: map[string]WebhookPayload{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)

	h, err := Webhook(WebhookConfig{URL: srv.URL, Secret: rc.secret, Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	cfg := b.groupConfig(WebhookGroup, h)
	stop := b.startGroup(cfg)

	const events = 30
	ids := b.SendMany(events, 5, "hook")
	rejected := b.Send("rejected", "r1", "no")

	b.Eventually(60*time.Second, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return len(rc.applied) == events && rc.duplicates == events
	}, "the receiver applied %d events and saw each third delivery as a duplicate", events)
	b.ConsumerSettled(WebhookGroup, 30*time.Second)
	require.NoError(t, stop())

	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Zero(t, rc.badSig, "every request carried a valid signature over its body")
	for _, id := range ids {
		eventID := fmt.Sprintf("outbox-%d", id)
		require.Equal(t, 1, rc.applied[eventID], "event %s applied once by the receiver", eventID)
		require.Equal(t, 3, rc.requests[eventID], "event %s: a timeout, a lost answer, then success", eventID)
		require.Equal(t, id, rc.bodies[eventID].OutboxID)
		require.Equal(t, WebhookGroup, rc.bodies[eventID].Group)
	}
	require.Equal(t, events, b.Count(`SELECT count(*) FROM group_inbox WHERE group_name = $1`, WebhookGroup))

	dead, err := DeadLetters(context.Background(), b.DB.Pool, WebhookGroup, false)
	require.NoError(t, err)
	require.Len(t, dead, 1, "the event the receiver rejects with a 4xx is parked")
	require.Equal(t, fmt.Sprintf("outbox-%d", rejected), dead[0].EventID)
	require.Equal(t, 1, dead[0].Attempts, "a 4xx is not retried")
	require.Contains(t, dead[0].Error, "422")
}

func TestWebhookSignatureIsHMACOverTheBody(t *testing.T) {
	t.Parallel()
	body := []byte(`{"event_id":"outbox-1"}`)
	sig := SignWebhook("k", body)
	// echo -n '{"event_id":"outbox-1"}' | openssl dgst -sha256 -hmac k
	require.Equal(t, "sha256=bc19e3595164279b4d0170c8c3e2cb8921a32db2dffc4cba40a705df98ae3dc8", sig, "the value openssl computes")
	require.True(t, VerifyWebhook("k", body, sig))
	require.False(t, VerifyWebhook("other", body, sig))
	require.False(t, VerifyWebhook("k", append(body, ' '), sig))
}

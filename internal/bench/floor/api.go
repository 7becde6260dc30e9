package floor

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
)

type api struct {
	o    Options
	pool *pgxpool.Pool
	nc   *natsclient.Conn
}

func runAPI(ctx context.Context, o Options) error {
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := natsclient.Connect(o.NATSURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	a := &api{o: o, pool: pool, nc: nc}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/conversations", a.createConversation)
	mux.HandleFunc("POST /v1/conversations/{cid}/messages", a.post)
	mux.HandleFunc("GET /v1/conversations/{cid}/events", a.events)
	ln, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, BaseContext: func(net.Listener) context.Context { return ctx }}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ready("api", "http://"+ln.Addr().String())
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}

// user looks the request's bearer token up: one statement, as every
// request of Baton's API needs a user.
func (a *api) user(r *http.Request) (int64, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return 0, false
	}
	var user int64
	err := a.pool.QueryRow(r.Context(), `SELECT user_id FROM floor_tokens WHERE hash = $1`, TokenHash(token)).Scan(&user)
	return user, err == nil
}

// conversation is the conversation's key: a client's id scoped by its user.
func conversation(user int64, cid string) string { return strconv.FormatInt(user, 10) + "_" + cid }

// createConversation exists for the benchmark's clients, which create a
// conversation before they post to it; the chain needs no row for it.
func (a *api) createConversation(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.user(r); !ok {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func (a *api) post(w http.ResponseWriter, r *http.Request) {
	user, ok := a.user(r)
	if !ok {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	var body struct{ ID, Content string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.ID == "" {
		http.Error(w, "want {id, content}", http.StatusBadRequest)
		return
	}
	// One transaction: the message, and its outbox row if it is new.
	_, err := a.pool.Exec(r.Context(), `WITH m AS (
		INSERT INTO floor_messages (conversation, id, role, content) VALUES ($1, $2, 'user', $3)
		ON CONFLICT DO NOTHING RETURNING id)
	INSERT INTO floor_outbox (conversation, message_id) SELECT $1, id FROM m`,
		conversation(user, r.PathValue("cid")), body.ID, body.Content)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// events streams what the worker publishes for the conversation: live
// deltas as "delta" events, conversation events as unnamed ones.
func (a *api) events(w http.ResponseWriter, r *http.Request) {
	user, ok := a.user(r)
	if !ok {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	ch := make(chan *natsclient.Msg, 256)
	sub, err := a.nc.ChanSubscribe(a.o.conversationSubject(conversation(user, r.PathValue("cid")))+".>", ch)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := a.nc.Flush(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	if _, err := w.Write([]byte("event: ready\ndata: {}\n\n")); err != nil {
		return
	}
	if err := rc.Flush(); err != nil {
		return
	}
	buf := make([]byte, 0, 512)
	for {
		select {
		case <-r.Context().Done():
			return
		case m := <-ch:
			buf = buf[:0]
			if strings.HasSuffix(m.Subject, ".live") {
				buf = append(buf, "event: delta\n"...)
			}
			buf = append(buf, "data: "...)
			buf = append(buf, m.Data...)
			buf = append(buf, "\n\n"...)
			if _, err := w.Write(buf); err != nil {
				return
			}
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return
			}
		}
	}
}

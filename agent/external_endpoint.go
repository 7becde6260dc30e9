package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/schema"
)

// Endpoint names an external agent, one protocol at one URL, without a
// secret: what `baton status` shows of it.
type Endpoint struct {
	// Name is the protocol and the origin, and when the URL has a path or
	// a query, "path:" and the first 8 hex digits of the SHA-256 of its
	// escaped path and query ("ag-ui https://agent.example.com
	// path:1a2b3c4d"): two agents of one origin differ, and a key in the
	// path or the query is never shown.
	Name string
	// Protocol is ProtocolAGUI or ProtocolAISDK.
	Protocol string
	// Origin is the URL's scheme, host and port, without credentials.
	Origin string
}

// EndpointOf is the Endpoint of an agent speaking protocol at rawURL.
func EndpointOf(protocol, rawURL string) Endpoint {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		// Validate refuses such a URL; it is never shown either way.
		return Endpoint{Name: protocol + " (an unparsable URL)", Protocol: protocol, Origin: "(an unparsable URL)"}
	}
	e := Endpoint{Protocol: protocol, Origin: u.Scheme + "://" + u.Host}
	e.Name = protocol + " " + e.Origin
	rest := u.EscapedPath()
	if u.RawQuery != "" || u.ForceQuery {
		rest += "?" + u.RawQuery
	}
	if rest != "" && rest != "/" {
		sum := sha256.Sum256([]byte(rest))
		e.Name += " path:" + hex.EncodeToString(sum[:4])
	}
	return e
}

// EndpointOutcome is what one step request to an external agent came to,
// as its reachability counts it (ExternalConfig.OnOutcome).
type EndpointOutcome struct {
	Endpoint Endpoint
	// At is when the request ended.
	At time.Time
	// Error is why the request failed, in short: the reason
	// (baton_agent_errors_total's) and what happened, with no header
	// value, token or URL credential. Empty when the agent answered: its
	// stream was read to its end, whatever it said.
	Error string
}

// Answered reports whether the agent answered the request.
func (o EndpointOutcome) Answered() bool { return o.Error == "" }

// DefaultEndpointRecordInterval is the least time between two records of
// an endpoint whose state did not change (EndpointRecorderConfig.Interval).
const DefaultEndpointRecordInterval = 5 * time.Second

// EndpointRecorderConfig configures an EndpointRecorder.
type EndpointRecorderConfig struct {
	// Interval is the least time between two records of an endpoint that
	// keeps answering, or keeps failing; a change (an answer after a
	// failure, a failure after an answer, the first outcome) is recorded
	// at once. Defaults to 5s.
	Interval time.Duration
	// Logger receives the recorder's logs: a record that failed, at debug
	// level. Defaults to no logging.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy with every zero field set to its default.
func (c EndpointRecorderConfig) WithDefaults() EndpointRecorderConfig {
	if c.Interval == 0 {
		c.Interval = DefaultEndpointRecordInterval
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns a *setting.Error for the first setting that is wrong.
func (c EndpointRecorderConfig) Validate() error {
	if c.Interval < 0 {
		return setting.Errorf("Interval", c.Interval, "must not be negative")
	}
	return nil
}

// EndpointRecorder records in PostgreSQL (agent_endpoints) whether the
// external agents of a worker answer, for `baton status`. Observe takes
// the outcomes of step requests (ExternalConfig.OnOutcome) without
// waiting; Run writes them in the background, so that the agent can be
// built before the worker connects, and a database that is slow or away
// never holds or fails a step: a record that fails is logged at debug
// level and written again later.
type EndpointRecorder struct {
	cfg  EndpointRecorderConfig
	log  zerolog.Logger
	wake chan struct{}

	mu        sync.Mutex
	endpoints map[string]*endpointState
}

// endpointState is what the recorder knows of one endpoint.
type endpointState struct {
	endpoint Endpoint
	// answered is whether the latest request got an answer, since when.
	answered bool
	since    time.Time
	// okAt, errAt and err are what was seen since the last record; zero
	// when nothing was.
	okAt, errAt time.Time
	err         string
	pending     bool
	// retry is set when the last record could not be written: it is
	// written again at the next interval, without waiting for a change.
	retry bool
	// recorded is set once a record is written; recordedAnswered and
	// recordedAt are its state and when it was written.
	recorded         bool
	recordedAnswered bool
	recordedAt       time.Time
}

// NewEndpointRecorder checks the configuration and returns a recorder.
// Nothing is written until Run.
func NewEndpointRecorder(cfg EndpointRecorderConfig) (*EndpointRecorder, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &EndpointRecorder{cfg: cfg, log: *cfg.Logger, wake: make(chan struct{}, 1), endpoints: map[string]*endpointState{}}, nil
}

// Observe takes the outcome of one step request. It never blocks: a
// change of state wakes Run, and what does not change waits for the next
// interval.
func (r *EndpointRecorder) Observe(o EndpointOutcome) {
	answered := o.Answered()
	r.mu.Lock()
	s := r.endpoints[o.Endpoint.Name]
	if s == nil {
		s = &endpointState{endpoint: o.Endpoint}
		r.endpoints[o.Endpoint.Name] = s
	}
	if s.since.IsZero() || s.answered != answered {
		s.since = o.At
	}
	s.answered = answered
	switch {
	case answered && o.At.After(s.okAt):
		s.okAt = o.At
	case !answered && o.At.After(s.errAt):
		s.errAt, s.err = o.At, o.Error
	}
	s.pending = true
	changed := !s.recorded || s.recordedAnswered != answered
	r.mu.Unlock()
	if changed {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// Run writes what Observe took to db until ctx ends, then writes what is
// left once, briefly. It returns nil: a record that fails is tried again.
func (r *EndpointRecorder) Run(ctx context.Context, db schema.Executor) error {
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			// What the last moments saw is left for `baton status`: a
			// worker that stops because its agent fails says so.
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			r.flush(last, db, true)
			cancel()
			return nil
		case <-r.wake:
		case <-ticker.C:
		}
		r.flush(ctx, db, false)
	}
}

// flush writes the records that are due: every pending one when all is
// set, otherwise those whose state changed and those not written for an
// interval.
func (r *EndpointRecorder) flush(ctx context.Context, db schema.Executor, all bool) {
	now := time.Now()
	var due []schema.AgentReach
	r.mu.Lock()
	for _, s := range r.endpoints {
		changed := !s.recorded || s.recordedAnswered != s.answered
		if !s.pending || !all && !changed && !s.retry && now.Sub(s.recordedAt) < r.cfg.Interval {
			continue
		}
		rec := schema.AgentReach{Name: s.endpoint.Name, Protocol: s.endpoint.Protocol, Origin: s.endpoint.Origin,
			Reachable: s.answered, Since: s.since, Error: s.err}
		if !s.okAt.IsZero() {
			t := s.okAt
			rec.OKAt = &t
		}
		if !s.errAt.IsZero() {
			t := s.errAt
			rec.ErrorAt = &t
		}
		due = append(due, rec)
		s.okAt, s.errAt, s.err, s.pending, s.retry = time.Time{}, time.Time{}, "", false, false
		s.recorded, s.recordedAnswered, s.recordedAt = true, s.answered, now
	}
	r.mu.Unlock()
	if len(due) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, rec := range due {
		if err := schema.RecordAgentReach(ctx, db, rec); err != nil {
			if ctx.Err() == nil || all {
				r.log.Debug().Err(err).Str("agent", rec.Name).Msg("could not record whether the agent answers; trying again later")
			}
			r.unflushed(rec)
		}
	}
}

// unflushed puts back a record that could not be written, under what was
// seen since: it is written again at the next interval (not at the next
// change, so that a database that is away is not asked at every step).
func (r *EndpointRecorder) unflushed(rec schema.AgentReach) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.endpoints[rec.Name]
	if rec.OKAt != nil && rec.OKAt.After(s.okAt) {
		s.okAt = *rec.OKAt
	}
	if rec.ErrorAt != nil && rec.ErrorAt.After(s.errAt) {
		s.errAt, s.err = *rec.ErrorAt, rec.Error
	}
	s.pending, s.retry = true, true
}

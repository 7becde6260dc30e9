package schema

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// AgentEndpoint is an external agent (one protocol at one URL) as the
// workers recorded whether it answers, for `baton status`. It holds no
// secret: Origin is the URL's scheme, host and port, and Name adds a hash
// of the rest of the URL, never the rest itself.
type AgentEndpoint struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	Origin   string `json:"origin"`
	// Reachable says whether the latest step request any worker recorded
	// got an answer (a stream read to its end).
	Reachable bool `json:"reachable"`
	// Since is when the endpoint became reachable, or stopped being.
	Since       time.Time  `json:"since"`
	LastOKAt    *time.Time `json:"last_ok_at,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// AgentReach is what one worker saw of an endpoint since it last recorded
// it: its latest answered request, its latest failed one, and which of
// the two states it is in since when.
type AgentReach struct {
	Name, Protocol, Origin string
	// Reachable and Since are the worker's view: whether its latest
	// request got an answer, and since when that is so.
	Reachable bool
	Since     time.Time
	// OKAt is the latest answered request; nil if none since the last
	// record.
	OKAt *time.Time
	// ErrorAt is the latest failed request and Error why it failed (short,
	// and holding no secret); nil and empty if none since the last record.
	ErrorAt *time.Time
	Error   string
}

// agentReachable is the state of an endpoint once a record is merged:
// reachable when its latest answer is no older than its latest failure.
const agentReachable = `coalesce(greatest(e.last_ok_at, EXCLUDED.last_ok_at) >= greatest(e.last_error_at, EXCLUDED.last_error_at),
		greatest(e.last_ok_at, EXCLUDED.last_ok_at) IS NOT NULL)`

// RecordAgentReach merges a worker's view of an endpoint with what the
// workers recorded before: each time is the latest any worker saw, and
// the state changes only when the merged times say so, whichever worker's
// record arrives first. The state's Since is the worker's, but no earlier
// than the other state's latest time, which another worker may have seen
// after this one's Since.
func RecordAgentReach(ctx context.Context, db Executor, r AgentReach) error {
	_, err := db.Exec(ctx, `
		INSERT INTO agent_endpoints AS e (name, protocol, origin, reachable, since, last_ok_at, last_error, last_error_at)
		VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''), $8)
		ON CONFLICT (name) DO UPDATE SET
			last_ok_at = greatest(e.last_ok_at, EXCLUDED.last_ok_at),
			last_error_at = greatest(e.last_error_at, EXCLUDED.last_error_at),
			last_error = CASE WHEN EXCLUDED.last_error_at > coalesce(e.last_error_at, '-infinity') THEN EXCLUDED.last_error ELSE e.last_error END,
			reachable = `+agentReachable+`,
			since = CASE WHEN `+agentReachable+` = e.reachable THEN e.since
				WHEN e.reachable THEN greatest(EXCLUDED.since, e.last_ok_at, EXCLUDED.last_ok_at)
				ELSE greatest(EXCLUDED.since, e.last_error_at, EXCLUDED.last_error_at) END`,
		r.Name, r.Protocol, r.Origin, r.Reachable, r.Since, r.OKAt, r.Error, r.ErrorAt)
	if err != nil {
		return fmt.Errorf("record agent %s: %w", r.Name, err)
	}
	return nil
}

// ListAgentEndpoints returns every recorded endpoint, by name.
func ListAgentEndpoints(ctx context.Context, db Executor) ([]AgentEndpoint, error) {
	rows, err := db.Query(ctx, `
		SELECT name, protocol, origin, reachable, since, last_ok_at, coalesce(last_error, ''), last_error_at
		FROM agent_endpoints ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AgentEndpoint, error) {
		var a AgentEndpoint
		err := r.Scan(&a.Name, &a.Protocol, &a.Origin, &a.Reachable, &a.Since, &a.LastOKAt, &a.LastError, &a.LastErrorAt)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return out, nil
}

package schema

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MCPListedTool is one tool as an MCP server listed it when a turn
// started, with the SHA-256 of its definition and the effect the worker
// derived for it.
type MCPListedTool struct {
	Tool       string
	SHA256     string
	Definition json.RawMessage
	Effect     Effect
}

// MCPToolState is what the journal of definitions says of a listed tool.
type MCPToolState struct {
	// Accepted is the hash of the definition an operator accepted (or the
	// first one seen).
	Accepted string
	// Changed is set when the listed definition is not the accepted one:
	// the tool is disabled until `baton mcp accept`.
	Changed bool
	// New is set when this listing recorded the tool for the first time.
	New bool
}

// mcpListingRefresh is how stale a tool's listed_at may grow before a
// listing that changed nothing writes it again: `baton status` shows when
// each server was last listed, to this precision, without a write per turn.
const mcpListingRefresh = time.Minute

// RecordMCPListing compares what server listed with the accepted
// definitions and returns each tool's state. The first definition of a
// tool is accepted as it is (trust on first use); a later one that differs
// is recorded as listed, and stays disabled until AcceptMCPTools. A
// listing that changed nothing reads only, unless its record is older than
// a minute.
func RecordMCPListing(ctx context.Context, db Executor, server string, tools []MCPListedTool) (map[string]MCPToolState, error) {
	type known struct {
		accepted, listed string
		effect           Effect
		at               time.Time
	}
	rows, err := db.Query(ctx, `SELECT tool, accepted_sha256, listed_sha256, effect, listed_at FROM mcp_tools WHERE server = $1`, server)
	if err != nil {
		return nil, fmt.Errorf("read MCP tool definitions of %s: %w", server, err)
	}
	have := map[string]known{}
	for rows.Next() {
		var name string
		var k known
		if err := rows.Scan(&name, &k.accepted, &k.listed, &k.effect, &k.at); err != nil {
			rows.Close()
			return nil, err
		}
		have[name] = k
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read MCP tool definitions of %s: %w", server, err)
	}
	out := make(map[string]MCPToolState, len(tools))
	var names, hashes, effects []string
	var defs []string
	for _, t := range tools {
		k, ok := have[t.Tool]
		switch {
		case !ok:
			out[t.Tool] = MCPToolState{Accepted: t.SHA256, New: true}
		default:
			out[t.Tool] = MCPToolState{Accepted: k.accepted, Changed: k.accepted != t.SHA256}
			if k.listed == t.SHA256 && k.effect == t.Effect && time.Since(k.at) < mcpListingRefresh {
				continue
			}
		}
		names, hashes, effects = append(names, t.Tool), append(hashes, t.SHA256), append(effects, string(t.Effect))
		defs = append(defs, string(t.Definition))
	}
	if len(names) > 0 {
		// A concurrent first listing by another worker may have inserted
		// the row meanwhile: then its accepted hash stands, as read back.
		rows, err := db.Query(ctx, `
			INSERT INTO mcp_tools (server, tool, accepted_sha256, accepted_definition, listed_sha256, listed_definition, effect)
			SELECT $1, l.tool, l.sha, l.def, l.sha, l.def, l.effect
			FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::text[]) AS l(tool, sha, def, effect)
			ON CONFLICT (server, tool) DO UPDATE SET listed_sha256 = EXCLUDED.listed_sha256,
				listed_definition = EXCLUDED.listed_definition, effect = EXCLUDED.effect, listed_at = now()
			RETURNING tool, accepted_sha256, (xmax = 0)`, server, names, hashes, defs, effects)
		if err != nil {
			return nil, fmt.Errorf("record MCP tool definitions of %s: %w", server, err)
		}
		for rows.Next() {
			var name, accepted string
			var inserted bool
			if err := rows.Scan(&name, &accepted, &inserted); err != nil {
				rows.Close()
				return nil, err
			}
			for _, t := range tools {
				if t.Tool == name {
					out[name] = MCPToolState{Accepted: accepted, Changed: accepted != t.SHA256, New: inserted}
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("record MCP tool definitions of %s: %w", server, err)
		}
	}
	return out, nil
}

// RecordMCPServer records when a worker last listed server, or why it
// could not (cause, which must hold no secret).
func RecordMCPServer(ctx context.Context, db Executor, server string, cause string) error {
	var err error
	if cause == "" {
		_, err = db.Exec(ctx, `
			INSERT INTO mcp_servers (server, listed_at) VALUES ($1, now())
			ON CONFLICT (server) DO UPDATE SET listed_at = now()`, server)
	} else {
		_, err = db.Exec(ctx, `
			INSERT INTO mcp_servers (server, error, error_at) VALUES ($1, $2, now())
			ON CONFLICT (server) DO UPDATE SET error = $2, error_at = now()`, server, cause)
	}
	if err != nil {
		return fmt.Errorf("record MCP server %s: %w", server, err)
	}
	return nil
}

// AcceptedMCPTool is a tool whose listed definition an operator accepted.
type AcceptedMCPTool struct {
	Server, Tool     string
	Previous, SHA256 string
}

// AcceptMCPTools accepts the listed definition of server's tool (every
// changed tool of server when tool is empty) and returns what it changed.
// Every worker offers the tool again from its next turn.
func AcceptMCPTools(ctx context.Context, db Executor, server, tool string) ([]AcceptedMCPTool, error) {
	rows, err := db.Query(ctx, `
		UPDATE mcp_tools t SET accepted_sha256 = t.listed_sha256, accepted_definition = t.listed_definition, accepted_at = now()
		FROM (SELECT server, tool, accepted_sha256 AS previous FROM mcp_tools
			WHERE server = $1 AND ($2 = '' OR tool = $2) AND accepted_sha256 <> listed_sha256 FOR UPDATE) p
		WHERE t.server = p.server AND t.tool = p.tool
		RETURNING t.server, t.tool, p.previous, t.accepted_sha256`, server, tool)
	if err != nil {
		return nil, fmt.Errorf("accept MCP tools: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AcceptedMCPTool, error) {
		var a AcceptedMCPTool
		err := r.Scan(&a.Server, &a.Tool, &a.Previous, &a.SHA256)
		return a, err
	})
}

// MCPTool is a recorded tool, as `baton status` lists it.
type MCPTool struct {
	Server   string    `json:"server"`
	Tool     string    `json:"tool"`
	Effect   Effect    `json:"effect"`
	Changed  bool      `json:"changed"`
	SHA256   string    `json:"sha256"`
	ListedAt time.Time `json:"listed_at"`
}

// MCPServerRecord is a recorded server, as `baton status` lists it.
type MCPServerRecord struct {
	Server   string     `json:"server"`
	ListedAt *time.Time `json:"listed_at,omitempty"`
	Error    string     `json:"error,omitempty"`
	ErrorAt  *time.Time `json:"error_at,omitempty"`
	Tools    []MCPTool  `json:"tools"`
}

// ListMCPServers returns every recorded server with its tools, by name.
func ListMCPServers(ctx context.Context, db Executor) ([]MCPServerRecord, error) {
	rows, err := db.Query(ctx, `
		SELECT s.server, s.listed_at, coalesce(s.error, ''), s.error_at FROM mcp_servers s
		UNION SELECT DISTINCT t.server, NULL::timestamptz, '', NULL::timestamptz FROM mcp_tools t
			WHERE NOT EXISTS (SELECT 1 FROM mcp_servers s WHERE s.server = t.server)
		ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list MCP servers: %w", err)
	}
	servers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MCPServerRecord, error) {
		var s MCPServerRecord
		err := r.Scan(&s.Server, &s.ListedAt, &s.Error, &s.ErrorAt)
		s.Tools = []MCPTool{}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list MCP servers: %w", err)
	}
	rows, err = db.Query(ctx, `
		SELECT server, tool, effect, accepted_sha256 <> listed_sha256, listed_sha256, listed_at
		FROM mcp_tools ORDER BY server, tool`)
	if err != nil {
		return nil, fmt.Errorf("list MCP tools: %w", err)
	}
	tools, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MCPTool, error) {
		var t MCPTool
		err := r.Scan(&t.Server, &t.Tool, &t.Effect, &t.Changed, &t.SHA256, &t.ListedAt)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list MCP tools: %w", err)
	}
	for _, t := range tools {
		for i := range servers {
			if servers[i].Server == t.Server {
				servers[i].Tools = append(servers[i].Tools, t)
			}
		}
	}
	return servers, nil
}

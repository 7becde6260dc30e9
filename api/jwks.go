package api

import (
	"net/http"
	"strconv"
	"time"
)

// agentKeysMaxAge is how long an agent or a proxy may keep the JWKS. A
// rotation serves the new key this long before the worker signs with it;
// an agent that meets an unknown kid sooner fetches the set again anyway.
const agentKeysMaxAge = 5 * time.Minute

// agentKeys serves the public keys of the worker's step tokens as a JWKS,
// for external agents to verify the requests that come from Baton. It
// needs no token: the keys are public, and an agent has no Baton token.
func (s *Server) agentKeys(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.AgentKeys == nil {
		writeError(w, http.StatusNotFound, "not_found", "this server publishes no agent keys")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age="+strconv.Itoa(int(agentKeysMaxAge.Seconds())))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(s.cfg.AgentKeys.JWKS())
}

package cli

import (
	"time"

	"github.com/batonhq/baton/api"
)

// quotaFlags are the API's per-user quotas; `baton api` and `baton dev`
// share them. A flag left out means the API's default.
type quotaFlags struct {
	MaxConversations  int           `name:"max-conversations" env:"BATON_MAX_CONVERSATIONS" help:"Conversations one user may have; one more gets 429. Negative turns the quota off. Defaults to ${max_conversations}."`
	MaxRetriesPerHour int           `name:"max-retries-per-hour" env:"BATON_MAX_RETRIES_PER_HOUR" help:"Retries of a conversation's failed turn per hour (each is a new round of model calls); past it 429 with Retry-After. Negative turns the quota off. Defaults to ${max_retries_per_hour}."`
	StreamRecheck     time.Duration `name:"stream-recheck" env:"BATON_STREAM_RECHECK" help:"How often an open event stream checks that its conversation and token are still valid, and ends when not. Defaults to ${stream_recheck}."`
}

// apiQuotas returns the quotas for api.Config.
func (q quotaFlags) apiQuotas() api.Quotas {
	return api.Quotas{MaxConversations: q.MaxConversations, MaxRetriesPerHour: q.MaxRetriesPerHour}
}

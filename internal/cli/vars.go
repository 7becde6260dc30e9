package cli

import (
	"fmt"
	"strings"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/console"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/internal/status"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// vars are the kong variables behind ${...} in flag tags: the libraries'
// own default constants, so that a default shown in --help or used by a
// flag is the library's and cannot drift from it.
func vars() map[string]string {
	return map[string]string{
		"nats_url":                  batonnats.DefaultURL,
		"stream":                    batonnats.DefaultStream,
		"subject_prefix":            batonnats.DefaultSubjectPrefix,
		"replicas":                  fmt.Sprint(batonnats.DefaultReplicas),
		"max_age":                   batonnats.DefaultMaxAge.String(),
		"duplicate_window":          batonnats.DefaultDuplicateWindow.String(),
		"partitions":                fmt.Sprint(batonnats.DefaultPartitions),
		"consumer":                  batonnats.DefaultConsumer,
		"max_deliver":               fmt.Sprint(batonnats.DefaultMaxDeliver),
		"slot":                      relay.DefaultSlot,
		"publication":               relay.DefaultPublication,
		"max_in_flight":             fmt.Sprint(relay.DefaultMaxInFlight),
		"status_interval":           relay.DefaultStatusInterval.String(),
		"heartbeat":                 relay.DefaultHeartbeatInterval.String(),
		"sweep_interval":            relay.DefaultSweepInterval.String(),
		"sweep_age":                 relay.DefaultSweepAge.String(),
		"ack_timeout":               relay.DefaultAckTimeout.String(),
		"debounce":                  consumer.DefaultDebounce.String(),
		"max_attempts":              fmt.Sprint(consumer.DefaultMaxAttempts),
		"lease":                     consumer.DefaultLease.String(),
		"concurrency":               fmt.Sprint(consumer.DefaultConcurrency),
		"group_lanes":               fmt.Sprint(group.DefaultLanes),
		"group_max_attempts":        fmt.Sprint(group.DefaultMaxAttempts),
		"group_retry_min":           group.DefaultRetryMin.String(),
		"group_retry_max":           group.DefaultRetryMax.String(),
		"group_ack_wait":            group.DefaultAckWait.String(),
		"webhook_timeout":           group.DefaultWebhookTimeout.String(),
		"model_base_url":            agent.DefaultBaseURL,
		"model_timeout":             agent.DefaultRequestTimeout.String(),
		"model_first_byte":          agent.DefaultFirstByteTimeout.String(),
		"model_idle":                agent.DefaultIdleTimeout.String(),
		"model_context":             fmt.Sprint(agent.DefaultContextTokens),
		"model_media":               strings.Join(agent.DefaultModelMedia, ","),
		"model_tool_result":         fmt.Sprint(agent.DefaultMaxToolResultBytes),
		"max_model_calls":           fmt.Sprint(agent.DefaultMaxModelCalls),
		"max_tool_iterations":       fmt.Sprint(consumer.DefaultMaxToolIterations),
		"agent_timeout":             agent.DefaultExternalTimeout.String(),
		"agent_first_byte":          agent.DefaultExternalFirstByteTimeout.String(),
		"agent_idle":                agent.DefaultExternalIdleTimeout.String(),
		"agent_max_in_flight":       fmt.Sprint(agent.DefaultMaxInFlight),
		"agent_max_step_bytes":      fmt.Sprint(agent.DefaultMaxStepBytes),
		"agent_max_tool_calls":      fmt.Sprint(agent.DefaultMaxToolCalls),
		"agent_issuer":              jwtauth.DefaultStepIssuer,
		"approval_ttl":              consumer.DefaultApprovalTTL.String(),
		"mcp_call_timeout":          agent.DefaultMCPCallTimeout.String(),
		"mcp_max_output":            fmt.Sprint(agent.DefaultMCPMaxOutputBytes),
		"http_header_timeout":       api.DefaultHeaderTimeout.String(),
		"http_read_timeout":         api.DefaultReadTimeout.String(),
		"http_write_timeout":        api.DefaultWriteTimeout.String(),
		"http_idle_timeout":         api.DefaultIdleTimeout.String(),
		"max_header_bytes":          fmt.Sprint(api.DefaultMaxHeaderBytes),
		"messages_per_minute":       fmt.Sprint(api.DefaultMessagesPerMinute),
		"message_burst":             fmt.Sprint(api.DefaultMessageBurst),
		"streams_per_user":          fmt.Sprint(api.DefaultMaxStreamsPerUser),
		"max_streams":               fmt.Sprint(api.DefaultMaxStreams),
		"max_chat_body_bytes":       fmt.Sprint(api.DefaultMaxChatBodyBytes),
		"max_chat_messages":         fmt.Sprint(api.DefaultMaxChatMessages),
		"max_file_bytes":            fmt.Sprint(schema.DefaultMaxFileBytes),
		"max_files_per_message":     fmt.Sprint(schema.DefaultMaxFiles),
		"max_user_file_bytes":       fmt.Sprint(schema.DefaultMaxUserFileBytes),
		"file_media_types":          strings.Join(schema.DefaultFileMediaTypes, ","),
		"file_link_ttl":             api.DefaultFileLinkTTL.String(),
		"token_expiry":              DefaultTokenExpiry.String(),
		"console_addr":              DefaultConsoleAddr,
		"console_session_idle":      console.DefaultSessionIdle.String(),
		"console_session_max_age":   console.DefaultSessionMaxAge.String(),
		"console_refresh":           console.DefaultRefreshInterval.String(),
		"console_sign_ins":          fmt.Sprint(console.DefaultSignInPerMinute),
		"console_sign_in_burst":     fmt.Sprint(console.DefaultSignInBurst),
		"console_lease_grace":       console.DefaultLeaseGrace.String(),
		"console_pending_after":     console.DefaultPendingAfter.String(),
		"console_approval_after":    console.DefaultApprovalAfter.String(),
		"console_max_lag":           fmt.Sprint(console.DefaultMaxLagBytes),
		"console_page_size":         fmt.Sprint(console.DefaultPageSize),
		"http_addr":                 config.DefaultHTTPAddr,
		"double_texting":            string(schema.DefaultDoubleTexting),
		"max_conversations":         fmt.Sprint(api.DefaultMaxConversations),
		"max_retries_per_hour":      fmt.Sprint(api.DefaultMaxRetriesPerHour),
		"stream_recheck":            api.DefaultStreamRecheck.String(),
		"max_turn_messages":         fmt.Sprint(consumer.DefaultMaxTurnMessages),
		"turn_timeout":              consumer.DefaultTurnTimeout.String(),
		"session_check":             consumer.DefaultSessionCheckInterval.String(),
		"stall_after":               status.DefaultStallAfter.String(),
		"lease_grace":               status.DefaultLeaseGrace.String(),
		"outbox_retention":          schema.DefaultOutboxRetention.String(),
		"run_retention":             schema.DefaultRunRetention.String(),
		"operation_retention":       schema.DefaultOperationRetention.String(),
		"operator_action_retention": schema.DefaultOperatorActionRetention.String(),
		"inbox_margin":              schema.DefaultInboxMargin.String(),
		"prune_batch":               fmt.Sprint(schema.DefaultPruneBatch),
		"prune_pass_time":           schema.DefaultPrunePassTime.String(),
		"prune_every":               DefaultPruneEvery.String(),
		"jwt_user_claim":            jwtauth.DefaultUserClaim,
	}
}

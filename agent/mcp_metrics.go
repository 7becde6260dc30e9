package agent

import "github.com/prometheus/client_golang/prometheus"

type mcpMetrics struct {
	calls             *prometheus.CounterVec
	callSeconds       *prometheus.HistogramVec
	listFailures      *prometheus.CounterVec
	definitionChanges *prometheus.CounterVec
	disabled          *prometheus.GaugeVec
}

func newMCPMetrics(reg prometheus.Registerer) *mcpMetrics {
	m := &mcpMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_mcp_calls_total",
			Help: "MCP tool calls by server and outcome: completed (isError included), refused (a protocol error), unavailable (not sent), failed (a read without an answer), unknown (a write without an answer: the turn failed, the call is never sent again).",
		}, []string{"server", "outcome"}),
		callSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "baton_mcp_call_seconds",
			Help:    "Time of MCP tool calls, by server.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"server"}),
		listFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_mcp_list_failures_total",
			Help: "Turns that started while an MCP server could not be listed; its tools were not offered.",
		}, []string{"server"}),
		definitionChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_mcp_tool_definition_changes_total",
			Help: "MCP tool definitions seen changed since they were accepted (each changed definition once per worker); the tool is disabled until `baton mcp accept`.",
		}, []string{"server"}),
		disabled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_mcp_tools_disabled",
			Help: "MCP tools of a server not offered at the last turn start because their definition changed since it was accepted.",
		}, []string{"server"}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.callSeconds, m.listFailures, m.definitionChanges, m.disabled)
	}
	return m
}

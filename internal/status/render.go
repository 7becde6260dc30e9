package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the report as tables a person can read at a glance,
// with what needs attention first.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	if len(r.Attention) == 0 {
		p("STATUS\tok\n\n")
	} else {
		p("STATUS\tneeds attention\n")
		for _, a := range r.Attention {
			p("  !\t%s\n", a)
		}
		p("\n")
	}

	if d := r.Database; d != nil {
		p("DATABASE\tSERVER\tTIMELINE\tSTANDBYS\n")
		standbys := "none"
		if len(d.Standbys) > 0 {
			var parts []string
			for _, sb := range d.Standbys {
				parts = append(parts, fmt.Sprintf("%s %s %s, replay lag %s", sb.Name, sb.State, sb.SyncState, Bytes(sb.ReplayLagBytes)))
			}
			standbys = strings.Join(parts, "; ")
		}
		if d.SynchronousStandbyNames != "" {
			standbys += " (synchronous: " + d.SynchronousStandbyNames + ")"
		}
		p("%s\t%s\t%d\t%s\n\n", d.Name, d.Server, d.Timeline, standbys)
	}

	s := r.Slot
	p("SLOT\tACTIVE\tCLIENT\tCONFIRMED LSN\tLAG\tRETAINED WAL\tWAL STATUS\tSTILL FOR\n")
	if s == nil || !s.Exists {
		p("%s\tmissing\t-\t-\t-\t-\t-\t-\n", s.Name)
	} else {
		client := s.Client
		if client == "" {
			client = "-"
		}
		still := "-"
		if s.StalledFor > 0 {
			still = round(time.Duration(s.StalledFor)).String()
		}
		p("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, yesNo(s.Active), client, s.ConfirmedFlushLSN,
			Bytes(s.LagBytes), Bytes(s.RetainedWALBytes), s.WALStatus, still)
	}
	p("\n")

	p("STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tFIRST\tLAST SEQ\tLAST\tREPLICAS\n")
	if st := r.Stream; st != nil {
		replicas := fmt.Sprint(st.Replicas)
		if len(st.Peers) > 0 {
			var parts []string
			for _, pe := range st.Peers {
				state := "current"
				switch {
				case pe.Offline:
					state = "offline"
				case !pe.Current:
					state = fmt.Sprintf("lag %d", pe.Lag)
				}
				if pe.Name == st.Leader {
					state = "leader"
				}
				parts = append(parts, pe.Name+" "+state)
			}
			replicas += " (" + strings.Join(parts, ", ") + ")"
		}
		p("%s\t%d\t%s\t%d\t%s\t%d\t%s\t%s\n", st.Name, st.Messages, Bytes(int64(st.Bytes)),
			st.FirstSeq, ago(st.FirstTime), st.LastSeq, ago(st.LastTime), replicas)
	} else {
		p("-\tunavailable\n")
	}
	p("\n")

	p("GROUP\tPENDING\tACK PENDING\tREDELIVERED\tWAITING PULLS\tLAST ACTIVITY\tLAST ACK\tOLDEST WAITING\n")
	if len(r.Groups) == 0 {
		p("(none)\n")
	}
	for _, g := range r.Groups {
		last, ack, oldest := "-", "-", "-"
		if g.LastActivity != nil {
			last = ago(*g.LastActivity)
		}
		if g.LastAck != nil {
			ack = ago(*g.LastAck)
		}
		if g.OldestWaiting != nil {
			oldest = ago(*g.OldestWaiting)
		}
		p("%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", g.Name, g.Pending, g.AckPending, g.Redelivered, g.Waiting, last, ack, oldest)
	}
	p("\n")

	o := r.Outbox
	oldest := "-"
	if o.OldestPendingAge != nil {
		oldest = time.Duration(*o.OldestPendingAge).Round(time.Millisecond).String()
	}
	p("OUTBOX\tPENDING\tPROCESSING\tDONE\tERROR\tOLDEST PENDING\n")
	p("rows\t%d\t%d\t%d\t%d\t%s\n\n", o.ByStatus["pending"], o.ByStatus["processing"], o.ByStatus["done"], o.ByStatus["error"], oldest)

	if len(r.DeadLetters) > 0 {
		p("DEAD LETTERS\tPARKED\tFIRST SEQ\tOLDEST\n")
		for _, d := range r.DeadLetters {
			p("%s\t%d\t%d\t%s\n", d.Group, d.Count, d.FirstSeq, ago(d.OldestParked))
		}
		p("\n")
	}

	if len(r.Tables) > 0 {
		p("TABLE\tSIZE\tROWS (ESTIMATE)\tOLDEST\n")
		for _, t := range r.Tables {
			oldest := "-"
			if t.Oldest != nil {
				oldest = ago(*t.Oldest) + " (" + t.Of + ")"
			}
			p("%s\t%s\t%d\t%s\n", t.Table, Bytes(t.Bytes), t.Rows, oldest)
		}
		p("\n")
	}

	if si := r.SignIn; si != nil {
		p("SIGN-IN\tISSUER\tAUDIENCE\tKEYS\tUSER\n")
		p("baton tokens\t-\t-\t-\t<name>\n")
		if j := si.JWT; j != nil {
			if j.Issuer != "" {
				keys := fmt.Sprintf("%d from %s", j.Keys, j.JWKSURL)
				if j.Error != "" {
					keys = "none fetched (" + j.KeySource + ")"
				} else if j.KeySource != j.JWKSURL {
					keys += " (" + j.KeySource + ")"
				}
				p("JWT\t%s\t%s\t%s\t<iss>|<%s>\n", j.Issuer, j.Audience, keys, j.UserClaim)
			}
			if j.HS256Issuer != "" {
				p("JWT HS256\t%s\t%s\tthe shared secret\t<iss>|<%s>\n", j.HS256Issuer, j.Audience, j.UserClaim)
			}
		}
		p("\n")
	}

	if len(r.MCPServers) > 0 {
		p("MCP SERVER\tTOOLS\tLISTED\tLAST ERROR\n")
		for _, s := range r.MCPServers {
			listed, failed := "-", "-"
			if s.ListedAt != nil {
				listed = ago(*s.ListedAt)
			}
			if s.ErrorAt != nil {
				failed = ago(*s.ErrorAt) + ": " + s.Error
			}
			p("%s\t%d\t%s\t%s\n", s.Server, len(s.Tools), listed, failed)
		}
		p("\nMCP TOOL\tEFFECT\tSTATE\tLISTED\n")
		for _, s := range r.MCPServers {
			for _, t := range s.Tools {
				state := "offered"
				if t.Changed {
					state = "changed: baton mcp accept " + s.Server + "__" + t.Tool
				}
				p("%s__%s\t%s\t%s\t%s\n", s.Server, t.Tool, t.Effect, state, ago(t.ListedAt))
			}
		}
		p("\napprovals waiting\t%d\n\n", r.ApprovalsWaiting)
	}

	if len(r.Agents) > 0 {
		p("AGENT\tREACHABLE\tSINCE\tLAST ANSWER\tLAST ERROR\n")
		for _, a := range r.Agents {
			answered, failed := "-", "-"
			if a.LastOKAt != nil {
				answered = ago(*a.LastOKAt)
			}
			if a.LastErrorAt != nil {
				failed = ago(*a.LastErrorAt) + ": " + a.LastError
			}
			p("%s\t%s\t%s\t%s\t%s\n", a.Name, yesNo(a.Reachable), ago(a.Since), answered, failed)
		}
		p("\n")
	}

	p("LEASES\tHELD\tEXPIRED\tPAST GRACE\n")
	p("runs\t%d\t%d\t%d\n", r.Leases.Held, r.Leases.Expired, r.Leases.Overdue)
	if len(r.Leases.Runs) > 0 {
		p("\nCONVERSATION\tRUN\tWORKER\tLEASE\n")
		for _, l := range r.Leases.Runs {
			p("%s\t%s\t%s\t%s\n", l.ConversationID, l.RunID, l.Worker, until(l.ExpiresAt))
		}
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func until(t time.Time) string {
	d := time.Until(t).Round(time.Second)
	if d < 0 {
		return "expired " + (-d).String() + " ago"
	}
	return "expires in " + d.String()
}

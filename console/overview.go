package console

import (
	"context"
	"net/http"
	"time"

	"github.com/batonhq/baton/internal/status"
	"github.com/batonhq/baton/schema"
)

// overviewData is what the overview shows, gathered at one moment.
type overviewData struct {
	At time.Time
	// Report is `baton status`'s report without its whole-table counts:
	// the relay's slot, the stream, the consumer groups, dead letters,
	// agents and what needs attention.
	Report    *status.Report
	ReportErr string
	Turns     schema.TurnStats
	TurnsErr  string
	// Charts of the last hour, drawn here as SVG.
	TurnsChart, LatencyChart chart
}

// overviewData returns the overview's data, gathered at most once per
// refresh interval: every tab that asks meanwhile gets the same, so the
// number of open tabs costs PostgreSQL and NATS nothing more. Tabs that
// ask while a gather runs wait for it.
func (s *Server) overviewData(ctx context.Context) *overviewData {
	o := &s.overview
	o.Lock()
	defer o.Unlock()
	if o.data != nil && time.Since(o.at) < s.cfg.RefreshInterval {
		return o.data
	}
	// A tab that goes away must not leave the others without data.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(2*s.cfg.RefreshInterval, 10*time.Second))
	defer cancel()
	d := &overviewData{At: time.Now()}
	report, err := status.Gather(gctx, s.db, s.js, status.Options{
		Slot: s.cfg.Slot, Stream: s.cfg.Stream, NoScans: true,
		MaxLagBytes: s.cfg.MaxLagBytes, MaxPendingAge: s.cfg.PendingAfter, LeaseGrace: s.cfg.LeaseGrace,
	})
	if err != nil {
		s.log.Warn().Err(err).Msg("cannot gather the overview's status")
		d.ReportErr = "The status of the relay, the stream and the groups cannot be read now; the console's log says why."
	}
	d.Report = report
	turns, err := schema.ReadTurnStats(gctx, s.db)
	if err != nil {
		s.log.Warn().Err(err).Msg("cannot read the overview's turns")
		d.TurnsErr = "The turns cannot be read now; the console's log says why."
	}
	d.Turns = turns
	d.TurnsChart, d.LatencyChart = turnsChart(turns.Minutes), latencyChart(turns.Minutes)
	o.data, o.at = d, time.Now()
	o.gathers++
	return d
}

func (s *Server) overviewPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "overview", s.newView(r, "Overview", "overview", s.overviewData(r.Context())))
}

// overviewLive is the overview's live part, which the page asks for again
// every refresh interval.
func (s *Server) overviewLive(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "overview-live", s.newView(r, "Overview", "overview", s.overviewData(r.Context())))
}

// DeadLettersOf counts the group's unresolved dead letters.
func (d *overviewData) DeadLettersOf(group string) int64 {
	if d.Report == nil {
		return 0
	}
	for _, g := range d.Report.DeadLetters {
		if g.Group == group {
			return g.Count
		}
	}
	return 0
}

// LagSeconds is how long the slot's confirmed position has stood still
// while WAL waited behind it: the relay's lag in time.
func (d *overviewData) LagSeconds() time.Duration {
	if d.Report == nil || d.Report.Slot == nil {
		return 0
	}
	return time.Duration(d.Report.Slot.StalledFor)
}

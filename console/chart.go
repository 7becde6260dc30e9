package console

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/batonhq/baton/schema"
)

// Charts drawn on the server: shapes with their coordinates, which the
// template writes as SVG. No script draws anything.

const (
	chartWidth  = 640
	chartHeight = 170
	chartLeft   = 44 // room for the y axis' labels
	chartBottom = 20 // room for the x axis' labels
	chartTop    = 8
)

type chart struct {
	Width, Height int
	Bars          []chartBar
	Lines         []chartLine
	YTicks        []chartTick
	XTicks        []chartTick
	Legend        []chartLegend
	// Plot is the area inside the axes.
	PlotLeft, PlotBottom, PlotRight float64
}

type chartBar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type chartLine struct {
	Points string
	Class  string
}

type chartTick struct {
	X, Y  float64
	Label string
	// Anchor is the label's text-anchor: start, middle or end.
	Anchor string
}

type chartLegend struct {
	Class, Label string
}

func newChart() chart {
	return chart{Width: chartWidth, Height: chartHeight, PlotLeft: chartLeft, PlotBottom: chartHeight - chartBottom, PlotRight: chartWidth - 4}
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten, so that the axis
// reads well.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// axes adds the y ticks (0, half, max) labelled by label, and an x tick
// every 15 minutes.
func (c *chart) axes(minutes []schema.MinuteStat, yMax float64, label func(float64) string) {
	h := c.PlotBottom - chartTop
	for _, f := range []float64{0, 0.5, 1} {
		c.YTicks = append(c.YTicks, chartTick{X: c.PlotLeft - 4, Y: c.PlotBottom - f*h, Label: label(f * yMax), Anchor: "end"})
	}
	n := len(minutes)
	if n == 0 {
		return
	}
	slot := (c.PlotRight - c.PlotLeft) / float64(n)
	for i, m := range minutes {
		switch {
		case i == 0:
			c.XTicks = append(c.XTicks, chartTick{X: c.PlotLeft, Y: float64(c.Height) - 4, Label: m.Start.UTC().Format("15:04"), Anchor: "start"})
		case i == n-1:
			c.XTicks = append(c.XTicks, chartTick{X: c.PlotRight, Y: float64(c.Height) - 4, Label: m.Start.UTC().Format("15:04"), Anchor: "end"})
		case i%15 == 0:
			c.XTicks = append(c.XTicks, chartTick{X: round1(c.PlotLeft + slot*(float64(i)+0.5)), Y: float64(c.Height) - 4, Label: m.Start.UTC().Format("15:04"), Anchor: "middle"})
		}
	}
}

// turnsChart draws the turns that ended each minute: answered, with the
// failed ones on top.
func turnsChart(minutes []schema.MinuteStat) chart {
	c := newChart()
	var most int64
	for _, m := range minutes {
		most = max(most, m.Answered+m.Failed)
	}
	yMax := niceMax(float64(most))
	c.axes(minutes, yMax, func(v float64) string { return fmt.Sprintf("%g", v) })
	if len(minutes) == 0 {
		return c
	}
	h := c.PlotBottom - chartTop
	slot := (c.PlotRight - c.PlotLeft) / float64(len(minutes))
	w := math.Max(slot-1, 1)
	for i, m := range minutes {
		x := c.PlotLeft + slot*float64(i)
		answered := float64(m.Answered) / yMax * h
		failed := float64(m.Failed) / yMax * h
		title := fmt.Sprintf("%s: %d answered, %d failed", m.Start.UTC().Format("15:04"), m.Answered, m.Failed)
		if m.Answered > 0 {
			c.Bars = append(c.Bars, chartBar{X: round1(x), Y: round1(c.PlotBottom - answered), W: round1(w), H: round1(answered), Class: "answered", Title: title})
		}
		if m.Failed > 0 {
			c.Bars = append(c.Bars, chartBar{X: round1(x), Y: round1(c.PlotBottom - answered - failed), W: round1(w), H: round1(failed), Class: "failed", Title: title})
		}
	}
	c.Legend = []chartLegend{{"answered", "answered"}, {"failed", "failed"}}
	return c
}

// latencyChart draws the p50 and p99 latency of the answering runs of each
// minute that had one.
func latencyChart(minutes []schema.MinuteStat) chart {
	c := newChart()
	var most time.Duration
	for _, m := range minutes {
		most = max(most, m.P99, m.P50)
	}
	yMax := niceMax(most.Seconds())
	c.axes(minutes, yMax, func(v float64) string { return shortDuration(time.Duration(v * float64(time.Second))) })
	if len(minutes) == 0 {
		return c
	}
	h := c.PlotBottom - chartTop
	slot := (c.PlotRight - c.PlotLeft) / float64(len(minutes))
	var p50, p99 []string
	for i, m := range minutes {
		if m.Answered == 0 {
			continue
		}
		x := round1(c.PlotLeft + slot*(float64(i)+0.5))
		p50 = append(p50, fmt.Sprintf("%g,%g", x, round1(c.PlotBottom-m.P50.Seconds()/yMax*h)))
		p99 = append(p99, fmt.Sprintf("%g,%g", x, round1(c.PlotBottom-m.P99.Seconds()/yMax*h)))
		title := fmt.Sprintf("%s: p50 %s, p99 %s", m.Start.UTC().Format("15:04"), shortDuration(m.P50), shortDuration(m.P99))
		c.Bars = append(c.Bars, chartBar{X: x - 1.5, Y: round1(c.PlotBottom - m.P99.Seconds()/yMax*h - 1.5), W: 3, H: 3, Class: "p99", Title: title})
	}
	if len(p99) > 0 {
		c.Lines = append(c.Lines, chartLine{Points: strings.Join(p99, " "), Class: "p99"}, chartLine{Points: strings.Join(p50, " "), Class: "p50"})
	}
	c.Legend = []chartLegend{{"p50", "p50"}, {"p99", "p99"}}
	return c
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

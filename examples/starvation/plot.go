package main

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // registers png
	_ "gonum.org/v1/plot/vg/vgsvg" // registers svg
)

var contenderColors = map[string]color.Color{
	"idle":     color.RGBA{R: 140, G: 140, B: 140, A: 255},
	"pgxpool":  color.RGBA{R: 214, G: 39, B: 40, A: 255},
	"two-pool": color.RGBA{R: 255, G: 127, B: 14, A: 255},
	"pgxlanes": color.RGBA{R: 31, G: 119, B: 180, A: 255},
	// learning off: the same hue as pgxlanes, lighter, and dashed
	"pgxlanes-nolearn": color.RGBA{R: 148, G: 103, B: 189, A: 255},
}

// drawPlot draws four panels: the p99 of short-query latency over time for the contenders under
// load (top), and the latency distribution of each contender in the steady, burst and slow phases
// (bottom), with latency on a log scale and the percentile on a scale that spreads the tail.
func drawPlot(r *report, cfg *config, path string) error {
	const w, h = 16 * vg.Inch, 10 * vg.Inch
	format := strings.TrimPrefix(filepath.Ext(path), ".")
	cw, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return err
	}
	dc := draw.New(cw)
	top := draw.Crop(dc, 0, 0, h*0.5, 0)
	bottom := draw.Crop(dc, 0, 0, 0, -h*0.5)

	over, err := overTimePlot(r, cfg)
	if err != nil {
		return err
	}
	panels := []*plot.Plot{over}
	for _, c := range []struct {
		title string
		ph    phase
	}{
		{fmt.Sprintf("steady: %d long transactions, %g lookups/s", cfg.longWorkers, cfg.rate), phaseSteady},
		{fmt.Sprintf("burst: %d long transactions, %g lookups/s of %v each", cfg.burstLongWorkers, cfg.burstRate, cfg.burstWork), phaseBurst},
		{fmt.Sprintf("slow: %d clients of %s, %g lookups/s", cfg.slowClients, slowSQL(cfg), cfg.rate), phaseSlow},
	} {
		p, err := cdfPlot(r, c.title, func(cr *contenderResult) *phaseResult { return *cr.phase(c.ph) })
		if err != nil {
			return err
		}
		panels = append(panels, p)
	}
	margin := func(c draw.Canvas) draw.Canvas {
		return draw.Crop(c, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -vg.Millimeter*3)
	}
	over.Draw(margin(top))
	for i, p := range panels[1:] {
		third := w / 3
		p.Draw(margin(draw.Crop(bottom, third*vg.Length(i), -third*vg.Length(2-i), 0, 0)))
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := cw.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cdfPlot draws, for every contender, the fraction of lookups of a phase that finished within a
// latency. Failed lookups never finish: a contender with failures tops out below 1.
func cdfPlot(r *report, title string, get func(*contenderResult) *phaseResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "short-query latency, ms (log scale)"
	p.Y.Label.Text = "lookups done within"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = msTicks{}
	p.Y.Scale = ninesScale{}
	p.Y.Tick.Marker = ninesTicks{}
	p.Y.Min, p.Y.Max = 0, 0.99999 // headroom above p99.9 for the legend
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true

	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range r.Contenders {
		pr := get(c)
		if pr == nil || pr.OK == 0 {
			continue
		}
		lat := slices.Clone(pr.Samples.LatencyMS)
		slices.Sort(lat)
		pts := make(plotter.XYs, 0, len(lat))
		for i, v := range lat {
			v = max(v, 0.001)
			pts = append(pts, plotter.XY{X: v, Y: (float64(i) + 0.5) / float64(pr.Issued)})
			lo, hi = min(lo, v), max(hi, v)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color = contenderColors[c.Name]
		l.Width = vg.Points(2)
		if c.Name == "idle" || c.Name == "pgxlanes-nolearn" {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(legendName(c, pr), l)
	}
	if lo <= hi {
		p.X.Min, p.X.Max = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	}
	return p, nil
}

func legendName(c *contenderResult, pr *phaseResult) string {
	s := fmt.Sprintf("%s: p99 %s", c.Name, fmtMS(pr.Latency.P99))
	if n := pr.Failed.total(); n > 0 {
		s += fmt.Sprintf(", %d failed", n)
	}
	return s
}

// overTimePlot draws the p99 of the lookups scheduled in each quarter second, for the contenders
// under load (the idle baseline has another timeline), with the phases marked. A window whose p99
// falls on a failed lookup is drawn on the "failed" line at the top. pgxlanes-nolearn runs only
// the learn and slow phases: its line is shifted to line up with the others'.
func overTimePlot(r *report, cfg *config) (*plot.Plot, error) {
	const window = 250.0 // ms
	p := plot.New()
	p.Title.Text = fmt.Sprintf("short-query p99 per %gms window (all contenders: %d conns; dashed lines: phase boundaries)", window, cfg.conns)
	p.X.Label.Text = "seconds since the contender started (long transactions start at 0, lookups after the ramp; the slow statements at learn)"
	p.Y.Label.Text = "p99 latency, ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = msTicks{}
	p.X.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ticks []plot.Tick
		for s := math.Ceil(lo); s <= hi; s++ {
			ticks = append(ticks, plot.Tick{Value: s, Label: fmt.Sprintf("%gs", s)})
		}
		return ticks
	})
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true

	// The reference timeline: the first contender that ran every phase.
	var ref *contenderResult
	for _, c := range r.Contenders {
		if c.Load && ref == nil {
			ref = c
		}
	}
	type series struct {
		c   *contenderResult
		pts plotter.XYs // Y is +Inf where the p99 is a failed lookup
	}
	var all []series
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range r.Contenders {
		if !c.Load && c.SlowStmts == nil {
			continue
		}
		shift := 0.0 // ms
		if !c.Load && ref != nil && ref.Learn != nil && c.Learn != nil {
			shift = (ref.Learn.FromS - c.Learn.FromS) * 1000
		}
		buckets := map[int][]float64{}
		for _, ph := range []phase{phaseSteady, phaseTransition, phaseBurst, phaseLearn, phaseSlow} {
			pr := *c.phase(ph)
			if pr == nil {
				continue
			}
			for i, at := range pr.Samples.AtMS {
				b := int((at + shift) / window)
				buckets[b] = append(buckets[b], pr.Samples.LatencyMS[i])
			}
			for _, at := range pr.FailedAtMS {
				b := int((at + shift) / window)
				buckets[b] = append(buckets[b], math.Inf(1))
			}
		}
		keys := make([]int, 0, len(buckets))
		for k := range buckets {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		pts := make(plotter.XYs, 0, len(keys))
		for _, k := range keys {
			v := buckets[k]
			slices.Sort(v)
			y := max(v[rank(len(v), 0.99)], 0.001)
			pts = append(pts, plotter.XY{X: (float64(k) + 0.5) * window / 1000, Y: y})
			if !math.IsInf(y, 1) {
				lo, hi = min(lo, y), max(hi, y)
			}
		}
		if len(pts) > 0 {
			all = append(all, series{c, pts})
		}
	}
	if lo > hi {
		return p, nil
	}
	// pgxlanes-nolearn last, dashed, so that pgxlanes' line does not hide it where they agree.
	slices.SortStableFunc(all, func(a, b series) int {
		return cmp.Compare(boolInt(a.c.Name == "pgxlanes-nolearn"), boolInt(b.c.Name == "pgxlanes-nolearn"))
	})
	// At least half a decade above the highest p99, so that it is not read as a latency.
	failLevel := math.Pow(10, math.Ceil(math.Log10(hi))+0.5)
	// A decade of headroom above the failed line, for the legend.
	p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(lo))), failLevel*10
	for _, s := range all {
		for i := range s.pts {
			if math.IsInf(s.pts[i].Y, 1) {
				s.pts[i].Y = failLevel
			}
		}
		l, err := plotter.NewLine(s.pts)
		if err != nil {
			return nil, err
		}
		l.Color = contenderColors[s.c.Name]
		l.Width = vg.Points(2)
		if s.c.Name == "pgxlanes-nolearn" {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(s.c.Name, l)
	}
	xmax, failed := 0.0, false
	for _, s := range all {
		xmax = max(xmax, s.pts[len(s.pts)-1].X)
		for _, pt := range s.pts {
			failed = failed || pt.Y == failLevel
		}
	}
	if failed {
		if err := addFailLine(p, xmax, failLevel); err != nil {
			return nil, err
		}
	}
	if ref == nil {
		return p, nil
	}
	return p, addPhaseBounds(p, ref)
}

// addFailLine draws the "failed" line of overTimePlot.
func addFailLine(p *plot.Plot, xmax, failLevel float64) error {
	failLine, err := plotter.NewLine(plotter.XYs{{X: 0, Y: failLevel}, {X: xmax, Y: failLevel}})
	if err != nil {
		return err
	}
	failLine.Color = color.RGBA{R: 200, A: 255}
	failLine.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
	p.Add(failLine)
	failLabel, err := plotter.NewLabels(plotter.XYLabels{XYs: []plotter.XY{{X: 0.05, Y: failLevel * 1.15}},
		Labels: []string{"failed: more than 1% of the window's lookups failed"}})
	if err != nil {
		return err
	}
	p.Add(failLabel)
	return nil
}

// addPhaseBounds marks the phases of ref, the reference timeline, on overTimePlot.
func addPhaseBounds(p *plot.Plot, ref *contenderResult) error {
	type bound struct {
		at   float64
		name string
	}
	var bounds []bound
	end := 0.0
	for _, ph := range []phase{phaseSteady, phaseTransition, phaseBurst, phaseLearn, phaseSlow} {
		if pr := *ref.phase(ph); pr != nil {
			bounds = append(bounds, bound{pr.FromS, ph.String()})
			end = pr.FromS + pr.Seconds
		}
	}
	bounds = append(bounds, bound{end, ""})
	for _, b := range bounds {
		l, err := plotter.NewLine(plotter.XYs{{X: b.at, Y: p.Y.Min}, {X: b.at, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 90}
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(4)}
		p.Add(l)
		if b.name == "" {
			continue
		}
		labels, err := plotter.NewLabels(plotter.XYLabels{
			XYs:    []plotter.XY{{X: b.at + 0.05, Y: p.Y.Max * 0.5}},
			Labels: []string{b.name},
		})
		if err != nil {
			return err
		}
		p.Add(labels)
	}
	return nil
}

// msTicks labels a log axis of milliseconds at every power of ten: "0.1ms" … "1ms" … "1s".
type msTicks struct{}

func (msTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		v := math.Pow(10, e)
		if v < lo*0.999 || v > hi*1.001 {
			continue
		}
		var label string
		switch {
		case v >= 1000:
			label = fmt.Sprintf("%gs", v/1000)
		case v >= 1:
			label = fmt.Sprintf("%gms", v)
		default:
			label = fmt.Sprintf("%gms", v)
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: label})
		for m := 2.0; m < 10; m++ {
			if mv := v * m; mv <= hi {
				ticks = append(ticks, plot.Tick{Value: mv})
			}
		}
	}
	return ticks
}

// ninesScale spreads the tail of a distribution: p50, p90, p99 and p99.9 are equally spaced.
type ninesScale struct{}

func nines(p float64) float64 { return -math.Log10(1 - min(p, 0.99999)) }

func (ninesScale) Normalize(lo, hi, x float64) float64 {
	return (nines(x) - nines(lo)) / (nines(hi) - nines(lo))
}

type ninesTicks struct{}

func (ninesTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, t := range []plot.Tick{{Value: 0, Label: "0"}, {Value: 0.5, Label: "p50"}, {Value: 0.9, Label: "p90"},
		{Value: 0.99, Label: "p99"}, {Value: 0.999, Label: "p99.9"}} {
		if t.Value >= lo && t.Value <= hi {
			ticks = append(ticks, t)
		}
	}
	return ticks
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

package main

import (
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
}

// drawPlot draws three panels: the p99 of short-query latency over time for the loaded
// contenders (top), and the latency distribution of each contender in the steady and the burst
// phase (bottom), with latency on a log scale and the percentile on a scale that spreads the tail.
func drawPlot(r *report, cfg *config, path string) error {
	const w, h = 12 * vg.Inch, 9 * vg.Inch
	format := strings.TrimPrefix(filepath.Ext(path), ".")
	cw, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return err
	}
	dc := draw.New(cw)
	top := draw.Crop(dc, 0, 0, h*0.45, 0)
	bottom := draw.Crop(dc, 0, 0, 0, -h*0.55)
	left := draw.Crop(bottom, 0, -w/2, 0, 0)
	right := draw.Crop(bottom, w/2, 0, 0, 0)

	over, err := overTimePlot(r, cfg)
	if err != nil {
		return err
	}
	steady, err := cdfPlot(r, fmt.Sprintf("steady phase: %d long transactions, %g lookups/s", cfg.longWorkers, cfg.rate),
		func(c *contenderResult) *phaseResult { return c.Steady })
	if err != nil {
		return err
	}
	burst, err := cdfPlot(r, fmt.Sprintf("burst phase: %d long transactions, %g lookups/s of %v each", cfg.burstLongWorkers,
		cfg.burstRate, cfg.burstWork), func(c *contenderResult) *phaseResult { return c.Burst })
	if err != nil {
		return err
	}
	over.Draw(draw.Crop(top, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -vg.Millimeter*3))
	steady.Draw(draw.Crop(left, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -vg.Millimeter*3))
	burst.Draw(draw.Crop(right, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -vg.Millimeter*3))

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
		if c.Name == "idle" {
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
// that ran the long transactions (the idle baseline has another timeline), with the phases marked.
func overTimePlot(r *report, cfg *config) (*plot.Plot, error) {
	const window = 250.0 // ms
	p := plot.New()
	p.Title.Text = fmt.Sprintf("short-query p99 per %gms window (all contenders: %d conns; dashed lines: phase boundaries)", window, cfg.conns)
	p.X.Label.Text = "seconds since the contender started (long transactions start at 0, lookups after the ramp)"
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

	lo, hi := math.Inf(1), math.Inf(-1)
	var bounds []float64
	var names []string
	for _, c := range r.Contenders {
		if !c.Load {
			continue
		}
		if bounds == nil {
			for _, ph := range []*phaseResult{c.Steady, c.Transition, c.Burst} {
				if ph != nil {
					bounds = append(bounds, ph.FromS)
				}
			}
			names = []string{"steady", "transition", "burst"}
			if c.Burst != nil {
				bounds = append(bounds, c.Burst.FromS+c.Burst.Seconds)
			}
		}
		buckets := map[int][]float64{}
		for _, pr := range []*phaseResult{c.Steady, c.Transition, c.Burst} {
			if pr == nil {
				continue
			}
			for i, at := range pr.Samples.AtMS {
				b := int(at / window)
				buckets[b] = append(buckets[b], pr.Samples.LatencyMS[i])
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
			lo, hi = min(lo, y), max(hi, y)
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color = contenderColors[c.Name]
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add(c.Name, l)
	}
	if lo > hi {
		return p, nil
	}
	// A decade of headroom above the highest point, for the legend.
	p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi))+1)
	for i, b := range bounds {
		l, err := plotter.NewLine(plotter.XYs{{X: b, Y: p.Y.Min}, {X: b, Y: p.Y.Max}})
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 90}
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(4)}
		p.Add(l)
		if i < len(names) && i+1 < len(bounds) {
			labels, err := plotter.NewLabels(plotter.XYLabels{
				XYs:    []plotter.XY{{X: b + 0.05, Y: p.Y.Max * 0.5}},
				Labels: []string{names[i]},
			})
			if err != nil {
				return nil, err
			}
			p.Add(labels)
		}
	}
	return p, nil
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

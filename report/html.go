package report

import (
	"fmt"
	"html/template"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Plot geometry, in SVG user units.
const (
	plotW, plotH           = 720, 220
	padL, padR, padT, padB = 56, 12, 12, 34
)

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// plot is one chart, drawn as inline SVG: the page needs no script, font
// or file from anywhere to show it.
type plot struct {
	ID, Title, XLabel, YLabel string
	Lines                     []line
	Bars                      []bar
	XTicks, YTicks            []tick
	Empty                     string // why there is nothing to draw
}

type line struct {
	Label, Color string
	Points       string // SVG polyline points
}

type bar struct {
	X, Y, W, H float64
	Color      string
	Title      string
}

type tick struct {
	Pos   float64
	Label string
}

// linear ticks for 0..top along a length.
func ticks(top float64, length float64, horizontal bool, format func(float64) string) []tick {
	if top <= 0 {
		top = 1
	}
	step := math.Pow(10, math.Floor(math.Log10(top)))
	for top/step > 6 {
		step *= 2
	}
	var out []tick
	for v := 0.0; v <= top*1.0001; v += step {
		pos := v / top * length
		if horizontal {
			out = append(out, tick{padL + pos, format(v)})
		} else {
			out = append(out, tick{plotH - padB - pos, format(v)})
		}
	}
	return out
}

func count(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	}
	return fmt.Sprintf("%.3g", v)
}

// seriesPlot draws one line per key of a time series, as rates per second.
func seriesPlot(id, title, ylabel string, s Series, duration time.Duration) plot {
	p := plot{ID: id, Title: title, XLabel: "seconds from the start", YLabel: ylabel}
	if len(s.Counts) == 0 || s.Bucket == 0 {
		p.Empty = "no events"
		return p
	}
	w := float64(plotW - padL - padR)
	h := float64(plotH - padT - padB)
	perSec := float64(time.Second) / float64(s.Bucket)
	var n int
	var top float64
	for _, c := range s.Counts {
		n = max(n, len(c))
		for _, v := range c {
			top = max(top, float64(v)*perSec)
		}
	}
	span := max(float64(n)*s.Bucket.Seconds(), duration.Seconds(), 1e-3)
	for i, k := range slices.Sorted(maps.Keys(s.Counts)) {
		var pts []string
		for j, v := range s.Counts[k] {
			// Each bucket is drawn as a step, so that a single bucket is a
			// visible segment too.
			x1 := padL + float64(j)*s.Bucket.Seconds()/span*w
			x2 := padL + float64(j+1)*s.Bucket.Seconds()/span*w
			y := float64(plotH-padB) - float64(v)*perSec/max(top, 1)*h
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x1, y, x2, y))
		}
		p.Lines = append(p.Lines, line{Label: k, Color: palette[i%len(palette)], Points: strings.Join(pts, " ")})
	}
	p.XTicks = ticks(span, w, true, func(v float64) string { return fmt.Sprintf("%.3g", v) })
	p.YTicks = ticks(top, h, false, count)
	return p
}

// workPlot draws the NAPI work-per-poll histogram.
func workPlot(work []uint64) plot {
	p := plot{ID: "napi-work", Title: "NAPI work per poll", XLabel: "packets handled in one poll", YLabel: "polls"}
	if len(work) == 0 {
		p.Empty = "no napi_poll events (record with -e napi)"
		return p
	}
	w := float64(plotW - padL - padR)
	h := float64(plotH - padT - padB)
	top := float64(slices.Max(work))
	bw := w / float64(len(work))
	for i, c := range work {
		bh := float64(c) / max(top, 1) * h
		p.Bars = append(p.Bars, bar{X: padL + float64(i)*bw, Y: float64(plotH-padB) - bh, W: max(bw-1, 1), H: bh, Color: palette[1], Title: fmt.Sprintf("work %d: %d polls", i, c)})
	}
	p.XTicks = ticks(float64(len(work)-1), w-bw, true, func(v float64) string { return fmt.Sprintf("%.0f", v) })
	for i := range p.XTicks {
		p.XTicks[i].Pos += bw / 2
	}
	p.YTicks = ticks(top, h, false, count)
	return p
}

// stagePlot draws each stage's latency histogram on a log time axis.
func stagePlot(stages []Stage) plot {
	p := plot{ID: "stage-latency", Title: "Stage latency", XLabel: "latency (log scale)", YLabel: "share of packets"}
	w := float64(plotW - padL - padR)
	h := float64(plotH - padT - padB)
	lo, hi := math.Inf(1), 0.0
	for _, s := range stages {
		for _, b := range s.Latency.Buckets {
			lo = min(lo, float64(max(b.Low, 1)))
			hi = max(hi, float64(max(b.Low, 1)))
		}
	}
	if hi == 0 {
		p.Empty = "no packet followed from one stage to the next (record with -e rx,tx,napi)"
		return p
	}
	llo, lhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi*1.07))
	if lhi <= llo {
		lhi = llo + 1
	}
	xOf := func(v float64) float64 { return padL + (math.Log10(max(v, 1))-llo)/(lhi-llo)*w }
	var top float64
	for _, s := range stages {
		for _, b := range s.Latency.Buckets {
			top = max(top, float64(b.Count)/float64(s.Latency.Count))
		}
	}
	for i, s := range stages {
		if s.Latency.Count == 0 {
			continue
		}
		var pts []string
		for _, b := range s.Latency.Buckets {
			x := xOf(float64(b.Low))
			y := float64(plotH-padB) - float64(b.Count)/float64(s.Latency.Count)/top*h
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x-2, y, x+2, y))
		}
		p.Lines = append(p.Lines, line{Label: s.Name, Color: palette[i%len(palette)], Points: strings.Join(pts, " ")})
	}
	for e := llo; e <= lhi; e++ {
		p.XTicks = append(p.XTicks, tick{xOf(math.Pow(10, e)), dur(time.Duration(math.Pow(10, e)))})
	}
	p.YTicks = ticks(top*100, h, false, func(v float64) string { return fmt.Sprintf("%.0f%%", v) })
	return p
}

// WriteHTML writes one self-contained page: the findings, the tables and
// four plots (drops over time by reason, event rate per stage, NAPI work per
// poll, stage latency), as inline SVG that opens offline in any browser.
func (r *Report) WriteHTML(w io.Writer) error {
	var stages []Stage
	for _, s := range r.Stages {
		if s.Latency.Count > 0 {
			stages = append(stages, s)
		}
	}
	data := struct {
		R      *Report
		Plots  []plot
		Stages []Stage
		Width  int
		Height int
	}{
		R: r,
		Plots: []plot{
			seriesPlot("drops-over-time", "Drops over time, by reason", "drops/s", r.Drops.OverTime, r.Recording.Duration),
			seriesPlot("stage-rate", "Packet rate per stage (events per probe)", "events/s", r.Rates, r.Recording.Duration),
			workPlot(r.NAPI.Work),
			stagePlot(stages),
		},
		Stages: stages, Width: plotW, Height: plotH,
	}
	return htmlPage.Execute(w, data)
}

var htmlPage = template.Must(template.New("report").Funcs(template.FuncMap{
	"dur":     dur,
	"pct":     func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"f1":      func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"f3":      func(f float64) string { return fmt.Sprintf("%.3f", f) },
	"join":    strings.Join,
	"where":   counterName,
	"time":    func(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") },
	"x0":      func() float64 { return padL },
	"y0":      func() float64 { return plotH - padB },
	"x1":      func() float64 { return plotW - padR },
	"y1":      func() float64 { return padT },
	"legendY": func(i int) int { return padT + 4 + 14*i },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>nettrace report: {{.R.Recording.Hostname}} {{time .R.Recording.Start}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1000px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left}.finding{border-left:4px solid #999;padding:.3em .8em;margin:.6em 0;background:#fafafa}
.error{border-color:#d62728}.warning{border-color:#ff7f0e}.info{border-color:#1f77b4}
.incomplete{background:#fee;border:1px solid #d62728;padding:.5em}.mono{font-family:ui-monospace,monospace;font-size:13px}
svg.plot{background:#fff;border:1px solid #ddd}svg text{font:11px sans-serif;fill:#444}
</style></head><body>
{{with .R.Incomplete}}<p class="incomplete" id="incomplete"><b>Incomplete recording:</b> {{.}}. The report covers what was written before the cut.</p>{{end}}
<h1>nettrace report</h1>
<p>{{time .R.Recording.Start}} on {{.R.Recording.Hostname}}, kernel {{.R.Recording.Kernel}}, {{.R.Recording.Mode}} recording of {{dur .R.Recording.Duration}}{{with .R.Recording.Stopped}} (stopped: {{.}}){{end}}.
{{with .R.Recording.Command}}<br>Command: <span class="mono">{{join . " "}}</span>{{end}}
{{with .R.Recording.Filter}}<br>Recorded with filter: <span class="mono">{{.}}</span>{{end}}
{{with .R.Filter}}<br>Report filter: <span class="mono">{{.}}</span>{{end}}</p>

<h2>Findings</h2>
{{range $i, $f := .R.Findings}}<div class="finding {{$f.Severity}}" id="finding-{{$i}}" data-rule="{{$f.Rule}}"><b>[{{$f.Severity}}] {{$f.Title}}</b>
<ul>{{range $f.Evidence}}<li class="mono">{{.}}</li>{{end}}</ul>
<p><b>Why:</b> {{$f.Explanation}}<br><b>Fix:</b> {{$f.Fix}}</p></div>
{{else}}<p>Nothing to report: no drops, no losses, no counter that signals trouble.</p>{{end}}

<h2>Plots</h2>
{{range .Plots}}<figure id="{{.ID}}"><figcaption>{{.Title}}</figcaption>
<svg class="plot" width="{{$.Width}}" height="{{$.Height}}" viewBox="0 0 {{$.Width}} {{$.Height}}" role="img" aria-label="{{.Title}}">
<line x1="{{x0}}" y1="{{y0}}" x2="{{x1}}" y2="{{y0}}" stroke="#888"/><line x1="{{x0}}" y1="{{y0}}" x2="{{x0}}" y2="{{y1}}" stroke="#888"/>
{{range .XTicks}}<text x="{{.Pos}}" y="{{y0}}" dy="14" text-anchor="middle">{{.Label}}</text>{{end}}
{{range .YTicks}}<text x="{{x0}}" y="{{.Pos}}" dx="-4" dy="4" text-anchor="end">{{.Label}}</text>{{end}}
<text x="{{x1}}" y="{{y0}}" dy="30" text-anchor="end">{{.XLabel}}</text>
{{range $i, $l := .Lines}}<polyline class="mark" fill="none" stroke="{{$l.Color}}" stroke-width="2" points="{{$l.Points}}"><title>{{$l.Label}}</title></polyline>
<text x="{{x1}}" y="{{legendY $i}}" text-anchor="end" style="fill:{{$l.Color}}">{{$l.Label}}</text>{{end}}
{{range .Bars}}<rect class="mark" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Color}}"><title>{{.Title}}</title></rect>{{end}}
{{with .Empty}}<text x="{{x0}}" y="{{y1}}" dx="10" dy="20">{{.}}</text>{{end}}
</svg></figure>
{{end}}

<h2>Events</h2>
<table><tr><th>probe</th><th>attach</th><th>written</th><th>seen</th><th>lost</th><th>lost %</th></tr>
{{range .R.Probes}}<tr><td>{{.Name}}</td><td>{{.Attach}}</td><td>{{.Events}}</td><td>{{.Seen}}</td><td>{{.Lost}}</td><td>{{pct .LostShare}}</td></tr>{{end}}</table>

<h2>Drops: {{.R.Drops.Total}}</h2>
{{template "rows" .R.Drops.ByReason}}{{template "rows" .R.Drops.ByLocation}}{{template "rows" .R.Drops.ByDevice}}{{template "rows" .R.Drops.ByFlow}}

{{if .R.NAPI.Polls}}<h2>NAPI</h2><table><tr><th>device</th><th>cpu</th><th>polls</th><th>work</th><th>budget</th><th>exhausted</th></tr>
{{range .R.NAPI.Polls}}<tr><td>{{.Device}}</td><td>{{.CPU}}</td><td>{{.Polls}}</td><td>{{.Work}}</td><td>{{.Budget}}</td><td>{{.Exhausted}}</td></tr>{{end}}</table>{{end}}
{{if .R.NAPI.Softirq}}<h2>Softirqs</h2><table><tr><th>vec</th><th>cpu</th><th>raised</th><th>runs</th><th>p50</th><th>p99</th><th>max</th></tr>
{{range .R.NAPI.Softirq}}<tr><td>{{.Vec}}</td><td>{{.CPU}}</td><td>{{.Raised}}</td><td>{{.Runs}}</td><td>{{dur .Time.P50}}</td><td>{{dur .Time.P99}}</td><td>{{dur .Time.Max}}</td></tr>{{end}}</table>{{end}}
{{if .R.NAPI.Softnet}}<h2>softnet_stat (change)</h2><table><tr><th>cpu</th><th>processed</th><th>dropped</th><th>time_squeeze</th></tr>
{{range .R.NAPI.Softnet}}<tr><td>{{.CPU}}</td><td>{{.Processed}}</td><td>{{.Dropped}}</td><td>{{.TimeSqueeze}}</td></tr>{{end}}</table>{{end}}

{{if .Stages}}<h2>Stages</h2><table><tr><th>stage</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>
{{range .Stages}}<tr><td>{{.Name}}</td><td>{{.Latency.Count}}</td><td>{{dur .Latency.P50}}</td><td>{{dur .Latency.P90}}</td><td>{{dur .Latency.P99}}</td><td>{{dur .Latency.Max}}</td></tr>{{end}}</table>{{end}}

{{if .R.Intervals}}<h2>Intervals</h2><table><tr><th>from s</th><th>to s</th><th>kernel drops</th><th>counters</th><th>notes</th></tr>
{{range .R.Intervals}}<tr><td>{{f3 .Start}}</td><td>{{f3 .End}}</td><td style="text-align:left">{{range $k, $v := .Drops}}{{$k}} {{$v}}<br>{{end}}</td>
<td style="text-align:left" class="mono">{{range .Counters}}{{.Source}} {{where .}} {{.Name}} +{{.Delta}}<br>{{end}}</td><td style="text-align:left">{{range .Notes}}{{.}}<br>{{end}}</td></tr>{{end}}</table>{{end}}

<script>
// Marks each plot with how many of its marks the browser laid out with a
// size, so that a test (and a curious reader) can see the plots are drawn.
document.querySelectorAll("svg.plot").forEach(function (svg) {
  var n = 0;
  svg.querySelectorAll(".mark").forEach(function (m) { var b = m.getBBox(); if (b.width > 0 || b.height > 0) n++; });
  svg.setAttribute("data-drawn", String(n));
});
</script>
</body></html>
{{define "rows"}}{{if .}}<table><tr><th>key</th><th>reason</th><th>count</th><th>rate/s</th><th>first s</th><th>last s</th></tr>
{{range .}}<tr><td class="mono">{{.Key}}</td><td>{{.Reason}}</td><td>{{.Count}}</td><td>{{f1 .Rate}}</td><td>{{f3 .First}}</td><td>{{f3 .Last}}</td></tr>{{end}}</table>{{end}}{{end}}
`))

package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart: axes with ticks, labels, a legend, one line per series.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	Width, Height         int // 0 means 960 x 480
}

// palette is Tableau 10: distinct, colorblind-tolerable hues.
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// niceTicks returns about n round tick values (1, 2 or 5 times a power of ten apart) covering lo..hi.
func niceTicks(lo, hi float64, n int) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step := p
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	var t []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		t = append(t, math.Round(v/step)*step)
	}
	return t
}

func fmtTick(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

// WriteSVG renders the chart.
func (c *Chart) WriteSVG(w io.Writer) error {
	W, H := c.Width, c.Height
	if W == 0 {
		W, H = 960, 480
	}
	const left, right, top, bottom = 80, 170, 50, 60
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		for i, x := range s.X {
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymax = math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	if ymax == 0 {
		ymax = 1
	}
	yt := niceTicks(0, ymax*1.05, 6)
	ytop := math.Max(yt[len(yt)-1], ymax)
	xt := niceTicks(xmin, xmax, 8)
	px := func(x float64) float64 { return left + (x-xmin)/math.Max(xmax-xmin, 1e-12)*pw }
	py := func(y float64) float64 { return top + ph - y/ytop*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica,Arial,sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="16" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(c.Title))
	for _, v := range yt {
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`, left, y, left+pw, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-6, y, fmtTick(v))
	}
	for _, v := range xt {
		x := px(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`, x, top+ph, x, top+ph+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, top+ph+18, fmtTick(v))
	}
	fmt.Fprintf(&b, `<path d="M%d %d V%.1f H%.1f" fill="none" stroke="#333"/>`+"\n", left, top, top+ph, left+pw)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", left+pw/2, H-15, html.EscapeString(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(20 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, html.EscapeString(c.YLabel))
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		var d strings.Builder
		for k := range s.X {
			op := 'L'
			if k == 0 {
				op = 'M'
			}
			fmt.Fprintf(&d, "%c%.1f %.1f", op, px(s.X[k]), py(s.Y[k]))
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.6" stroke-linejoin="round"/>`+"\n", d.String(), col)
		ly := top + 10 + 18*i
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="3"/>`, left+pw+15, ly, left+pw+35, ly, col)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" dominant-baseline="middle">%s</text>`+"\n", left+pw+40, ly, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// maxPoints is the most points a chart line gets; longer series are averaged (rates) or reduced to
// their maximum (queues) over equal buckets, so plots of long runs stay small and readable.
const maxPoints = 600

// downsample reduces s to at most maxPoints points, each the mean (or, with peak, the maximum) of a
// bucket of consecutive samples, placed at the bucket's last x.
func (s Series) downsample(peak bool) Series {
	n := len(s.X)
	if n <= maxPoints {
		return s
	}
	b := (n + maxPoints - 1) / maxPoints
	out := Series{Name: s.Name}
	for i := 0; i < n; i += b {
		j := min(i+b, n)
		v := 0.0
		for _, y := range s.Y[i:j] {
			if peak {
				v = max(v, y)
			} else {
				v += y / float64(j-i)
			}
		}
		out.X = append(out.X, s.X[j-1])
		out.Y = append(out.Y, v)
	}
	return out
}

// ThroughputChart plots each flow's arrival rate over time, averaged over buckets of samples in long
// runs.
func (r *Recorder) ThroughputChart(title string) *Chart {
	c := &Chart{Title: title, XLabel: "time (µs)", YLabel: "throughput (Gb/s)"}
	for i, f := range r.Flows {
		s := Series{Name: f.Spec.Name + " " + f.Spec.Src.Name + "→" + f.Spec.Dst.Name}
		for k, t := range r.Times {
			if k == 0 {
				continue // no interval behind the first sample
			}
			s.X = append(s.X, float64(t)/float64(Microsecond))
			s.Y = append(s.Y, r.FlowRate[i][k]/1e9)
		}
		c.Series = append(c.Series, s.downsample(false))
	}
	return c
}

// RateChart plots each flow's DCQCN rate over time; nil when no flow runs DCQCN.
func (r *Recorder) RateChart(title string) *Chart {
	if r.CCRate == nil {
		return nil
	}
	c := &Chart{Title: title, XLabel: "time (µs)", YLabel: "DCQCN rate RC (Gb/s)"}
	for i, f := range r.Flows {
		s := Series{Name: f.Spec.Name + " " + f.Spec.Src.Name + "→" + f.Spec.Dst.Name}
		for k, t := range r.Times {
			if t < f.Spec.Start {
				continue
			}
			s.X = append(s.X, float64(t)/float64(Microsecond))
			s.Y = append(s.Y, r.CCRate[i][k]/1e9)
		}
		c.Series = append(c.Series, s.downsample(false))
	}
	return c
}

// QueueChart plots each watched port's queue over time: in long runs, the largest sample of each
// bucket.
func (r *Recorder) QueueChart(title string) *Chart {
	c := &Chart{Title: title, XLabel: "time (µs)", YLabel: "queue (KiB)"}
	for i, p := range r.Ports {
		s := Series{Name: p.Name}
		for k, t := range r.Times {
			s.X = append(s.X, float64(t)/float64(Microsecond))
			s.Y = append(s.Y, float64(r.Queue[i][k])/1024)
		}
		c.Series = append(c.Series, s.downsample(true))
	}
	return c
}

// WriteSVG draws the ladder: the two hosts as vertical lines, time flowing down, each packet an arrow
// from its sender to its receiver, a lost packet ending in a red cross. Idle stretches longer than a
// few round trips (a retransmission timeout, say) are cut short and labeled.
func (l *Ladder) WriteSVG(w io.Writer, title string) error {
	const W, xa, xb, top = 900, 300, 600, 80
	var times []Time
	for _, e := range l.Entries {
		times = append(times, e.Sent)
		if e.End != 0 {
			times = append(times, e.End)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	// y positions: proportional time, with each step capped, and gaps beyond the cap marked
	var steps []Time
	for i := 1; i < len(times); i++ {
		if d := times[i] - times[i-1]; d > 0 {
			steps = append(steps, d)
		}
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	unit := Microsecond
	if len(steps) > 0 {
		unit = max(steps[len(steps)/2], Nanosecond) // the median step gets 14 px
	}
	const stepPx, capPx = 14.0, 70.0
	y := map[Time]float64{}
	type gap struct {
		y float64
		d Time
	}
	var gaps []gap
	cur := float64(top)
	for i, t := range times {
		if i > 0 {
			d := times[i] - times[i-1]
			dy := float64(d) / float64(unit) * stepPx
			if dy > capPx {
				gaps = append(gaps, gap{cur + capPx/2, d})
				dy = capPx
			}
			cur += dy
		}
		y[t] = cur
	}
	H := int(cur) + 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica,Arial,sans-serif" font-size="11">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	b.WriteString(`<defs><marker id="arr" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0 0 L10 5 L0 10 z" fill="#333"/></marker></defs>` + "\n")
	fmt.Fprintf(&b, `<text x="20" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="13" font-weight="bold">%s</text>`, xa, top-20, html.EscapeString(l.A))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="13" font-weight="bold">%s</text>`+"\n", xb, top-20, html.EscapeString(l.B))
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333" stroke-width="2"/>`, xa, top-10, xa, H-30)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333" stroke-width="2"/>`+"\n", xb, top-10, xb, H-30)
	for _, g := range gaps {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="middle" fill="#888" font-style="italic">≈ %v</text>`+"\n", (xa+xb)/2, g.y, g.d.Duration())
		fmt.Fprintf(&b, `<path d="M%d %.1f l8 -4 M%d %.1f l8 -4" stroke="#888"/>`, xa-4, g.y+2, xb-4, g.y+2)
	}
	for _, e := range l.Entries {
		x0, x1 := float64(xa), float64(xb)
		if !e.FromA {
			x0, x1 = x1, x0
		}
		y0 := y[e.Sent]
		col := "#333"
		switch {
		case e.Dropped:
			col = "#d62728"
		case e.Dup:
			col = "#9467bd"
		case !e.FromA:
			col = "#1f77b4"
		}
		if e.End == 0 { // still in flight when the run ended
			continue
		}
		y1 := y[e.End]
		if e.Dropped {
			xm := (x0 + x1) / 2
			ym := (y0 + y1) / 2
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="4 3"/>`, x0, y0, xm, ym, col)
			fmt.Fprintf(&b, `<path d="M%.1f %.1f l8 8 m0 -8 l-8 8" stroke="%s" stroke-width="2"/>`, xm-4, ym-4, col)
		} else {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" marker-end="url(#arr)"/>`, x0, y0, x1, y1, col)
		}
		label := e.Label
		if e.Dropped {
			label += " ✗ " + e.Reason.String()
		}
		if e.Dup {
			label += " (dup)"
		}
		if e.FromA {
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle" fill="%s">%s</text>`, xa-8, y0, col, html.EscapeString(label))
		} else {
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" dominant-baseline="middle" fill="%s">%s</text>`, xb+8, y0, col, html.EscapeString(label))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#888" font-size="9" dominant-baseline="middle">%.2fµs</text>`+"\n", 8, y0, float64(e.Sent)/float64(Microsecond))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

package main

import (
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/goroce/goroce/interop/capture/explain"
	"github.com/goroce/goroce/wire"
)

func init() {
	register(command{"view", "write a capture as one self-contained HTML page: packet ladders per queue pair, field trees, explanations", runView})
}

const viewUsage = `usage: goroce view [-o OUT.html] [-plots DIR] [-title TEXT] FILE.pcap

Writes one HTML file that shows a RoCEv2 capture (pcap or pcapng) in a browser, offline: no network, no
CDN, everything inline. A packet ladder per queue pair (zoom, filter by pair and opcode, packets laid out
one a row or by time), and for the packet you click its dump line, its field tree (goroce dump -v) and
what goroce dump -explain says about it; then the per-QP summary and each pair's story. With -plots, the
SVG plots of a directory (goroce sim run NAME -out DIR writes throughput.svg, queue.svg, rate.svg,
ladder.svg) are shown too. The page opens at a packet with #pkt=N in its address.

flags:
`

// viewPlots are the plots -plots looks for, in the order the page shows them.
var viewPlots = []string{"throughput.svg", "queue.svg", "rate.svg", "ladder.svg"}

func runView(args []string) error {
	fs := flag.NewFlagSet("view", flag.ContinueOnError)
	out := fs.String("o", "", "write the page to `FILE` (default: the capture's name with .html)")
	plots := fs.String("plots", "", "show the SVG plots of `DIR` (goroce sim run -out DIR) under the ladder")
	title := fs.String("title", "", "title the page `TEXT` (default: the capture's name)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), viewUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	in := fs.Arg(0)
	if *out == "" {
		*out = strings.TrimSuffix(in, filepath.Ext(in)) + ".html"
	}
	v := viewOptions{title: *title}
	if *plots != "" {
		var err error
		if v.plots, err = readPlots(*plots); err != nil {
			return err
		}
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	n, err := writeView(f, in, v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(*out)
		return err
	}
	pairs := "queue pairs"
	if n.pairs == 1 {
		pairs = "queue pair"
	}
	fmt.Printf("wrote %s: %d RoCEv2 packets in %d %s (open it in a browser)\n", *out, n.roce, n.pairs, pairs)
	return nil
}

// readPlots reads the plots of a goroce sim run -out directory.
func readPlots(dir string) ([]viewPlot, error) {
	var plots []viewPlot
	for _, name := range viewPlots {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		plots = append(plots, viewPlot{name, b})
	}
	if len(plots) == 0 {
		return nil, fmt.Errorf("-plots %s: none of %s", dir, strings.Join(viewPlots, ", "))
	}
	return plots, nil
}

// viewOptions are what a page shows besides the capture.
type viewOptions struct {
	title string
	plots []viewPlot
}

// viewPlot is an SVG plot shown under the ladder.
type viewPlot struct {
	name string
	svg  []byte
}

// viewCounts is what writeView reports.
type viewCounts struct{ roce, pairs int }

// The page's parts: view.html holds the layout with placeholders for the others.
var (
	//go:embed view.html
	viewHTML string
	//go:embed view.css
	viewCSS string
	//go:embed view.js
	viewJS string
)

// writeView decodes the capture file in as goroce dump -v -explain does and writes the page to w.
func writeView(w io.Writer, in string, v viewOptions) (viewCounts, error) {
	d := newDumper(io.Discard, dumpOptions{keep: true, explain: true})
	if err := d.dumpFile(in); err != nil {
		return viewCounts{}, err
	}
	k := d.kept[0]
	if v.title == "" {
		v.title = filepath.Base(in)
	}
	data, err := json.Marshal(viewModel(k, in, v.title))
	if err != nil {
		return viewCounts{}, err
	}
	var plots strings.Builder
	for _, p := range v.plots {
		fmt.Fprintf(&plots, "<figure class=\"plot\"><figcaption>%s</figcaption>%s</figure>\n", html.EscapeString(p.name),
			xmlDecl.ReplaceAll(p.svg, nil))
	}
	page := strings.NewReplacer(
		"{{TITLE}}", html.EscapeString(v.title),
		"/*{{CSS}}*/", viewCSS,
		"/*{{JS}}*/", viewJS,
		"{{DATA}}", string(data),
		"{{PLOTS}}", plots.String(),
	).Replace(viewHTML)
	_, err = io.WriteString(w, page)
	return viewCounts{k.counts.roce, len(k.analysis.Pairs)}, err
}

// xmlDecl matches an XML declaration or doctype, which an SVG inlined in HTML must not carry.
var xmlDecl = regexp.MustCompile(`(?s)<\?xml.*?\?>|<!DOCTYPE[^>]*>`)

// The page's data, as JSON: short keys, since a simulator's capture has thousands of packets.
type (
	viewData struct {
		Title     string         `json:"title"`
		File      string         `json:"file"`
		Counts    string         `json:"counts"`
		Endpoints []viewEndpoint `json:"endpoints"`
		Pairs     []viewPair     `json:"pairs"`
		Packets   []viewPacket   `json:"packets"`
		Others    []viewOther    `json:"others"`
		Summary   string         `json:"summary"`
		Legend    string         `json:"legend"`
	}
	viewEndpoint struct {
		ID   int    `json:"id"`
		Name string `json:"name"`
	}
	viewPair struct {
		ID    int      `json:"id"`
		Name  string   `json:"name"`
		A     int      `json:"a"`
		B     int      `json:"b"`
		Story []string `json:"story"`
	}
	viewPacket struct {
		N     int        `json:"n"`
		T     float64    `json:"t"` // microseconds since the capture's first packet
		Line  string     `json:"line"`
		Tree  []string   `json:"tree"`
		From  int        `json:"from"`
		To    int        `json:"to"`
		Pair  int        `json:"pair"`
		Op    string     `json:"op"`
		Role  string     `json:"role"`
		Label string     `json:"label"` // what the ladder writes beside the arrow
		Fate  string     `json:"fate,omitempty"`
		Notes []viewNote `json:"notes,omitempty"`
	}
	viewNote struct {
		Kind     string `json:"k"`
		Text     string `json:"t"`
		Inferred bool   `json:"i,omitempty"`
		Refs     []int  `json:"r,omitempty"`
	}
	viewOther struct {
		N    int    `json:"n"`
		Line string `json:"line"`
	}
)

// viewModel makes the page's data from what the dumper kept of a capture.
func viewModel(k *keptFile, in, title string) *viewData {
	a := k.analysis
	v := &viewData{Title: title, File: filepath.Base(in), Counts: k.counts.line(), Summary: k.summary,
		Legend: legend + "\n" + explainLegend}
	for _, e := range a.Endpoints {
		v.Endpoints = append(v.Endpoints, viewEndpoint{e.ID, e.String()})
	}
	for _, p := range a.Pairs {
		v.Pairs = append(v.Pairs, viewPair{p.ID, p.String(), p.A.ID, p.B.ID, p.Story})
	}
	for _, h := range k.packets {
		var e *explain.Explanation
		if h.roce != nil {
			e = a.Frame(h.n)
		}
		if e == nil || e.Pair == nil { // not RoCEv2, or without even a BTH: listed under the summary
			v.Others = append(v.Others, viewOther{h.n, h.line})
			continue
		}
		p := viewPacket{N: h.n, T: float64(h.at.Nanoseconds()) / 1e3, Line: strings.TrimSpace(h.line),
			From: e.From.ID, To: e.To.ID, Pair: e.Pair.ID, Role: e.Role.String()}
		for _, l := range strings.Split(strings.TrimRight(h.tree, "\n"), "\n") {
			p.Tree = append(p.Tree, strings.TrimPrefix(l, treeIndent))
		}
		p.Op, p.Label = viewLabel(h.roce.Data)
		for _, c := range h.roce.Comments {
			verb, _, _ := strings.Cut(c, ":")
			switch verb {
			case "lost", "dropped", "corrupted", "marked", "duplicate":
				if p.Fate == "" || verb == "lost" || verb == "dropped" {
					p.Fate = verb
				}
			}
		}
		for _, n := range e.Notes {
			p.Notes = append(p.Notes, viewNote{n.Kind.String(), n.Text, n.Inferred, n.Refs})
		}
		v.Packets = append(v.Packets, p)
	}
	return v
}

// viewLabel returns a packet's opcode name and the words the ladder writes beside its arrow: the name,
// the PSN, and an AETH's syndrome when it is not a plain ACK.
func viewLabel(b []byte) (op, label string) {
	if len(b) < wire.BTHLen {
		return "", "truncated"
	}
	h := wire.BTH(b[:wire.BTHLen])
	op = explain.OpcodeName(h.Opcode())
	if h.Opcode().Transport() == wire.TransportCNP {
		return op, op // a CNP's PSN means nothing
	}
	label = op + " " + h.PSN().String()
	if p, err := wire.Parse(b); err == nil && p.Has(wire.HdrAETH) {
		if syn := p.AETH().Syndrome(); !syn.IsACK() {
			label += " " + syn.String()
		}
	}
	return op, label
}

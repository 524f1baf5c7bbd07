package main

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/sim"
)

// demoCapture is goroce demo's lossy run (see its README).
const demoCapture = "../../interop/capture/explain/testdata/demo-loss20-seed3.pcapng"

// viewCase is a page the tests write and load: a capture, the packet to open at, what its notes say.
type viewCase struct {
	name    string
	capture string
	plots   string // a directory of sim plots, or ""
	pkt     int    // the packet the page opens at (#pkt=N)
	note    string // a phrase of that packet's explanation
}

func viewCases(t *testing.T) []viewCase {
	simCap, simOut := simLadder(t)
	return []viewCase{
		{"demo", demoCapture, "", 16, "PSN sequence error: the responder expected PSN 0xdbfde4"},
		{"rping", wireTestdata + "/rping.pcap", "", 7, "answers READ #6"},
		{"sim-ladder", simCap, simOut, 21, "it got PSN"},
	}
}

// simLadder runs the simulator's lossy ladder as goroce sim run ladder -loss 0.05 -w FILE -out DIR does
// and returns FILE and DIR.
func simLadder(t *testing.T) (capFile, plotDir string) {
	t.Helper()
	dir := t.TempDir()
	capFile, plotDir = filepath.Join(dir, "ladder.pcapng"), filepath.Join(dir, "ladder")
	p, err := sim.DefaultParams("ladder")
	if err != nil {
		t.Fatal(err)
	}
	p.Loss = 0.05
	if _, err := runOneScenario(io.Discard, "ladder", p, runFiles{out: plotDir, pcap: capFile}); err != nil {
		t.Fatal(err)
	}
	return capFile, plotDir
}

// writeCase writes a case's page and returns its path.
func writeCase(t *testing.T, dir string, c viewCase) string {
	t.Helper()
	out := filepath.Join(dir, c.name+".html")
	var v viewOptions
	if c.plots != "" {
		var err error
		if v.plots, err = readPlots(c.plots); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := writeView(f, c.capture, v); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestViewOffline checks that a page stands alone: no script, style, image or font from anywhere else,
// the data and the plots inline.
func TestViewOffline(t *testing.T) {
	dir := t.TempDir()
	for _, c := range viewCases(t) {
		b, err := os.ReadFile(writeCase(t, dir, c))
		if err != nil {
			t.Fatal(err)
		}
		page := string(b)
		// The only URLs allowed are the SVG namespace, which names and does not fetch, and references
		// within the page (url(#marker)).
		rest := strings.ReplaceAll(strings.ReplaceAll(page, "http://www.w3.org/2000/svg", ""), "url(#", "")
		for _, bad := range []string{"http://", "https://", " src=", "@import", "url(", "<link"} {
			if strings.Contains(rest, bad) {
				i := strings.Index(rest, bad)
				t.Errorf("%s: the page has %q: ...%s...", c.name, bad, rest[max(0, i-80):min(len(rest), i+80)])
			}
		}
		if n := strings.Count(page, `<figure class="plot">`); (c.plots != "") != (n > 0) || strings.Contains(page, "<?xml") {
			t.Errorf("%s: %d plots", c.name, n)
		}
		if !strings.Contains(page, `<script type="application/json" id="data">{"title":`) {
			t.Errorf("%s: no data", c.name)
		}
	}
}

// chromium finds Debian's chromium. Without it the browser test is skipped, except in CI (CI set), where
// .ci/run installs it and its absence is a failure.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed, and CI is set: .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (Debian: apt-get install chromium); CI runs this test")
	return ""
}

// headless runs chromium headless on the page with its extra arguments and returns its standard output.
func headless(t *testing.T, browser, page string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=10000"}, args...)
	cmd := exec.CommandContext(ctx, browser, append(args, page)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", browser, strings.Join(args, " "), err, lastLines(stderr.String(), 10))
	}
	return out
}

// artifacts is where the browser test keeps its screenshots: $GOROCE_ARTIFACTS, or goroce-artifacts in
// the temporary directory. They outlive the test, for a person or a CI job to look at.
func artifacts(t *testing.T) string {
	dir := os.Getenv("GOROCE_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "goroce-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestViewChromium loads each page in headless Chromium, opened at one packet, and checks the DOM the
// page's script built: the ladder has one packet element for every RoCEv2 packet goroce dump counts, the
// field tree shown is the one goroce dump -v prints for that packet, and its explanation is shown; the
// controls work (the page's #selftest clicks a packet, zooms, filters by pair and opcode, lays the
// packets out by time). It keeps a screenshot of each page.
func TestViewChromium(t *testing.T) {
	browser := chromium(t)
	dir := t.TempDir()
	shots := artifacts(t)
	for _, c := range viewCases(t) {
		t.Run(c.name, func(t *testing.T) {
			page := writeCase(t, dir, c)
			url := "file://" + page + fmt.Sprintf("#pkt=%d", c.pkt)
			dom := string(headless(t, browser, url, "--dump-dom"))

			total, _ := dump(io.Discard, dumpOptions{}, c.capture)
			ladder := between(dom, `<svg id="ladder"`, "</svg>")
			if got := strings.Count(ladder, `<g class="pkt`); got != total.roce || got == 0 {
				t.Errorf("the ladder has %d packets, goroce dump counts %d RoCEv2 packets", got, total.roce)
			}

			var v bytes.Buffer
			dump(&v, dumpOptions{verbose: true}, c.capture)
			want := treeOf(t, v.String(), c.pkt)
			got := html.UnescapeString(between(dom, `<pre id="tree">`, "</pre>"))
			if got != want {
				t.Errorf("packet %d's field tree in the page:\n%s\ngoroce dump -v:\n%s", c.pkt, got, want)
			}
			if notes := html.UnescapeString(tags.ReplaceAllString(between(dom, `<ul id="notes">`, "</ul>"), "")); !strings.Contains(notes, c.note) {
				t.Errorf("packet %d's notes lack %q:\n%s", c.pkt, c.note, notes)
			}
			if title := html.UnescapeString(between(dom, `<h2 id="dtitle">`, "</h2>")); !strings.HasPrefix(title, fmt.Sprintf("Packet #%d,", c.pkt)) {
				t.Errorf("detail title %q", title)
			}

			// The page drives its own controls (click, zoom, the pair and opcode filters, the time
			// layout) and says what it saw.
			self := html.UnescapeString(between(string(headless(t, browser, "file://"+page+"#selftest", "--dump-dom")),
				`<pre id="selftest">`, "</pre>"))
			if strings.Count(self, "ok ") != 7 || strings.Contains(self, "FAIL") {
				t.Errorf("the page's self-test:\n%s", self)
			}

			shot := filepath.Join(shots, "view-"+c.name+".png")
			headless(t, browser, url, "--window-size=1600,1000", "--screenshot="+shot)
			if b, err := os.ReadFile(shot); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
				t.Fatalf("screenshot %s: %v", shot, err)
			}
			t.Logf("%s: %d packets in the ladder, packet %d's tree as dump -v prints it; self-test:\n%s\nscreenshot %s",
				c.name, total.roce, c.pkt, self, shot)
		})
	}
}

// between returns the text of s after the first from (and the rest of its tag, if from does not end it)
// up to the next to.
func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	s = s[i+len(from):]
	if !strings.HasSuffix(from, ">") {
		if j := strings.IndexByte(s, '>'); j >= 0 {
			s = s[j+1:]
		}
	}
	if j := strings.Index(s, to); j >= 0 {
		s = s[:j]
	}
	return s
}

// tags matches an HTML tag.
var tags = regexp.MustCompile(`<[^>]*>`)

// dumpLine matches the start of a packet's line in goroce dump's output.
var dumpLine = regexp.MustCompile(`^\s*(\d+) +\d+\.\d{6} `)

// treeOf returns packet n's field tree in goroce dump -v's output, without the indent.
func treeOf(t *testing.T, out string, n int) string {
	t.Helper()
	var tree []string
	in := false
	for _, l := range strings.Split(out, "\n") {
		if m := dumpLine.FindStringSubmatch(l); m != nil {
			in = m[1] == fmt.Sprint(n)
			continue
		}
		if in && strings.HasPrefix(l, treeIndent) {
			tree = append(tree, strings.TrimPrefix(l, treeIndent))
		}
	}
	if len(tree) == 0 {
		t.Fatalf("goroce dump -v shows no tree for packet %d", n)
	}
	return strings.Join(tree, "\n")
}

// TestSimRunView: goroce sim run -view writes the same page as -w then goroce view -plots: the run's
// packets (as many as the capture holds) and its throughput and queue plots, with no capture left
// behind when -w is not given.
func TestSimRunView(t *testing.T) {
	dir := t.TempDir()
	p, err := sim.DefaultParams("ladder")
	if err != nil {
		t.Fatal(err)
	}
	p.Loss = 0.05
	page, capFile := filepath.Join(dir, "ladder.html"), filepath.Join(dir, "ladder.pcapng")
	if _, err := runOneScenario(io.Discard, "ladder", p, runFiles{pcap: capFile, view: page}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if _, err := writeView(&want, capFile, viewOptions{}); err != nil {
		t.Fatal(err)
	}
	data := regexp.MustCompile(`"packets":\[`)
	if got, w := len(data.FindAll(b, -1)), len(data.FindAll(want.Bytes(), -1)); got != 1 || w != 1 {
		t.Fatalf("packet lists: %d in the page, %d in goroce view's", got, w)
	}
	count := func(page []byte) int { return bytes.Count(page, []byte(`"op":`)) }
	if got, w := count(b), count(want.Bytes()); got == 0 || got != w {
		t.Errorf("the page has %d packets, goroce view of the capture %d", got, w)
	}
	for _, plot := range []string{"throughput.svg", "queue.svg", "ladder.svg"} {
		if !bytes.Contains(b, []byte("<figcaption>"+plot+"</figcaption>")) {
			t.Errorf("no %s on the page", plot)
		}
	}

	// Without -w the capture is temporary.
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "goroce-sim-*.pcapng"))
	if _, err := runOneScenario(io.Discard, "ladder", p, runFiles{view: filepath.Join(dir, "only.html")}); err != nil {
		t.Fatal(err)
	}
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "goroce-sim-*.pcapng"))
	if len(after) > len(before) {
		t.Errorf("-view left its capture behind: %v", after)
	}
}

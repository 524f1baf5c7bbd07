package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/sim"
)

func init() {
	register(command{"sim", "run simulated network scenarios on the real engines: CSV, SVG plots, summary", runSim})
}

func simUsage(w io.Writer) {
	fmt.Fprintln(w, `usage: goroce sim list
       goroce sim run NAME [flags] [-out DIR] [-w FILE.pcapng]
       goroce sim replay -seed N [-trace]

run writes summary.csv, timeseries.csv, throughput.svg and queue.svg (ladder.svg for the ladder
scenario; rate.svg and report.csv for the dcqcn-* scenarios, with -dcqcn both in DIR/off and DIR/on and
a side-by-side report.csv in DIR) to -out and prints a summary table; -w writes every packet to a pcapng
file in virtual time, the lost, dropped and marked ones marked; "goroce sim run NAME -h" lists the flags. replay reruns
one seed of the fault campaign (go test ./sim -run TestCampaign) and, with -trace, prints every packet.`)
}

func runSim(args []string) error {
	if len(args) == 0 {
		simUsage(os.Stderr)
		return errUsage
	}
	switch args[0] {
	case "list":
		for _, sc := range sim.Scenarios() {
			fmt.Printf("  %-15s %s\n", sc.Name, sc.Help)
		}
		return nil
	case "run":
		if len(args) < 2 {
			simUsage(os.Stderr)
			return errUsage
		}
		return runSimScenario(args[1], args[2:])
	case "replay":
		return runSimReplay(args[1:])
	case "-h", "-help", "--help", "help":
		simUsage(os.Stdout)
		return nil
	}
	simUsage(os.Stderr)
	return errUsage
}

func runSimScenario(name string, args []string) error {
	p, err := sim.DefaultParams(name)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("sim run "+name, flag.ContinueOnError)
	fs.Uint64Var(&p.Seed, "seed", p.Seed, "random seed: a run is a function of it")
	fs.Func("rate", fmt.Sprintf("link rate, Gb/s: 40, 100 or 40G (default %g)", p.Rate), func(v string) error {
		g, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSuffix(v, "G"), "g"), 64)
		if err != nil || g <= 0 {
			return fmt.Errorf("want a positive rate in Gb/s")
		}
		p.Rate = g
		return nil
	})
	fs.DurationVar(&p.Delay, "delay", p.Delay, "propagation delay per link")
	fs.IntVar(&p.Flows, "flows", p.Flows, "number of flows (senders)")
	fs.DurationVar(&p.Duration, "duration", p.Duration, "simulated time")
	fs.Int64Var(&p.Size, "size", p.Size, "bytes per flow; 0 runs until -duration")
	fs.IntVar(&p.Msg, "msg", p.Msg, "bytes per work request")
	fs.IntVar(&p.Depth, "depth", p.Depth, "work requests outstanding per flow")
	op := fs.String("op", p.Op.String(), "operation: write, read or send")
	fs.IntVar(&p.MTU, "mtu", p.MTU, "path MTU: 256, 512, 1024, 2048 or 4096")
	timeout := fs.Uint("timeout", uint(p.Timeout), "local ACK timeout code: 4.096 us * 2^N")
	fs.DurationVar(&p.Stagger, "stagger", p.Stagger, "flow i starts at i*stagger")
	fs.Float64Var(&p.Loss, "loss", p.Loss, "independent packet loss probability per link")
	fs.Float64Var(&p.Burst, "burst", p.Burst, "probability per packet of a loss burst (Gilbert-Elliott, mean 4 packets)")
	fs.Float64Var(&p.Reorder, "reorder", p.Reorder, "probability a packet is held back up to 10 us")
	fs.Float64Var(&p.Dup, "dup", p.Dup, "duplication probability")
	fs.Float64Var(&p.Corrupt, "corrupt", p.Corrupt, "probability a packet gets one bit flipped (the ICRC drops it)")
	fs.IntVar(&p.Buffer, "buffer", p.Buffer, "switch output queue, bytes")
	fs.BoolVar(&p.ECN, "ecn", p.ECN, "ECN: senders send ECT(0), switches mark CE (RED on the instantaneous queue)")
	fs.IntVar(&p.Kmin, "kmin", p.Kmin, "ECN Kmin, bytes")
	fs.IntVar(&p.Kmax, "kmax", p.Kmax, "ECN Kmax, bytes")
	fs.Float64Var(&p.Pmax, "pmax", p.Pmax, "ECN marking probability at Kmax")
	fs.BoolVar(&p.ECNDequeue, "ecn-dequeue", p.ECNDequeue, "mark CE as packets leave the queue (as the DCQCN authors' ns-3 does), not as they join it")
	fs.BoolVar(&p.PFC, "pfc", p.PFC, "PFC: pause upstream past -xoff bytes per ingress port, resume at -xon")
	fs.IntVar(&p.XOff, "xoff", p.XOff, "PFC XOFF threshold, bytes")
	fs.IntVar(&p.XOn, "xon", p.XOn, "PFC XON threshold, bytes")
	fs.IntVar(&p.Leaves, "leaves", p.Leaves, "leafspine: leaf switches")
	fs.IntVar(&p.Spines, "spines", p.Spines, "leafspine: spine switches")
	fs.IntVar(&p.HostsPerLeaf, "hosts", p.HostsPerLeaf, "leafspine: hosts per leaf")
	fs.IntVar(&p.Packets, "packets", p.Packets, "ladder: packets to draw")
	fs.DurationVar(&p.Sample, "sample", p.Sample, "sampling interval of the time series (0: duration/400)")
	dcqcn := "on"
	if !p.DCQCN {
		dcqcn = "off"
	}
	fs.StringVar(&dcqcn, "dcqcn", dcqcn, "dcqcn-* scenarios: on, off, or both (two runs side by side, in DIR/off and DIR/on)")
	out := fs.String("out", "", "directory for CSV and SVG files (created); none written if empty")
	write := fs.String("w", "", "write the run's packets to `FILE`, pcapng, stamped in virtual time from 1970-01-01 (with -dcqcn both: FILE with -off and -on before its extension)")
	view := fs.String("view", "", "write the run as one offline HTML page to `FILE` (as goroce view does: packet ladders, field trees, explanations, and the throughput, queue and rate plots); for short runs, since every packet is on the page (with -dcqcn both: FILE with -off and -on before its extension)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	modes := map[string][]bool{"on": {true}, "off": {false}, "both": {false, true}}[dcqcn]
	if modes == nil {
		return fmt.Errorf("-dcqcn %q: want on, off or both", dcqcn)
	}
	if p.Op, err = sim.ParseOp(*op); err != nil {
		return err
	}
	if *timeout > 31 {
		return fmt.Errorf("-timeout %d: want 0..31", *timeout)
	}
	p.Timeout = uint8(*timeout)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	if !strings.HasPrefix(name, "dcqcn-") {
		_, err := runOneScenario(w, name, p, runFiles{*out, *write, *view})
		return err
	}
	var reps []*sim.DCQCNReport
	for _, on := range modes {
		p.DCQCN = on
		dir := *out
		if dir != "" && len(modes) > 1 {
			dir = filepath.Join(dir, map[bool]string{false: "off", true: "on"}[on])
		}
		fmt.Fprintf(w, "=== DCQCN %s ===\n", map[bool]string{false: "off", true: "on"}[on])
		suffixed := func(file string) string {
			if file == "" || len(modes) == 1 {
				return file
			}
			ext := filepath.Ext(file)
			return strings.TrimSuffix(file, ext) + map[bool]string{false: "-off", true: "-on"}[on] + ext
		}
		r, err := runOneScenario(w, name, p, runFiles{dir, suffixed(*write), suffixed(*view)})
		if err != nil {
			return err
		}
		fmt.Fprintln(w)
		sim.WriteReports(w, r.Report)
		fmt.Fprintln(w)
		reps = append(reps, r.Report)
	}
	if len(reps) > 1 {
		fmt.Fprintf(w, "=== %s: DCQCN off and on ===\n", name)
		sim.WriteReports(w, reps...)
	}
	if *out != "" {
		fn := filepath.Join(*out, "report.csv")
		if err := writeFile(fn, func(f io.Writer) error { return sim.WriteReportsCSV(f, reps...) }); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s\n", fn)
	}
	return nil
}

// runFiles are the files a scenario run writes, each only if named: out, a directory of CSV and SVG
// files; pcap, its packets as pcapng; view, an HTML page of the packets and plots.
type runFiles struct{ out, pcap, view string }

// runOneScenario runs one scenario, prints its summary and writes the files f names.
func runOneScenario(w io.Writer, name string, p sim.Params, f runFiles) (*sim.Result, error) {
	out, pcap := f.out, f.pcap
	if f.view != "" && pcap == "" {
		// The page is made from a capture, as goroce view makes it: a temporary one unless -w keeps it.
		tmp, err := os.CreateTemp("", "goroce-sim-*.pcapng")
		if err != nil {
			return nil, err
		}
		tmp.Close()
		pcap = tmp.Name()
		defer os.Remove(pcap)
	}
	var cw *capture.Writer
	if pcap != "" {
		var err error
		if cw, err = capture.Create(pcap, nil); err != nil {
			return nil, fmt.Errorf("-w: %w", err)
		}
		defer cw.Close() // after an error; the run's end closes it below
		p.Tracer = cw.SimTracer(time.Time{}, p.Tracer)
	}
	r, err := sim.RunScenario(name, p)
	if err != nil {
		return nil, err
	}
	if cw != nil {
		if err := cw.Close(); err != nil {
			return nil, fmt.Errorf("-w %s: %w", pcap, err)
		}
		if f.pcap != "" {
			defer fmt.Fprintf(w, "wrote %d packets to %s\n", cw.Packets(), pcap)
		}
	}
	s := r.Sim
	fmt.Fprintf(w, "scenario %s, seed %d: %v simulated, %d events in %v (%.2fM events/s)\n\n", name, p.Seed,
		s.Now().Duration(), s.Processed, r.Wall.Round(time.Millisecond), float64(s.Processed)/r.Wall.Seconds()/1e6)
	rows := s.Summary()
	sim.WriteSummary(w, rows)
	fmt.Fprintln(w)
	sim.WritePorts(w, s.Ports())
	if r.Ladder != nil {
		fmt.Fprintln(w)
		for _, e := range r.Ladder.Entries {
			fmt.Fprintln(w, e.String())
		}
	}
	title := fmt.Sprintf("%s: %d flow(s) at %g Gb/s, seed %d", name, len(rows), p.Rate, p.Seed)
	if r.Report != nil {
		title = fmt.Sprintf("%s, DCQCN %s, PFC %s: %d flow(s) at %g Gb/s, seed %d", name,
			map[bool]string{false: "off", true: "on"}[p.DCQCN], map[bool]string{false: "off", true: "on"}[p.PFC], len(rows), p.Rate, p.Seed)
	}
	files := map[string]func(io.Writer) error{
		"summary.csv":    func(f io.Writer) error { return sim.WriteSummaryCSV(f, rows) },
		"timeseries.csv": r.Rec.WriteCSV,
		"throughput.svg": r.Rec.ThroughputChart("throughput per flow — " + title).WriteSVG,
		"queue.svg":      r.Rec.QueueChart("queue length — " + title).WriteSVG,
	}
	if c := r.Rec.RateChart("DCQCN rate per flow — " + title); c != nil {
		files["rate.svg"] = c.WriteSVG
	}
	if r.Report != nil {
		files["report.csv"] = func(f io.Writer) error { return sim.WriteReportsCSV(f, r.Report) }
	}
	if r.Ladder != nil {
		lt := fmt.Sprintf("first %d packets, loss %g, seed %d", len(r.Ladder.Entries), p.Loss, p.Seed)
		files["ladder.svg"] = func(f io.Writer) error { return r.Ladder.WriteSVG(f, lt) }
	}
	if f.view != "" {
		var plots []viewPlot
		for _, n := range viewPlots {
			if fn, ok := files[n]; ok {
				var b bytes.Buffer
				if err := fn(&b); err != nil {
					return nil, err
				}
				plots = append(plots, viewPlot{n, b.Bytes()})
			}
		}
		if err := writeFile(f.view, func(w io.Writer) error {
			_, err := writeView(w, pcap, viewOptions{title: title, plots: plots})
			return err
		}); err != nil {
			return nil, fmt.Errorf("-view: %w", err)
		}
		fmt.Fprintf(w, "wrote %s (open it in a browser)\n", f.view)
	}
	if out == "" {
		return r, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	for _, n := range []string{"summary.csv", "timeseries.csv", "throughput.svg", "queue.svg", "rate.svg", "report.csv", "ladder.svg"} {
		fn, ok := files[n]
		if !ok {
			continue
		}
		if err := writeFile(filepath.Join(out, n), fn); err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(out, n))
	}
	return r, nil
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	if err := fn(bw); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func runSimReplay(args []string) error {
	fs := flag.NewFlagSet("sim replay", flag.ContinueOnError)
	seed := fs.Uint64("seed", 1, "campaign seed to replay")
	trace := fs.Bool("trace", false, "print every packet event and completion")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	var tw io.Writer
	if *trace {
		tw = w
	}
	res, err := sim.RunCampaignSeed(*seed, tw)
	fmt.Fprintf(w, "seed %d: %s\n%d requests, %d packets, %d lost, %d ICRC drops, %d events, %v simulated\n",
		res.Seed, res.Profile, res.Requests, res.Packets, res.Lost, res.ICRCDrop, res.Events, res.End.Duration())
	if err != nil {
		fmt.Fprintf(w, "FAIL: %v\n", err)
		return exitError(1)
	}
	fmt.Fprintln(w, "ok: every invariant holds")
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/goroce/goroce/internal/perf"
	"github.com/goroce/goroce/wire"
)

func init() {
	register(command{"perf", "measure goroce: against TCP and raw UDP (perf loopback), or as a perftest peer (perf write_bw, read_lat, ...)", runPerf})
}

const perfLoopbackUsage = "usage: goroce perf loopback [-procs 1|2|both] [-runs n] [-d duration] [-only groups] [flags]"

func runPerf(args []string) error {
	switch {
	case len(args) == 0:
	case args[0] == "loopback":
		return perfLoopback(args[1:])
	case findPerftest(args[0]) != nil:
		return runPerftest(findPerftest(args[0]), args[1:])
	default:
		fmt.Fprintf(os.Stderr, "goroce perf: unknown test %q: goroce perf runs loopback and perftest's %s\n", args[0], perftestNames())
	}
	fmt.Fprintln(os.Stderr, perfLoopbackUsage)
	perftestUsage(os.Stderr)
	return errUsage
}

// perfLoopback parses the flags of `goroce perf loopback`, runs the measurements of package perf
// and prints their report; with the hidden -child flag it is the child process those measurements
// drive instead.
func perfLoopback(args []string) error {
	cfg := perf.DefaultConfig()
	fs := flag.NewFlagSet("perf loopback", flag.ContinueOnError)
	procs := fs.String("procs", string(cfg.Procs), "where the peers run, `1|2|both`: 1 = both goroce devices (or both UDP sockets) in this process,\n"+
		"the original figures; 2 = this process sends and a child process (this binary again) receives\n"+
		"or answers, as goroce is used, next to Go TCP and raw UDP; both = each run makes both")
	fs.IntVar(&cfg.Runs, "runs", cfg.Runs, "times each measurement runs, interleaved (A B C A B C ...); the report gives medians and ranges")
	fs.DurationVar(&cfg.Duration, "d", cfg.Duration, "timed interval of each throughput measurement")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "traffic before each timed interval")
	fs.IntVar(&cfg.Msg, "msg", cfg.Msg, "goroce WRITE, READ and SEND message `bytes`")
	fs.IntVar(&cfg.MTU, "mtu", cfg.MTU, "goroce path MTU of the streams, and the payload of a raw UDP datagram (which has 16 bytes more: BTH and ICRC)")
	qps := fs.String("qps", joinInts(cfg.QPs), "comma-separated `counts` of queue pairs of the multi-QP goroce runs, besides 1, each QP with its CQ\n"+
		"and goroutine (1: no multi-QP runs)")
	fs.IntVar(&cfg.Depth, "depth", cfg.Depth, "goroce work requests outstanding per QP")
	fs.IntVar(&cfg.CQMod, "cq-mod", cfg.CQMod, "goroce: one work request in `n` asks for a completion")
	fs.IntVar(&cfg.TCPWrite, "tcp-write", cfg.TCPWrite, "`bytes` of each TCP write")
	fs.IntVar(&cfg.Window, "window", cfg.Window, "raw UDP datagrams in flight")
	fs.IntVar(&cfg.Burst, "burst", cfg.Burst, "raw UDP datagrams per GSO write")
	fs.IntVar(&cfg.Pings, "pings", cfg.Pings, "round trips of each ping-pong run")
	fs.DurationVar(&cfg.BusyPoll, "busy-poll", cfg.BusyPoll, "ping-pongs poll for up to this `duration` before they sleep: goroce's devices (Config.BusyPoll)\n"+
		"and raw UDP's readers alike, as ib_send_lat polls its CQ unless given -e; 0 sleeps at once")
	fs.IntVar(&cfg.IdleQPs, "idle-qps", cfg.IdleQPs, "connected idle RC QPs of the memory measurement, made once in this process (0: none)")
	only := fs.String("only", "", "comma-separated `groups` to run: "+strings.Join(perf.Groups, ", ")+"; all unless set")
	base := fs.String("addr", cfg.Base.String(), "first of the loopback `address`es used: this process +1, the child +2, the one-process pairs +3 to +12")
	child := fs.Bool("child", false, "serve as the child process, on stdin and stdout (internal)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, perfLoopbackUsage)
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name == "child" {
				return
			}
			name, usage := flag.UnquoteUsage(f)
			def := ""
			if f.DefValue != "" {
				def = " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(w, "  -%s %s\n    \t%s%s\n", f.Name, name, strings.ReplaceAll(usage, "\n", "\n    \t"), def)
		})
	}
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "goroce perf loopback: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return errUsage
	}
	if *child {
		// The parent ends the child by closing its stdin, on Ctrl-C too: the terminal's SIGINT
		// reaches the whole process group, and the child must not die before it has stopped.
		signal.Ignore(os.Interrupt)
		return perf.Serve(os.Stdin, os.Stdout)
	}
	cfg.Procs = perf.Procs(*procs)
	if *only != "" {
		for _, g := range strings.Split(*only, ",") {
			cfg.Only = append(cfg.Only, strings.TrimSpace(g))
		}
	}
	cfg.QPs = nil
	for _, f := range strings.Split(*qps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("-qps %q: want comma-separated counts, such as 2,4", *qps)
		}
		if n > 1 {
			cfg.QPs = append(cfg.QPs, n)
		}
	}
	var err error
	if cfg.Base, err = netip.ParseAddr(*base); err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to start the child: %w", err)
	}
	cfg.Child = perf.ChildCommand{Path: exe, Args: []string{"perf", "loopback", "-child"}}

	// The first Ctrl-C ends the measurements cleanly (the child stopped, the report so far printed);
	// a second one, the default again, ends the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	w := os.Stdout
	printPerfHeader(w, fs, cfg)
	specs, _ := cfg.Specs()
	width := titleWidth(specs)
	rep, err := perf.Run(ctx, cfg, func(run int, s perf.Spec, o perf.Outcome) {
		fmt.Fprintf(os.Stderr, "run %d/%d  %-*s  %s\n", run+1, cfg.Runs, width, s.Title, outcomeString(s, o))
	})
	if rep != nil {
		printPerfReport(w, rep)
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return err
}

// printPerfHeader prints how to run the same measurements again and on what.
func printPerfHeader(w io.Writer, fs *flag.FlagSet, cfg perf.Config) {
	args := []string{filepath.Base(os.Args[0])}
	for _, a := range os.Args[1:] {
		args = append(args, shellQuote(a))
	}
	fmt.Fprintf(w, "command:  %s\n", strings.Join(args, " "))
	all := []string{"goroce perf loopback"}
	fs.VisitAll(func(f *flag.Flag) {
		if v := f.Value.String(); f.Name != "child" && v != "" {
			all = append(all, "-"+f.Name+" "+shellQuote(v))
		}
	})
	fmt.Fprintf(w, "settings: %s\n", strings.Join(all, " "))
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	fmt.Fprintf(w, "machine:  %d CPUs%s, GOMAXPROCS %d, %s, %s/%s %s, ICRC by %s\n", runtime.NumCPU(), cpuModel(), runtime.GOMAXPROCS(0),
		runtime.Version(), runtime.GOOS, runtime.GOARCH, kernel, wire.ICRCMethod())
	if v, ok := os.LookupEnv("GOROCE_GSO"); ok {
		fmt.Fprintf(w, "warning:  GOROCE_GSO=%s overrides every device's GSO mode: the GSO and one-datagram rows are not what they say\n", v)
	}
	fmt.Fprintf(w, "figures:  median [min-max] of %d runs, interleaved (every measurement once per run)\n", cfg.Runs)
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./=:,+@%-]+$`)

// shellQuote quotes s for a POSIX shell where it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func titleWidth(specs []perf.Spec) int {
	n := 0
	for _, s := range specs {
		n = max(n, len(s.Title))
	}
	return n
}

// outcomeString is one run's figure, for the progress lines.
func outcomeString(s perf.Spec, o perf.Outcome) string {
	switch {
	case o.Err != nil:
		return "error: " + o.Err.Error()
	case s.Kind.PingPong():
		return fmt.Sprintf("RTT p50 %v, p99 %v", o.Result.RTTP50.Round(100*time.Nanosecond), o.Result.RTTP99.Round(100*time.Nanosecond))
	}
	return fmt.Sprintf("%7.2f Gb/s", o.Result.Gbps)
}

// printPerfReport prints the summary of every measurement, then the ratios, the idle QPs' memory,
// the notes and the errors.
func printPerfReport(w io.Writer, rep *perf.Report) {
	cfg := rep.Config
	sections := []struct {
		title string
		two   bool
	}{
		{fmt.Sprintf("two processes: this one (%v) sends, a child process (%v) receives or answers", addrPlus(cfg.Base, 1), addrPlus(cfg.Base, 2)), true},
		{"one process: both peers in this process, as `perf loopback` always measured them", false},
	}
	for _, sec := range sections {
		var thr, rtt [][]string
		for _, s := range rep.Specs {
			switch {
			case s.Kind.TwoProcess() != sec.two:
			case s.Kind.PingPong():
				rtt = append(rtt, []string{s.Title, summaryString(rep, s.ID, perf.P50, "%.1f"), summaryString(rep, s.ID, perf.P99, "%.1f"),
					summaryString(rep, s.ID, perf.CPUPerRTT, "%.1f"), packetsString(rep, s)})
			default:
				thr = append(thr, []string{s.Title, summaryString(rep, s.ID, perf.Gbps, "%.2f"), summaryString(rep, s.ID, perf.CPUPerGB, "%.3f"),
					busyString(rep, s), allocsString(rep, s), retransString(rep, s)})
			}
		}
		if len(thr)+len(rtt) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n== %s\n", sec.title)
		if len(thr) > 0 {
			printTable(w, append([][]string{{"throughput", "Gb/s of payload", "CPU s/GB", "CPUs busy", "allocs/packet", "retransmissions"}}, thr...))
		}
		if len(rtt) > 0 {
			printTable(w, append([][]string{{"round trips", "RTT p50, us", "RTT p99, us", "CPU us/RTT", "packets/round trip"}}, rtt...))
		}
	}
	if ratios := rep.Ratios(); len(ratios) > 0 {
		var rows [][]string
		for _, r := range ratios {
			goal := ""
			if !r.Goal.IsZero() {
				verdict := "not met"
				if r.Goal.Met(r.Median) {
					verdict = "met"
				}
				goal = fmt.Sprintf("goal: %v, %s", r.Goal, verdict)
			}
			rows = append(rows, []string{r.Name, formatSummary(r.Summary, ratioFormat(r.Summary.Median, r.Goal), cfg.Runs), goal})
		}
		fmt.Fprintf(w, "\n== ratios: taken within each run, then their median [min-max]\n")
		printTable(w, rows)
	}
	if rep.Idle != nil {
		i := rep.Idle
		mib := float64(i.HeapBytes) / (1 << 20)
		fmt.Fprintf(w, "\n== %d connected idle RC QPs on one device\n  %.1f MiB of heap (%.1f KiB each), created and connected in %v  (goal: under 100 MiB)\n",
			i.QPs, mib, mib*1024/float64(max(i.QPs, 1)), i.Elapsed.Round(time.Millisecond))
	}
	if rep.IdleErr != nil {
		fmt.Fprintf(w, "\n== idle RC QPs: error: %v\n", rep.IdleErr)
	}
	var notes, errs []string
	for _, s := range rep.Specs {
		for run, o := range rep.Outcomes[s.ID] {
			if !o.Done {
				continue
			}
			if o.Err != nil {
				errs = append(errs, fmt.Sprintf("%s, run %d: %v", s.Title, run+1, o.Err))
			}
			for _, n := range o.Result.Notes {
				notes = append(notes, fmt.Sprintf("%s, run %d: %s", s.Title, run+1, n))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "\n== notes\n  %s\n", strings.Join(notes, "\n  "))
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\n== errors (those runs have no figure)\n  %s\n", strings.Join(errs, "\n  "))
	}
	fmt.Fprint(w, `
Gb/s of payload: goroce messages completed at the sender, TCP bytes written, raw UDP datagrams the
  receiver acknowledged counted at 4096 bytes each (the RoCE payload of a 4112-byte packet).
CPU s/GB, CPU us/RTT: CPU time (user and system) both processes used per 10^9 bytes of payload, or per
  round trip: this process's over the timed interval or pings, the child's from their start to the
  stop. Another tenant's load on the machine takes throughput away; it moves these much less.
CPUs busy: CPU time over the timed interval, median over the runs: this process / the child (in one
  process, this process's). Near 1 for a side whose one goroutine bounds the stream.
allocs/packet: heap allocations per packet the goroce device sent or received, median over the runs:
  this process in the timed interval / the child from the interval's start to the stop. In one
  process: per packet of device A, both devices' allocations counted.
retransmissions: go-back-N retransmissions goroce started, both sides, all runs.
packets/round trip: goroce packets the pinging device sent and received per round trip, median over
  the runs: a SEND and its ACK each way make 4.
`)
}

// printTable prints rows in aligned columns, indented; the last column is not padded.
func printTable(w io.Writer, rows [][]string) {
	var width []int
	for _, r := range rows {
		for i, c := range r {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		b.WriteString(" ")
		for i, c := range r {
			b.WriteString(" ")
			if i < len(r)-1 {
				fmt.Fprintf(&b, "%-*s ", width[i], c)
			} else {
				b.WriteString(c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

func addrPlus(base netip.Addr, n byte) netip.Addr {
	b := base.As4()
	b[3] += n
	return netip.AddrFrom4(b)
}

// ran reports whether any run got to measurement id.
func ran(rep *perf.Report, id string) bool {
	for _, o := range rep.Outcomes[id] {
		if o.Done {
			return true
		}
	}
	return false
}

// summaryString is a measurement's summary for the table.
func summaryString(rep *perf.Report, id string, m perf.Metric, format string) string {
	if !ran(rep, id) {
		return "not run"
	}
	return formatSummary(rep.Summary(id, m), format, rep.Config.Runs)
}

// busyString gives the median CPUs each process kept busy in s's runs: "this / child" across two
// processes, this process's alone in one.
func busyString(rep *perf.Report, s perf.Spec) string {
	if !ran(rep, s.ID) {
		return "-"
	}
	self := rep.Summary(s.ID, perf.Busy)
	if self.N == 0 {
		return "-"
	}
	if !s.Kind.TwoProcess() {
		return fmt.Sprintf("%.2f", self.Median)
	}
	peer := rep.Summary(s.ID, perf.PeerBusy)
	if peer.N == 0 {
		return fmt.Sprintf("%.2f / -", self.Median)
	}
	return fmt.Sprintf("%.2f / %.2f", self.Median, peer.Median)
}

// ratioFormat is the verb a ratio is printed with: two decimals, or as many more (up to four) as it
// takes for the printed median to fall on the side of g's bound its verdict says, so that a median
// of 0.997 against "at least 1.00" does not print as 1.00 next to "not met".
func ratioFormat(median float64, g perf.Goal) string {
	for d := 2; d < 4; d++ {
		f := "%." + strconv.Itoa(d) + "f"
		shown, err := strconv.ParseFloat(fmt.Sprintf(f, median), 64)
		if g.IsZero() || err != nil || g.Met(shown) == g.Met(median) {
			return f
		}
	}
	return "%.4f"
}

// formatSummary writes "median [min-max]", and how many runs count when some did not.
func formatSummary(s perf.Summary, format string, runs int) string {
	if s.N == 0 {
		return "no figure"
	}
	out := fmt.Sprintf(format+" ["+format+"-"+format+"]", s.Median, s.Min, s.Max)
	if s.N < runs {
		out += fmt.Sprintf(" (%d of %d runs)", s.N, runs)
	}
	return out
}

// allocsString is the median allocations per packet of a measurement over its runs: this
// process's, and the child's if it reported them.
func allocsString(rep *perf.Report, s perf.Spec) string {
	var mine, peer []float64
	for _, o := range rep.Outcomes[s.ID] {
		if o.Done && o.Err == nil {
			mine, peer = append(mine, o.Result.Allocs), append(peer, o.Result.PeerAllocs)
		}
	}
	a, b := perf.Median(mine), perf.Median(peer)
	switch {
	case math.IsNaN(a):
		return "-"
	case math.IsNaN(b):
		return fmt.Sprintf("%.3f", a)
	}
	return fmt.Sprintf("%.3f / %.3f", a, b)
}

// packetsString is the median packets per round trip of a goroce ping-pong over its runs.
func packetsString(rep *perf.Report, s perf.Spec) string {
	var v []float64
	for _, o := range rep.Outcomes[s.ID] {
		if o.Done && o.Err == nil {
			v = append(v, o.Result.PacketsPerRTT)
		}
	}
	if m := perf.Median(v); !math.IsNaN(m) {
		return fmt.Sprintf("%.2f", m)
	}
	return "-"
}

// retransString sums a goroce measurement's retransmissions over its runs.
func retransString(rep *perf.Report, s perf.Spec) string {
	if s.QPs == 0 || !ran(rep, s.ID) {
		return "-"
	}
	var n uint64
	for _, o := range rep.Outcomes[s.ID] {
		n += o.Result.Retransmissions
	}
	return fmt.Sprint(n)
}

// joinInts writes ns comma-separated, as -qps takes them.
func joinInts(ns []int) string {
	fs := make([]string, len(ns))
	for i, n := range ns {
		fs[i] = strconv.Itoa(n)
	}
	return strings.Join(fs, ",")
}

// cpuModel returns " (model)" with the CPU's model name from /proc/cpuinfo, or "" where there is none.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return " (" + strings.TrimSpace(v) + ")"
		}
	}
	return ""
}

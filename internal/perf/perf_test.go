package perf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// childEnv makes the test binary the child process: TestMain serves instead of testing.
const childEnv = "GOROCE_PERF_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		signal.Ignore(os.Interrupt)
		if err := Serve(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testBase is the tests' loopback block: away from the command's 127.0.4.0 and from the root
// package's tests (127.1.0.0 and up).
var testBase = netip.MustParseAddr("127.0.5.0")

// testChild runs the test binary as the child. Under the race detector a process sleeps a second
// before it exits (GORACE atexit_sleep_ms), which the child need not.
func testChild() ChildCommand {
	return ChildCommand{Path: os.Args[0], Env: []string{childEnv + "=1", "GORACE=" + os.Getenv("GORACE") + " atexit_sleep_ms=0"}}
}

// testConfig is a run of every measurement, short enough for a unit test: the figures mean
// nothing, only that each kind runs end to end and measures something.
func testConfig() Config {
	c := DefaultConfig()
	c.Runs = 2
	c.Duration = 50 * time.Millisecond
	c.Warmup = 20 * time.Millisecond
	c.QPs = []int{2}
	c.Pings = 20
	c.IdleQPs = 10
	c.Base = testBase
	c.Child = testChild()
	return c
}

func startTestChild(t *testing.T) *Child {
	t.Helper()
	ch, err := StartChild(context.Background(), testChild())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ch.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return ch
}

// TestRun runs every measurement twice through Run and checks the interleaving, that every run
// of every kind measured a positive figure, and that every ratio has a value per run.
func TestRun(t *testing.T) {
	cfg := testConfig()
	specs, err := cfg.Specs()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	rep, err := Run(context.Background(), cfg, func(run int, s Spec, o Outcome) {
		order = append(order, fmt.Sprint(run, s.ID))
		if o.Err != nil {
			t.Errorf("run %d, %s: %v", run, s.ID, o.Err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for run := range cfg.Runs {
		for _, s := range specs {
			want = append(want, fmt.Sprint(run, s.ID))
		}
	}
	if !slices.Equal(order, want) {
		t.Errorf("order %v,\nwant %v", order, want)
	}
	kinds := map[Kind]bool{}
	for _, s := range specs {
		kinds[s.Kind] = true
		// On a loaded machine one 50 ms interval of a stream can pass with no message completed (the
		// child not scheduled, a retransmission timeout in the window): a kind must measure something
		// in at least one of its runs, not in every one.
		measured := 0
		for _, o := range rep.Outcomes[s.ID] {
			if o.Done && o.Err == nil && (s.Kind.PingPong() || o.Result.Messages > 0) {
				measured++
			}
		}
		if measured == 0 {
			t.Errorf("%s: no run measured anything", s.ID)
		}
		for run, o := range rep.Outcomes[s.ID] {
			r := o.Result
			switch {
			case !o.Done || o.Err != nil:
				continue // reported above
			case s.Kind.PingPong():
				if r.RTTP50 <= 0 || r.RTTP99 < r.RTTP50 || r.Pings != cfg.Pings && s.Kind != LocalUDPPingPong {
					t.Errorf("run %d, %s: RTT p50 %v, p99 %v of %d pings", run, s.ID, r.RTTP50, r.RTTP99, r.Pings)
				}
				if goroceKind := s.Kind == GorocePingPong || s.Kind == LocalPingPong; goroceKind != (r.PacketsPerRTT >= 2) {
					t.Errorf("run %d, %s: %v packets per round trip", run, s.ID, r.PacketsPerRTT)
				}
			case r.Messages == 0:
				t.Logf("run %d, %s: no message completed in the interval", run, s.ID)
			default:
				if r.Gbps <= 0 || r.Bytes == 0 {
					t.Errorf("run %d, %s: %v Gb/s, %d bytes, %d messages", run, s.ID, r.Gbps, r.Bytes, r.Messages)
				}
			}
			if runtime.GOOS == "linux" && (s.Kind.PingPong() || r.Messages > 0) {
				m := CPUPerGB
				if s.Kind.PingPong() {
					m = CPUPerRTT
				}
				if v := m.of(r); r.CPU <= 0 || !(v > 0) {
					t.Errorf("run %d, %s: CPU %v, %v %v", run, s.ID, r.CPU, v, m)
				}
			}
			if s.Kind.TwoProcess() && s.Kind != TCPStream && s.Kind != UDPStream && s.Kind != UDPPingPong && !s.Kind.PingPong() {
				if r.Allocs < 0 || r.PeerAllocs < 0 {
					t.Errorf("run %d, %s: allocations per packet %v / %v", run, s.ID, r.Allocs, r.PeerAllocs)
				}
			}
			for _, n := range r.Notes {
				t.Logf("run %d, %s: %s", run, s.ID, n)
				if strings.Contains(n, "MISMATCH") {
					t.Errorf("run %d, %s: %s", run, s.ID, n)
				}
			}
		}
	}
	for _, k := range []Kind{GoroceWrite, GoroceRead, GoroceSend, GorocePingPong, TCPStream, UDPStream, UDPPingPong,
		LocalWrite, LocalUDP, LocalPingPong, LocalUDPPingPong} {
		if !kinds[k] {
			t.Errorf("no measurement of kind %s", k)
		}
	}
	ratios := rep.Ratios()
	if len(ratios) != len(RatioDefs(specs)) || len(ratios) < 15 {
		t.Errorf("%d ratios", len(ratios))
	}
	for _, r := range ratios {
		// A run whose interval completed nothing (see above) gives its ratios no value.
		if r.N < 1 || r.N > cfg.Runs || !(r.Median > 0) {
			t.Errorf("ratio %s: %+v", r.Name, r.Summary)
		}
	}
	if rep.Idle == nil || rep.Idle.QPs != cfg.IdleQPs {
		t.Errorf("idle: %+v, %v", rep.Idle, rep.IdleErr)
	}
	if len(rep.ChildPIDs) != 1 {
		t.Errorf("child processes %v, want one for every run", rep.ChildPIDs)
	}
}

// TestChildProtocol drives the child by hand: requests out of order are refused without breaking
// the channel, a second start is refused while one runs, and the child exits when its stdin closes.
func TestChildProtocol(t *testing.T) {
	ch, err := StartChild(context.Background(), testChild())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ch.mark(ctx); err == nil || !strings.Contains(err.Error(), "no measurement") {
		t.Errorf("mark before start: %v", err)
	}
	if _, err := ch.stop(ctx); err == nil || !strings.Contains(err.Error(), "no measurement") {
		t.Errorf("stop before start: %v", err)
	}
	if _, err := ch.call(ctx, request{Op: "dance"}, time.Second); err == nil || !strings.Contains(err.Error(), "unknown operation") {
		t.Errorf("unknown operation: %v", err)
	}
	if _, err := ch.start(ctx, Spec{Kind: LocalWrite}, "127.0.5.2", Endpoint{}); err == nil || !strings.Contains(err.Error(), "not a two-process") {
		t.Errorf("start of a one-process kind: %v", err)
	}
	if _, err := ch.start(ctx, Spec{Kind: GoroceWrite, QPs: 2}, "127.0.5.2", Endpoint{}); err == nil || !strings.Contains(err.Error(), "peer QPs") {
		t.Errorf("start without the parent's QPs: %v", err)
	}
	s := Spec{Kind: TCPStream, Size: 1024}
	ep, err := ch.start(ctx, s, "127.0.5.2", Endpoint{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netip.ParseAddrPort(ep.Addr); err != nil {
		t.Errorf("TCP endpoint %q: %v", ep.Addr, err)
	}
	if _, err := ch.start(ctx, s, "127.0.5.2", Endpoint{}); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second start: %v", err)
	}
	if err := ch.mark(ctx); err != nil {
		t.Error(err)
	}
	// Nobody connected: the stop reports it, through an error, with the report. The child measured
	// its CPU time from the mark: answering the two requests took some.
	if rep, err := ch.stop(ctx); err != nil || rep.Bytes != 0 || runtime.GOOS == "linux" && rep.CPU <= 0 {
		t.Errorf("stop: %+v, %v", rep, err)
	}
	// A stop without a mark has no CPU time to report.
	if _, err := ch.start(ctx, s, "127.0.5.2", Endpoint{}); err != nil {
		t.Fatal(err)
	}
	if rep, err := ch.stop(ctx); err != nil || rep.CPU != 0 {
		t.Errorf("stop without a mark: %+v, %v", rep, err)
	}
	if ch.broken != nil {
		t.Fatalf("channel broken: %v", ch.broken)
	}
	start := time.Now()
	if err := ch.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if d := time.Since(start); d >= exitTimeout {
		t.Errorf("the child took %v to exit: killed rather than ended by its stdin", d)
	}
	if _, err := ch.stop(ctx); !errors.Is(err, ErrChild) {
		t.Errorf("stop after close: %v", err)
	}
}

// TestChildStartFails checks that children that do not serve fail StartChild with what they said.
func TestChildStartFails(t *testing.T) {
	ctx := context.Background()
	if _, err := StartChild(ctx, ChildCommand{Path: "/nonexistent/goroce"}); !errors.Is(err, ErrChild) {
		t.Errorf("missing binary: %v", err)
	}
	_, err := StartChild(ctx, ChildCommand{Path: "/bin/sh", Args: []string{"-c", "echo no perf here >&2; exit 3"}})
	if !errors.Is(err, ErrChild) || !strings.Contains(err.Error(), "no perf here") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("exiting child: %v", err)
	}
	_, err = StartChild(ctx, ChildCommand{Path: "/bin/sh", Args: []string{"-c", "echo '{\"op\":\"hello\",\"version\":99}'; read x"}})
	if !errors.Is(err, ErrChild) || !strings.Contains(err.Error(), "version 99") {
		t.Errorf("child of another version: %v", err)
	}
	_, err = StartChild(ctx, ChildCommand{Path: "/bin/sh", Args: []string{"-c", "echo garbage; read x"}})
	if !errors.Is(err, ErrChild) || !strings.Contains(err.Error(), "garbage") {
		t.Errorf("child speaking garbage: %v", err)
	}
}

// TestCancel ends a long goroce stream through its context, as Ctrl-C does: it returns promptly,
// the child's side is stopped, and the child serves the next measurement.
func TestCancel(t *testing.T) {
	ch := startTestChild(t)
	cfg := testConfig()
	cfg.Only, cfg.Procs, cfg.Duration = []string{GroupWrite}, ProcsTwo, time.Minute
	specs, err := cfg.Specs()
	if err != nil {
		t.Fatal(err)
	}
	s := specs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = measure(ctx, cfg, ch, s)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled stream: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancelled stream took %v", d)
	}
	s.Duration = 30 * time.Millisecond
	if r, err := measure(context.Background(), cfg, ch, s); err != nil || r.Gbps <= 0 {
		t.Errorf("next stream: %v Gb/s, %v", r.Gbps, err)
	}
}

// TestChildDies kills the child in the middle of a goroce stream: the measurement ends at once
// (not after goroce's retries run out) with an error that says the child exited.
func TestChildDies(t *testing.T) {
	ch, err := StartChild(context.Background(), testChild())
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	cfg := testConfig()
	cfg.Only, cfg.Procs, cfg.Duration = []string{GroupSend}, ProcsTwo, time.Minute
	specs, err := cfg.Specs()
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { ch.cmd.Process.Kill() })
	start := time.Now()
	_, err = measureWatched(context.Background(), cfg, ch, specs[0])
	if !errors.Is(err, ErrChild) || !strings.Contains(err.Error(), "exited") {
		t.Errorf("measurement with a dead child: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the measurement took %v to notice", d)
	}
	if ch.broken == nil {
		t.Error("the channel to a dead child is not marked broken")
	}
}

func TestConfig(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"procs", func(c *Config) { c.Procs = "3" }, "procs"},
		{"runs", func(c *Config) { c.Runs = 0 }, "runs"},
		{"MTU", func(c *Config) { c.MTU = 1500 }, "MTU"},
		{"CQ moderation over depth", func(c *Config) { c.CQMod = c.Depth + 1 }, "CQ moderation"},
		{"burst beyond a datagram", func(c *Config) { c.Burst = 16 }, "burst"},
		{"window within a burst", func(c *Config) { c.Window = c.Burst }, "window"},
		{"base", func(c *Config) { c.Base = netip.MustParseAddr("10.0.0.1") }, "base"},
		{"base too high", func(c *Config) { c.Base = netip.MustParseAddr("127.0.4.250") }, "base"},
		{"group", func(c *Config) { c.Only = []string{"writes"} }, "group"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}

	ids := func(c Config) []string {
		specs, err := c.Specs()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range specs {
			out = append(out, s.ID)
		}
		return out
	}
	c := DefaultConfig()
	want := []string{"write-1-gso", "write-1-dgram", "write-2-gso", "write-2-dgram", "write-4-gso", "write-4-dgram",
		"read-1", "read-2", "read-4", "send-1", "send-2", "send-4", "tcp", "udp", "udp-gso", "pingpong", "udp-pingpong", "local-write", "local-udp", "local-pingpong", "local-udp-pingpong"}
	if got := ids(c); !slices.Equal(got, want) {
		t.Errorf("default specs %v, want %v", got, want)
	}
	c.Only = []string{GroupUDP}
	if got := ids(c); !slices.Equal(got, []string{"udp", "udp-gso", "local-udp"}) {
		t.Errorf("-only udp: %v", got)
	}
	c.Only, c.Procs, c.QPs = []string{GroupWrite}, ProcsTwo, nil
	if got := ids(c); !slices.Equal(got, []string{"write-1-gso", "write-1-dgram"}) {
		t.Errorf("-only write -procs 2 -qps 1: %v", got)
	}
	c.Only, c.Procs = nil, ProcsOne
	if got := ids(c); !slices.Equal(got, []string{"local-write", "local-udp", "local-pingpong", "local-udp-pingpong"}) {
		t.Errorf("-procs 1: %v", got)
	}
	// Each datagram of the raw UDP streams is a WRITE MIDDLE packet at the MTU.
	c = DefaultConfig()
	specs, _ := c.Specs()
	for _, s := range specs {
		if s.Kind == UDPStream && (s.Size != 4112 || s.Payload != 4096) {
			t.Errorf("%s: %d-byte datagrams counting %d", s.ID, s.Size, s.Payload)
		}
		if s.Kind == UDPPingPong && s.Size != 32 {
			t.Errorf("%s: %d-byte pings", s.ID, s.Size)
		}
	}
}

// TestAckEvery checks that a UDP sender blocked on its window always has an ack coming: the
// receiver acknowledges before the unacknowledged datagrams leave less than one write of room.
func TestAckEvery(t *testing.T) {
	for _, tc := range []struct{ window, burst int }{{128, 1}, {128, 15}, {16, 15}, {2, 1}, {1024, 15}} {
		s := Spec{Window: tc.window, Burst: tc.burst}
		k := ackEvery(s)
		if k < 1 || int(k)-1+tc.burst > tc.window || k > maxAckEvery {
			t.Errorf("window %d, burst %d: ack every %d", tc.window, tc.burst, k)
		}
	}
}

// TestCPUFigures checks the CPU metrics and how a run's CPU time adds up: both processes' or
// nothing.
func TestCPUFigures(t *testing.T) {
	r := Result{CPU: 2 * time.Second, Bytes: 4e9, Pings: 1000}
	if v := CPUPerGB.of(r); v != 0.5 {
		t.Errorf("CPU per GB %v, want 0.5", v)
	}
	if v := CPUPerRTT.of(r); v != 2000 {
		t.Errorf("CPU per round trip %v us, want 2000", v)
	}
	if v := CPUPerGB.of(Result{Bytes: 4e9}); !math.IsNaN(v) {
		t.Errorf("CPU per GB without CPU time: %v, want NaN", v)
	}
	if v := CPUPerRTT.of(Result{CPU: time.Second}); !math.IsNaN(v) {
		t.Errorf("CPU per round trip without round trips: %v, want NaN", v)
	}
	self := cpuSpan{t0: time.Second, t1: 3 * time.Second, begun: true}
	for _, c := range []struct {
		self                     *cpuSpan
		peer                     *PeerReport
		want, wantSelf, wantPeer time.Duration
	}{
		{&self, nil, 2 * time.Second, 2 * time.Second, 0},
		{&self, &PeerReport{CPU: time.Second}, 3 * time.Second, 2 * time.Second, time.Second},
		{&self, &PeerReport{}, 0, 0, 0},                       // the child measured nothing
		{&cpuSpan{}, &PeerReport{CPU: time.Second}, 0, 0, 0},  // this process measured nothing
		{&cpuSpan{t0: -1, t1: -1, begun: true}, nil, 0, 0, 0}, // the clock could not be read
	} {
		var r Result
		r.setCPU(c.self, c.peer)
		if r.CPU != c.want || r.SelfCPU != c.wantSelf || r.PeerCPU != c.wantPeer {
			t.Errorf("self %+v, peer %+v: CPU %v (self %v, child %v), want %v (%v, %v)", *c.self, c.peer,
				r.CPU, r.SelfCPU, r.PeerCPU, c.want, c.wantSelf, c.wantPeer)
		}
	}
	// CPUs busy: each side's CPU time over the interval.
	busy := Result{SelfCPU: 1500 * time.Millisecond, PeerCPU: 500 * time.Millisecond, Elapsed: 2 * time.Second}
	if v := Busy.of(busy); v != 0.75 {
		t.Errorf("CPUs busy %v, want 0.75", v)
	}
	if v := PeerBusy.of(busy); v != 0.25 {
		t.Errorf("child's CPUs busy %v, want 0.25", v)
	}
	if v := PeerBusy.of(Result{SelfCPU: time.Second, Elapsed: time.Second}); !math.IsNaN(v) {
		t.Errorf("child's CPUs busy in one process: %v, want NaN", v)
	}
	if runtime.GOOS == "linux" {
		var c cpuSpan
		c.begin()
		for start := time.Now(); time.Since(start) < 20*time.Millisecond; {
		}
		c.end()
		if u := c.used(); u < 5*time.Millisecond {
			t.Errorf("20 ms of spinning measured %v of CPU time", u)
		}
	}
}

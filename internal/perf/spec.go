package perf

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/goroce/goroce/wire"
)

// Kind is a kind of measurement.
type Kind string

// Measurements between two processes: the parent sends (or pings), the child receives, responds
// or echoes.
const (
	GoroceWrite    Kind = "goroce-write"    // RDMA WRITEs into the child's region
	GoroceRead     Kind = "goroce-read"     // RDMA READs of the child's region
	GoroceSend     Kind = "goroce-send"     // SENDs to receives the child keeps posted
	GorocePingPong Kind = "goroce-pingpong" // a small SEND the child answers with a SEND
	TCPStream      Kind = "tcp"             // a Go TCP stream the child reads and discards
	UDPStream      Kind = "udp"             // raw UDP datagrams, windowed by the child's acks
	UDPPingPong    Kind = "udp-pingpong"    // a raw UDP datagram the child echoes
)

// Measurements inside the parent, as `goroce perf loopback` always made them.
const (
	LocalWrite       Kind = "local-write"        // two devices in one process, RDMA WRITEs
	LocalUDP         Kind = "local-udp"          // conn.RawThroughput
	LocalPingPong    Kind = "local-pingpong"     // two devices in one process, SEND ping-pong
	LocalUDPPingPong Kind = "local-udp-pingpong" // conn.RawPingPong
)

// TwoProcess reports whether k runs with the child.
func (k Kind) TwoProcess() bool { return !strings.HasPrefix(string(k), "local-") }

// PingPong reports whether k measures round trips rather than throughput.
func (k Kind) PingPong() bool { return strings.HasSuffix(string(k), "pingpong") }

// Spec is one measurement: a row of the report, run once per run. The child receives it with
// every start request.
type Spec struct {
	ID    string `json:"id"`    // short and unique: what ratios refer to
	Title string `json:"title"` // the report's label
	Kind  Kind   `json:"kind"`
	// Groups are the names -only selects the measurement by.
	Groups []string `json:"groups,omitempty"`

	QPs int `json:"qps,omitempty"` // goroce: queue pairs, each with its CQ and goroutine
	// GSO: for goroce, the devices' default GSO mode (GSOAuto) rather than GSOOff; for raw UDP,
	// GSO writes to a GRO receiver rather than one datagram per system call slot.
	GSO   bool `json:"gso,omitempty"`
	Size  int  `json:"size"`            // bytes of a goroce message, a TCP write, a UDP datagram
	MTU   int  `json:"mtu,omitempty"`   // goroce path MTU, bytes
	Depth int  `json:"depth,omitempty"` // goroce: work requests outstanding per QP
	CQMod int  `json:"cqmod,omitempty"` // goroce: one work request in CQMod asks for a completion

	// Raw UDP streams: each datagram counts Payload bytes (the RoCE payload a packet of Size bytes
	// would carry), Burst datagrams leave in one GSO write, and at most Window are in flight.
	Payload int `json:"payload,omitempty"`
	Burst   int `json:"burst,omitempty"`
	Window  int `json:"window,omitempty"`

	Pings int `json:"pings,omitempty"` // ping-pongs: round trips measured
	// BusyPoll: ping-pongs poll for up to this long before they sleep, goroce's devices
	// (Config.BusyPoll) and raw UDP's readers (conn.BusyPolling) alike.
	BusyPoll time.Duration `json:"busypoll,omitempty"`
	Duration time.Duration `json:"duration,omitempty"` // throughput: the timed interval
	Warmup   time.Duration `json:"warmup,omitempty"`   // throughput: traffic before it

	// Tag marks the raw datagrams of one measurement so that stragglers of another are ignored.
	Tag uint64 `json:"tag,omitempty"`
}

// Groups of measurements that Config.Only selects.
const (
	GroupWrite    = "write"
	GroupRead     = "read"
	GroupSend     = "send"
	GroupTCP      = "tcp"
	GroupUDP      = "udp"
	GroupPingPong = "pingpong"
	GroupIdle     = "idle"
)

// Groups lists every group, in report order.
var Groups = []string{GroupWrite, GroupRead, GroupSend, GroupTCP, GroupUDP, GroupPingPong, GroupIdle}

// Procs says which measurements run: in one process, with a child process, or both.
type Procs string

// Process choices.
const (
	ProcsOne  Procs = "1"
	ProcsTwo  Procs = "2"
	ProcsBoth Procs = "both"
)

// Packet sizes the raw UDP baselines mirror. IBTA Vol 1 9.2 (BTH), Annex A17 (ICRC).
const (
	// pingPayload is the SEND of the ping-pongs; pingDatagram is its SEND_ONLY packet.
	pingPayload  = 16
	pingDatagram = wire.BTHLen + pingPayload + wire.ICRCLen
	// pingMTU is the ping-pongs' path MTU, as the one-process figures always used.
	pingMTU = 1024
	// pingDepth is the ping-pongs' send queue: one SEND at a time, but an echo's previous SEND may
	// await its ACK, which waits for company (goroce.Config.AckDelay).
	pingDepth = 16
	// maxGSOBytes bounds a GSO write: its bytes must fit one UDP datagram over IPv4.
	maxGSOBytes = 65535 - 20 - 8
)

// Config is a whole `goroce perf loopback` run.
type Config struct {
	Procs    Procs
	Runs     int           // times each measurement runs, interleaved
	Duration time.Duration // timed interval of each throughput run
	Warmup   time.Duration // traffic before the timed interval
	Msg      int           // goroce WRITE, READ and SEND message size
	MTU      int           // goroce path MTU of the streams, and payload of a raw UDP datagram
	TCPWrite int           // bytes of each TCP write
	QPs      []int         // queue pairs of the multi-QP goroce runs, besides the 1-QP ones (none: no such runs)
	Depth    int           // goroce work requests outstanding per QP
	CQMod    int           // goroce: one work request in CQMod is signaled
	Window   int           // raw UDP datagrams in flight
	Burst    int           // raw UDP datagrams per GSO write
	Pings    int           // round trips of each ping-pong run
	BusyPoll time.Duration // ping-pongs poll for up to this long before they sleep, goroce and raw UDP alike
	IdleQPs  int           // connected idle QPs of the memory run (0: none)
	Only     []string      // groups to run; all when empty
	// Base is the first of the loopback addresses used: Base+1 is the parent's and Base+2 the
	// child's; the one-process measurements take Base+3 to Base+12.
	Base netip.Addr
	// Child starts the child process.
	Child ChildCommand
}

// DefaultConfig returns the command's defaults. Child is left empty.
func DefaultConfig() Config {
	return Config{
		Procs:    ProcsBoth,
		Runs:     3,
		Duration: 2 * time.Second,
		Warmup:   250 * time.Millisecond,
		Msg:      64 << 10,
		MTU:      4096,
		TCPWrite: 1 << 20,
		QPs:      []int{2, 4},
		Depth:    16,
		CQMod:    4,
		Window:   128,
		Burst:    15,
		Pings:    20000,
		IdleQPs:  10000,
		Base:     netip.MustParseAddr("127.0.4.0"),
	}
}

// Address offsets from Config.Base.
const (
	addrParent = 1 + iota
	addrChild
	addrLocalWriteA
	addrLocalWriteB
	addrLocalUDPA
	addrLocalUDPB
	addrLocalPingA
	addrLocalPingB
	addrLocalUDPPingA
	addrLocalUDPPingB
	addrIdle
	addrIdlePeer
)

// addr returns Base + off.
func (c Config) addr(off int) netip.Addr {
	b := c.Base.As4()
	b[3] += byte(off)
	return netip.AddrFrom4(b)
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Procs == ProcsOne || c.Procs == ProcsTwo || c.Procs == ProcsBoth, "procs %q: want 1, 2 or both", c.Procs)
	check(c.Runs >= 1, "runs %d: want at least 1", c.Runs)
	check(c.Duration > 0, "duration %v: want more than 0", c.Duration)
	check(c.Warmup >= 0, "warm-up %v: want 0 or more", c.Warmup)
	_, mtuOK := wire.MTUFromBytes(c.MTU)
	check(mtuOK, "MTU %d: want 256, 512, 1024, 2048 or 4096", c.MTU)
	check(c.Msg >= 1, "message size %d: want at least 1", c.Msg)
	check(c.TCPWrite >= 1, "TCP write size %d: want at least 1", c.TCPWrite)
	for _, n := range c.QPs {
		check(n >= 1 && n <= 64, "QPs %d: want 1 to 64", n)
	}
	check(c.Depth >= 1 && c.Depth <= 1024, "depth %d: want 1 to 1024", c.Depth)
	check(c.CQMod >= 1 && c.CQMod <= c.Depth, "CQ moderation %d: want 1 to the depth (%d), or no work request would complete", c.CQMod, c.Depth)
	size := udpDatagram(c.MTU)
	check(c.Burst >= 1 && c.Burst*size <= maxGSOBytes, "burst %d: want 1 to %d datagrams of %d bytes", c.Burst, maxGSOBytes/size, size)
	check(c.Window >= c.Burst+1, "window %d: want more than the burst (%d)", c.Window, c.Burst)
	check(c.Pings >= 1, "pings %d: want at least 1", c.Pings)
	check(c.IdleQPs >= 0, "idle QPs %d: want 0 or more", c.IdleQPs)
	check(c.Base.Is4() && c.Base.IsLoopback() && c.Base.As4()[3] <= 255-addrIdlePeer,
		"base address %v: want an IPv4 loopback address a.b.c.d with d at most %d", c.Base, 255-addrIdlePeer)
	for _, g := range c.Only {
		check(slices.Contains(Groups, g), "group %q: want one of %s", g, strings.Join(Groups, ", "))
	}
	return errors.Join(errs...)
}

// udpDatagram is the size of a WRITE MIDDLE packet at path MTU mtu: BTH, payload, ICRC.
func udpDatagram(mtu int) int { return wire.BTHLen + mtu + wire.ICRCLen }

// wants reports whether c runs group g.
func (c Config) wants(g string) bool { return len(c.Only) == 0 || slices.Contains(c.Only, g) }

// Specs returns the measurements c runs, in the order each run makes them.
func (c Config) Specs() ([]Spec, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var out []Spec
	add := func(s Spec) {
		for _, g := range s.Groups {
			if c.wants(g) {
				out = append(out, s)
				return
			}
		}
	}
	gor := func(id, title string, kind Kind, qps int, gso bool, group string) Spec {
		return Spec{ID: id, Title: title, Kind: kind, Groups: []string{group}, QPs: qps, GSO: gso, Size: c.Msg,
			MTU: c.MTU, Depth: c.Depth, CQMod: c.CQMod, Duration: c.Duration, Warmup: c.Warmup}
	}
	qpCounts := []int{1}
	for _, n := range c.QPs {
		if !slices.Contains(qpCounts, n) {
			qpCounts = append(qpCounts, n)
		}
	}
	slices.Sort(qpCounts)
	msg := sizeString(c.Msg)
	size := udpDatagram(c.MTU)
	polling := ""
	if c.BusyPoll > 0 {
		polling = fmt.Sprintf(", busy-polling %v", c.BusyPoll)
	}
	if c.Procs != ProcsOne {
		for _, n := range qpCounts {
			add(gor(fmt.Sprintf("write-%d-gso", n), fmt.Sprintf("goroce WRITE %s, %s, GSO (default)", msg, qpString(n)), GoroceWrite, n, true, GroupWrite))
			add(gor(fmt.Sprintf("write-%d-dgram", n), fmt.Sprintf("goroce WRITE %s, %s, GSO off: one datagram a packet", msg, qpString(n)), GoroceWrite, n, false, GroupWrite))
		}
		for _, n := range qpCounts {
			add(gor(fmt.Sprintf("read-%d", n), fmt.Sprintf("goroce READ %s, %s", msg, qpString(n)), GoroceRead, n, true, GroupRead))
		}
		for _, n := range qpCounts {
			add(gor(fmt.Sprintf("send-%d", n), fmt.Sprintf("goroce SEND %s, %s", msg, qpString(n)), GoroceSend, n, true, GroupSend))
		}
		add(Spec{ID: "tcp", Title: fmt.Sprintf("Go TCP, %s writes", sizeString(c.TCPWrite)), Kind: TCPStream, Groups: []string{GroupTCP},
			Size: c.TCPWrite, Duration: c.Duration, Warmup: c.Warmup})
		udp := Spec{ID: "udp", Title: fmt.Sprintf("raw UDP, %d-byte datagrams, one a packet", size), Kind: UDPStream, Groups: []string{GroupUDP},
			Size: size, Payload: c.MTU, Window: c.Window, Burst: 1, Duration: c.Duration, Warmup: c.Warmup}
		add(udp)
		udp.ID, udp.Title, udp.GSO, udp.Burst = "udp-gso", fmt.Sprintf("raw UDP, %d-byte datagrams, %d per GSO write, GRO", size, c.Burst), true, c.Burst
		add(udp)
		add(Spec{ID: "pingpong", Title: fmt.Sprintf("goroce %d-byte SEND ping-pong%s", pingPayload, polling), Kind: GorocePingPong, Groups: []string{GroupPingPong},
			QPs: 1, GSO: true, Size: pingPayload, MTU: pingMTU, Depth: pingDepth, CQMod: 1, Pings: c.Pings, BusyPoll: c.BusyPoll})
		add(Spec{ID: "udp-pingpong", Title: fmt.Sprintf("raw UDP %d-byte ping-pong%s", pingDatagram, polling), Kind: UDPPingPong, Groups: []string{GroupPingPong},
			Size: pingDatagram, Pings: c.Pings, BusyPoll: c.BusyPoll})
	}
	if c.Procs != ProcsTwo {
		add(Spec{ID: "local-write", Title: fmt.Sprintf("goroce WRITE %s, 1 QP, GSO", msg), Kind: LocalWrite, Groups: []string{GroupWrite},
			QPs: 1, GSO: true, Size: c.Msg, MTU: c.MTU, Depth: c.Depth, CQMod: c.CQMod, Duration: c.Duration, Warmup: c.Warmup})
		add(Spec{ID: "local-udp", Title: fmt.Sprintf("raw UDP, %d-byte datagrams, one a packet", size), Kind: LocalUDP, Groups: []string{GroupWrite, GroupUDP},
			Size: size, Payload: c.MTU, Window: c.Window, Burst: 1, Duration: c.Duration})
		add(Spec{ID: "local-pingpong", Title: fmt.Sprintf("goroce %d-byte SEND ping-pong%s", pingPayload, polling), Kind: LocalPingPong, Groups: []string{GroupPingPong},
			QPs: 1, GSO: true, Size: pingPayload, MTU: pingMTU, Depth: pingDepth, CQMod: 1, Pings: c.Pings, BusyPoll: c.BusyPoll})
		add(Spec{ID: "local-udp-pingpong", Title: fmt.Sprintf("raw UDP %d-byte ping-pong%s", pingDatagram, polling), Kind: LocalUDPPingPong, Groups: []string{GroupPingPong},
			Size: pingDatagram, Pings: c.Pings, BusyPoll: c.BusyPoll})
	}
	return out, nil
}

// Metric is the figure of a measurement a summary or ratio is about.
type Metric uint8

// Metrics.
const (
	Gbps Metric = iota // payload throughput, 10^9 bits per second
	P50                // median round trip, microseconds
	P99                // 99th percentile round trip, microseconds
	// CPUPerGB is the CPU time both processes used per 10^9 bytes of payload, seconds: Result.CPU
	// over Result.Bytes.
	CPUPerGB
	// CPUPerRTT is the CPU time both processes used per round trip, microseconds.
	CPUPerRTT
	// Busy is how many CPUs this process kept busy over a throughput run's interval: Result.SelfCPU
	// over Result.Elapsed. In a two-process run it is the sending side's share, and near 1 when one
	// goroutine's work bounds the stream.
	Busy
	// PeerBusy is Busy for the child: Result.PeerCPU over Result.Elapsed (its span runs from the
	// interval's start to the stop, a few milliseconds more).
	PeerBusy
)

// String returns the metric's short name.
func (m Metric) String() string {
	switch m {
	case Gbps:
		return "Gb/s"
	case P50:
		return "RTT p50"
	case P99:
		return "RTT p99"
	case CPUPerGB:
		return "CPU s/GB"
	case CPUPerRTT:
		return "CPU us/RTT"
	case Busy:
		return "CPUs busy"
	case PeerBusy:
		return "child's CPUs busy"
	}
	return fmt.Sprintf("Metric(%d)", uint8(m))
}

// of returns r's figure for m, NaN if r has none.
func (m Metric) of(r Result) float64 {
	var v float64
	switch m {
	case Gbps:
		v = r.Gbps
	case P50:
		v = float64(r.RTTP50) / float64(time.Microsecond)
	case P99:
		v = float64(r.RTTP99) / float64(time.Microsecond)
	case CPUPerGB:
		if r.Bytes > 0 {
			v = r.CPU.Seconds() / (float64(r.Bytes) / 1e9)
		}
	case CPUPerRTT:
		if r.Pings > 0 {
			v = float64(r.CPU) / float64(time.Microsecond) / float64(r.Pings)
		}
	case Busy, PeerBusy:
		cpu := r.SelfCPU
		if m == PeerBusy {
			cpu = r.PeerCPU
		}
		if r.Elapsed > 0 {
			v = cpu.Seconds() / r.Elapsed.Seconds()
		}
	}
	if v <= 0 {
		return math.NaN()
	}
	return v
}

// RatioDef is a ratio the report shows: the figure of measurement Num over that of Den, run by run.
type RatioDef struct {
	Name     string
	Num, Den string // Spec IDs
	Metric   Metric
	Goal     Goal // the project's goal for it, if any
}

// Goal bounds a ratio's median: at least Min unless Min is 0, at most Max unless Max is 0. The goals are
// those of the datapath's issue (11): on a 2-CPU machine, two processes on loopback, 64 KiB messages at
// MTU 4096.
type Goal struct{ Min, Max float64 }

// IsZero reports that g sets no bound.
func (g Goal) IsZero() bool { return g.Min == 0 && g.Max == 0 }

// Met reports whether v lies within g's bounds; a NaN meets none.
func (g Goal) Met(v float64) bool {
	return !math.IsNaN(v) && (g.Min == 0 || v >= g.Min) && (g.Max == 0 || v <= g.Max)
}

func (g Goal) String() string {
	switch {
	case g.IsZero():
		return ""
	case g.Max == 0:
		return fmt.Sprintf("at least %.2f", g.Min)
	case g.Min == 0:
		return fmt.Sprintf("at most %.2f", g.Max)
	}
	return fmt.Sprintf("%.2f to %.2f", g.Min, g.Max)
}

// RatioDefs returns the ratios of the report on specs, those whose two measurements are both there.
func RatioDefs(specs []Spec) []RatioDef {
	has := func(id string) bool {
		return slices.ContainsFunc(specs, func(s Spec) bool { return s.ID == id })
	}
	var multi []int // the QP counts of the two-process runs with more than one QP
	for _, s := range specs {
		if s.Kind.TwoProcess() && s.QPs > 1 && !slices.Contains(multi, s.QPs) {
			multi = append(multi, s.QPs)
		}
	}
	slices.Sort(multi)
	var out []RatioDef
	add := func(d RatioDef) {
		if has(d.Num) && has(d.Den) {
			out = append(out, d)
		}
	}
	// perQP adds a ratio for 1 QP and for each multi-QP count; name has a %s for the QPs.
	perQP := func(name string, num, den func(n int) string, goal func(n int) Goal) {
		for _, n := range append([]int{1}, multi...) {
			add(RatioDef{Name: fmt.Sprintf(name, qpString(n)), Num: num(n), Den: den(n), Goal: goal(n)})
		}
	}
	id := func(format string) func(int) string { return func(n int) string { return fmt.Sprintf(format, n) } }
	tcp := func(int) string { return "tcp" }
	oneQP := func(g Goal) func(int) Goal {
		return func(n int) Goal {
			if n == 1 {
				return g
			}
			return Goal{}
		}
	}
	writeGoal := func(n int) Goal {
		switch n {
		case 1:
			return Goal{Min: 0.7}
		case 4:
			return Goal{Min: 1} // the target beyond its goal: 4 QPs at or above TCP
		}
		return Goal{}
	}
	perQP("goroce WRITE %s / TCP", id("write-%d-gso"), tcp, writeGoal)
	perQP("goroce WRITE GSO / one datagram, %s", id("write-%d-gso"), id("write-%d-dgram"), oneQP(Goal{}))
	perQP("goroce READ / WRITE, %s", id("read-%d"), id("write-%d-gso"), oneQP(Goal{Min: 0.85, Max: 1.15}))
	perQP("goroce SEND / TCP, %s", id("send-%d"), tcp, oneQP(Goal{Min: 0.6}))
	for _, n := range multi {
		add(RatioDef{Name: "goroce READ " + qpString(n) + " / TCP", Num: fmt.Sprintf("read-%d", n), Den: "tcp"})
	}
	add(RatioDef{Name: "goroce WRITE one datagram / raw UDP one datagram, 1 QP", Num: "write-1-dgram", Den: "udp"})
	add(RatioDef{Name: "goroce WRITE GSO / raw UDP GSO+GRO, 1 QP", Num: "write-1-gso", Den: "udp-gso"})
	add(RatioDef{Name: "raw UDP GSO+GRO / raw UDP one datagram", Num: "udp-gso", Den: "udp"})
	add(RatioDef{Name: "goroce RTT p50 / raw UDP p50", Num: "pingpong", Den: "udp-pingpong", Metric: P50, Goal: Goal{Max: 1.25}})
	add(RatioDef{Name: "goroce RTT p99 / raw UDP p99", Num: "pingpong", Den: "udp-pingpong", Metric: P99, Goal: Goal{Max: 2}})
	// CPU time per byte and per round trip, both processes': the figures another tenant's load
	// moves least. The issue sets no goal on them.
	for _, n := range append([]int{1}, multi...) {
		add(RatioDef{Name: fmt.Sprintf("goroce WRITE CPU per byte / TCP's, %s", qpString(n)), Num: fmt.Sprintf("write-%d-gso", n), Den: "tcp", Metric: CPUPerGB})
	}
	add(RatioDef{Name: "goroce SEND CPU per byte / TCP's, 1 QP", Num: "send-1", Den: "tcp", Metric: CPUPerGB})
	add(RatioDef{Name: "goroce WRITE CPU per byte / raw UDP GSO+GRO's, 1 QP", Num: "write-1-gso", Den: "udp-gso", Metric: CPUPerGB})
	add(RatioDef{Name: "goroce CPU per round trip / raw UDP's", Num: "pingpong", Den: "udp-pingpong", Metric: CPUPerRTT})
	add(RatioDef{Name: "one process: goroce WRITE / raw UDP", Num: "local-write", Den: "local-udp"})
	add(RatioDef{Name: "one process: goroce WRITE CPU per byte / raw UDP's", Num: "local-write", Den: "local-udp", Metric: CPUPerGB})
	add(RatioDef{Name: "one process: goroce CPU per round trip / raw UDP's", Num: "local-pingpong", Den: "local-udp-pingpong", Metric: CPUPerRTT})
	add(RatioDef{Name: "one process: goroce RTT p50 / raw UDP p50", Num: "local-pingpong", Den: "local-udp-pingpong", Metric: P50, Goal: Goal{Max: 1.25}})
	add(RatioDef{Name: "one process: goroce RTT p99 / raw UDP p99", Num: "local-pingpong", Den: "local-udp-pingpong", Metric: P99, Goal: Goal{Max: 2}})
	return out
}

func qpString(n int) string {
	if n == 1 {
		return "1 QP"
	}
	return fmt.Sprintf("%d QPs", n)
}

// sizeString writes a size in KiB or MiB when it is a whole number of them.
func sizeString(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

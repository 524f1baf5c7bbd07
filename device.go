// Package goroce is a software RDMA NIC: a Device speaks RoCEv2 over an ordinary UDP socket and runs
// queue pairs for Go programs through a verbs-style API. A libibverbs user finds the same objects
// (protection domains, memory regions, completion queues, queue pairs, work requests) with Go names;
// the README maps each ibv_* call to its goroce counterpart.
//
// A minimal RC connection:
//
//	dev, _ := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: goroce.DefaultPort})
//	pd, _ := dev.AllocPD()
//	cq, _ := dev.CreateCQ(64)
//	qp, _ := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
//	// send qp.Endpoint() to the peer out of band, receive its Endpoint, then:
//	qp.Connect(peer, nil)
//
// Tests need no sockets: devices opened on one NewMemNetwork talk to each other in memory, with the
// losses and delays a test asks for.
//
// Concurrency: every method is safe for concurrent use. Inside (package internal/datapath), each QP
// lives on one of the device's shards, which receives its packets and keeps its timers, and sends from
// one of the device's source ports; whoever has work for a QP runs its engine under the QP's lock.
// A goroutine blocked in CQ.Wait on a CQ whose QPs share a shard drives that shard itself, so that it
// is the one the kernel wakes when a reply arrives.
package goroce

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/internal/datapath"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// DefaultPort is the RoCEv2 UDP port. IBTA Annex A17.
const DefaultPort = wire.UDPPort

// Config configures a Device.
type Config struct {
	// Addr is the local IP address the device binds to and derives its GID from. Required.
	Addr netip.Addr
	// Port is the UDP port the device receives on. 0 picks a free port, as for any socket, which
	// suits tests and devices that talk only to goroce peers told of it (Endpoint.Port); RoCEv2 peers
	// such as rxe and NICs send to DefaultPort (4791), so a device that talks to them sets it.
	Port uint16
	// Clock is where the device reads the time; RealClock unless set.
	Clock Clock
	// Shards is the number of receive sockets and the goroutines that drive them, each with the
	// queue pairs placed on it: GOMAXPROCS, at most 4, unless set. The kernel steers every packet to
	// the shard of its destination QP (SO_REUSEPORT with a BPF program), so the shards run on
	// different cores without sharing a QP. A shard's socket takes packets from its first QP on, and
	// SO_REUSEPORT and the BPF program come only once a second shard does: together they cost each
	// packet received 0.2 to 0.3 us, which a device with one QP saves.
	Shards int
	// SourcePorts bounds the UDP source ports the device sends from, one socket each: 16 unless set.
	// Each QP sends from one of them, chosen by its QPN, as rxe maps QPNs to source ports, so that
	// ECMP fabrics and receive-side steering see one flow per QP and different QPs spread.
	SourcePorts int
	// GSO chooses whether runs of equal-sized packets leave in one UDP GSO write: GSOAuto unless set.
	// The environment variable GOROCE_GSO=off (or on) overrides it.
	GSO GSOMode
	// NoGRO turns UDP GRO off on the receive sockets.
	NoGRO bool
	// BusyPoll is how long a goroutine in CQ.Wait polls the device's socket before it sleeps, when it
	// reads the socket itself (its CQ's queue pairs share a shard): Linux's SO_BUSY_POLL, or an RDMA
	// program's ibv_poll_cq loop. A reply that comes within it costs no wake-up: a 16-byte ping-pong
	// between two processes on loopback took 16-17 us with 50 us of polling against 29 us without,
	// on a 2-CPU machine. The goroutine keeps a CPU busy meanwhile, so it suits request-reply loops,
	// not waits that last. 0, the default, sleeps at once.
	BusyPoll time.Duration
	// RecvBuffer is the socket receive buffer in bytes (SO_RCVBUF, or SO_RCVBUFFORCE when permitted).
	RecvBuffer int
	// MaxQPs bounds the queue pairs of the device; 65536 unless set.
	MaxQPs int
	// ICRC selects how received ICRCs are checked; see ICRCMode.
	ICRC ICRCMode
	// Tracer, if set, sees every packet the device sends and receives and every completion.
	Tracer Tracer
	// DCQCN, if set, turns on DCQCN congestion control for the device's RC and UC QPs with these
	// parameters: each QP's requester is paced by a congestion.DCQCN reaction point, its packets are
	// sent ECN-capable (ECT(0)), and a CE-marked packet it receives makes the device send a CNP to the
	// sending QP, at most one per flow per CNPInterval. Peers that know no CNPs (rxe drops them) are
	// unaffected.
	DCQCN *DCQCNParams
	// AckDelay is how long a responder's ACK may wait for company (the reply to the message it
	// acknowledges, or any other packet of its QP) before it leaves alone: 25 us unless set; negative
	// sends every ACK at once, as rxe does. Requesters retransmit after milliseconds, so the wait costs
	// them nothing, while a request-reply exchange saves a packet's worth of system calls and wake-ups
	// each way. A QP whose ACK waited in vain sends the next ones at once until it sends a request
	// again, so a stream's receiver does not hold each ACK back. See qp.Config.AckDelay.
	AckDelay time.Duration
	// NoTailProbe turns off the RC requester's tail-loss probe (see qp.Config.TailProbe): with it, a
	// lost last packet or a lost ACK costs about two round trips (at least 1 ms) instead of the local
	// ACK timeout; without it goroce waits for the timeout, as rxe does.
	NoTailProbe bool
	// CNPInterval is the notification point's minimum gap between CNPs to one flow: 50 us unless set.
	// DCQCN paper section 3.2.
	CNPInterval time.Duration

	// Network is where the device's packets travel: the host's UDP sockets unless set, or a
	// MemNetwork for hermetic tests.
	Network Network
}

// DCQCNParams are DCQCN's parameters (Config.DCQCN): see congestion.Params for each, with its source.
type DCQCNParams = congestion.Params

// DefaultDCQCN returns the DCQCN parameters of the paper and of ConnectX NICs for a line rate in bits
// per second.
func DefaultDCQCN(lineRate float64) DCQCNParams { return congestion.DefaultParams(lineRate) }

// GSOMode says whether a device sends runs of equal-sized packets (the middle packets of a message,
// READ responses) in one UDP GSO write instead of one system call per packet.
type GSOMode uint8

// GSO modes.
const (
	// GSOAuto uses GSO where the kernel has it, toward destinations whose egress device cuts the run
	// into packets in software. The RoCEv2 ICRC covers the IPv4 identification, which the kernel
	// numbers 0, 1, 2... along a run it segments itself; a NIC that segments in hardware numbers them
	// as it likes, and full-ICRC receivers (rxe, RoCE NICs) would drop the packets.
	GSOAuto GSOMode = iota
	// GSOOff sends one datagram per packet.
	GSOOff
	// GSOOn uses GSO wherever the kernel has it.
	GSOOn
)

// gsoFromEnv applies GOROCE_GSO: off, on or auto.
func gsoFromEnv(m GSOMode) GSOMode {
	switch strings.ToLower(os.Getenv("GOROCE_GSO")) {
	case "off", "0", "false":
		return GSOOff
	case "on", "1", "true":
		return GSOOn
	case "auto":
		return GSOAuto
	}
	return m
}

// ICRCMode says how a device verifies the ICRC of received packets. A UDP socket does not show the
// sender's IP header, and the ICRC covers its identification field, which rxe numbers per packet.
type ICRCMode uint8

// ICRC modes.
const (
	// ICRCRecoverID checks the ICRC against the IP header as the receiver knows it, first with the
	// identification goroce peers send (0 for a datagram, i for the i-th packet of a GSO run, with DF),
	// then reconstructing the sender's identification from the CRC, which is linear (wire.IDRecovery).
	// IPv6 has no identification: its check is always complete. For IPv4 the check keeps 16 of its 32
	// bits of strength against random corruption (measured: 2^-16.2 false accepts), detects every
	// single-bit error in any RoCE-sized packet, and requires DF, which rxe, ConnectX NICs and goroce
	// all set. The identification itself is covered by the IPv4 header checksum, which the kernel
	// verifies.
	ICRCRecoverID ICRCMode = iota
	// ICRCStrict accepts only packets whose ICRC matches with DF and identification 0, or i for the
	// i-th packet of a run the kernel delivered coalesced (GRO): goroce peers on the same host, and
	// senders that use IP_PMTUDISC_DO without GSO. rxe's packets fail it.
	ICRCStrict
	// ICRCOff skips the check. For debugging only.
	ICRCOff
)

// Device is one software RDMA NIC bound to an IP address and UDP port.
type Device struct {
	cfg   Config
	dp    *datapath.Datapath
	clock Clock
	mem   *mr.Table
	local netip.AddrPort
	gid   GID
	guid  uint64
	cm    *cmDevice

	closing atomic.Bool

	events        chan AsyncEvent
	eventsMu      sync.RWMutex // guards eventsClosed against a post racing with the close
	eventsClosed  bool
	eventsDropped atomic.Uint64

	mu      sync.Mutex // guards objects
	objects map[closer]struct{}
}

type closer interface{ close() }

// Open creates a device and starts its goroutines. It mirrors ibv_open_device.
func Open(cfg Config) (*Device, error) {
	if !cfg.Addr.IsValid() {
		return nil, fmt.Errorf("%w: no address", ErrBadConfig)
	}
	_, real := cfg.Clock.(RealClock)
	if cfg.Clock == nil {
		cfg.Clock, real = RealClock{}, true
	}
	switch {
	case cfg.AckDelay == 0:
		cfg.AckDelay = 25 * time.Microsecond
	case cfg.AckDelay < 0:
		cfg.AckDelay = 0
	}
	if cfg.DCQCN != nil {
		if err := cfg.DCQCN.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
		}
	}
	if cfg.RecvBuffer <= 0 {
		cfg.RecvBuffer = 8 << 20
	}
	cfg.GSO = gsoFromEnv(cfg.GSO)
	local := netip.AddrPortFrom(cfg.Addr, cfg.Port)
	d := &Device{cfg: cfg, clock: cfg.Clock, mem: mr.NewTable(), gid: GIDFromAddr(cfg.Addr),
		objects: map[closer]struct{}{}, events: make(chan AsyncEvent, eventQueueLen)}
	d.cm = newCMDevice(d)
	var network conn.Network
	if cfg.Network != nil {
		network = cfg.Network.network()
	}
	dcfg := datapath.Config{
		Network: network, Addr: local, OnEvent: d.onEvent, Shards: cfg.Shards, SourcePorts: cfg.SourcePorts,
		GSO: datapath.GSOMode(cfg.GSO), NoGRO: cfg.NoGRO, RecvBuffer: cfg.RecvBuffer, MaxQPs: cfg.MaxQPs,
		ICRC: datapath.ICRCMode(cfg.ICRC), RealClock: real,
		CNPInterval: cfg.CNPInterval, GSI: d.cm.handleMAD, BusyPoll: cfg.BusyPoll,
	}
	if !real {
		// On the real clock the datapath keeps its own, which reads the monotonic clock alone.
		dcfg.Clock = clockAdapter{cfg.Clock}
	}
	if cfg.Tracer != nil {
		dcfg.Tracer = tracerAdapter{cfg.Tracer}
	}
	dp, err := datapath.Open(dcfg)
	if err != nil {
		// The socket's own words, without the internal packages' prefixes: "address already in use"
		// matches syscall.EADDRINUSE.
		var errno syscall.Errno
		if errors.As(err, &errno) {
			err = errno
		}
		return nil, fmt.Errorf("goroce: opening %v: %w", local, err)
	}
	d.dp = dp
	d.local = dp.LocalAddr()
	d.guid = deriveGUID(d.local)
	d.cm.start()
	return d, nil
}

// clockAdapter gives the datapath the device's Clock.
type clockAdapter struct{ c Clock }

func (a clockAdapter) Now() time.Time                          { return a.c.Now() }
func (a clockAdapter) NewTimer(d time.Duration) datapath.Timer { return a.c.NewTimer(d) }

// tracerAdapter gives the datapath the device's Tracer.
type tracerAdapter struct{ t Tracer }

// traceEvents holds the events tracerAdapter hands a Tracer: an event passed through the Tracer
// interface escapes, and one allocated per packet cost a traced device an allocation a packet.
var traceEvents = sync.Pool{New: func() any { return new(TraceEvent) }}

func (a tracerAdapter) TracePacket(r *datapath.TraceRecord) {
	e := traceEvents.Get().(*TraceEvent)
	*e = TraceEvent{Dir: Received, At: r.At, From: r.From, To: r.To, TOS: r.TOS, IPID: r.IPID, Bytes: r.Bytes, Packet: r.Packet,
		Reason: string(r.Drop), Resent: r.Resend.String()}
	switch {
	case r.Sent:
		e.Dir = Sent
	case r.Drop != "":
		e.Dir = Dropped
	}
	a.t.Packet(e)
	*e = TraceEvent{} // keep no packet reachable from the pool
	traceEvents.Put(e)
}

// GID returns the device's GID: its address as an IPv6 or IPv4-mapped address. It mirrors
// ibv_query_gid with index 0.
func (d *Device) GID() GID { return d.gid }

// LocalAddr returns the UDP address the device receives on.
func (d *Device) LocalAddr() netip.AddrPort { return d.local }

// Memory returns the device's memory region table, for code that drives the engines directly.
func (d *Device) Memory() *mr.Table { return d.mem }

// Close stops the device and closes everything on it: every queue pair is flushed (outstanding work
// requests complete with WR_FLUSH_ERR), then its PDs, MRs, CQs and SRQs are closed (their Close
// returns nil from then on), the sockets are closed, Events is closed, and every goroutine has ended
// when it returns. Completions already in a CQ can still be polled.
func (d *Device) Close() error {
	if d.closing.Swap(true) {
		return nil
	}
	d.cm.close() // its last DREQs and REJs leave before the sockets close
	err := d.dp.Close()
	d.mu.Lock()
	objs := d.objects
	d.objects = map[closer]struct{}{}
	d.mu.Unlock()
	for o := range objs {
		o.close()
	}
	d.closeEvents()
	return err
}

func (d *Device) track(o closer) {
	d.mu.Lock()
	d.objects[o] = struct{}{}
	d.mu.Unlock()
}

func (d *Device) untrack(o closer) {
	d.mu.Lock()
	delete(d.objects, o)
	d.mu.Unlock()
}

// Stats are a device's counters: its own, and the sum of its queue pairs' (Counters).
type Stats struct {
	RxPackets, RxBytes, TxPackets, TxBytes uint64
	DropMalformed                          uint64 // failed wire.Parse: truncated, bad opcode, bad lengths
	DropICRC                               uint64 // ICRC mismatch
	DropUnknownQPN                         uint64 // no QP with the destination QPN
	DropWrongPeer                          uint64 // an RC/UC packet from another address than the QP's peer
	DropNotReady                           uint64 // an RC/UC packet for a QP not yet connected (before RTR): connect both ends first
	DropTruncated                          uint64 // datagram larger than a receive buffer
	DropNoRoute                            uint64 // a packet to a GID with no usable address
	CERcvd                                 uint64 // packets that arrived marked Congestion Experienced
	CNPSent                                uint64 `mlx5:"np_cnp_sent"` // congestion notification packets sent (DCQCN notification point)
	TxGSO                                  uint64 // GSO writes: runs of packets sent with one system call
	GSOFallback                            uint64 // GSO writes the kernel refused, sent again packet by packet
	RxGRO                                  uint64 // coalesced runs received (UDP GRO)
	DrivenWaits                            uint64 // CQ waits that drove their shard (no hand-off on the way to them)
	ParkedWaits                            uint64 // CQ waits that parked until another goroutine's completion woke them
	Yields                                 uint64 // times a busy receive loop gave the Go scheduler a turn (at most once a millisecond), so that the device's other loops' packets do not wait
	BusyPolls                              uint64 // reads that found packets while a waiter polled (Config.BusyPoll)
	BusyPollMisses                         uint64 // polls that found nothing within Config.BusyPoll, after which the waiter slept
	EventsDropped                          uint64 // asynchronous events lost because nobody read Events
	RxMADs, TxMADs                         uint64 // management datagrams received and sent on QP1 (the RDMA CM's)
	DropGSI                                uint64 // packets for QP1 that are not MADs: not a UD SEND_ONLY, or another Q_Key or partition
	QP                                     Counters
	CM                                     CMStats // the connection manager's (Dial, Listen)
}

// Each calls fn with the device's own counters, by name (mlx5's where it has one, as np_cnp_sent; else
// the field's name, as DropICRC), then with Stats.QP's (Counters.Each: rxe's and mlx5's names) and the
// CM's (CMStats.Each), each of those prefixed "cm_".
func (s *Stats) Each(fn func(name string, v uint64)) {
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Uint64 {
			continue
		}
		name := f.Tag.Get("mlx5")
		if name == "" {
			name = f.Name
		}
		fn(name, v.Field(i).Uint())
	}
	s.QP.Each(fn)
	s.CM.Each(func(name string, v uint64) { fn("cm_"+name, v) })
}

// Stats returns a snapshot of the device's counters.
func (d *Device) Stats() Stats {
	s := d.dp.Stats()
	out := Stats{
		RxPackets: s.RxPackets, RxBytes: s.RxBytes, TxPackets: s.TxPackets, TxBytes: s.TxBytes,
		DropMalformed: s.DropMalformed, DropICRC: s.DropICRC, DropUnknownQPN: s.DropUnknownQPN,
		DropWrongPeer: s.DropWrongPeer, DropTruncated: s.DropTruncated, DropNoRoute: s.DropNoRoute,
		CERcvd: s.CERcvd, CNPSent: s.CNPSent, TxGSO: s.TxGSO, GSOFallback: s.GSOFallback, RxGRO: s.RxGRO,
		DrivenWaits: s.DrivenWaits, ParkedWaits: s.ParkedWaits, Yields: s.Yields, DropNotReady: s.DropNotReady,
		BusyPolls: s.BusyPolls, BusyPollMisses: s.BusyPollMisses,
		EventsDropped: d.eventsDropped.Load(), RxMADs: s.RxMADs, TxMADs: s.TxMADs, DropGSI: s.DropGSI,
		CM: d.cm.stats(),
	}
	d.dp.QPs(func(q *datapath.QP) {
		c := Counters(q.Counters())
		out.QP.Add(&c)
	})
	return out
}

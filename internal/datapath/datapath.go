// Package datapath is the machinery behind a goroce device: the sockets, the goroutines that run the
// queue pair engines (package qp) on the packets and timers that concern them, batching with UDP GSO
// and GRO, and the ICRC sealed on every packet sent and checked on every packet received. Package
// goroce puts the verbs API on top; this package knows nothing of protection domains or memory
// regions beyond what the engines take.
//
// # Layout
//
// A Datapath receives on Shards sockets bound together to its address (port 4791): the kernel steers
// each datagram to the socket at index (destination QPN mod Shards), and a QP's number is chosen so
// that it lands on the shard it was placed on. A shard is the socket, the QPs placed on it and their
// timers, and at any moment one goroutine that drives it: reads the socket, runs the engines of the
// QPs the packets address, sends what they answer, and fires the timers that come due, one step at a
// time (shard.step). That goroutine is normally the shard's own, but a goroutine waiting in CQ.Wait
// for a CQ whose QPs all live on one shard takes the shard over and drives it itself until its
// completion arrives: it is then the goroutine the kernel wakes when the reply comes in, and the
// round trip costs the two wake-ups a UDP ping-pong costs, not four. See shard.go.
//
// A QP sends from one of up to SourcePorts sockets bound to ephemeral ports, picked by its QPN, so that
// its packets form one UDP flow (ECMP and receive steering keep it together) and different QPs spread.
// They only send (peers answer to port 4791) and stay out of the netpoller (conn.Options.SendOnly),
// which Linux would otherwise wake each time it frees a datagram they sent.
// Every packet of a QP is built and sent under its port's lock, so a QP's packets leave in the order
// its engine built them. Runs of equal-sized packets to one destination leave in one GSO write, each
// segment sealed with the IPv4 identification the kernel will give it. See tx.go.
//
// # Ownership
//
// A QP's engine is guarded by its mutex: whoever has work for it (an API call, a shard's driver, a
// timer) takes it, so the engine never runs on two goroutines at once, and with steering the packets
// of a QP are always handled by the driver of its own shard. Lock order: a port's mu, then a QP's mu,
// then a shard's mu, then a CQ's.
package datapath

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/internal/monotime"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// Errors of the datapath.
var (
	ErrClosed     = errors.New("goroce: closed")
	ErrTooManyQPs = errors.New("goroce: too many queue pairs")
	ErrBadConfig  = errors.New("goroce: invalid configuration")
)

// ICRCMode says how received ICRCs are verified; the values are goroce.ICRCMode's.
type ICRCMode uint8

// ICRC modes: see goroce.ICRCMode.
const (
	ICRCRecoverID ICRCMode = iota
	ICRCStrict
	ICRCOff
)

// GSOMode says whether runs of packets leave in GSO writes.
type GSOMode uint8

// GSO modes.
const (
	// GSOAuto uses GSO where the kernel has it, toward destinations whose egress device segments in
	// software (so that the identification of every segment is known).
	GSOAuto GSOMode = iota
	// GSOOff sends one datagram per packet.
	GSOOff
	// GSOOn uses GSO wherever the kernel has it, whatever the egress device.
	GSOOn
)

// Clock is where the datapath reads the time it gives the engines. With RealClock the shards wait for
// their timers in the socket's read deadline; any other clock's timers are armed as its own.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// Tracer sees every packet sent, received or dropped on arrival. It runs on the datapath's goroutines,
// must not block and must not keep the record or the bytes it points to.
type Tracer interface {
	TracePacket(r *TraceRecord)
}

// TraceRecord is one packet as it was on the wire: enough to rebuild its IP and UDP headers.
type TraceRecord struct {
	Sent     bool // sent by the datapath; else received
	At       time.Time
	From, To netip.AddrPort
	TOS      uint8
	// IPID is an IPv4 packet's identification: the one a sent packet's ICRC was sealed with (i for
	// the i-th segment of a GSO write), or the one a received packet's ICRC verified with.
	IPID uint16
	// Bytes is the datagram's payload, BTH through ICRC; Packet is it parsed, the zero Packet for one
	// dropped as malformed.
	Bytes  []byte
	Packet wire.Packet
	// Drop, for a received packet the datapath dropped, says why; "" for one it took.
	Drop Drop
	// Resend, for a sent RC request packet that goes again, says what set the resend off (qp.Tx).
	Resend qp.Resend
}

// Drop is why the datapath dropped a received packet (it counts each in Stats).
type Drop string

// Drop reasons.
const (
	DropMalformed  Drop = "malformed"   // wire.Parse refused it
	DropICRC       Drop = "bad ICRC"    // its ICRC did not verify
	DropUnknownQPN Drop = "unknown QPN" // no QP has its destination QPN
	DropWrongPeer  Drop = "wrong peer"  // an RC/UC QP's packet from another address than its peer's
	DropNotReady   Drop = "not ready"   // an RC/UC QP not yet connected (before RTR)
	DropTruncated  Drop = "truncated"   // larger than the receive buffer
)

// Config configures a Datapath. Zero fields take the defaults named.
type Config struct {
	// Network opens the sockets: conn.UDP unless set.
	Network conn.Network
	// Addr is the address the shards receive on (port 4791 normally) and the QPs send from.
	Addr netip.AddrPort
	// Shards is the number of receive sockets and drivers: GOMAXPROCS, at most 4, unless set.
	Shards int
	// SourcePorts bounds the send sockets, each a UDP source port: 16 unless set.
	SourcePorts int
	// GSO chooses whether runs of packets leave in GSO writes.
	GSO GSOMode
	// GRO turns UDP GRO off on the receive sockets when false... see NoGRO.
	NoGRO bool
	// RecvBuffer is each receive socket's SO_RCVBUF.
	RecvBuffer int
	// MaxQPs bounds the QPs.
	MaxQPs int
	// ICRC selects how received ICRCs are checked.
	ICRC ICRCMode
	// Clock is the time source; RealClock-like (Real true) unless set.
	Clock Clock
	// RealClock tells that Clock reads the system's monotonic clock, so that socket deadlines can
	// stand for its timers.
	RealClock bool
	// Tracer, if set, sees every packet.
	Tracer Tracer
	// OnEvent, if set, is told of the QPs' asynchronous events, on the goroutine that runs the
	// engine; it must not block.
	OnEvent func(Event)
	// CNPInterval is the notification point's minimum gap between CNPs to one flow, for QPs created
	// with DCQCN.
	CNPInterval time.Duration
	// GSI, if set, makes the datapath QP1, the general services interface: every packet for QPN 1
	// that is a MAD (a UD SEND_ONLY with the GSI Q_Key) is handed to GSI with its sender's address and
	// the 256-byte payload, on the goroutine that read it; others are dropped (DropGSI). GSI must not
	// block and must not keep mad. SendMAD sends QP1's MADs. Without it, packets for QPN 1 are dropped
	// as any packet for a QPN nobody has.
	GSI func(from netip.AddrPort, mad []byte, now time.Time)
	// Linger is how long a goroutine that drove a shard from CQ.Wait keeps it after its completion
	// came, so that its next Wait drives again without a hand-over: 1 ms unless set; negative
	// disables driving from Wait. Packets for the shard that come meanwhile wait for the next Wait,
	// or for the shard's own goroutine, which takes over once the linger has ended: at most
	// maxLingerSlack (16 ms) later when waiters kept renewing it.
	Linger time.Duration
	// BusyPoll is how long a goroutine that drives its shard from CQ.Wait reads the socket without
	// sleeping, before it sleeps in the netpoller: Linux's SO_BUSY_POLL for the shard's socket, and
	// what ibv_poll_cq in a loop is to a NIC. A reply that comes meanwhile costs no wake-up (between
	// two processes on loopback, 12 or 13 us of a 29 us round trip), and the goroutine keeps a CPU
	// busy while it polls. 0 sleeps at once. Only with the real clock.
	BusyPoll time.Duration
}

// Datapath is the runtime of one device. See the package documentation.
type Datapath struct {
	cfg    Config
	net    conn.Network
	local  netip.AddrPort
	clock  Clock
	shards []*shard
	ports  []*port // len SourcePorts; each opened on first use, under mu
	gso    gsoPolicy

	qps     sync.Map // wire.QPN -> *QP
	nqps    atomic.Int64
	woke    atomic.Bool  // a completion woke a goroutine parked on a CQ; background drivers yield to it
	parked  atomic.Int32 // goroutines parked in CQ.Wait
	closing atomic.Bool
	done    chan struct{}
	wg      sync.WaitGroup

	mu        sync.Mutex // guards rng, nextShard, joinFailed, each shard's joined and opening ports
	rng       *rand.Rand
	nextShard int
	// joinFailed: a shard's socket could not join the group; QPs placed on a shard not joined go
	// to shard 0 instead.
	joinFailed bool

	stats counters

	gsiPSN wire.PSN // the PSN of QP1's next packet; guarded by the mu of QP1's port
}

// Open binds the receive sockets and starts the shards.
func Open(cfg Config) (*Datapath, error) {
	if cfg.Network == nil {
		cfg.Network = conn.UDP
	}
	if cfg.Shards <= 0 {
		cfg.Shards = min(runtime.GOMAXPROCS(0), 4)
	}
	if cfg.SourcePorts <= 0 {
		cfg.SourcePorts = 16
	}
	if cfg.MaxQPs <= 0 {
		cfg.MaxQPs = 1 << 16
	}
	if cfg.CNPInterval <= 0 {
		cfg.CNPInterval = congestion.DefaultCNPInterval
	}
	if cfg.Linger == 0 {
		cfg.Linger = time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock, cfg.RealClock = realClock{}, true
	}
	// A shard's socket joins the group on the shard's first QP (Datapath.join): a device with one QP
	// runs without SO_REUSEPORT and the steering program, which together cost every datagram
	// received 0.2 to 0.3 us (conn.Options.JoinLazily).
	opts := conn.Options{RecvBuffer: cfg.RecvBuffer, GRO: !cfg.NoGRO, JoinLazily: true}
	if !cfg.NoGRO {
		opts.BatchSize = groBatch
	}
	conns, err := cfg.Network.ListenShards(cfg.Addr, cfg.Shards, opts)
	if errors.Is(err, errors.ErrUnsupported) && cfg.Shards > 1 {
		cfg.Shards = 1
		conns, err = cfg.Network.ListenShards(cfg.Addr, 1, opts)
	}
	if err != nil {
		return nil, err
	}
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	d := &Datapath{
		cfg:   cfg,
		net:   cfg.Network,
		local: conns[0].LocalAddr(),
		clock: cfg.Clock,
		ports: make([]*port, cfg.SourcePorts),
		done:  make(chan struct{}),
		rng:   rand.New(rand.NewChaCha8(seed)),
	}
	d.gso.init(cfg.GSO, cfg.Network)
	if st, ok := conn.StatsOf(conns[0]); ok && st.SteerFailed != 0 {
		d.stats.steerFailed.Store(1)
	}
	for i, c := range conns {
		s := newShard(d, i, c)
		j, ok := c.(conn.Joiner)
		s.joined = !ok || j.Joined()
		d.shards = append(d.shards, s)
	}
	for _, s := range d.shards {
		d.wg.Add(1)
		go s.background()
	}
	return d, nil
}

// LocalAddr returns the address the datapath receives on.
func (d *Datapath) LocalAddr() netip.AddrPort { return d.local }

// Now returns the datapath's time.
func (d *Datapath) Now() time.Time { return d.clock.Now() }

// Closing reports whether Close has begun.
func (d *Datapath) Closing() bool { return d.closing.Load() }

// Close shuts every QP down (their pending ACKs leave first), closes the sockets and waits for the
// shards' goroutines.
func (d *Datapath) Close() error {
	if d.closing.Swap(true) {
		return nil
	}
	d.qps.Range(func(_, v any) bool {
		v.(*QP).Close()
		return true
	})
	close(d.done)
	var err error
	for _, s := range d.shards {
		if e := s.conn.Close(); e != nil && err == nil {
			err = e
		}
		s.wakeBackground()
	}
	d.mu.Lock()
	for _, p := range d.ports {
		if p != nil {
			p.close()
		}
	}
	d.mu.Unlock()
	d.wg.Wait()
	return err
}

// placeQP picks the shard of a new QP, round robin, and an unused, unpredictable QPN that steers to
// it, never 0 or 1 (the special QPs). IBTA Vol 1 chapter 13.
func (d *Datapath) placeQP() (*shard, wire.QPN, error) {
	if d.nqps.Load() >= int64(d.cfg.MaxQPs) {
		return nil, 0, ErrTooManyQPs
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.shards[d.nextShard]
	d.nextShard = (d.nextShard + 1) % len(d.shards)
	if !s.joined && (d.joinFailed || !d.join(s)) {
		s = d.shards[0]
	}
	k := uint32(len(d.shards))
	for {
		n := d.rng.Uint32() & wire.PSNMask
		n = n - n%k + uint32(s.idx)
		if n > wire.PSNMask || n <= uint32(wire.QPNGSI) {
			continue
		}
		if _, used := d.qps.Load(wire.QPN(n)); !used {
			return s, wire.QPN(n), nil
		}
	}
}

// join makes s's socket take the datagrams steered to it (conn.Joiner), on its first QP. Shards join
// in index order, as round-robin placement reaches them. A failure is counted, and no shard joins
// after it: the group's steering program picks sockets by their place in the group. The caller
// holds d.mu.
func (d *Datapath) join(s *shard) bool {
	if j, ok := s.conn.(conn.Joiner); ok {
		if err := j.Join(); err != nil {
			d.joinFailed = true
			d.stats.joinFailed.Add(1)
			return false
		}
	}
	s.joined = true
	if st, ok := conn.StatsOf(d.shards[0].conn); ok && st.SteerFailed != 0 {
		d.stats.steerFailed.Store(1)
	}
	return true
}

// RandomPSN returns a random 24-bit starting PSN, as ibv_rc_pingpong picks with lrand48.
func (d *Datapath) RandomPSN() wire.PSN {
	d.mu.Lock()
	defer d.mu.Unlock()
	return wire.PSN(d.rng.Uint32() & wire.PSNMask)
}

// portFor returns the send socket of the QP numbered qpn, opening it on first use. The QPN is hashed
// (Fibonacci hashing) so that consecutive QPNs spread over the ports.
func (d *Datapath) portFor(qpn wire.QPN) (*port, error) {
	i := int((uint32(qpn) * 0x9e3779b1) >> 8 % uint32(len(d.ports)))
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.ports[i]; p != nil {
		return p, nil
	}
	if d.closing.Load() {
		return nil, ErrClosed
	}
	c, err := d.net.Listen(netip.AddrPortFrom(d.local.Addr(), 0), conn.Options{GSO: d.gso.mode != GSOOff, RecvBuffer: -1, SendOnly: true})
	if err != nil {
		return nil, fmt.Errorf("opening a send socket: %w", err)
	}
	p := &port{d: d, conn: c, num: c.LocalAddr().Port()}
	d.ports[i] = p
	return p, nil
}

// Event is an asynchronous event of a QP: see qp.Event. CQ is set for a CQ error.
type Event struct {
	Kind qp.Event
	QP   *QP
	CQ   *CQ
}

// realClock is the system's clock, read from the monotonic clock alone (see monotime).
type realClock struct{}

func (realClock) Now() time.Time                 { return monotime.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop()                 { r.t.Stop() }

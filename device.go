// Package goroce is a software RDMA NIC: a Device speaks RoCEv2 over an ordinary UDP socket and runs
// queue pairs for Go programs through a verbs-style API. A libibverbs user finds the same objects
// (protection domains, memory regions, completion queues, queue pairs, work requests) with Go names;
// the README maps each ibv_* call to its goroce counterpart.
//
// A minimal RC connection:
//
//	dev, _ := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("127.0.0.1")})
//	pd, _ := dev.AllocPD()
//	cq, _ := dev.CreateCQ(64)
//	qp, _ := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
//	// exchange qp.Info() with the peer out of band, then:
//	qp.Connect(peerInfo, goroce.ConnectOptions{})
//
// Concurrency: every method is safe for concurrent use. Inside, each QP is owned by one shard
// goroutine that runs its engine; API calls take the QP's lock only to hand work to the engine.
package goroce

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// Errors of the device API. They match with errors.Is.
var (
	ErrClosed     = errors.New("goroce: closed")
	ErrBusy       = errors.New("goroce: resource still in use")
	ErrBadConfig  = errors.New("goroce: invalid configuration")
	ErrForeign    = errors.New("goroce: object belongs to another device or protection domain")
	ErrTooManyQPs = errors.New("goroce: too many queue pairs")
)

// DefaultPort is the RoCEv2 UDP port. IBTA Annex A17.
const DefaultPort = wire.UDPPort

// Config configures a Device.
type Config struct {
	// Addr is the local IP address the device binds to and derives its GID from. Required.
	Addr netip.Addr
	// Port is the UDP port the device binds to and sends to on its peers: 4791 unless set.
	Port uint16
	// Clock is where the device reads the time; RealClock unless set.
	Clock Clock
	// Shards is the number of goroutines that own and run queue pairs; 1 unless set.
	Shards int
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
	DCQCN *congestion.Params
	// AckDelay is how long a responder's ACK may wait for company (the reply to the message it
	// acknowledges, or any other packet of its QP) before it leaves alone: 25 us unless set; negative
	// sends every ACK at once, as rxe does. Requesters retransmit after milliseconds, so the wait costs
	// them nothing, while a request-reply exchange saves a packet's worth of system calls and wake-ups
	// each way. See qp.Config.AckDelay.
	AckDelay time.Duration
	// CNPInterval is the notification point's minimum gap between CNPs to one flow: 50 us unless set.
	// DCQCN paper section 3.2.
	CNPInterval time.Duration

	// Conn replaces the UDP socket. Its type is internal: it is for goroce's own tests and tools
	// (an in-memory network, a lossy wrapper); programs leave it nil.
	Conn conn.Conn
}

// ICRCMode says how a device verifies the ICRC of received packets. A UDP socket does not show the
// sender's IP header, and the ICRC covers its identification field, which rxe numbers per packet.
type ICRCMode uint8

// ICRC modes.
const (
	// ICRCRecoverID checks the ICRC against the IP header as the receiver knows it, first with the
	// identification goroce peers send (0, with DF), then reconstructing the sender's identification
	// from the CRC, which is linear (wire.IDRecovery). IPv6 has no identification: its check is always
	// complete. For IPv4 the check keeps 16 of its 32 bits of strength against random corruption
	// (measured: 2^-16.2 false accepts), detects every single-bit error in any RoCE-sized packet, and
	// requires DF, which rxe, ConnectX NICs and goroce all set. The identification itself is covered by
	// the IPv4 header checksum, which the kernel verifies.
	ICRCRecoverID ICRCMode = iota
	// ICRCStrict accepts only packets whose ICRC matches identification 0 with DF: goroce peers and
	// other senders that use IP_PMTUDISC_DO. rxe's packets fail it.
	ICRCStrict
	// ICRCOff skips the check. For debugging only.
	ICRCOff
)

// Device is one software RDMA NIC bound to an IP address and UDP port.
type Device struct {
	cfg    Config
	conn   conn.Conn
	clock  Clock
	mem    *mr.Table
	local  netip.AddrPort
	gid    GID
	shards []*shard

	qps     sync.Map // wire.QPN -> *QP
	nqps    atomic.Int64
	woke    atomic.Bool // a CQ woke a waiting goroutine; the receive loop yields to it
	txMu    sync.Mutex  // held from building packets to sending them: packets leave in PSN order
	closing atomic.Bool
	done    chan struct{}
	wg      sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	rng     *rand.Rand
	objects map[closer]struct{}

	stats deviceStats
}

type closer interface{ close() }

// Open creates a device and starts its goroutines. It mirrors ibv_open_device.
func Open(cfg Config) (*Device, error) {
	if !cfg.Addr.IsValid() {
		return nil, fmt.Errorf("%w: no address", ErrBadConfig)
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	if cfg.MaxQPs <= 0 {
		cfg.MaxQPs = 1 << 16
	}
	switch {
	case cfg.AckDelay == 0:
		cfg.AckDelay = 25 * time.Microsecond
	case cfg.AckDelay < 0:
		cfg.AckDelay = 0
	}
	if cfg.CNPInterval <= 0 {
		cfg.CNPInterval = congestion.DefaultCNPInterval
	}
	if cfg.DCQCN != nil {
		if err := cfg.DCQCN.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
		}
	}
	if cfg.RecvBuffer <= 0 {
		cfg.RecvBuffer = 8 << 20
	}
	c := cfg.Conn
	if c == nil {
		var err error
		c, err = conn.Listen(netip.AddrPortFrom(cfg.Addr, cfg.Port), conn.Options{RecvBuffer: cfg.RecvBuffer})
		if err != nil {
			return nil, err
		}
	}
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	d := &Device{
		cfg:     cfg,
		conn:    c,
		clock:   cfg.Clock,
		mem:     mr.NewTable(),
		local:   netip.AddrPortFrom(cfg.Addr, cfg.Port),
		gid:     GIDFromAddr(cfg.Addr),
		done:    make(chan struct{}),
		rng:     rand.New(rand.NewChaCha8(seed)),
		objects: map[closer]struct{}{},
	}
	for i := 0; i < cfg.Shards; i++ {
		s := newShard(d)
		d.shards = append(d.shards, s)
		d.wg.Add(1)
		go s.run()
	}
	d.wg.Add(1)
	go d.rxLoop()
	return d, nil
}

// GID returns the device's GID: its address as an IPv6 or IPv4-mapped address. It mirrors
// ibv_query_gid with index 0.
func (d *Device) GID() GID { return d.gid }

// LocalAddr returns the UDP address the device is bound to.
func (d *Device) LocalAddr() netip.AddrPort { return d.local }

// Memory returns the device's memory region table, for code that drives the engines directly.
func (d *Device) Memory() *mr.Table { return d.mem }

// Close stops the device: every queue pair is flushed (outstanding work requests complete with
// WR_FLUSH_ERR), the socket is closed and every goroutine has ended when it returns.
func (d *Device) Close() error {
	if d.closing.Swap(true) {
		return nil
	}
	d.qps.Range(func(_, v any) bool {
		v.(*QP).shutdown()
		return true
	})
	close(d.done)
	err := d.conn.Close()
	d.wg.Wait()
	d.mu.Lock()
	objs := d.objects
	d.objects = map[closer]struct{}{}
	d.mu.Unlock()
	for o := range objs {
		o.close()
	}
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

// allocQPN returns an unused, unpredictable QPN, never 0 or 1 (the special QPs). IBTA Vol 1 chapter 13.
func (d *Device) allocQPN() (wire.QPN, error) {
	if d.nqps.Load() >= int64(d.cfg.MaxQPs) {
		return 0, ErrTooManyQPs
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		n := wire.QPN(d.rng.Uint32() & wire.PSNMask)
		if n <= wire.QPNGSI {
			continue
		}
		if _, used := d.qps.Load(n); !used {
			return n, nil
		}
	}
}

// randomPSN returns a random 24-bit starting PSN, as ibv_rc_pingpong picks with lrand48.
func (d *Device) randomPSN() wire.PSN {
	d.mu.Lock()
	defer d.mu.Unlock()
	return wire.PSN(d.rng.Uint32() & wire.PSNMask)
}

// deviceStats are the device's counters outside any QP.
type deviceStats struct {
	rxPackets, rxBytes, txPackets, txBytes                        atomic.Uint64
	dropMalformed, dropICRC, dropUnknownQPN, dropWrongPeer        atomic.Uint64
	dropInboxFull, dropTruncated, dropClosed, dropNoRoute, rxBusy atomic.Uint64
	cnpSent, ceRcvd                                               atomic.Uint64
}

// Stats are a device's counters: its own, and the sum of its queue pairs' (see qp.Counters for those).
type Stats struct {
	RxPackets, RxBytes, TxPackets, TxBytes uint64
	DropMalformed                          uint64 // failed wire.Parse: truncated, bad opcode, bad lengths
	DropICRC                               uint64 // ICRC mismatch
	DropUnknownQPN                         uint64 // no QP with the destination QPN
	DropWrongPeer                          uint64 // an RC/UC packet from another address than the QP's peer
	DropInboxFull                          uint64 // the owning shard's inbox was full
	DropTruncated                          uint64 // datagram larger than a receive buffer
	DropNoRoute                            uint64 // a packet to a GID with no usable address
	CERcvd                                 uint64 // packets that arrived marked Congestion Experienced
	CNPSent                                uint64 // congestion notification packets sent (DCQCN notification point)
	QP                                     qp.Counters
}

// Stats returns a snapshot of the device's counters.
func (d *Device) Stats() Stats {
	s := &d.stats
	out := Stats{
		RxPackets: s.rxPackets.Load(), RxBytes: s.rxBytes.Load(), TxPackets: s.txPackets.Load(), TxBytes: s.txBytes.Load(),
		DropMalformed: s.dropMalformed.Load(), DropICRC: s.dropICRC.Load(), DropUnknownQPN: s.dropUnknownQPN.Load(),
		DropWrongPeer: s.dropWrongPeer.Load(), DropInboxFull: s.dropInboxFull.Load(), DropTruncated: s.dropTruncated.Load(),
		DropNoRoute: s.dropNoRoute.Load(), CERcvd: s.ceRcvd.Load(), CNPSent: s.cnpSent.Load(),
	}
	d.qps.Range(func(_, v any) bool {
		c := v.(*QP).Counters()
		out.QP.Add(&c)
		return true
	})
	return out
}

// rxBufSize holds the largest RoCEv2 datagram: headers, a 4096-byte payload, pad and ICRC.
const rxBufSize = 4096 + 256

// ipv4Template writes the IPv4 header a RoCEv2 packet of n transport bytes travels in, with
// identification 0 and DF as goroce sends it; TOS, TTL and checksum are masked by the ICRC.
func ipv4Template(h *[20]byte, src, dst netip.Addr, n int) {
	*h = [20]byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17}
	binary.BigEndian.PutUint16(h[2:], uint16(20+wire.UDPHeaderLen+n))
	s, t := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], t[:])
}

// ipv6Template writes the IPv6 header of a RoCEv2 packet of n transport bytes.
func ipv6Template(h *[40]byte, src, dst netip.Addr, n int) {
	*h = [40]byte{0x60}
	binary.BigEndian.PutUint16(h[4:], uint16(wire.UDPHeaderLen+n))
	h[6], h[7] = 17, 64
	s, t := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], t[:])
}

func udpTemplate(h *[8]byte, sport, dport uint16, n int) {
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(wire.UDPHeaderLen+n))
	h[6], h[7] = 0, 0
}

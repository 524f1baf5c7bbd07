package goroce

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/goroce/goroce/internal/conn"
)

// Network is where a device's packets travel (Config.Network): the host's UDP sockets when nil, a
// *MemNetwork, or the host's sockets with impairments (*ImpairedHost).
type Network interface {
	network() conn.Network
}

// rawNetwork lets goroce's own tests hand a device any internal network.
type rawNetwork struct{ n conn.Network }

func (r rawNetwork) network() conn.Network { return r.n }

// Impairment says what a network does to the datagrams written after it is set. Probabilities are
// between 0 and 1; each datagram draws them independently, in write order, from a generator seeded
// with Seed, so a test that writes from one goroutine replays exactly.
type Impairment struct {
	// Loss drops a datagram.
	Loss float64
	// Delay holds every datagram back this long. Each waits on a timer of its own, so datagrams
	// written microseconds apart may swap places, as on a path with several queues. Jitter adds a
	// random extra of up to Jitter to each, which reorders more. MemNetwork only.
	Delay, Jitter time.Duration
	// Reorder holds a datagram back by ReorderBy (200 us unless set), so that the ones written after
	// it overtake it. MemNetwork only.
	Reorder   float64
	ReorderBy time.Duration
	// Duplicate delivers a datagram twice.
	Duplicate float64
	// CE marks an ECN-capable datagram (ECT(0) or ECT(1)) Congestion Experienced, as a congested
	// switch queue would. Devices with Config.DCQCN send ECN-capable packets.
	CE float64
	// Seed seeds the random choices.
	Seed uint64
	// From, if valid, limits the impairment to datagrams sent from that address: one direction of a
	// conversation.
	From netip.Addr
	// Dropped, if set, is told of every datagram Loss drops, on the writing goroutine; b is valid
	// only during the call. For traces that show the loss.
	Dropped func(b []byte, from, to netip.AddrPort)
}

// ImpairStats count what an impaired network did.
type ImpairStats struct {
	Dropped, Delayed, Reordered, Duplicated, Marked uint64
}

// ecn bits of the TOS byte. RFC 3168.
const (
	ecnMask = 0x03
	ecnCE   = 0x03
)

// impairer applies an Impairment, one datagram at a time.
type impairer struct {
	mu    sync.Mutex // guards everything below
	imp   Impairment
	on    bool
	rng   *rand.Rand
	stats ImpairStats
}

func (p *impairer) set(imp Impairment, host bool) error {
	for _, v := range []float64{imp.Loss, imp.Reorder, imp.Duplicate, imp.CE} {
		if v < 0 || v > 1 || v != v {
			return fmt.Errorf("%w: impairment probability %v", ErrBadConfig, v)
		}
	}
	if imp.Delay < 0 || imp.Jitter < 0 || imp.ReorderBy < 0 {
		return fmt.Errorf("%w: negative impairment delay", ErrBadConfig)
	}
	if host && (imp.Delay > 0 || imp.Jitter > 0 || imp.Reorder > 0) {
		return fmt.Errorf("%w: delay and reordering are for a MemNetwork", ErrBadConfig)
	}
	if imp.ReorderBy == 0 {
		imp.ReorderBy = 200 * time.Microsecond
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.imp = imp
	p.on = imp.Loss > 0 || imp.Delay > 0 || imp.Jitter > 0 || imp.Reorder > 0 || imp.Duplicate > 0 || imp.CE > 0
	p.rng = rand.New(rand.NewPCG(imp.Seed, imp.Seed^0x9e3779b97f4a7c15))
	return nil
}

func (p *impairer) snapshot() ImpairStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// decide draws the fate of datagram m from `from`, marking its TOS if it is to be marked.
func (p *impairer) decide(m *conn.Message, from netip.AddrPort) conn.Verdict {
	p.mu.Lock()
	imp, r := &p.imp, p.rng
	if !p.on || (imp.From.IsValid() && from.Addr().Unmap() != imp.From.Unmap()) {
		p.mu.Unlock()
		return conn.Verdict{}
	}
	if imp.Loss > 0 && r.Float64() < imp.Loss {
		p.stats.Dropped++
		dropped := imp.Dropped
		p.mu.Unlock()
		if dropped != nil {
			dropped(m.Buf, from, m.Addr)
		}
		return conn.Verdict{Drop: true}
	}
	defer p.mu.Unlock()
	var v conn.Verdict
	if imp.CE > 0 && m.TOS&ecnMask != 0 && r.Float64() < imp.CE {
		m.TOS |= ecnCE
		p.stats.Marked++
	}
	if imp.Duplicate > 0 && r.Float64() < imp.Duplicate {
		v.Duplicates = 1
		p.stats.Duplicated++
	}
	v.Delay = imp.Delay
	if imp.Jitter > 0 {
		v.Delay += time.Duration(r.Int64N(int64(imp.Jitter)))
	}
	if imp.Reorder > 0 && r.Float64() < imp.Reorder {
		v.Delay += imp.ReorderBy
		p.stats.Reordered++
	}
	if v.Delay > 0 {
		p.stats.Delayed++
	}
	return v
}

// MemNetwork is an in-memory network for hermetic tests: devices opened on it (Config.Network) talk
// to each other with no sockets, at any address, on any operating system. Each datagram is copied
// into its receiver's queue of 4096; a full queue drops it, as a socket's buffer would. Impair makes
// the network lose, delay, reorder, duplicate and congestion-mark datagrams, for tests of what the
// transport does then.
//
// A device on a MemNetwork behaves as on loopback: UDP GSO writes arrive whole where GRO is on
// (datagram by datagram while an impairment is set), and the path MTU is 4096.
type MemNetwork struct {
	n   *conn.MemNetwork
	imp impairer
}

// NewMemNetwork returns an empty in-memory network without impairments.
func NewMemNetwork() *MemNetwork {
	m := &MemNetwork{n: conn.NewMemNetwork()}
	_ = m.imp.set(Impairment{}, false)
	return m
}

func (m *MemNetwork) network() conn.Network { return m.n }

// Impair sets what the network does to datagrams written from now on; the zero Impairment delivers
// every datagram at once.
func (m *MemNetwork) Impair(imp Impairment) error {
	if err := m.imp.set(imp, false); err != nil {
		return err
	}
	if m.imp.on {
		m.n.SetFilter(m.imp.decide)
	} else {
		m.n.SetFilter(nil)
	}
	return nil
}

// Stats returns what the impairments did so far.
func (m *MemNetwork) Stats() ImpairStats { return m.imp.snapshot() }

// Wait waits until every datagram held back by Delay, Jitter or Reorder has been delivered or
// dropped, for a test that checks counters after the traffic.
func (m *MemNetwork) Wait() { m.n.Wait() }

// ImpairedHost is the host's UDP sockets with impairments on what the devices opened on it send:
// loss, duplication and CE marks (not delay). goroce's demo shows retransmission with it. Its GSO is
// off, so that every packet leaves on its own and may be the one lost.
type ImpairedHost struct {
	imp impairer
}

// NewImpairedHost returns the host's network with imp applied to every packet sent.
func NewImpairedHost(imp Impairment) (*ImpairedHost, error) {
	h := &ImpairedHost{}
	if err := h.imp.set(imp, true); err != nil {
		return nil, err
	}
	return h, nil
}

// Stats returns what the impairments did so far.
func (h *ImpairedHost) Stats() ImpairStats { return h.imp.snapshot() }

func (h *ImpairedHost) network() conn.Network {
	return conn.WrapNetwork(conn.UDP, func(c conn.Conn) conn.Conn { return &impairedConn{Conn: c, imp: &h.imp} })
}

// impairedConn applies an impairer to what it writes.
type impairedConn struct {
	conn.Conn
	imp  *impairer
	keep []conn.Message
}

// Offload reports no GSO, so that every packet is drawn for on its own.
func (c *impairedConn) Offload() conn.Offload { return conn.Offload{GRO: c.Conn.Offload().GRO} }

func (c *impairedConn) WriteBatch(msgs []conn.Message) (int, error) {
	c.keep = c.keep[:0]
	from := c.LocalAddr()
	for _, m := range msgs {
		v := c.imp.decide(&m, from)
		if v.Drop {
			continue
		}
		for range 1 + v.Duplicates {
			c.keep = append(c.keep, m)
		}
	}
	if len(c.keep) > 0 {
		if _, err := c.Conn.WriteBatch(c.keep); err != nil {
			return 0, err
		}
	}
	return len(msgs), nil
}

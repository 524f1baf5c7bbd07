package conn

import (
	"math/rand/v2"
	"net/netip"
	"sync"
)

// ecnCE is the ECN codepoint Congestion Experienced in the low two bits of the TOS / traffic
// class byte. RFC 3168 section 5.
const ecnCE = 0b11

// faultConn wraps a Conn and injects faults into written datagrams: drops (Lossy) or ECN CE
// marks (MarkCE). mu serializes WriteBatch calls and guards rng and the scratch slices.
type faultConn struct {
	Conn
	percent float64
	markCE  bool
	stats   counters // dropFiltered, markedCE

	mu      sync.Mutex
	rng     *rand.Rand
	scratch []Message
	index   []int // index[j] is the position in the caller's batch of scratch[j]
}

// Lossy wraps c so that dropPercent% of written datagrams, chosen by a PCG generator seeded
// with seed, are silently discarded (and reported as sent, like any lost packet). Reads pass
// through. The same seed and the same sequence of writes drop the same datagrams.
func Lossy(c Conn, dropPercent float64, seed uint64) Conn {
	return &faultConn{Conn: c, percent: dropPercent, rng: rand.New(rand.NewPCG(seed, seed^pcgStream))}
}

// MarkCE wraps c so that percent% of written datagrams, chosen by a PCG generator seeded with
// seed, leave with the ECN field of their TOS set to CE (11), as a congested switch would mark
// them (a real switch marks only ECN-capable packets; this marks whatever it picks). The marks
// reach the receiver wherever the Conn carries TOS: the in-memory network, and a UDP socket
// through the kernel (loopback included). The caller's messages are not modified.
func MarkCE(c Conn, percent float64, seed uint64) Conn {
	return &faultConn{Conn: c, percent: percent, markCE: true, rng: rand.New(rand.NewPCG(seed, seed^pcgStream))}
}

// Offload reports no GSO: faults apply to datagrams, so a faulty Conn sends them one by one.
func (f *faultConn) Offload() Offload {
	o := f.Conn.Offload()
	o.GSO = 0
	return o
}

// WrapNetwork returns a Network whose Conns are n's passed through wrap (Lossy, MarkCE, ...).
func WrapNetwork(n Network, wrap func(Conn) Conn) Network { return wrapped{n, wrap} }

type wrapped struct {
	n    Network
	wrap func(Conn) Conn
}

func (w wrapped) Listen(addr netip.AddrPort, opts Options) (Conn, error) {
	c, err := w.n.Listen(addr, opts)
	if err != nil {
		return nil, err
	}
	return w.wrap(c), nil
}

// ListenShards joins every Conn of the group at once: a wrapper would hide Joiner.
func (w wrapped) ListenShards(addr netip.AddrPort, k int, opts Options) ([]Conn, error) {
	opts.JoinLazily = false
	cs, err := w.n.ListenShards(addr, k, opts)
	for i := range cs {
		cs[i] = w.wrap(cs[i])
	}
	return cs, err
}

// WriteBatch writes msgs through the wrapped Conn, with faults injected.
func (f *faultConn) WriteBatch(msgs []Message) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out, index := f.scratch[:0], f.index[:0]
	for i := range msgs {
		hit := f.rng.Float64()*100 < f.percent
		m := msgs[i]
		switch {
		case hit && !f.markCE:
			f.stats.dropFiltered.Add(1)
			continue
		case hit:
			m.TOS |= ecnCE
			f.stats.markedCE.Add(1)
		}
		out, index = append(out, m), append(index, i)
	}
	n, err := f.Conn.WriteBatch(out)
	sent := len(msgs)
	if n < len(out) {
		sent = index[n] // everything before the first unsent datagram was sent or dropped
	}
	clear(out) // do not keep the caller's buffers reachable
	f.scratch, f.index = out, index
	return sent, err
}

// Stats returns the wrapped Conn's counters (if it keeps any) plus the injected drops or marks.
func (f *faultConn) Stats() Stats {
	s, _ := StatsOf(f.Conn)
	return s.Add(f.stats.snapshot())
}

package explain

import (
	"net/netip"
	"sort"

	"github.com/goroce/goroce/wire"
)

// flowKey names a flow: packets from one address to one QP at another, in one role. UD flows are told
// apart by their source QP too, which their DETH names.
type flowKey struct {
	src, dst netip.Addr
	qpn      wire.QPN
	srcQP    wire.QPN
	role     Role
	tr       wire.Transport
}

// flow is the packets of one flowKey, with the endpoints they go from and to.
type flow struct {
	key      flowKey
	pkts     []*pkt
	src, dst *Endpoint
	mate     *flow // RC: the response flow that answers this request flow, or the other way round
	guessed  bool  // src was matched by a weaker guess than PSNs
}

// epKey names an endpoint: a known QP, or the unknown QP at addr that sends to peer.
type epKey struct {
	addr    netip.Addr
	qpn     wire.QPN
	known   bool
	peer    netip.Addr
	peerQPN wire.QPN
}

// endpoints is the registry of the endpoints and the pairs of an Analysis.
type endpoints struct {
	a       *Analysis
	eps     map[epKey]*Endpoint
	partner map[*Endpoint]*Endpoint
	pairs   map[[2]*Endpoint]*Pair
}

func (r *endpoints) get(k epKey) *Endpoint {
	e, ok := r.eps[k]
	if !ok {
		e = &Endpoint{ID: len(r.a.Endpoints), Addr: k.addr, QPN: k.qpn, Known: k.known}
		r.eps[k] = e
		r.a.Endpoints = append(r.a.Endpoints, e)
	}
	return e
}

func (r *endpoints) known(a netip.Addr, q wire.QPN) *Endpoint {
	return r.get(epKey{addr: a, qpn: q, known: true})
}

func (r *endpoints) match(x, y *Endpoint) {
	r.partner[x], r.partner[y] = y, x
}

// pairUp finds the endpoints of every packet and groups the packets into pairs.
//
// A BTH names only the destination QP. The source QP of an RC request is the destination QP of the
// responses that answer it, found by matching PSNs: an ACK, a NAK or a READ response carries the PSN of
// a request it answers. A UD packet names its source QP in its DETH. A CNP goes to the QP whose packets
// were marked, from the QP that received them. What none of that settles (UC, requests whose responses
// the capture lacks) is paired by elimination when one QP at each address is left over, and otherwise
// left with an unknown source QP.
func (a *Analysis) pairUp(ps []*pkt) {
	r := &endpoints{a: a, eps: map[epKey]*Endpoint{}, partner: map[*Endpoint]*Endpoint{}, pairs: map[[2]*Endpoint]*Pair{}}
	flows := map[flowKey]*flow{}
	var order []*flow
	pmtu := 0
	for _, p := range ps {
		if !p.ok {
			continue
		}
		k := flowKey{src: p.in.Src.Addr(), dst: p.in.Dst.Addr(), qpn: p.bth.DestQP, role: p.role, tr: p.info.Transport}
		if p.deth {
			k.srcQP = p.srcQP
		}
		f, ok := flows[k]
		if !ok {
			f = &flow{key: k, dst: r.known(k.dst, k.qpn)}
			flows[k] = f
			order = append(order, f)
		}
		f.pkts = append(f.pkts, p)
		if pos := p.info.Pos; (pos == wire.PosFirst || pos == wire.PosMiddle) && p.err == "" {
			pmtu = max(pmtu, p.payload)
		}
	}
	for _, f := range order {
		if f.key.tr == wire.TransportUD && len(f.pkts) > 0 && f.pkts[0].deth {
			f.src = r.known(f.key.src, f.key.srcQP)
		}
	}

	// RC: match response flows to request flows by the PSNs they share.
	type match struct {
		req, resp *flow
		score     int
	}
	var ms []match
	for _, resp := range order {
		if resp.key.role != RoleResponse {
			continue
		}
		for _, req := range order {
			k := req.key
			if k.role != RoleRequest || k.tr != resp.key.tr || k.src != resp.key.dst || k.dst != resp.key.src {
				continue
			}
			if s := psnOverlap(req, resp, pmtu); s > 0 {
				ms = append(ms, match{req, resp, s})
			}
		}
	}
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].score > ms[j].score })
	for _, m := range ms {
		if m.req.mate != nil || m.resp.mate != nil {
			continue
		}
		m.req.mate, m.resp.mate = m.resp, m.req
		m.req.src = r.known(m.req.key.src, m.resp.key.qpn)
		m.resp.src = r.known(m.resp.key.src, m.req.key.qpn)
		r.match(m.req.src, m.req.dst)
	}

	// Requests and responses left: the partner of their destination, if it is at their source.
	fromPartner := func(f *flow) bool {
		if q := r.partner[f.dst]; q != nil && q.Addr == f.key.src {
			f.src = q
			return true
		}
		return false
	}
	for _, f := range order {
		if f.src == nil && f.key.role != RoleCNP {
			fromPartner(f)
		}
	}
	// By elimination: one unmatched destination QP at each of two addresses, of one transport.
	type dir struct {
		src, dst netip.Addr
		tr       wire.Transport
	}
	left := map[dir][]*flow{}
	for _, f := range order {
		if f.src == nil && f.key.role != RoleCNP && r.partner[f.dst] == nil {
			d := dir{f.key.src, f.key.dst, f.key.tr}
			left[d] = append(left[d], f)
		}
	}
	for _, f := range order {
		if f.src != nil || f.key.role == RoleCNP {
			continue
		}
		d := dir{f.key.src, f.key.dst, f.key.tr}
		back := left[dir{d.dst, d.src, d.tr}]
		if len(left[d]) != 1 || len(back) != 1 || distinctQPN(left[d]) != 1 || distinctQPN(back) != 1 {
			continue
		}
		g := back[0]
		f.src, g.src = r.known(f.key.src, g.key.qpn), r.known(g.key.src, f.key.qpn)
		f.guessed, g.guessed = true, true
		r.match(f.src, g.src)
	}
	for _, f := range order {
		if f.src == nil && !fromPartner(f) {
			f.src = r.get(epKey{addr: f.key.src, peer: f.key.dst, peerQPN: f.key.qpn})
			f.guessed = true
		}
	}

	for _, p := range ps {
		if !p.ok {
			continue
		}
		k := flowKey{src: p.in.Src.Addr(), dst: p.in.Dst.Addr(), qpn: p.bth.DestQP, role: p.role, tr: p.info.Transport}
		if p.deth {
			k.srcQP = p.srcQP
		}
		f := flows[k]
		p.ex.From, p.ex.To = f.src, f.dst
		pr := r.pair(f.src, f.dst, p)
		pr.Inferred = pr.Inferred || f.guessed || !f.src.Known
		p.ex.Pair = pr
		pr.Frames = append(pr.Frames, p.frame())
	}
}

func distinctQPN(fs []*flow) int {
	seen := map[wire.QPN]bool{}
	for _, f := range fs {
		seen[f.key.qpn] = true
	}
	return len(seen)
}

// pair returns the pair of x and y, made with p as its first packet if it is new.
func (r *endpoints) pair(x, y *Endpoint, p *pkt) *Pair {
	k := [2]*Endpoint{x, y}
	if x.ID > y.ID {
		k = [2]*Endpoint{y, x}
	}
	pr, ok := r.pairs[k]
	if !ok {
		pr = &Pair{ID: len(r.a.Pairs) + 1, A: x, B: y, Transport: p.info.Transport, Stats: Stats{MSN: -1}}
		r.pairs[k] = pr
		r.a.Pairs = append(r.a.Pairs, pr)
	}
	if pr.Transport == wire.TransportCNP && p.role != RoleCNP {
		pr.Transport = p.info.Transport
	}
	return pr
}

// psnOverlap counts the packets of the response flow whose PSN the request flow sent, a READ standing for
// the PSNs of its responses.
func psnOverlap(req, resp *flow, pmtu int) int {
	sent := map[wire.PSN]bool{}
	for _, p := range req.pkts {
		n := uint32(1)
		if p.info.Op == wire.OpReadRequest {
			n = readSpan(p.dmaLen, pmtu)
		}
		for i := range n {
			sent[p.bth.PSN.Add(i)] = true
		}
	}
	score := 0
	for _, p := range resp.pkts {
		psn := p.bth.PSN
		if p.aeth && p.syn.Kind() != wire.KindACK && p.syn.Kind() != wire.KindRNRNAK {
			psn = psn.Sub(1) // a NAK names the PSN the responder expects; it answers the one before
		}
		if sent[psn] || sent[p.bth.PSN] {
			score++
		}
	}
	return score
}

// maxReadSpan bounds the responses one READ is taken to ask for: 2^31 bytes at 256 bytes a packet is
// more, but no capture this package reads holds a READ that large whole.
const maxReadSpan = 1 << 16

// readSpan is the number of response packets, each a PSN, that a READ of n bytes asks for at the path
// MTU pmtu, one at least: each response packet takes a PSN of its own. IBTA Vol 1 9.7 (reliable service). An
// unknown pmtu (0) counts one.
func readSpan(n uint32, pmtu int) uint32 {
	if pmtu <= 0 || n == 0 {
		return 1
	}
	s := (uint64(n) + uint64(pmtu) - 1) / uint64(pmtu)
	return uint32(min(s, maxReadSpan))
}

package perftest

import (
	"fmt"
	"net/netip"

	"github.com/goroce/goroce"
)

// peer is the verbs objects of one run, as perftest's struct pingpong_context: one device, one
// protection domain, one CQ for every QP's sends and receives, the QPs, and the buffer in one region
// or, with Options.MRPerQP, one region per QP.
//
// The buffer holds two slots per QP of slot bytes each, as perftest's: QP i sends from (and READs
// into) its local slot and offers its remote slot to the peer (its vaddr), where the peer's WRITEs,
// READs, atomics and SENDs land. With one region the local slots come first (slot i), then the
// remote ones (slot QPs+i), as set_up_connection computes the vaddrs; with a region per QP, each
// region is QP i's local slot and then its remote one.
type peer struct {
	o      Options
	sh     shape
	client bool
	dev    *goroce.Device
	pd     *goroce.PD
	mrs    []*goroce.MR
	cq     *goroce.CQ
	qps    []*goroce.QP
	// slot is the size of each buffer slot: the largest message, at least the cycle buffer both
	// sides settled on (perftest's BUFF_SIZE), which the peer's requests may cycle through.
	slot  int
	local []Dest
	rem   []Dest
	// routs counts each QP's receives posted and not completed.
	routs []int
	// qpIndex maps a QPN to its QP's index, for receive completions.
	qpIndex map[goroce.QPN]int
	// cmConns are the QPs' rdma_cm connections (-R), in QP order; the CM connected them.
	cmConns []*goroce.Conn
}

// access returns the rights perftest grants the peer for a verb, on the region and on the QPs
// (create_mr and ctx_modify_qp_to_init in perftest_resources.c): a WRITE test's region takes WRITEs
// only, a READ test's READs only, an atomic test's atomics only, and a SEND test's none at all (its
// QPs allow WRITEs, which its region then refuses).
func access(v Verb) (region, qp goroce.Access) {
	switch v {
	case Write:
		return goroce.LocalWrite | goroce.RemoteWrite, goroce.RemoteWrite
	case Read:
		return goroce.LocalWrite | goroce.RemoteRead, goroce.RemoteRead
	case Atomic:
		return goroce.LocalWrite | goroce.RemoteAtomic, goroce.RemoteAtomic
	}
	return goroce.LocalWrite, goroce.RemoteWrite
}

// newPeer opens the device on addr (or takes dev, rdma_cm's, if not nil) and creates the run's
// objects; pageSize is the cycle buffer the sides settled on in Hello.
func newPeer(dev *goroce.Device, addr netip.Addr, sh shape, o Options, client bool, pageSize int) (*peer, error) {
	p := &peer{o: o, sh: sh, client: client, qpIndex: make(map[goroce.QPN]int)}
	for _, s := range o.Sizes() {
		p.slot = max(p.slot, s)
	}
	p.slot = max(p.slot, pageSize)
	var err error
	p.dev = dev
	if p.dev == nil {
		if p.dev, err = goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort, Network: o.Network, Tracer: o.Tracer}); err != nil {
			return nil, err
		}
	}
	fail := func(err error) (*peer, error) {
		p.dev.Close()
		return nil, err
	}
	if p.pd, err = p.dev.AllocPD(); err != nil {
		return fail(err)
	}
	n := o.QPs
	regionAccess, _ := access(sh.verb)
	if o.MRPerQP {
		for range n {
			mr, err := p.pd.AllocMR(2*p.slot, regionAccess)
			if err != nil {
				return fail(fmt.Errorf("couldn't allocate MR: %w", err))
			}
			p.mrs = append(p.mrs, mr)
		}
	} else {
		mr, err := p.pd.AllocMR(2*n*p.slot, regionAccess)
		if err != nil {
			return fail(fmt.Errorf("couldn't allocate MR: %w", err))
		}
		p.mrs = append(p.mrs, mr)
	}
	recvs := 0
	if sh.verb == Send {
		recvs = o.RxDepth
	}
	if p.cq, err = p.dev.CreateCQ(n*(o.TxDepth+recvs) + 16); err != nil {
		return fail(fmt.Errorf("couldn't create CQ: %w", err))
	}
	inline := 0
	if sh.verb == Write || sh.verb == Send {
		inline = o.InlineSize
	}
	p.routs = make([]int, n)
	for i := range n {
		q, err := p.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cq, RecvCQ: p.cq,
			MaxSendWR: max(o.TxDepth, o.PostList, 16), MaxRecvWR: max(o.RxDepth, 1), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: inline, TrafficClass: o.TrafficClass})
		if err != nil {
			return fail(fmt.Errorf("couldn't create QP: %w", err))
		}
		p.qps = append(p.qps, q)
		p.qpIndex[q.QPN()] = i
		e := q.Endpoint()
		mr, _ := p.remoteSlot(i)
		d := Dest{OutReads: 1, QPN: e.QPN, PSN: e.PSN, RKey: mr.RKey(), VAddr: p.vaddr(i), GID: e.GID}
		if sh.verb == Read || sh.verb == Atomic {
			d.OutReads = o.OutReads
		}
		p.local = append(p.local, d)
	}
	return p, nil
}

// close closes the device, which first sends what it still holds, such as the ACK of the peer's
// last message.
func (p *peer) close() { p.dev.Close() }

// localSlot returns the region and offset of QP i's local slot.
func (p *peer) localSlot(i int) (*goroce.MR, int) {
	if p.o.MRPerQP {
		return p.mrs[i], 0
	}
	return p.mrs[0], i * p.slot
}

// remoteSlot returns the region and offset of QP i's remote slot, the one the peer targets.
func (p *peer) remoteSlot(i int) (*goroce.MR, int) {
	if p.o.MRPerQP {
		return p.mrs[i], p.slot
	}
	return p.mrs[0], (len(p.qps) + i) * p.slot
}

// vaddr returns the address of QP i's remote slot, which its key message offers.
func (p *peer) vaddr(i int) uint64 {
	if p.o.MRPerQP {
		return p.mrs[i].Addr() + uint64(p.slot)
	}
	return p.mrs[0].Addr() + uint64((p.o.QPs+i)*p.slot)
}

// connect moves every QP to RTS towards the peer's key messages.
func (p *peer) connect(rem []Dest, mtu goroce.MTU, tcpPeer netip.Addr) error {
	p.rem = rem
	if p.cmConns != nil {
		return nil // rdma_cm connected them
	}
	_, qpAccess := access(p.sh.verb)
	for i, q := range p.qps {
		peer := rem[i].Endpoint()
		if rem[i].GID == (goroce.GID{}) {
			// The peer runs without a GID index and sent none; RoCE needs one: take the TCP peer's
			// address.
			peer.GID = goroce.GIDFromAddr(tcpPeer)
		}
		rd := uint8(1)
		if p.sh.verb == Read || p.sh.verb == Atomic {
			rd = uint8(max(1, min(p.local[i].OutReads, rem[i].OutReads)))
		}
		opts := goroce.DefaultConnectOptions()
		// perftest's QP: its rights, the MTU both sides settled on, -u's ACK timeout, 7 retries and
		// RNR retries forever (ctx_modify_qp_to_rts).
		opts.MTU, opts.RdAtomic, opts.RNRRetry, opts.RetryCnt = mtu, rd, 7, 7
		opts.Access, opts.Timeout = qpAccess, p.o.Timeout
		if err := q.Connect(peer, &opts); err != nil {
			return fmt.Errorf("failed to modify QP %#x to RTS: %w", uint32(q.QPN()), err)
		}
	}
	return nil
}

// recvWRID marks receive completions (with the QP's index in the low bits); send work requests carry
// their QP's index above sendSeqBits and their number below.
const (
	recvWRID    = 1 << 63
	sendSeqBits = 40
)

func sendWRID(qp, seq int) uint64 { return uint64(qp)<<sendSeqBits | uint64(seq) }

func splitWRID(id uint64) (qp, seq int) {
	return int(id >> sendSeqBits), int(id & (1<<sendSeqBits - 1))
}

// postRecvs tops QP i's receive queue up to rx depth, or to limit receives outstanding if fewer, in
// lists of RecvPostList; receives land in the QP's remote slot.
func (p *peer) postRecvs(i, limit int) error {
	mr, off := p.remoteSlot(i)
	want := min(p.o.RxDepth, limit)
	var list [16]goroce.RecvWR
	var ptrs [16]*goroce.RecvWR
	for p.routs[i] < want {
		n := min(want-p.routs[i], p.o.RecvPostList, len(list))
		for k := range n {
			list[k] = goroce.RecvWR{WRID: recvWRID | uint64(i), SGL: []goroce.SGE{mr.SGE(off, p.slot)}}
			ptrs[k] = &list[k]
		}
		if err := p.qps[i].PostRecv(ptrs[:n]...); err != nil {
			return fmt.Errorf("couldn't post receive: %w", err)
		}
		p.routs[i] += n
	}
	return nil
}

// rcvdPkts returns the packets the QPs received so far.
func (p *peer) rcvdPkts() uint64 {
	var n uint64
	for _, q := range p.qps {
		n += q.Counters().RcvdPkts
	}
	return n
}

// rnrSent returns the RNR NAKs the QPs sent so far: SENDs that found no receive posted.
func (p *peer) rnrSent() uint64 {
	var n uint64
	for _, q := range p.qps {
		n += q.Counters().SendRNRErr
	}
	return n
}

package goroce

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/internal/datapath"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// The work request, completion and attribute types are the engines' own; goroce names them here so
// that a program needs only this package.
type (
	SendWR           = qp.SendWR
	RecvWR           = qp.RecvWR
	SGE              = mr.SGE
	Completion       = qp.Completion
	Status           = qp.Status
	CompletionOpcode = qp.CompletionOpcode
	WROpcode         = qp.WROpcode
	SendFlags        = qp.SendFlags
	QPType           = qp.Type
	QPState          = qp.State
	Attr             = qp.Attr
	AttrMask         = qp.AttrMask
	AddressHandle    = qp.AddressHandle
	Access           = mr.Access
	Counters         = qp.Counters
)

// Queue pair types, opcodes, flags and access rights, re-exported from the engines.
const (
	RC = qp.RC
	UC = qp.UC
	UD = qp.UD

	WRSend        = qp.WRSend
	WRSendImm     = qp.WRSendImm
	WRSendInv     = qp.WRSendInv
	WRWrite       = qp.WRWrite
	WRWriteImm    = qp.WRWriteImm
	WRRead        = qp.WRRead
	WRCompareSwap = qp.WRCompareSwap
	WRFetchAdd    = qp.WRFetchAdd

	Signaled  = qp.Signaled
	Fence     = qp.Fence
	Solicited = qp.Solicited
	Inline    = qp.Inline

	LocalWrite   = mr.LocalWrite
	RemoteWrite  = mr.RemoteWrite
	RemoteRead   = mr.RemoteRead
	RemoteAtomic = mr.RemoteAtomic

	StatusSuccess     = qp.StatusSuccess
	StatusWRFlushErr  = qp.StatusWRFlushErr
	StatusRetryExcErr = qp.StatusRetryExcErr

	CompSend            = qp.CompSend
	CompRDMAWrite       = qp.CompRDMAWrite
	CompRDMARead        = qp.CompRDMARead
	CompCompareSwap     = qp.CompCompareSwap
	CompFetchAdd        = qp.CompFetchAdd
	CompRecv            = qp.CompRecv
	CompRecvRDMAWithImm = qp.CompRecvRDMAWithImm
)

// PD is a protection domain. It mirrors struct ibv_pd.
type PD struct {
	dev  *Device
	pd   *mr.PD
	refs atomic.Int64 // regions and QPs in the domain
}

// AllocPD creates a protection domain. It mirrors ibv_alloc_pd.
func (d *Device) AllocPD() (*PD, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	pd := &PD{dev: d, pd: d.mem.AllocPD()}
	d.track(pd)
	return pd, nil
}

// Close deallocates the domain; it fails with ErrBusy while regions or QPs remain. It mirrors
// ibv_dealloc_pd.
func (pd *PD) Close() error {
	if pd.refs.Load() > 0 {
		return ErrBusy
	}
	pd.dev.untrack(pd)
	return pd.dev.mem.DeallocPD(pd.pd)
}

func (pd *PD) close() { _ = pd.dev.mem.DeallocPD(pd.pd) }

// MR is a registered memory region. It mirrors struct ibv_mr.
type MR struct {
	pd *PD
	r  *mr.Region
}

// RegMR registers buf for access, with the IOVA libibverbs would use (the buffer's address) unless an
// option chooses another. It mirrors ibv_reg_mr (and, with mr.WithIOVA, ibv_reg_mr_iova2).
func (pd *PD) RegMR(buf []byte, access Access, opts ...mr.Option) (*MR, error) {
	if pd.dev.closing.Load() {
		return nil, ErrClosed
	}
	r, err := pd.dev.mem.Register(pd.pd, buf, access, opts...)
	if err != nil {
		return nil, err
	}
	return pd.newMR(r), nil
}

// AllocMR allocates n bytes of page-aligned memory and registers it.
func (pd *PD) AllocMR(n int, access Access, opts ...mr.Option) (*MR, error) {
	if pd.dev.closing.Load() {
		return nil, ErrClosed
	}
	r, err := pd.dev.mem.Alloc(pd.pd, n, access, opts...)
	if err != nil {
		return nil, err
	}
	return pd.newMR(r), nil
}

func (pd *PD) newMR(r *mr.Region) *MR {
	m := &MR{pd: pd, r: r}
	pd.refs.Add(1)
	pd.dev.track(m)
	return m
}

// Bytes returns the registered memory.
func (m *MR) Bytes() []byte { return m.r.Bytes() }

// LKey returns the local key, for SGEs.
func (m *MR) LKey() wire.LKey { return m.r.LKey() }

// RKey returns the remote key, for a peer's RDMA and atomics.
func (m *MR) RKey() wire.RKey { return m.r.RKey() }

// Addr returns the IOVA of the region's first byte: what SGEs and a peer's RETH name it by.
func (m *MR) Addr() uint64 { return m.r.IOVA() }

// SGE returns the scatter/gather element for n bytes at offset off of the region.
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.r.IOVA() + uint64(off), Length: uint32(n), LKey: m.r.LKey()}
}

// Close deregisters the region: when it returns, no access through its keys succeeds. It mirrors
// ibv_dereg_mr.
func (m *MR) Close() error {
	m.pd.dev.untrack(m)
	if err := m.pd.dev.mem.Deregister(m.r); err != nil {
		return err
	}
	m.pd.refs.Add(-1)
	return nil
}

func (m *MR) close() { _ = m.pd.dev.mem.Deregister(m.r) }

// CQ is a completion queue. It mirrors struct ibv_cq; Wait combines ibv_req_notify_cq and
// ibv_get_cq_event.
type CQ struct {
	dev  *Device
	cq   *datapath.CQ
	refs atomic.Int64
}

// CreateCQ creates a completion queue of n entries. It mirrors ibv_create_cq.
func (d *Device) CreateCQ(n int) (*CQ, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: CQ size %d", ErrBadConfig, n)
	}
	c := &CQ{dev: d, cq: d.dp.NewCQ(n)}
	d.track(c)
	return c, nil
}

// Poll moves up to len(wc) completions into wc and returns how many. It mirrors ibv_poll_cq.
func (c *CQ) Poll(wc []Completion) int {
	n := c.cq.Engine().Poll(wc)
	c.trace(wc[:n])
	return n
}

func (c *CQ) trace(wc []Completion) {
	if t := c.dev.cfg.Tracer; t != nil {
		for i := range wc {
			t.Completion(c.dev.clock.Now(), wc[i])
		}
	}
}

// Wait blocks until the CQ holds a completion or ctx ends, then polls like Poll. While the CQ's queue
// pairs all live on one of the device's shards, the waiting goroutine receives and handles their
// packets itself, so that a reply wakes it directly.
func (c *CQ) Wait(ctx context.Context, wc []Completion) (int, error) {
	if len(wc) == 0 {
		return 0, fmt.Errorf("%w: CQ.Wait needs room for at least one completion", ErrBadConfig)
	}
	n, err := c.cq.Wait(ctx, wc)
	c.trace(wc[:n])
	return n, err
}

// Close destroys the CQ; it fails with ErrBusy while QPs use it. It mirrors ibv_destroy_cq.
func (c *CQ) Close() error {
	if c.refs.Load() > 0 {
		return ErrBusy
	}
	c.dev.untrack(c)
	c.cq.Close()
	return nil
}

func (c *CQ) close() { c.cq.Close() }

// SRQ is a shared receive queue. It mirrors struct ibv_srq.
type SRQ struct {
	pd   *PD
	srq  *qp.SRQ
	refs atomic.Int64
}

// CreateSRQ creates a shared receive queue of n receives of up to maxSGE elements. It mirrors
// ibv_create_srq.
func (pd *PD) CreateSRQ(n, maxSGE int) (*SRQ, error) {
	if pd.dev.closing.Load() {
		return nil, ErrClosed
	}
	s := &SRQ{pd: pd, srq: qp.NewSRQ(n, maxSGE)}
	pd.refs.Add(1)
	pd.dev.track(s)
	return s, nil
}

// PostRecv posts a receive. It mirrors ibv_post_srq_recv.
func (s *SRQ) PostRecv(wr *RecvWR) error {
	if s.pd.dev.closing.Load() {
		return ErrClosed
	}
	return s.srq.PostRecv(wr)
}

// Close destroys the SRQ; it fails with ErrBusy while QPs use it.
func (s *SRQ) Close() error {
	if s.refs.Load() > 0 {
		return ErrBusy
	}
	s.pd.dev.untrack(s)
	s.pd.refs.Add(-1)
	return nil
}

func (s *SRQ) close() {}

// QPInit are a queue pair's creation parameters. It mirrors struct ibv_qp_init_attr; zero limits take
// the defaults (128 work requests, 4 SGEs, 256 bytes inline).
type QPInit struct {
	Type          QPType
	SendCQ        *CQ
	RecvCQ        *CQ
	SRQ           *SRQ
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
	SigAll        bool
	// TrafficClass is the IP TOS / traffic class byte of the QP's packets, as grh.traffic_class.
	TrafficClass uint8
	// Pacer is an optional rate controller for the QP's requests. With Config.DCQCN set, RC and UC
	// QPs without one get a congestion.DCQCN.
	Pacer qp.Pacer
}

// QP is a queue pair. It mirrors struct ibv_qp.
type QP struct {
	dev  *Device
	pd   *PD
	dq   *datapath.QP
	typ  QPType
	qpn  wire.QPN
	psn  wire.PSN // the send PSN Connect uses
	init QPInit
	tc   uint8
	once sync.Once
}

// CreateQP creates a queue pair in RESET. It mirrors ibv_create_qp.
func (pd *PD) CreateQP(init QPInit) (*QP, error) {
	d := pd.dev
	if d.closing.Load() {
		return nil, ErrClosed
	}
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("%w: a QP needs a send CQ and a receive CQ", ErrBadConfig)
	}
	if init.SendCQ.dev != d || init.RecvCQ.dev != d || (init.SRQ != nil && init.SRQ.pd != pd) {
		return nil, ErrForeign
	}
	def := func(v *int, n int) {
		if *v == 0 {
			*v = n
		}
	}
	def(&init.MaxSendWR, 128)
	def(&init.MaxRecvWR, 128)
	def(&init.MaxSendSGE, 4)
	def(&init.MaxRecvSGE, 4)
	def(&init.MaxInlineData, 256)
	dc := datapath.QPConfig{SendCQ: init.SendCQ.cq, RecvCQ: init.RecvCQ.cq, TrafficClass: init.TrafficClass}
	if d.cfg.DCQCN != nil && init.Type != UD {
		if init.Pacer == nil {
			rp, err := congestion.NewDCQCN(*d.cfg.DCQCN)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
			}
			dc.Congestion, init.Pacer = rp, rp
		}
		dc.NotificationPoint = true
		dc.TrafficClass |= ecnECT0
	}
	dc.Engine = qp.Config{Type: init.Type, PD: pd.pd, Memory: d.mem,
		MaxSendWR: init.MaxSendWR, MaxRecvWR: init.MaxRecvWR, MaxSendSGE: init.MaxSendSGE, MaxRecvSGE: init.MaxRecvSGE,
		MaxInlineData: init.MaxInlineData, SigAll: init.SigAll, Pacer: init.Pacer, AckDelay: d.cfg.AckDelay}
	if init.SRQ != nil {
		dc.Engine.SRQ = init.SRQ.srq
	}
	dq, err := d.dp.NewQP(dc)
	if err != nil {
		return nil, err
	}
	q := &QP{dev: d, pd: pd, dq: dq, typ: init.Type, qpn: dq.QPN(), psn: d.dp.RandomPSN(), init: init, tc: dc.TrafficClass}
	pd.refs.Add(1)
	init.SendCQ.refs.Add(1)
	init.RecvCQ.refs.Add(1)
	if init.SRQ != nil {
		init.SRQ.refs.Add(1)
	}
	return q, nil
}

// QPN returns the queue pair number.
func (q *QP) QPN() wire.QPN { return q.qpn }

// Type returns the QP type.
func (q *QP) Type() QPType { return q.typ }

// Modify changes the QP's attributes and state. It mirrors ibv_modify_qp: the mask names the fields of
// a to apply, and the transition's required attributes must all be there.
func (q *QP) Modify(a *Attr, mask AttrMask) error {
	var peer netip.Addr
	if mask&qp.AttrAV != 0 && q.typ != UD {
		peer = GID(a.AV.DGID).Addr()
	}
	return q.dq.Modify(a, mask, peer)
}

// Query returns the QP's attributes. It mirrors ibv_query_qp.
func (q *QP) Query() Attr { return q.dq.Query() }

// State returns the QP's state.
func (q *QP) State() QPState { return q.dq.State() }

// Counters returns the QP's counters.
func (q *QP) Counters() Counters { return q.dq.Counters() }

// PostSend posts a send work request. It mirrors ibv_post_send; an error means nothing was posted.
// What the QP can send now leaves from the calling goroutine, as ringing a NIC's doorbell.
func (q *QP) PostSend(wr *SendWR) error { return q.dq.PostSend(wr) }

// PostRecv posts a receive work request. It mirrors ibv_post_recv.
func (q *QP) PostRecv(wr *RecvWR) error { return q.dq.PostRecv(wr) }

// Close destroys the QP: outstanding work requests complete with WR_FLUSH_ERR and packets for its
// QPN are dropped from then on. It mirrors ibv_destroy_qp.
func (q *QP) Close() error {
	q.shutdown()
	return nil
}

func (q *QP) shutdown() {
	q.once.Do(func() {
		q.dq.Close()
		q.pd.refs.Add(-1)
		q.init.SendCQ.refs.Add(-1)
		q.init.RecvCQ.refs.Add(-1)
		if q.init.SRQ != nil {
			q.init.SRQ.refs.Add(-1)
		}
	})
}

// ecnECT0 is the ECN-capable transport codepoint in the TOS byte, which DCQCN QPs send. RFC 3168.
const ecnECT0 = 0x02

// CongestionRate returns the rate the QP's congestion controller allows, in bits per second, and false
// if the QP has none.
func (q *QP) CongestionRate() (float64, bool) { return q.dq.Rate() }

// RemoteInfo is what two RC peers exchange out of band to connect: the QPN, the first PSN and the GID,
// as ibv_rc_pingpong's "%04x:%06x:%06x:%s" message carries them.
type RemoteInfo struct {
	QPN wire.QPN
	PSN wire.PSN
	GID GID
}

// Info returns what the peer needs to connect to q.
func (q *QP) Info() RemoteInfo { return RemoteInfo{QPN: q.qpn, PSN: q.psn, GID: q.dev.gid} }

// ConnectOptions tune Connect; zero values take ibv_rc_pingpong's choices.
type ConnectOptions struct {
	MTU         wire.MTU  // path MTU; 1024 unless set
	Access      Access    // remote rights of the peer on this QP; read, write and atomic unless set
	Timeout     uint8     // local ACK timeout code; 14 (67 ms) unless set
	RetryCnt    uint8     // 7 unless set
	RNRRetry    uint8     // 7 (forever) unless set
	MinRNRTimer uint8     // 12 (0.64 ms) unless set
	RdAtomic    uint8     // outstanding READs/atomics each way; 16 unless set
	QKey        wire.QKey // UD only
}

// Connect moves an RC or UC QP from RESET to RTS connected to remote, or a UD QP to RTS, with the
// attributes ibv_rc_pingpong uses unless opts says otherwise.
func (q *QP) Connect(remote RemoteInfo, opts ConnectOptions) error {
	if opts.MTU == 0 {
		opts.MTU = wire.MTU1024
	}
	if opts.Access == 0 {
		opts.Access = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic
	}
	if opts.Timeout == 0 {
		opts.Timeout = 14
	}
	if opts.RetryCnt == 0 {
		opts.RetryCnt = 7
	}
	if opts.RNRRetry == 0 {
		opts.RNRRetry = 7
	}
	if opts.MinRNRTimer == 0 {
		opts.MinRNRTimer = 12
	}
	if opts.RdAtomic == 0 {
		opts.RdAtomic = 16
	}
	av := AddressHandle{DGID: remote.GID, HopLimit: 64, TrafficClass: q.tc}
	return q.dq.Connect(&qp.ConnectParams{AccessFlags: opts.Access &^ LocalWrite, QKey: opts.QKey,
		AV: av, PathMTU: opts.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN, SQPSN: q.psn, Timeout: opts.Timeout,
		RetryCnt: opts.RetryCnt, RNRRetry: opts.RNRRetry, MinRNRTimer: opts.MinRNRTimer, RdAtomic: opts.RdAtomic},
		remote.GID.Addr())
}

// Direction says whether a traced packet was sent or received.
type Direction uint8

// Directions.
const (
	Sent Direction = iota
	Received
)

// TraceEvent is a packet a device sent or received.
type TraceEvent struct {
	Dir      Direction
	At       time.Time
	From, To netip.AddrPort
	Packet   wire.Packet // valid only during the call
}

// Tracer sees a device's packets and completions. Its methods run on the device's goroutines and must
// not block or keep the packet.
type Tracer interface {
	Packet(e TraceEvent)
	Completion(at time.Time, wc Completion)
}

package goroce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/internal/datapath"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
)

// Every Close in this file is idempotent: closing an object twice returns nil the second time.

// PD is a protection domain: regions and queue pairs of one PD may use each other. It mirrors struct
// ibv_pd.
type PD struct {
	dev    *Device
	pd     *mr.PD
	refs   atomic.Int64 // regions, SRQs and QPs in the domain
	closed atomic.Bool
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

// Close deallocates the domain; it fails with ErrBusy while regions, SRQs or QPs remain. It mirrors
// ibv_dealloc_pd.
func (pd *PD) Close() error {
	if pd.closed.Load() {
		return nil
	}
	if pd.refs.Load() > 0 {
		return ErrBusy
	}
	if pd.closed.Swap(true) {
		return nil
	}
	pd.dev.untrack(pd)
	_ = pd.dev.mem.DeallocPD(pd.pd)
	return nil
}

func (pd *PD) close() {
	pd.closed.Store(true)
	_ = pd.dev.mem.DeallocPD(pd.pd)
}

// MR is a registered memory region. It mirrors struct ibv_mr.
type MR struct {
	pd     *PD
	r      *mr.Region
	closed atomic.Bool
}

// MROption modifies a registration: WithIOVA, Invalidatable.
type MROption = mr.Option

// WithIOVA registers the region at iova instead of its buffer's address, as ibv_reg_mr_iova2 does: SGEs
// and a peer's RDMA name its bytes from iova on.
func WithIOVA(iova uint64) MROption { return mr.WithIOVA(iova) }

// Invalidatable lets a peer's SEND with invalidate (and a local invalidation) revoke the region's keys,
// as rxe allows only for fast-registration regions.
func Invalidatable() MROption { return mr.Invalidatable() }

// RegMR registers buf for access, with the IOVA libibverbs would use (the buffer's address) unless
// WithIOVA chooses another. It mirrors ibv_reg_mr. The program keeps buf; the device reads and writes it
// while the region is registered.
func (pd *PD) RegMR(buf []byte, access Access, opts ...MROption) (*MR, error) {
	if pd.dev.closing.Load() || pd.closed.Load() {
		return nil, ErrClosed
	}
	r, err := pd.dev.mem.Register(pd.pd, buf, mr.Access(access), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: registering %d bytes: %v", ErrBadConfig, len(buf), err)
	}
	return pd.newMR(r), nil
}

// AllocMR allocates n bytes of zeroed, page-aligned memory and registers it. The memory belongs to the
// Go heap: after Close the program may still use Bytes, and the collector frees it when unreachable.
func (pd *PD) AllocMR(n int, access Access, opts ...MROption) (*MR, error) {
	if pd.dev.closing.Load() || pd.closed.Load() {
		return nil, ErrClosed
	}
	r, err := pd.dev.mem.Alloc(pd.pd, n, mr.Access(access), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: allocating %d bytes: %v", ErrBadConfig, n, err)
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
func (m *MR) LKey() LKey { return m.r.LKey() }

// RKey returns the remote key, for a peer's RDMA and atomics.
func (m *MR) RKey() RKey { return m.r.RKey() }

// Addr returns the IOVA of the region's first byte: what SGEs and a peer's RETH name it by.
func (m *MR) Addr() uint64 { return m.r.IOVA() }

// SGE returns the scatter/gather element for n bytes at offset off of the region. It does not check
// the range: a post checks every SGE (ErrBadSGE).
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.r.IOVA() + uint64(off), Length: uint32(n), LKey: m.r.LKey()}
}

// Close deregisters the region: when it returns, no access through its keys succeeds. It mirrors
// ibv_dereg_mr. The memory stays the program's.
func (m *MR) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	m.pd.dev.untrack(m)
	_ = m.pd.dev.mem.Deregister(m.r)
	m.pd.refs.Add(-1)
	return nil
}

func (m *MR) close() {
	m.closed.Store(true)
	_ = m.pd.dev.mem.Deregister(m.r)
}

// CQ is a completion queue. It mirrors struct ibv_cq; Wait combines ibv_req_notify_cq,
// ibv_get_cq_event and ibv_poll_cq.
type CQ struct {
	dev    *Device
	cq     *datapath.CQ
	refs   atomic.Int64
	closed atomic.Bool

	mu  sync.Mutex // guards buf
	buf [64]qp.Completion
}

// CreateCQ creates a completion queue of n entries. It mirrors ibv_create_cq. A completion that does
// not fit is lost, its QP enters the error state, and the device reports EventCQError.
func (d *Device) CreateCQ(n int) (*CQ, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: CQ size %d", ErrBadConfig, n)
	}
	c := &CQ{dev: d, cq: d.dp.NewCQ(n)}
	c.cq.Owner = c
	d.track(c)
	return c, nil
}

// Poll moves up to len(wc) completions into wc, oldest first, and returns how many. It mirrors
// ibv_poll_cq.
func (c *CQ) Poll(wc []Completion) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < len(wc) {
		k := c.cq.Engine().Poll(c.buf[:min(len(wc)-n, len(c.buf))])
		for i := range k {
			wc[n+i] = completionFrom(&c.buf[i])
		}
		n += k
		if k < len(c.buf) {
			break
		}
	}
	if t := c.dev.cfg.Tracer; t != nil {
		for i := range n {
			t.Completion(c.dev.dp.Now(), wc[i])
		}
	}
	return n
}

// Wait blocks until the CQ holds a completion, ctx ends or the device closes, then polls like Poll and
// returns how many completions it moved (at least one) or ctx's error, or ErrClosed. While all the
// CQ's queue pairs live on one of the device's shards, the waiting goroutine receives and handles
// their packets itself, so that a reply wakes it directly: reuse one context across waits (a new one
// each time costs a registration).
func (c *CQ) Wait(ctx context.Context, wc []Completion) (int, error) {
	if len(wc) == 0 {
		return 0, ErrNoRoom
	}
	for {
		if c.cq.Engine().Len() > 0 {
			if n := c.Poll(wc); n > 0 {
				return n, nil
			}
		}
		if err := c.cq.Wait(ctx, false); err != nil {
			if n := c.Poll(wc); n > 0 {
				return n, nil
			}
			return 0, err
		}
	}
}

// WaitSolicited blocks until a solicited or failed completion arrives, as ibv_req_notify_cq with
// solicited_only does: a receive of a message sent with the Solicited flag, or any error. Completions
// already queued do not count; other completions do not end the wait. It then polls like Poll (the
// solicited completion comes with what arrived before it) and returns how many it moved.
func (c *CQ) WaitSolicited(ctx context.Context, wc []Completion) (int, error) {
	if len(wc) == 0 {
		return 0, ErrNoRoom
	}
	if err := c.cq.Wait(ctx, true); err != nil {
		return 0, err
	}
	return c.Poll(wc), nil
}

// Overflowed reports whether a completion was ever lost because the CQ was full.
func (c *CQ) Overflowed() bool { return c.cq.Engine().Overflowed() }

// Close destroys the CQ; it fails with ErrBusy while QPs use it. It mirrors ibv_destroy_cq.
func (c *CQ) Close() error {
	if c.closed.Load() {
		return nil
	}
	if c.refs.Load() > 0 {
		return ErrBusy
	}
	if c.closed.Swap(true) {
		return nil
	}
	c.dev.untrack(c)
	c.cq.Close()
	return nil
}

func (c *CQ) close() {
	c.closed.Store(true)
	c.cq.Close()
}

// SRQ is a shared receive queue: the receives of every QP created with it. It mirrors struct ibv_srq.
type SRQ struct {
	pd     *PD
	srq    *qp.SRQ
	refs   atomic.Int64
	closed atomic.Bool
}

// CreateSRQ creates a shared receive queue of n receives of up to maxSGE elements. It mirrors
// ibv_create_srq.
func (pd *PD) CreateSRQ(n, maxSGE int) (*SRQ, error) {
	if pd.dev.closing.Load() || pd.closed.Load() {
		return nil, ErrClosed
	}
	if n <= 0 || maxSGE <= 0 {
		return nil, fmt.Errorf("%w: SRQ of %d receives of %d SGEs", ErrBadConfig, n, maxSGE)
	}
	s := &SRQ{pd: pd, srq: qp.NewSRQ(n, maxSGE)}
	pd.refs.Add(1)
	pd.dev.track(s)
	return s, nil
}

// PostRecv posts receives, in order. It mirrors ibv_post_srq_recv; an error is a *PostError that
// says which work request failed (those before it were posted).
func (s *SRQ) PostRecv(wrs ...*RecvWR) error {
	if s.pd.dev.closing.Load() || s.closed.Load() {
		return ErrClosed
	}
	for i, wr := range wrs {
		var sgl [maxStackSGEs]mr.SGE
		e := qp.RecvWR{ID: wr.WRID, SGL: engineSGL(wr.SGL, &sgl)}
		if err := s.pd.dev.mem.CheckSGL(s.pd.pd, e.SGL, mr.LocalWrite); err != nil {
			return &PostError{Index: i, Err: postError(err)}
		}
		if err := s.srq.PostRecv(&e); err != nil {
			return &PostError{Index: i, Err: postError(err)}
		}
	}
	return nil
}

// Len returns how many receives are posted and not yet taken.
func (s *SRQ) Len() int { return s.srq.Len() }

// SetLimit asks for EventSRQLimitReached once, when fewer than limit receives are left posted: the application
// posts more before the queue runs dry (ibv_modify_srq with srq_limit). 0 disarms.
func (s *SRQ) SetLimit(limit int) {
	d := s.pd.dev
	s.srq.ArmLimit(limit, func() { d.post(AsyncEvent{Type: EventSRQLimitReached, SRQ: s}) })
}

// Close destroys the SRQ; it fails with ErrBusy while QPs use it.
func (s *SRQ) Close() error {
	if s.closed.Load() {
		return nil
	}
	if s.refs.Load() > 0 {
		return ErrBusy
	}
	if s.closed.Swap(true) {
		return nil
	}
	s.pd.dev.untrack(s)
	s.pd.refs.Add(-1)
	return nil
}

func (s *SRQ) close() { s.closed.Store(true) }

// QPInit are a queue pair's creation parameters. It mirrors struct ibv_qp_init_attr; zero limits take
// the defaults (128 work requests, 4 SGEs, 256 bytes inline).
type QPInit struct {
	Type          QPType
	SendCQ        *CQ
	RecvCQ        *CQ
	SRQ           *SRQ // if set, receives come from it and PostRecv is refused
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
	SigAll        bool // every send completes, signaled or not
	// TrafficClass is the IP TOS / traffic class byte of the QP's packets, as grh.traffic_class.
	TrafficClass uint8
	// Pacer is an optional rate controller for the QP's requests. With Config.DCQCN set, RC and UC
	// QPs without one get a congestion.DCQCN.
	Pacer Pacer
}

// Pacer paces a QP's requests: a rate controller such as congestion.DCQCN.
type Pacer = qp.Pacer

// QP is a queue pair. It mirrors struct ibv_qp.
type QP struct {
	dev  *Device
	pd   *PD
	dq   *datapath.QP
	typ  QPType
	qpn  QPN
	psn  PSN // the send PSN Connect uses
	init QPInit
	tc   uint8
	once sync.Once
}

// CreateQP creates a queue pair in RESET. It mirrors ibv_create_qp.
func (pd *PD) CreateQP(init QPInit) (*QP, error) {
	d := pd.dev
	if d.closing.Load() || pd.closed.Load() {
		return nil, ErrClosed
	}
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("%w: a QP needs a send CQ and a receive CQ", ErrBadConfig)
	}
	if init.SendCQ.dev != d || init.RecvCQ.dev != d || (init.SRQ != nil && init.SRQ.pd != pd) {
		return nil, ErrForeign
	}
	if init.SendCQ.closed.Load() || init.RecvCQ.closed.Load() || (init.SRQ != nil && init.SRQ.closed.Load()) {
		return nil, ErrClosed
	}
	switch init.Type {
	case RC, UC, UD:
	default:
		return nil, fmt.Errorf("%w: QP type %v", ErrBadConfig, init.Type)
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
	dc.Engine = qp.Config{Type: qp.Type(init.Type), PD: pd.pd, Memory: d.mem,
		MaxSendWR: init.MaxSendWR, MaxRecvWR: init.MaxRecvWR, MaxSendSGE: init.MaxSendSGE, MaxRecvSGE: init.MaxRecvSGE,
		MaxInlineData: init.MaxInlineData, SigAll: init.SigAll, Pacer: init.Pacer, AckDelay: d.cfg.AckDelay,
		TailProbe: !d.cfg.NoTailProbe}
	if init.SRQ != nil {
		dc.Engine.SRQ = init.SRQ.srq
	}
	dq, err := d.dp.NewQP(dc)
	if err != nil {
		return nil, err
	}
	q := &QP{dev: d, pd: pd, dq: dq, typ: init.Type, qpn: dq.QPN(), psn: d.dp.RandomPSN(), init: init, tc: dc.TrafficClass}
	dq.Owner = q
	pd.refs.Add(1)
	init.SendCQ.refs.Add(1)
	init.RecvCQ.refs.Add(1)
	if init.SRQ != nil {
		init.SRQ.refs.Add(1)
	}
	return q, nil
}

// QPN returns the queue pair number.
func (q *QP) QPN() QPN { return q.qpn }

// Type returns the QP type.
func (q *QP) Type() QPType { return q.typ }

// Modify changes the QP's attributes and state. It mirrors ibv_modify_qp: the mask names the fields of
// a to apply, and the transition's required attributes must all be there. Connect does RESET to RTS in
// one call.
func (q *QP) Modify(a *Attr, mask AttrMask) error {
	e := a.engine()
	var peer netip.AddrPort
	if mask&AttrAV != 0 && q.typ != UD {
		peer = netip.AddrPortFrom(a.AV.DGID.Addr(), a.AV.Port) // port 0: the device's own
	}
	if err := q.dq.Modify(&e, qp.AttrMask(mask), peer); err != nil {
		if errors.Is(err, ErrClosed) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	return nil
}

// Query returns the QP's attributes. It mirrors ibv_query_qp.
func (q *QP) Query() Attr { return attrFrom(q.dq.Query()) }

// State returns the QP's state.
func (q *QP) State() QPState { return QPState(q.dq.State()) }

// Counters returns the QP's counters.
func (q *QP) Counters() Counters { return Counters(q.dq.Counters()) }

// PostError is the error of a post that failed part way: the work requests before Index were posted,
// the one at Index and those after were not (ibv_post_send's bad_wr). It unwraps to the reason, one of
// ErrQueueFull, ErrBadState, ErrBadWR, ErrBadSGE or ErrClosed.
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string { return fmt.Sprintf("%v (work request %d)", e.Err, e.Index) }

// Unwrap returns the reason.
func (e *PostError) Unwrap() error { return e.Err }

// PostSend posts send work requests, in order. It mirrors ibv_post_send: each is checked (opcode for
// the QP type, SGEs inside their regions, lengths) and queued, and what the QP can send then leaves from
// the calling goroutine, as ringing a NIC's doorbell once for the whole list. An error is a *PostError.
func (q *QP) PostSend(wrs ...*SendWR) error {
	if q.dev.closing.Load() {
		return ErrClosed
	}
	now := q.dev.dp.Now()
	for i, wr := range wrs {
		var sgl [maxStackSGEs]mr.SGE
		var ah qp.AddressHandle
		e := engineSendWR(wr, &sgl, &ah)
		if err := q.checkSendSGL(&e); err != nil {
			if i > 0 {
				q.dq.Flush(now)
			}
			return &PostError{Index: i, Err: err}
		}
		if err := q.dq.Enqueue(now, &e); err != nil {
			if i > 0 {
				q.dq.Flush(now)
			}
			return &PostError{Index: i, Err: q.postError(err)}
		}
	}
	q.dq.Flush(now)
	return nil
}

// postError is postError with the QP's state named when it is the reason.
func (q *QP) postError(err error) error {
	if err = postError(err); err == ErrBadState {
		return fmt.Errorf("%w: the QP is in %v", ErrBadState, q.State())
	}
	return err
}

// checkSendSGL checks a send request's SGEs against the QP's protection domain: the data sent, or the
// memory a READ or an atomic writes (which must be writable).
func (q *QP) checkSendSGL(wr *qp.SendWR) error {
	if wr.Flags&qp.Inline != 0 {
		return nil
	}
	want := mr.Access(0)
	if wr.Opcode == qp.WRRead || wr.Opcode == qp.WRCompareSwap || wr.Opcode == qp.WRFetchAdd {
		want = mr.LocalWrite
	}
	if err := q.dev.mem.CheckSGL(q.pd.pd, wr.SGL, want); err != nil {
		return postError(err)
	}
	return nil
}

// PostRecv posts receive work requests, in order. It mirrors ibv_post_recv: each SGE must lie in a
// writable region of the QP's protection domain. An error is a *PostError.
func (q *QP) PostRecv(wrs ...*RecvWR) error {
	if q.dev.closing.Load() {
		return ErrClosed
	}
	for i, wr := range wrs {
		var sgl [maxStackSGEs]mr.SGE
		e := qp.RecvWR{ID: wr.WRID, SGL: engineSGL(wr.SGL, &sgl)}
		if err := q.dev.mem.CheckSGL(q.pd.pd, e.SGL, mr.LocalWrite); err != nil {
			return &PostError{Index: i, Err: q.postError(err)}
		}
		if err := q.dq.PostRecv(&e); err != nil {
			return &PostError{Index: i, Err: q.postError(err)}
		}
	}
	return nil
}

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

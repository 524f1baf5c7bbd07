package goroce

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/goroce/goroce/internal/cm"
	"github.com/goroce/goroce/wire/mad"
)

// UD services through the RDMA CM: service ID resolution (SIDR, IBTA Vol 1 12.11), as rdma_cm does it
// for the RDMA_PS_UDP port space (librdmacm's udaddy):
//
//	ln, err := dev.ListenUD(7174, q, nil)              // rdma_listen on an RDMA_PS_UDP id, q's QPN offered
//	s, err := dev.ResolveUD(ctx, "10.0.0.2:7174", nil) // rdma_resolve_addr/route, rdma_connect, ESTABLISHED
//	s.Address(&wr)                                     // event->param.ud: the AH, QPN and Q_Key
//	q.PostSend(&wr)
//
// On the wire a SIDR_REQ to QP1 carries the service ID (RDMA_PS_UDP and the port) and rdma_cm's CMA
// header (the IP addresses and ports) in its private data; the SIDR_REP answers with the QPN and Q_Key
// of the UD QP serving the port, or a status saying why not. Nothing is connected: the client sends
// datagrams to what it learned, and the server answers from what each datagram carries (its GRH, its
// source QP).

// RDMAUDPQKey is the Q_Key rdma_cm gives every UD QP of the RDMA_PS_UDP port space (librdmacm's and
// Linux's RDMA_UDP_QKEY): the one a SIDR_REP names and the one an rdma_cm peer's datagrams carry. A
// UD QP that talks to rdma_cm peers (udaddy) must hold it, or their datagrams are dropped on a Q_Key
// mismatch; Linux's rdma_cm also refuses a SIDR_REP naming another one.
const RDMAUDPQKey QKey = 0x01234567

// SIDRStatus is a SIDR_REP's status: whether the server offers the service. IBTA Vol 1 12.11.2
// (Table 120).
type SIDRStatus = mad.SIDRStatus

// SIDR statuses a program meets. The others are in package wire/mad.
const (
	// SIDRSuccess: the QPN and Q_Key are valid.
	SIDRSuccess = mad.SIDRSuccess
	// SIDRUnsupported: nobody serves the port (the counterpart of RejectInvalidServiceID).
	SIDRUnsupported = mad.SIDRUnsupported
	// SIDRReject: the service refused the request (UDRequest.Reject, rdma_reject), or its program did
	// not answer in time.
	SIDRReject = mad.SIDRReject
)

// SIDRError is the error of a resolution the server refused: its SIDR_REP's status and private data
// (136 bytes, zero-padded). It matches ErrConnRefused with errors.Is, as rdma_cm reports such an
// answer as RDMA_CM_EVENT_UNREACHABLE with the status.
type SIDRError struct {
	Status      SIDRStatus
	PrivateData []byte
}

func (e *SIDRError) Error() string {
	return fmt.Sprintf("goroce: UD service refused: %v (SIDR status %d)", e.Status, uint8(e.Status))
}

// Is reports whether target is ErrConnRefused.
func (e *SIDRError) Is(target error) bool { return target == ErrConnRefused }

// UDOptions are the options of ListenUD and ResolveUD. A nil *UDOptions means the zero value, which
// is what rdma_cm does.
type UDOptions struct {
	// QKey is the Q_Key of the UD QP: ListenUD's QP, or ResolveUD's QP when set. 0 means RDMAUDPQKey,
	// the only one rdma_cm peers use.
	QKey QKey
	// PrivateData is sent to the peer: ResolveUD's SIDR_REQ carries up to 180 bytes after rdma_cm's
	// 36-byte header; ListenUD's answers (those given without ManualAccept) up to 136.
	PrivateData []byte
	// ManualAccept makes ListenUD hand every request to UDListener.Request, for the program to Accept
	// or Reject; without it every request is accepted at once, with PrivateData, as a UDP socket
	// bound to a port serves anyone.
	ManualAccept bool
	// Backlog bounds the requests a ManualAccept listener holds that Request has not taken; beyond it
	// the CM drops them and the peer resends. 0 means DefaultCMBacklog.
	Backlog int
	// QP is ResolveUD's UD QP, if the caller wants it readied: a QP in RESET or INIT is brought to
	// RTS with QKey, so that the service's answers (sent with QKey, as udaddy's server does) are
	// taken. A QP already in RTS must hold QKey.
	QP *QP
}

func udOptions(o *UDOptions) UDOptions {
	if o == nil {
		return UDOptions{QKey: RDMAUDPQKey}
	}
	r := *o
	if r.QKey == 0 {
		r.QKey = RDMAUDPQKey
	}
	return r
}

// udPrivateDataLen is what a SIDR_REQ from rdma_cm leaves the application: 216 bytes less the CMA header.
const udPrivateDataLen = mad.SIDRReqPrivateDataLen - mad.CMAHeaderLen

// readyUD brings q, a UD QP of d, to RTS with Q_Key qkey, or checks that it is there.
func (d *Device) readyUD(q *QP, qkey QKey) error {
	switch {
	case q == nil:
		return fmt.Errorf("%w: no QP", ErrBadConfig)
	case q.dev != d:
		return ErrForeign
	case q.typ != UD:
		return fmt.Errorf("%w: a UD service needs a UD QP, not %v", ErrBadConfig, q.typ)
	}
	switch s := q.State(); s {
	case StateReset, StateInit:
		o := DefaultConnectOptions()
		o.QKey = qkey
		return q.Connect(Endpoint{}, &o)
	case StateRTS:
		if k := q.Query().QKey; k != qkey {
			return fmt.Errorf("%w: the QP's Q_Key is %#x, the service's %#x", ErrBadConfig, uint32(k), uint32(qkey))
		}
		return nil
	default:
		return fmt.Errorf("%w: the QP is in %v", ErrBadState, s)
	}
}

// UDListener answers SIDR requests for an rdma_cm port of the RDMA_PS_UDP space with its UD QP's QPN
// and Q_Key: an rdma_cm_id of RDMA_PS_UDP after rdma_listen, whose accepted requests all name the
// same QP. Its methods are safe for concurrent use.
type UDListener struct {
	m    *cmDevice
	port uint16
	sid  uint64
	qp   *QP
	opts UDOptions
	q    requestQueue[*UDRequest] // holds requests with ManualAccept only
}

// ListenUD starts answering SIDR requests for port (0 picks a free one; Addr says which) in rdma_cm's
// RDMA_PS_UDP space, with q's QPN and Q_Key opts.QKey (RDMAUDPQKey by default). q is a UD QP of the
// device: one in RESET or INIT is brought to RTS with that Q_Key (post its receives in INIT, before
// ListenUD, so that a client's first datagrams find them: udaddy sends as soon as it is answered);
// one in RTS must hold it already. The listener does not own q: Close leaves it as it is.
//
// A request without rdma_cm's header in its private data is refused (SIDRReject), as Linux's rdma_cm
// refuses it; a request for a port nobody listens on is answered SIDRUnsupported.
func (d *Device) ListenUD(port uint16, q *QP, opts *UDOptions) (*UDListener, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	o := udOptions(opts)
	switch {
	case len(o.PrivateData) > mad.SIDRRepPrivateDataLen:
		return nil, fmt.Errorf("%w: %d bytes of private data; a SIDR_REP carries %d", ErrBadConfig, len(o.PrivateData), mad.SIDRRepPrivateDataLen)
	case o.QP != nil && o.QP != q:
		return nil, fmt.Errorf("%w: UDOptions.QP is ResolveUD's; ListenUD takes its QP as an argument", ErrBadConfig)
	}
	if err := d.readyUD(q, o.QKey); err != nil {
		return nil, err
	}
	if o.Backlog <= 0 {
		o.Backlog = DefaultCMBacklog
	}
	m := d.cm
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	port, sid, err := m.listenLocked(mad.PortSpaceUDP, port, o.Backlog)
	if err != nil {
		return nil, fmt.Errorf("goroce: listening on rdma_cm UDP port %d: %w", port, syscall.EADDRINUSE)
	}
	l := &UDListener{m: m, port: port, sid: sid, qp: q, opts: o}
	backlog := 0 // without ManualAccept the listener answers every request itself
	if o.ManualAccept {
		backlog = o.Backlog
	}
	l.q.init(backlog)
	m.udListeners[sid] = l
	return l, nil
}

// Addr returns the address and rdma_cm port the listener answers for.
func (l *UDListener) Addr() netip.AddrPort { return netip.AddrPortFrom(l.m.d.local.Addr(), l.port) }

// QP returns the UD QP the listener offers.
func (l *UDListener) QP() *QP { return l.qp }

// QKey returns the Q_Key the listener's answers name.
func (l *UDListener) QKey() QKey { return l.opts.QKey }

// Request waits for the next SIDR request of a ManualAccept listener, ctx's end or Close
// (RDMA_CM_EVENT_CONNECT_REQUEST on a UD id). The program answers it with Accept or Reject within a
// minute, after which the CM refuses it for the program (SIDRReject). Without ManualAccept there is
// nothing to wait for: Request returns ErrBadState.
func (l *UDListener) Request(ctx context.Context) (*UDRequest, error) {
	if !l.opts.ManualAccept {
		return nil, fmt.Errorf("%w: the listener accepts every request itself (UDOptions.ManualAccept)", ErrBadState)
	}
	return l.q.next(ctx)
}

// Close stops answering: later requests for the port are answered SIDRUnsupported, and those queued
// for Request and not taken are refused (SIDRReject). The QP stays as it is.
func (l *UDListener) Close() error {
	l.m.mu.Lock()
	l.closeLocked()
	l.m.flush(l.m.d.clock.Now())
	l.m.mu.Unlock()
	return nil
}

func (l *UDListener) closeLocked() {
	m := l.m
	l.q.close(func() {
		m.eng.Unlisten(l.sid)
		delete(m.udListeners, l.sid)
	}, func(r *UDRequest) {
		_ = m.eng.AnswerSIDR(m.d.clock.Now(), r.id, &cm.SIDRAnswer{Status: mad.SIDRReject})
	})
}

// UDRequest is a peer's SIDR request waiting for the program's answer (ManualAccept). Answer it once,
// with Accept or Reject.
type UDRequest struct {
	m           *cmDevice
	l           *UDListener
	id          cm.ConnID
	remote      netip.AddrPort
	privateData []byte
}

// RemoteAddr returns the peer's address and its rdma_cm port (from rdma_cm's header).
func (r *UDRequest) RemoteAddr() netip.AddrPort { return r.remote }

// PrivateData returns the private data of the SIDR_REQ after rdma_cm's header: 180 bytes, zero-padded.
func (r *UDRequest) PrivateData() []byte { return r.privateData }

// take claims the request for an answer. The caller holds m.mu.
func (r *UDRequest) take() bool {
	if r.m.udReqs[r.id] != r {
		return false
	}
	delete(r.m.udReqs, r.id)
	return true
}

// Accept answers the request with the listener's QPN and Q_Key and private data p (up to 136 bytes),
// as rdma_accept does on a UD id.
func (r *UDRequest) Accept(p []byte) error {
	return r.answer(&cm.SIDRAnswer{Status: mad.SIDRSuccess, QPN: r.l.qp.qpn, QKey: r.l.opts.QKey, PrivateData: p})
}

// Reject refuses the request with SIDRReject and private data p (up to 136 bytes), as rdma_reject does
// on a UD id: the peer's ResolveUD fails with a *SIDRError carrying them.
func (r *UDRequest) Reject(p []byte) error {
	return r.answer(&cm.SIDRAnswer{Status: mad.SIDRReject, PrivateData: p})
}

func (r *UDRequest) answer(a *cm.SIDRAnswer) error {
	if len(a.PrivateData) > mad.SIDRRepPrivateDataLen {
		return fmt.Errorf("%w: %d bytes of private data; a SIDR_REP carries %d", ErrBadConfig, len(a.PrivateData), mad.SIDRRepPrivateDataLen)
	}
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if !r.take() {
		return errRequestGone
	}
	now := m.d.clock.Now()
	err := m.eng.AnswerSIDR(now, r.id, a)
	m.flush(now)
	return cmError(err)
}

// sidrRequest answers a SIDR_REQ for a UD listener, or queues it for the program. The caller holds mu.
func (m *cmDevice) sidrRequest(now time.Time, ev cm.Event) {
	l := m.udListeners[ev.ServiceID]
	if l == nil {
		// Nobody serves the port (a TCP-space listener, or one closed since): say so, as rdma_cm does.
		_ = m.eng.AnswerSIDR(now, ev.ID, &cm.SIDRAnswer{Status: mad.SIDRUnsupported})
		return
	}
	h, err := mad.ParseCMAHeader(ev.PrivateData)
	if err != nil {
		_ = m.eng.RejectSIDRBadCMAHeader(now, ev.ID)
		return
	}
	if !l.opts.ManualAccept {
		_ = m.eng.AnswerSIDR(now, ev.ID, &cm.SIDRAnswer{Status: mad.SIDRSuccess, QPN: l.qp.qpn, QKey: l.opts.QKey,
			PrivateData: l.opts.PrivateData})
		return
	}
	r := &UDRequest{m: m, l: l, id: ev.ID, remote: netip.AddrPortFrom(ev.Peer, h.SrcPort()),
		privateData: ev.PrivateData[mad.CMAHeaderLen:]}
	if l.q.put(r) {
		m.udReqs[ev.ID] = r
	} else {
		_ = m.eng.AnswerSIDR(now, ev.ID, &cm.SIDRAnswer{Status: mad.SIDRReject})
	}
}

// UDService is what ResolveUD learned: where a UD service's QP is (rdma_cm's event->param.ud).
type UDService struct {
	// Addr is the server's address and rdma_cm port.
	Addr netip.AddrPort
	// AH is the address handle of the server's device.
	AH AddressHandle
	// QPN and QKey are the UD QP serving the port and its Q_Key: the RemoteQPN and RemoteQKey of
	// every datagram to it.
	QPN  QPN
	QKey QKey
	// PrivateData is the SIDR_REP's: 136 bytes, zero-padded.
	PrivateData []byte
}

// Address sets wr's UD fields (AH, RemoteQPN, RemoteQKey) to send to the service.
func (s *UDService) Address(wr *SendWR) {
	ah := s.AH
	wr.AH, wr.RemoteQPN, wr.RemoteQKey = &ah, s.QPN, s.QKey
}

// ResolveUD asks the device at address, "host:port" (an IP address or a name, and an rdma_cm port of
// the RDMA_PS_UDP space, as udaddy's), which UD QP serves the port: a SIDR_REQ with rdma_cm's header
// and opts.PrivateData, resent on chapter 12's timeouts (about 4.3 s) up to 15 times, as rdma_cm
// resolves a UD id. It mirrors rdma_resolve_addr, rdma_resolve_route, rdma_connect on a UD id and
// the wait for RDMA_CM_EVENT_ESTABLISHED. opts nil means the defaults; opts.QP, if set, is readied
// with opts.QKey first.
//
// The errors match with errors.Is: ErrConnRefused for a refusal (a *SIDRError: SIDRUnsupported when
// nobody serves the port, SIDRReject when the service said no), ctx's error when ctx ends first,
// ErrUnreachable when the peer's CM never answers, ErrBadConfig for an address or options that cannot
// be used, ErrClosed when the device closes.
func (d *Device) ResolveUD(ctx context.Context, address string, opts *UDOptions) (*UDService, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	o := udOptions(opts)
	if len(o.PrivateData) > udPrivateDataLen {
		return nil, fmt.Errorf("%w: %d bytes of private data; a SIDR_REQ carries %d", ErrBadConfig, len(o.PrivateData), udPrivateDataLen)
	}
	raddr, err := d.resolveCM(ctx, address)
	if err != nil {
		return nil, err
	}
	if o.QP != nil {
		if err := d.readyUD(o.QP, o.QKey); err != nil {
			return nil, err
		}
	}
	m := d.cm
	ch := make(chan cm.Event, 2)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	hdr := mad.CMAHeaderFields{SrcPort: m.ephemeralPort(), SrcAddr: d.local.Addr(), DstAddr: raddr.Addr()}
	now := d.clock.Now()
	id, err := m.eng.Resolve(now, &cm.SIDRParams{ServiceID: mad.ServiceID(mad.PortSpaceUDP, raddr.Port()),
		Peer: raddr.Addr(), PrivateData: hdr.Append(nil, o.PrivateData)})
	if err != nil {
		m.mu.Unlock()
		return nil, cmError(err)
	}
	m.resolves[id] = ch
	m.flush(now)
	m.mu.Unlock()

	fail := func(err error) (*UDService, error) {
		m.mu.Lock()
		if m.resolves[id] == ch {
			delete(m.resolves, id)
			if !m.closed {
				now := d.clock.Now()
				_ = m.eng.Abort(now, id)
				m.flush(now)
			}
		}
		m.mu.Unlock()
		return nil, fmt.Errorf("goroce: resolving UD service %v: %w", raddr, err)
	}
	var ev cm.Event
	select {
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-m.done:
		return fail(ErrClosed)
	case ev = <-ch:
	}
	switch {
	case ev.Kind == cm.EventUnreachable:
		return fail(ErrUnreachable)
	case ev.Kind != cm.EventSIDRResolved:
		return fail(fmt.Errorf("%w: unexpected CM event %v", ErrBadState, ev.Kind))
	case ev.Status != mad.SIDRSuccess:
		return fail(&SIDRError{Status: ev.Status, PrivateData: ev.PrivateData})
	}
	return &UDService{Addr: raddr, AH: AddressHandle{DGID: GIDFromAddr(raddr.Addr()), HopLimit: 64, Port: d.local.Port()},
		QPN: ev.QP.DestQPN, QKey: ev.QKey, PrivateData: ev.PrivateData}, nil
}

// dispatchSIDR hands a SIDR event to its resolve or request; false if it is not one. The caller holds mu.
func (m *cmDevice) dispatchSIDR(now time.Time, ev cm.Event) bool {
	if ev.Kind == cm.EventSIDRRequest {
		m.sidrRequest(now, ev)
		return true
	}
	if ch := m.resolves[ev.ID]; ch != nil {
		delete(m.resolves, ev.ID)
		select {
		case ch <- ev:
		default:
		}
		return true
	}
	if m.udReqs[ev.ID] != nil {
		// A request the program did not answer in time: the engine refused it, and take now finds
		// it gone.
		delete(m.udReqs, ev.ID)
		return true
	}
	return false
}

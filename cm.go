package goroce

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/goroce/goroce/internal/cm"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire/mad"
)

// The RDMA connection manager: connections set up the way librdmacm's applications set them up (rping,
// perftest -R, rdma_server and rdma_client, NVMe over Fabrics), as Go programs expect a connection:
//
//	ln, err := dev.Listen(7471, nil)               // rdma_bind_addr, rdma_listen
//	c, err := ln.Accept(ctx)                       // rdma_get_cm_event(CONNECT_REQUEST), rdma_accept, ESTABLISHED
//	c, err := dev.Dial(ctx, "10.0.0.2:7471", nil)  // rdma_resolve_addr/route, rdma_connect, ESTABLISHED
//	c.QP().PostSend(...)                           // a connected RC QP with its CQs
//	err = c.Close()                                // rdma_disconnect: DREQ
//	<-c.Done()                                     // RDMA_CM_EVENT_DISCONNECTED: the peer's DREQ
//
// On the wire this is the InfiniBand CM of IBTA Vol 1 chapter 12: MADs in UD SENDs to QP1 (12.6:
// REQ, MRA, REJ, REP, RTU, DREQ, DREP), resent on their timeouts (12.4.3), with rdma_cm's conventions
// on top: the service ID of RDMA_PS_TCP and a port (IBTA Annex A11), and the CMA header (the IP
// addresses and ports) before the application's private data in the REQ. Package internal/cm is the
// engine; the device feeds it QP1's MADs, sends what it answers, runs its one timer and connects the
// QPs it negotiates.
//
// The device's CA GUID, which REQ and REP carry and a REJ for a timeout names, is derived from its
// address and UDP port (Device.GUID).

// DefaultCMBacklog is the number of connection requests a Listener holds that Accept has not taken
// yet, unless CMOptions.Backlog says otherwise.
const DefaultCMBacklog = cm.DefaultBacklog

// RejectReason is why the peer's CM refused a connection: the reason field of a REJ. IBTA Vol 1
// 12.6.7 (Table 109).
type RejectReason = mad.RejectReason

// Reject reasons a program meets. The others are in package wire/mad.
const (
	// RejectConsumer: the application refused the request (rdma_reject, ConnRequest.Reject).
	RejectConsumer = mad.RejConsumerReject
	// RejectInvalidServiceID: nobody listens on the port (the RDMA counterpart of a TCP RST).
	RejectInvalidServiceID = mad.RejInvalidServiceID
	// RejectTimeout: the peer's CM gave up waiting (for the RTU, or for its application's answer).
	RejectTimeout = mad.RejTimeout
	// RejectStaleConnection: the peer still holds an older connection of the same QP.
	RejectStaleConnection = mad.RejStaleConnection
)

// Errors of the connection manager. They match with errors.Is.
var (
	// ErrConnRefused: the peer rejected the connection (a REJ), as ECONNREFUSED does for TCP. The error
	// is a *RejectError, which carries the reason.
	ErrConnRefused = errors.New("goroce: connection refused")
	// ErrDisconnected: the peer disconnected (its DREQ), or the connection ended under it; Conn.Err
	// says so once Conn.Done is closed.
	ErrDisconnected = errors.New("goroce: connection disconnected by the peer")
	// ErrUnreachable: the peer's CM never answered: the REQ (or the REP) went unanswered through all
	// its retries (IBTA Vol 1 12.4.3; about 100 s with rdma_cm's timeouts). It also matches
	// os.ErrDeadlineExceeded, and its Timeout method reports true, as a net.Dial timeout does. A Dial
	// whose context ends first returns the context's error instead.
	ErrUnreachable error = &timeoutError{"goroce: peer unreachable: its connection manager never answered"}
)

type timeoutError struct{ s string }

func (e *timeoutError) Error() string        { return e.s }
func (e *timeoutError) Timeout() bool        { return true }
func (e *timeoutError) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// RejectError is the error of a connection the peer rejected: the reason, the additional rejection
// information and the private data of its REJ (rdma_reject's, all 148 bytes: chapter 12 carries no
// length). It matches ErrConnRefused with errors.Is.
type RejectError struct {
	Reason      RejectReason
	ARI         []byte // additional rejection information: the GUID of a CM that timed out, a GID...
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("goroce: connection refused: %v (reject reason %d)", e.Reason, uint16(e.Reason))
}

// Is reports whether target is ErrConnRefused.
func (e *RejectError) Is(target error) bool { return target == ErrConnRefused }

// CMOptions are the attributes of a connection the CM sets up: what Dial asks for, what a Listener's
// Accept (or ConnRequest.Accept) answers with, and the queue pair either uses. Every field means what
// it says, zero included, except where its comment says otherwise: start from DefaultCMOptions and
// change what differs. A nil *CMOptions means the defaults. The numbers are rdma_conn_param's.
type CMOptions struct {
	// PD is the protection domain of the queue pair the connection creates, whose regions its work
	// requests use. nil creates one for the connection (Conn.PD), closed by Conn.Close once no region
	// remains in it.
	PD *PD
	// QP, if set, is the caller's queue pair (RC or UC, in RESET or INIT, on this device): the CM
	// connects it, as rdma_cm connects a QP made with rdma_create_qp. A program posts its first
	// receives on a QP of its own before Dial or Accept (QP.Init, then QP.PostRecv), so that a SEND
	// the peer sends at once finds them. The caller keeps it: Conn.Close disconnects it (it enters
	// the error state) and does not destroy it. nil creates a QP (Conn.QP) from QPInit on PD, which
	// Conn.Close destroys.
	QP *QP
	// QPInit is the creation parameters of the QP the connection creates when QP is nil: Type RC unless
	// UC is asked; nil CQs mean one CQ of MaxSendWR+MaxRecvWR entries for both, which Conn.Close
	// destroys.
	QPInit QPInit
	// PrivateData is sent to the peer: up to 56 bytes in the REQ (Dial: 92 less rdma_cm's 36-byte
	// header), up to 196 in the REP (Accept). The peer reads all of them, zero-padded.
	PrivateData []byte
	// ResponderResources is how many RDMA READs and atomics this side takes in flight as responder;
	// InitiatorDepth how many it issues (at most the peer's ResponderResources, which the CM
	// enforces). 0 refuses the peer's READs, or forbids this side's. IBTA Vol 1 12.6.5, 12.6.8.
	ResponderResources, InitiatorDepth uint8
	// RetryCount is the transport retry count of both QPs (Dial; 0..7).
	RetryCount uint8
	// RNRRetryCount is how many times the peer's QP resends after an RNR NAK from this side: 7 retries
	// forever (0..7). The REQ carries it for the passive QP, the REP for the active one.
	RNRRetryCount uint8
	// MinRNRTimer is the RNR NAK timer code this side asks the peer to wait: 12 is 0.64 ms.
	MinRNRTimer uint8
	// Timeout is this QP's local ACK timeout code, 4.096 us * 2^Timeout. 0 takes the CM's: the peer's
	// CA ACK delay plus twice the path's packet lifetime (19, 2.1 s, with rdma_cm's values and an
	// rxe peer), as rdma_cm sets it.
	Timeout uint8
	// MTU is the path MTU (Dial); 0 chooses the largest the link toward the peer allows. The passive
	// side takes the REQ's.
	MTU MTU
	// Access is what the peer may do to this side's regions through the connection.
	Access Access
	// Backlog bounds the requests a Listener holds that Accept has not taken (Listen only); beyond
	// it requests are dropped and the peer resends them. 0 means DefaultCMBacklog.
	Backlog int
}

// DefaultCMOptions returns the defaults: a new PD, QP and CQ; 16 READs and atomics in flight each way;
// RetryCount 7; RNRRetryCount 7 (rping's and perftest's); MinRNRTimer 12; the CM's Timeout; the largest
// MTU; every remote access right; DefaultCMBacklog.
func DefaultCMOptions() CMOptions {
	return CMOptions{ResponderResources: 16, InitiatorDepth: 16, RetryCount: 7, RNRRetryCount: 7, MinRNRTimer: 12,
		Access: RemoteWrite | RemoteRead | RemoteAtomic}
}

// cmaPrivateDataLen is what an rdma_cm REQ leaves the application: 92 bytes less the CMA header.
const cmaPrivateDataLen = mad.REQPrivateDataLen - mad.CMAHeaderLen

// cmDevice is the device's CM: the engine, the connections and listeners it serves, and the goroutine
// that runs the engine's timer. mu serializes every use of the engine; it is taken by API calls, by the
// datapath's goroutine that received a MAD (Config.GSI), by the timer goroutine and by a passive QP's
// first packet (NotifyReceive), none of them holding another lock. Lock order: mu, then a QP's and a
// port's locks (the CM connects QPs and sends MADs under mu); nothing that holds those takes mu.
type cmDevice struct {
	d    *Device
	kick chan struct{} // cap 1: the deadline moved earlier
	done chan struct{}
	wg   sync.WaitGroup

	mu        sync.Mutex
	eng       *cm.Engine
	closed    bool
	conns     map[cm.ConnID]*Conn
	reqs      map[cm.ConnID]*ConnRequest // requests handed to a listener and not answered
	listeners map[uint64]*Listener
	// UD services (sidr.go): listeners by service ID, SIDR requests handed to a ManualAccept
	// listener and not answered, and ResolveUD's waiting for their answer.
	udListeners map[uint64]*UDListener
	udReqs      map[cm.ConnID]*UDRequest
	resolves    map[cm.ConnID]chan cm.Event
	armed       time.Time
	rng         *rand.Rand
	buf         [mad.Len]byte
}

// deriveGUID returns the CA GUID of a device at a: EUI-64 shaped, unicast and locally administered
// (the U/L bit set), from a hash of the address and port. rxe derives its GUID from its interface's
// MAC address, which goroce does not have (it is a UDP socket, and devices on one interface would
// share one); the address and port are what tell goroce devices apart, and the GUID stays the same
// when a device is opened again there, as a NIC's does.
func deriveGUID(a netip.AddrPort) uint64 {
	var b [18]byte
	ip := a.Addr().WithZone("").As16()
	copy(b[:], ip[:])
	binary.BigEndian.PutUint16(b[16:], a.Port())
	h := sha256.Sum256(b[:])
	g := binary.BigEndian.Uint64(h[:8])
	return g&^(1<<56) | 1<<57 // first byte: multicast bit clear, locally administered bit set
}

// GUID returns the device's CA GUID, as ibv_get_device_guid does: what its CM puts in REQs and REPs.
// goroce derives it from the device's address and UDP port, locally administered (see deriveGUID).
func (d *Device) GUID() uint64 { return d.guid }

// newCMDevice returns the CM of d, which takes no MAD until start.
func newCMDevice(d *Device) *cmDevice {
	return &cmDevice{
		d:         d,
		kick:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		conns:     map[cm.ConnID]*Conn{},
		reqs:      map[cm.ConnID]*ConnRequest{},
		listeners: map[uint64]*Listener{},

		udListeners: map[uint64]*UDListener{},
		udReqs:      map[cm.ConnID]*UDRequest{},
		resolves:    map[cm.ConnID]chan cm.Event{},
	}
}

// start creates the engine, once the device knows its address, and starts the timer.
func (m *cmDevice) start() {
	seed := rand.Uint64() | 1
	m.mu.Lock()
	m.eng = cm.NewEngine(cm.Config{LocalGID: m.d.local.Addr().WithZone(""), CAGUID: m.d.guid, Seed: seed})
	m.rng = rand.New(rand.NewPCG(seed, seed>>1))
	m.mu.Unlock()
	m.wg.Add(1)
	go m.run()
}

// run is the CM's timer: one timer on the device's clock, re-armed at the engine's next deadline.
func (m *cmDevice) run() {
	defer m.wg.Done()
	clock := m.d.clock
	t := clock.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		m.mu.Lock()
		next := m.eng.NextDeadline()
		m.armed = next
		m.mu.Unlock()
		now := clock.Now()
		if !next.IsZero() && !next.After(now) {
			m.advance()
			continue
		}
		if next.IsZero() {
			t.Stop()
		} else {
			t.Reset(next.Sub(now))
		}
		select {
		case <-m.done:
			return
		case <-m.kick:
		case <-t.C():
			m.advance()
		}
	}
}

func (m *cmDevice) advance() {
	m.mu.Lock()
	if !m.closed {
		now := m.d.clock.Now()
		m.eng.Advance(now)
		m.flush(now)
	}
	m.mu.Unlock()
}

// handleMAD is the datapath's Config.GSI: a MAD for QP1.
func (m *cmDevice) handleMAD(from netip.AddrPort, b []byte, now time.Time) {
	m.mu.Lock()
	if m.eng != nil && !m.closed {
		m.eng.HandleMAD(now, from.Addr().Unmap(), b)
		m.flush(now)
	}
	m.mu.Unlock()
}

// flush sends the MADs the engine queued, to QP1 of the peer at this device's own UDP port (4791 for
// every RoCEv2 device), hands out its events, and tells the timer when its deadline moved earlier.
// The caller holds mu.
func (m *cmDevice) flush(now time.Time) {
	for {
		sent := false
		for {
			to, b, ok := m.eng.PollMAD(m.buf[:0])
			if !ok {
				break
			}
			sent = true
			_ = m.d.dp.SendMAD(netip.AddrPortFrom(to, m.d.local.Port()), b, now)
		}
		ev, ok := m.eng.PollEvent()
		if !ok && !sent {
			break
		}
		if ok {
			m.dispatch(now, ev)
		}
	}
	if next := m.eng.NextDeadline(); !next.IsZero() && (m.armed.IsZero() || next.Before(m.armed)) {
		m.armed = next
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
}

// dispatch hands an engine event to the listener, request or connection it concerns. The caller
// holds mu; nothing here blocks.
func (m *cmDevice) dispatch(now time.Time, ev cm.Event) {
	if ev.Kind == cm.EventRequest {
		m.request(now, ev)
		return
	}
	if m.dispatchSIDR(now, ev) {
		return
	}
	if m.reqs[ev.ID] != nil {
		// A request the application did not answer in time: the engine rejected it, and take now
		// finds it gone.
		delete(m.reqs, ev.ID)
		return
	}
	c := m.conns[ev.ID]
	if c == nil {
		return
	}
	switch {
	case ev.Kind == cm.EventTimewaitDone:
		delete(m.conns, ev.ID)
	case !c.established:
		if ev.Kind == cm.EventEstablished {
			c.established = true
			c.qp.dq.NotifyReceive(nil)
		}
		select {
		case c.ev <- ev:
		default: // the engine emits at most four events per connection
		}
		switch ev.Kind {
		case cm.EventRejected, cm.EventUnreachable, cm.EventDisconnected:
			c.qpError()
		}
	case ev.Kind == cm.EventDisconnected, ev.Kind == cm.EventRejected:
		// The peer's DREQ (or a REJ, or our DREQ's end): the QP enters the error state, so that
		// its outstanding work requests complete (flushed) and a waiting program learns of it.
		c.qpError()
		c.end(ErrDisconnected)
	}
}

// request queues a REQ for its listener, or rejects it.
func (m *cmDevice) request(now time.Time, ev cm.Event) {
	l := m.listeners[ev.ServiceID]
	h, err := mad.ParseCMAHeader(ev.PrivateData)
	switch {
	case l == nil: // closed since the engine took the REQ
		_ = m.eng.Reject(now, ev.ID, mad.RejInvalidServiceID, nil)
		return
	case err != nil:
		_ = m.eng.RejectBadCMAHeader(now, ev.ID)
		return
	}
	r := &ConnRequest{m: m, l: l, id: ev.ID, qp: ev.QP,
		local:       netip.AddrPortFrom(m.d.local.Addr(), l.port),
		remote:      netip.AddrPortFrom(ev.Peer, h.SrcPort()),
		privateData: ev.PrivateData[mad.CMAHeaderLen:]}
	if l.q.put(r) {
		m.reqs[ev.ID] = r
	} else {
		_ = m.eng.Reject(now, ev.ID, mad.RejNoResources, nil)
	}
}

// close ends every connection (an established one gets a DREQ, an attempt a REJ), every listener and
// the timer goroutine. The device calls it before it closes its sockets.
func (m *cmDevice) close() {
	m.mu.Lock()
	if m.closed || m.eng == nil {
		m.closed = true
		m.mu.Unlock()
		return
	}
	now := m.d.clock.Now()
	for id, c := range m.conns {
		_ = m.eng.Abort(now, id)
		c.end(ErrClosed)
	}
	for id := range m.reqs {
		_ = m.eng.Abort(now, id)
	}
	for _, l := range m.listeners {
		l.closeLocked()
	}
	for id := range m.udReqs {
		_ = m.eng.Abort(now, id)
	}
	for id := range m.resolves {
		_ = m.eng.Abort(now, id)
	}
	for _, l := range m.udListeners {
		l.closeLocked()
	}
	m.flush(now)
	m.closed = true
	m.mu.Unlock()
	close(m.done)
	m.wg.Wait()
}

// ephemeralPort picks a port of the range Linux gives rdma_cm ids bound without one
// (net.ipv4.ip_local_port_range's default), for a Dial's CMA header and a Listen on port 0.
func (m *cmDevice) ephemeralPort() uint16 {
	return uint16(32768 + m.rng.IntN(60999-32768+1))
}

// listenLocked has the engine take requests for port of space, or for a free ephemeral port of it
// when port is 0, and returns the port and its service ID. The caller holds mu.
func (m *cmDevice) listenLocked(space mad.PortSpace, port uint16, backlog int) (uint16, uint64, error) {
	for {
		p := port
		if p == 0 {
			p = m.ephemeralPort()
		}
		sid := mad.ServiceID(space, p)
		err := m.eng.Listen(sid, backlog)
		if err == nil || port != 0 || !errors.Is(err, cm.ErrServiceInUse) {
			return p, sid, err
		}
	}
}

// CMStats are the connection manager's counters (Stats.CM): the MADs by CM attribute, rejections by
// reason, and every MAD dropped by reason. The arrays are indexed by attribute (0 REQ, 1 MRA, 2 REJ,
// 3 REP, 4 RTU, 5 DREQ, 6 DREP, 7 SIDR_REQ, 8 SIDR_REP, 9 LAP, 10 APR), as Linux's cm_tx_msgs and
// cm_rx_msgs, or by reject reason; Each names them.
type CMStats struct {
	Received    uint64     // MADs the CM took from QP1
	Sent        [11]uint64 // MADs sent, by attribute
	Rcvd        [11]uint64 // valid CM MADs received, by attribute
	Retries     [11]uint64 // requests resent after a timeout, by attribute
	Duplicates  [11]uint64 // duplicates received, by attribute
	RejectsSent [35]uint64 // REJs sent, by reason (34: reasons beyond 33)
	RejectsRcvd [35]uint64 // REJs received for a connection, by reason

	Established     uint64 // connections that reached ESTABLISHED
	Unreachable     uint64 // attempts given up: retries exhausted or the application too slow
	StaleRejected   uint64 // REQs and REPs rejected as stale connections
	TimewaitExits   uint64 // connections that left timewait
	SIDRResolved    uint64 // SIDR_REPs received for a SIDR_REQ
	UnknownAnswered uint64 // MADs of no connection answered: a REP with REJ invalid comm ID, a DREQ with DREP

	Dropped              uint64 // every MAD dropped, whatever the reason below
	DropMalformed        uint64 // shorter than 256 bytes or a base version other than 1
	DropNotCM            uint64 // another management class, or not the Send method
	DropClassVersion     uint64 // a CM class version other than 2
	DropUnknownAttribute uint64 // an attribute chapter 12 does not define
	DropUnsupported      uint64 // LAP and APR: no alternate paths on RoCE
	DropUnknownConn      uint64 // a message for a connection the CM does not hold, with no answer due
	DropState            uint64 // a message the connection's state does not take
	DropQPN              uint64 // a DREQ naming another QP than the connection's
	DropReservedQPN      uint64 // a REQ or REP naming QP0 or QP1 as the QP to connect
	DropBacklog          uint64 // a REQ beyond its listener's backlog (the peer resends it)
	DropConnTable        uint64 // a REQ with the most connections held at once (256)
	DropTxQueueFull      uint64 // an outgoing MAD with the queue full
	DropEventQueueFull   uint64 // an event with the queue full (cannot happen)
	TransitionErrors     uint64 // state changes the transition table refused: bugs, always 0
	BuildErrors          uint64 // MADs that would not build: bugs, always 0

	// BadCMAHeader counts REQs and SIDR_REQs for a listener without rdma_cm's header in their private
	// data, refused.
	BadCMAHeader uint64
}

// Each calls fn with every counter's name and value; arrays give their nonzero entries, named by
// attribute or reason ("Sent[ConnectRequest]", "RejectsRcvd[consumer reject]").
func (s *CMStats) Each(fn func(name string, v uint64)) {
	c := cm.Counters(*s)
	c.Each(fn)
}

// stats returns the engine's counters. CMStats has cm.Counters' fields in the same order, so that each
// converts to the other: a field added to one and not the other breaks the build here.
func (m *cmDevice) stats() CMStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return CMStats(m.eng.Counters())
}

// Conn is a connection the CM set up: a connected RC (or UC) queue pair, its CQs, and what the peer
// said in its REQ or REP. It mirrors an rdma_cm_id in the connected state. Its methods are safe for
// concurrent use.
type Conn struct {
	m            *cmDevice
	id           cm.ConnID
	qp           *QP
	pd           *PD
	ownQP, ownPD bool
	cq           *CQ // the CQ the connection created, if it did
	opts         CMOptions
	local        netip.AddrPort
	remote       netip.AddrPort
	private      []byte
	ev           chan cm.Event // the engine's events until the connection is established
	done         chan struct{}

	// Guarded by m.mu.
	established bool
	closed      bool
	err         error
}

// QP returns the connection's queue pair: connected, in RTS.
func (c *Conn) QP() *QP { return c.qp }

// PD returns the protection domain of the connection's queue pair: where its regions go.
func (c *Conn) PD() *PD { return c.pd }

// SendCQ returns the CQ of the queue pair's send completions.
func (c *Conn) SendCQ() *CQ { return c.qp.init.SendCQ }

// RecvCQ returns the CQ of the queue pair's receive completions.
func (c *Conn) RecvCQ() *CQ { return c.qp.init.RecvCQ }

// PrivateData returns the private data the peer sent: the REP's 196 bytes on the active side, the
// REQ's 56 after rdma_cm's header on the passive side, zero-padded (chapter 12 carries no length).
func (c *Conn) PrivateData() []byte { return c.private }

// LocalAddr returns this side's address and rdma_cm port: the listener's, or the port Dial chose.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// RemoteAddr returns the peer's address and rdma_cm port.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// Done returns a channel that is closed when the connection ends: Close, the peer's DREQ
// (RDMA_CM_EVENT_DISCONNECTED), or the device closing. The QP is then in the error state: its
// outstanding work requests complete with ErrFlushed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns nil while the connection is up, and why it ended once Done is closed: ErrDisconnected
// when the peer disconnected, ErrClosed after Close or when the device closed.
func (c *Conn) Err() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.err
}

// Close disconnects, as rdma_disconnect does: the QP enters the error state (outstanding work requests
// are flushed) and a DREQ goes to the peer, which the CM resends until the peer's DREP comes; the
// connection then waits out timewait in the CM while Close has already returned. It destroys the QP,
// the CQ and the PD that the connection created (the PD once no region remains in it); a QP of the
// caller's (CMOptions.QP) stays the caller's to destroy. Close is idempotent.
func (c *Conn) Close() error {
	m := c.m
	m.mu.Lock()
	if c.closed {
		m.mu.Unlock()
		return nil
	}
	c.closed = true
	c.qpError()
	if !m.closed {
		now := m.d.clock.Now()
		if err := m.eng.Disconnect(now, c.id, nil); err != nil {
			_ = m.eng.Abort(now, c.id)
		}
		m.flush(now)
	}
	c.end(ErrClosed)
	m.mu.Unlock()
	c.release()
	return nil
}

// end records why the connection ended and closes Done, once. The caller holds m.mu.
func (c *Conn) end(err error) {
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// qpError moves the QP to the error state, as rdma_disconnect does.
func (c *Conn) qpError() {
	_ = c.qp.dq.Modify(&qp.Attr{State: qp.StateErr}, qp.AttrState, netip.AddrPort{})
}

// release destroys what the connection created.
func (c *Conn) release() {
	if c.ownQP {
		_ = c.qp.Close()
	}
	if c.cq != nil {
		_ = c.cq.Close()
	}
	if c.ownPD {
		_ = c.pd.Close() // ErrBusy while the program's regions remain: they keep the PD
	}
}

// newConn prepares a connection: the caller's QP or a new one, with its PD and CQ.
func (m *cmDevice) newConn(o *CMOptions) (*Conn, error) {
	d := m.d
	c := &Conn{m: m, opts: *o, ev: make(chan cm.Event, 8), done: make(chan struct{})}
	if q := o.QP; q != nil {
		switch {
		case q.dev != d:
			return nil, ErrForeign
		case q.typ != RC && q.typ != UC:
			return nil, fmt.Errorf("%w: a CM connection needs an RC or UC QP, not %v", ErrBadConfig, q.typ)
		}
		if s := q.State(); s != StateReset && s != StateInit {
			return nil, fmt.Errorf("%w: the QP is in %v; the CM connects a QP in RESET or INIT", ErrBadState, s)
		}
		c.qp, c.pd = q, q.pd
		return c, nil
	}
	init := o.QPInit
	switch init.Type {
	case 0:
		init.Type = RC
	case RC, UC:
	default:
		return nil, fmt.Errorf("%w: a CM connection needs an RC or UC QP, not %v", ErrBadConfig, init.Type)
	}
	c.pd = o.PD
	if c.pd == nil {
		pd, err := d.AllocPD()
		if err != nil {
			return nil, err
		}
		c.pd, c.ownPD = pd, true
	} else if c.pd.dev != d {
		return nil, ErrForeign
	}
	if init.SendCQ == nil || init.RecvCQ == nil {
		n := max(init.MaxSendWR, 0) + max(init.MaxRecvWR, 0)
		if init.MaxSendWR == 0 {
			n += 128
		}
		if init.MaxRecvWR == 0 {
			n += 128
		}
		cq, err := d.CreateCQ(n)
		if err != nil {
			c.release()
			return nil, err
		}
		c.cq = cq
		if init.SendCQ == nil {
			init.SendCQ = cq
		}
		if init.RecvCQ == nil {
			init.RecvCQ = cq
		}
	}
	q, err := c.pd.CreateQP(init)
	if err != nil {
		c.release()
		return nil, err
	}
	c.qp, c.ownQP = q, true
	return c, nil
}

// connectQP takes the QP from RESET or INIT to RTS with the attributes the CM agreed on.
func (c *Conn) connectQP(p cm.QPParams) error {
	o := &c.opts
	timeout := o.Timeout
	if timeout == 0 {
		timeout = p.Timeout
	}
	av := qp.AddressHandle{DGID: p.Peer.As16(), TrafficClass: c.qp.tc, HopLimit: p.HopLimit, FlowLabel: p.FlowLabel}
	err := c.qp.dq.Connect(&qp.ConnectParams{AccessFlags: wireAccess(o.Access), AV: av, PathMTU: p.PathMTU,
		DestQPN: p.DestQPN, RQPSN: p.RQPSN, SQPSN: p.SQPSN, Timeout: timeout, RetryCnt: p.RetryCount,
		RNRRetry: p.RNRRetry, MinRNRTimer: o.MinRNRTimer, MaxRdAtomic: p.MaxRdAtomic, MaxDestRdAtomic: p.MaxDestRdAtomic},
		netip.AddrPortFrom(p.Peer, c.m.d.local.Port()))
	if err != nil && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: connecting the QP: %v", ErrBadConfig, err)
	}
	return err
}

// cmOptions returns o, or the defaults for nil.
func cmOptions(o *CMOptions) *CMOptions {
	if o == nil {
		d := DefaultCMOptions()
		return &d
	}
	return o
}

// Dial connects to the listener at address, "host:port" (an IP address or a name, and the rdma_cm
// port: an RDMA_PS_TCP service, as rping's -p), and returns the connection once it is established:
// the REQ sent, the REP taken, the QP connected with what both sides agreed on (IBTA Vol 1 12.6.5,
// 12.6.8), the RTU sent. It mirrors rdma_resolve_addr, rdma_resolve_route, rdma_connect and the wait
// for RDMA_CM_EVENT_ESTABLISHED. opts nil means DefaultCMOptions.
//
// The REQ carries rdma_cm's header (this device's address, the peer's, and a port of this side)
// before opts.PrivateData, so that librdmacm peers take it. Both devices receive on the same UDP port:
// DefaultPort for every RoCEv2 device; goroce devices on another port reach only their like.
//
// The errors match with errors.Is: ErrConnRefused for a REJ (a *RejectError: nobody listens, or the
// application refused), ctx's error when ctx ends first (the attempt is then abandoned, with a REJ to
// the peer), ErrUnreachable when the peer never answers, ErrBadConfig for an address or options that
// cannot be used, ErrClosed when the device closes.
func (d *Device) Dial(ctx context.Context, address string, opts *CMOptions) (*Conn, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	o := cmOptions(opts)
	raddr, err := d.resolveCM(ctx, address)
	if err != nil {
		return nil, err
	}
	switch {
	case len(o.PrivateData) > cmaPrivateDataLen:
		return nil, fmt.Errorf("%w: %d bytes of private data; a REQ carries %d", ErrBadConfig, len(o.PrivateData), cmaPrivateDataLen)
	case o.RetryCount > 7 || o.RNRRetryCount > 7:
		return nil, fmt.Errorf("%w: retry counts are 0..7", ErrBadConfig)
	case o.MTU != 0 && !o.MTU.Valid():
		return nil, fmt.Errorf("%w: MTU code %d", ErrBadConfig, o.MTU)
	}
	m := d.cm
	c, err := m.newConn(o)
	if err != nil {
		return nil, err
	}
	mtu := o.MTU
	if mtu == 0 {
		mtu = d.dp.MaxMTU(raddr.Addr())
	}
	transport := mad.TransportRC
	if c.qp.typ == UC {
		transport = mad.TransportUC
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		c.release()
		return nil, ErrClosed
	}
	c.local = netip.AddrPortFrom(d.local.Addr(), m.ephemeralPort())
	c.remote = raddr
	hdr := mad.CMAHeaderFields{SrcPort: c.local.Port(), SrcAddr: d.local.Addr(), DstAddr: raddr.Addr()}
	now := d.clock.Now()
	id, err := m.eng.Connect(now, &cm.ConnectParams{
		ServiceID: mad.ServiceID(mad.PortSpaceTCP, raddr.Port()), Peer: raddr.Addr(), Transport: transport,
		QPN: c.qp.qpn, StartingPSN: d.dp.RandomPSN(), ResponderResources: o.ResponderResources,
		InitiatorDepth: o.InitiatorDepth, RetryCount: o.RetryCount, RNRRetryCount: o.RNRRetryCount,
		PathMTU: mtu, TrafficClass: c.qp.tc, PrivateData: hdr.Append(nil, o.PrivateData)})
	if err != nil {
		m.mu.Unlock()
		c.release()
		return nil, cmError(err)
	}
	c.id = id
	m.conns[id] = c
	m.flush(now)
	m.mu.Unlock()

	connected := false
	fail := func(err error) (*Conn, error) {
		m.mu.Lock()
		if !m.closed {
			now := d.clock.Now()
			_ = m.eng.Abort(now, id)
			m.flush(now)
		}
		delete(m.conns, id)
		if connected {
			c.qpError()
		}
		c.end(err)
		m.mu.Unlock()
		c.release()
		return nil, fmt.Errorf("goroce: dialing %v: %w", raddr, err)
	}
	for {
		var ev cm.Event
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-c.done:
			return fail(ErrClosed)
		case ev = <-c.ev:
		}
		switch ev.Kind {
		case cm.EventReply:
			c.private = ev.PrivateData
			if err := c.connectQP(ev.QP); err != nil {
				return fail(err)
			}
			connected = true
			m.mu.Lock()
			now := d.clock.Now()
			err := m.eng.Confirm(now, id, nil)
			if err == nil {
				c.established = true
			}
			m.flush(now)
			m.mu.Unlock()
			if err != nil {
				return fail(cmError(err))
			}
			return c, nil
		case cm.EventRejected:
			return fail(&RejectError{Reason: ev.Reason, ARI: ev.ARI, PrivateData: ev.PrivateData})
		case cm.EventUnreachable:
			return fail(ErrUnreachable)
		}
	}
}

// resolveCM turns "host:port" into the peer's address and rdma_cm port, resolving a name to an
// address of the device's family.
func (d *Device) resolveCM(ctx context.Context, address string) (netip.AddrPort, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %q: %v", ErrBadConfig, address, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return netip.AddrPort{}, fmt.Errorf("%w: %q: the port is 1..65535", ErrBadConfig, address)
	}
	v4 := d.local.Addr().Unmap().Is4()
	ip, err := netip.ParseAddr(host)
	if err != nil {
		network := "ip6"
		if v4 {
			network = "ip4"
		}
		ips, lerr := net.DefaultResolver.LookupNetIP(ctx, network, host)
		if lerr != nil || len(ips) == 0 {
			return netip.AddrPort{}, fmt.Errorf("%w: resolving %q: %v", ErrBadConfig, host, lerr)
		}
		ip = ips[0]
	}
	ip = ip.Unmap()
	if ip.Is4() != v4 {
		return netip.AddrPort{}, fmt.Errorf("%w: %v is not of the device's IP version (%v)", ErrBadConfig, ip, d.local.Addr())
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

// cmError maps the engine's refusals to the API's errors.
func cmError(err error) error {
	switch {
	case errors.Is(err, cm.ErrTooManyConns):
		return fmt.Errorf("%w: %v", ErrBusy, err)
	case errors.Is(err, cm.ErrBadParam):
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	case errors.Is(err, cm.ErrState), errors.Is(err, cm.ErrUnknownConn):
		return fmt.Errorf("%w: the connection is over (%v)", ErrDisconnected, err)
	}
	return err
}

// Listener takes connection requests for an rdma_cm port (RDMA_PS_TCP): an rdma_cm_id after
// rdma_listen. Its methods are safe for concurrent use.
type Listener struct {
	m    *cmDevice
	port uint16
	sid  uint64
	opts CMOptions
	q    requestQueue[*ConnRequest]
}

// Listen starts taking connection requests for port (0 picks a free one; Addr says which), as
// rdma_bind_addr and rdma_listen do on an RDMA_PS_TCP id. A REQ for the port waits for Accept or
// Request; beyond opts.Backlog of them, the peer's CM resends. A REQ for a port nobody listens on is
// rejected with RejectInvalidServiceID. opts (nil: DefaultCMOptions) are what Accept answers with;
// its PD and QP fields must be nil, as each connection needs a QP of its own.
func (d *Device) Listen(port uint16, opts *CMOptions) (*Listener, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	o := *cmOptions(opts)
	if o.QP != nil {
		return nil, fmt.Errorf("%w: a listener's connections each need a QP of their own: pass it to ConnRequest.Accept", ErrBadConfig)
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
	port, sid, err := m.listenLocked(mad.PortSpaceTCP, port, o.Backlog)
	if err != nil {
		return nil, fmt.Errorf("goroce: listening on rdma_cm port %d: %w", port, syscall.EADDRINUSE)
	}
	l := &Listener{m: m, port: port, sid: sid, opts: o}
	l.q.init(o.Backlog)
	m.listeners[sid] = l
	return l, nil
}

// Addr returns the address and rdma_cm port the listener takes requests on.
func (l *Listener) Addr() netip.AddrPort { return netip.AddrPortFrom(l.m.d.local.Addr(), l.port) }

// Request waits for the next connection request, ctx's end or the listener's Close
// (RDMA_CM_EVENT_CONNECT_REQUEST). The program answers it with Accept or Reject within a minute,
// after which the CM rejects it for the program (reason timeout).
func (l *Listener) Request(ctx context.Context) (*ConnRequest, error) { return l.q.next(ctx) }

// Accept waits for the next connection request and accepts it with the listener's options, as a TCP
// listener's Accept does: it returns the connection once established (the peer's RTU, or its first
// packet on the QP). ctx bounds the whole wait.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	for {
		r, err := l.Request(ctx)
		if err != nil {
			return nil, err
		}
		o := l.opts
		c, err := r.Accept(ctx, &o)
		if errors.Is(err, errRequestGone) {
			continue // the request timed out or was withdrawn meanwhile: take the next one
		}
		return c, err
	}
}

// Close stops taking requests: later REQs for the port are rejected (RejectInvalidServiceID), and the
// requests queued and not taken by Request are rejected (RejectConsumer). Requests taken already stay
// the program's to answer; connections accepted stay up.
func (l *Listener) Close() error {
	l.m.mu.Lock()
	l.closeLocked()
	l.m.flush(l.m.d.clock.Now())
	l.m.mu.Unlock()
	return nil
}

func (l *Listener) closeLocked() {
	m := l.m
	l.q.close(func() {
		m.eng.Unlisten(l.sid)
		delete(m.listeners, l.sid)
	}, func(r *ConnRequest) {
		_ = m.eng.Reject(m.d.clock.Now(), r.id, mad.RejConsumerReject, nil)
	})
}

// requestQueue holds a listener's requests until the program takes them (Request), and refuses those
// it did not take when the listener closes. A request is claimed for an answer with take, under
// cmDevice.mu, so that Close, the program and the CM's timeout answer each at most once.
type requestQueue[R interface{ take() bool }] struct {
	reqs   chan R // nil: the listener answers every request itself
	closed chan struct{}
	once   sync.Once
}

// init makes q hold up to backlog requests; 0 makes it hold none.
func (q *requestQueue[R]) init(backlog int) {
	q.closed = make(chan struct{})
	if backlog > 0 {
		q.reqs = make(chan R, backlog)
	}
}

// put queues r, or reports that the backlog is full.
func (q *requestQueue[R]) put(r R) bool {
	select {
	case q.reqs <- r:
		return true
	default:
		return false
	}
}

// next waits for the next request, ctx's end or close.
func (q *requestQueue[R]) next(ctx context.Context) (R, error) {
	var none R
	select {
	case r := <-q.reqs:
		return r, nil
	case <-q.closed:
		return none, ErrClosed
	case <-ctx.Done():
		return none, ctx.Err()
	}
}

// close, the first time, runs stop, wakes the waiters of next and refuses every request queued and
// not yet taken. The caller holds cmDevice.mu.
func (q *requestQueue[R]) close(stop func(), refuse func(R)) {
	q.once.Do(func() {
		stop()
		close(q.closed)
		for {
			select {
			case r := <-q.reqs:
				if r.take() {
					refuse(r)
				}
			default:
				return
			}
		}
	})
}

// errRequestGone is the error of an answer to a request the CM no longer holds.
var errRequestGone = fmt.Errorf("%w: the request was answered, withdrawn or timed out", ErrBadState)

// ConnRequest is a peer's connection request (a REQ) waiting for the program's answer: an rdma_cm_id
// from RDMA_CM_EVENT_CONNECT_REQUEST. Answer it once, with Accept or Reject.
type ConnRequest struct {
	m           *cmDevice
	l           *Listener
	id          cm.ConnID
	qp          cm.QPParams
	local       netip.AddrPort
	remote      netip.AddrPort
	privateData []byte
}

// PrivateData returns the private data of the REQ after rdma_cm's header: 56 bytes, zero-padded.
func (r *ConnRequest) PrivateData() []byte { return r.privateData }

// RemoteAddr returns the peer's address and its rdma_cm port (from rdma_cm's header).
func (r *ConnRequest) RemoteAddr() netip.AddrPort { return r.remote }

// LocalAddr returns the listener's address and port.
func (r *ConnRequest) LocalAddr() netip.AddrPort { return r.local }

// PathMTU returns the path MTU the REQ asks for, which the connection will use.
func (r *ConnRequest) PathMTU() MTU { return r.qp.PathMTU }

// InitiatorDepth returns how many READs and atomics the peer will issue in flight: how many this side
// needs as responder resources.
func (r *ConnRequest) InitiatorDepth() uint8 { return r.qp.MaxDestRdAtomic }

// ResponderResources returns how many READs and atomics the peer takes in flight: the most this side
// may issue.
func (r *ConnRequest) ResponderResources() uint8 { return r.qp.MaxRdAtomic }

// take claims the request for an answer; false if it was answered, withdrawn or timed out. The caller
// holds m.mu.
func (r *ConnRequest) take() bool {
	if r.m.reqs[r.id] != r {
		return false
	}
	delete(r.m.reqs, r.id)
	return true
}

// Reject refuses the request with RejectConsumer and private data p (up to 148 bytes), as rdma_reject
// does: the peer's Dial fails with a *RejectError carrying them.
func (r *ConnRequest) Reject(p []byte) error {
	if len(p) > mad.REJPrivateDataLen {
		return fmt.Errorf("%w: %d bytes of private data; a REJ carries %d", ErrBadConfig, len(p), mad.REJPrivateDataLen)
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
	err := m.eng.Reject(now, r.id, mad.RejConsumerReject, p)
	m.flush(now)
	return cmError(err)
}

// Accept accepts the request, as rdma_accept does: the QP (opts.QP, or one made from opts) is connected
// with what the REQ offers and opts allow, before the REP leaves, so that the peer may send as soon
// as it has the REP; Accept returns once the connection is established (the RTU, or the peer's first
// packet on the QP, IBTA Vol 1 12.9.6). opts nil means DefaultCMOptions. If ctx ends first, the
// connection is rejected and ctx's error returned.
func (r *ConnRequest) Accept(ctx context.Context, opts *CMOptions) (*Conn, error) {
	o := cmOptions(opts)
	if len(o.PrivateData) > mad.REPPrivateDataLen {
		return nil, fmt.Errorf("%w: %d bytes of private data; a REP carries %d", ErrBadConfig, len(o.PrivateData), mad.REPPrivateDataLen)
	}
	if o.RNRRetryCount > 7 {
		return nil, fmt.Errorf("%w: the RNR retry count is 0..7", ErrBadConfig)
	}
	m := r.m
	c, err := m.newConn(o)
	if err != nil {
		m.mu.Lock()
		if !m.closed && r.take() {
			now := m.d.clock.Now()
			_ = m.eng.Reject(now, r.id, mad.RejNoResources, nil)
			m.flush(now)
		}
		m.mu.Unlock()
		return nil, err
	}
	c.local, c.remote, c.private = r.local, r.remote, r.privateData
	d := m.d
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		c.release()
		return nil, ErrClosed
	case !r.take():
		m.mu.Unlock()
		c.release()
		return nil, errRequestGone
	}
	now := d.clock.Now()
	p, err := m.eng.Accept(now, r.id, &cm.AcceptParams{QPN: c.qp.qpn, StartingPSN: d.dp.RandomPSN(),
		ResponderResources: o.ResponderResources, InitiatorDepth: o.InitiatorDepth, RNRRetryCount: o.RNRRetryCount,
		PrivateData: o.PrivateData})
	if err == nil {
		// The QP is connected before the REP leaves (flush): the peer may send once it has the REP.
		if err = c.connectQP(p); err != nil {
			_ = m.eng.Reject(now, r.id, mad.RejConsumerReject, nil)
		}
	}
	if err != nil {
		m.flush(now)
		m.mu.Unlock()
		c.release()
		return nil, cmError(err)
	}
	c.id = r.id
	m.conns[r.id] = c
	c.qp.dq.NotifyReceive(func() { m.establish(c) })
	m.flush(now)
	m.mu.Unlock()

	fail := func(err error) (*Conn, error) {
		m.mu.Lock()
		if !m.closed {
			now := d.clock.Now()
			_ = m.eng.Abort(now, r.id)
			m.flush(now)
		}
		c.qp.dq.NotifyReceive(nil)
		c.qpError()
		c.end(err)
		m.mu.Unlock()
		c.release()
		return nil, fmt.Errorf("goroce: accepting %v: %w", r.remote, err)
	}
	for {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-c.done:
			return fail(ErrClosed)
		case ev := <-c.ev:
			switch ev.Kind {
			case cm.EventEstablished:
				return c, nil
			case cm.EventRejected:
				return fail(&RejectError{Reason: ev.Reason, ARI: ev.ARI, PrivateData: ev.PrivateData})
			case cm.EventUnreachable:
				return fail(ErrUnreachable)
			case cm.EventDisconnected:
				return fail(ErrDisconnected)
			}
		}
	}
}

// establish is a passive QP's first packet before its RTU: the connection is in use, so it is
// established (the communication established event; IBTA Vol 1 12.9.6, Linux ib_cm_notify).
func (m *cmDevice) establish(c *Conn) {
	m.mu.Lock()
	if !m.closed && !c.established && m.conns[c.id] == c {
		now := m.d.clock.Now()
		_ = m.eng.Establish(now, c.id)
		m.flush(now)
	}
	m.mu.Unlock()
}

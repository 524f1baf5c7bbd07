package cm

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// ConnID names a connection (or a SIDR resolution) to the engine's owner. It is the connection's local
// communication ID on the wire (a SIDR_REQ's request ID): random, never 0, unique among the
// connections the engine holds.
type ConnID uint32

// Config configures an Engine. The zero value of a field means its default.
type Config struct {
	// LocalGID is the device's GID (on RoCEv2 its IP address, IPv4 or IPv4-mapped alike): the REQs
	// this engine sends name it as their path's local GID, and a REQ naming another GID as its remote
	// one is rejected with RejInvalidGID. The zero Addr skips that check.
	LocalGID netip.Addr
	// CAGUID is the channel adapter's GUID (rxe derives it from the MAC address): REQ and REP carry
	// it, and it is the ARI of the REJ a timeout sends.
	CAGUID uint64
	// MaxConns bounds the connections held at once, in every state (DefaultMaxConns).
	MaxConns int
	// Backlog is a listener's default backlog (DefaultBacklog).
	Backlog int
	// PacketLifeTime is the path's packet lifetime code (DefaultPacketLifeTime).
	PacketLifeTime uint8
	// CMResponseTimeout is the response timeout code REQs announce for both CMs (DefaultCMResponseTimeout).
	CMResponseTimeout uint8
	// MaxCMRetries is how many times a REQ, DREQ or SIDR_REQ is resent (DefaultMaxCMRetries).
	MaxCMRetries uint8
	// ACKDelay is this CA's ACK delay code, which REPs report (DefaultACKDelay).
	ACKDelay uint8
	// MRATimeout is the service timeout code of the MRAs sent while the owner decides (DefaultMRATimeout).
	MRATimeout uint8
	// OwnerTimeout bounds the owner's answer to a request or a reply (DefaultOwnerTimeout).
	OwnerTimeout time.Duration
	// Seed seeds the communication and transaction IDs, so that a test replays exactly; 0 picks a
	// random seed.
	Seed uint64
}

func (c *Config) setDefaults() {
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Backlog <= 0 {
		c.Backlog = DefaultBacklog
	}
	if c.PacketLifeTime == 0 {
		c.PacketLifeTime = DefaultPacketLifeTime
	}
	if c.CMResponseTimeout == 0 {
		c.CMResponseTimeout = DefaultCMResponseTimeout
	}
	if c.MaxCMRetries == 0 {
		c.MaxCMRetries = DefaultMaxCMRetries
	}
	if c.ACKDelay == 0 {
		c.ACKDelay = DefaultACKDelay
	}
	if c.MRATimeout == 0 {
		c.MRATimeout = DefaultMRATimeout
	}
	if c.OwnerTimeout <= 0 {
		c.OwnerTimeout = DefaultOwnerTimeout
	}
	c.PacketLifeTime = min(c.PacketLifeTime, 31)
	c.CMResponseTimeout = min(c.CMResponseTimeout, 31)
	c.MaxCMRetries = min(c.MaxCMRetries, 15)
	c.ACKDelay = min(c.ACKDelay, 31)
	c.MRATimeout = min(c.MRATimeout, 31)
	if c.Seed == 0 {
		c.Seed = rand.Uint64() | 1
	}
}

// Errors of the owner's calls. They match with errors.Is.
var (
	ErrUnknownConn  = errors.New("cm: no such connection")
	ErrState        = errors.New("cm: not allowed in the connection's state")
	ErrTooManyConns = errors.New("cm: too many connections (Config.MaxConns)")
	ErrServiceInUse = errors.New("cm: service ID already has a listener")
	ErrBadParam     = errors.New("cm: invalid parameter")
)

// maxEventsPerConn bounds the events one connection queues over its life: request or reply,
// established, disconnected, timewait done. A connection is freed only once its events are polled, so
// an event queue of maxEventsPerConn × MaxConns never overflows.
const maxEventsPerConn = 4

// txSlack is the room the outgoing queue has beyond one MAD per connection: stateless answers (REJ to
// an unknown service, DREP to an unknown DREQ) between two drains.
const txSlack = 64

// Engine is the communication manager of one device: every connection the device's QP1 sets up or
// tears down, active and passive, and its listeners. It does no I/O and reads no clock: see the
// package documentation for how a device drives it. An Engine is not safe for concurrent use; its
// owner serializes the calls (one goroutine, or a lock).
type Engine struct {
	cfg   Config
	rng   *rand.Rand
	tidHi uint64 // the high half of the transaction IDs of the requests this engine starts

	conns      map[ConnID]*conn
	byRemote   map[remoteKey]*conn // passive and connected conns by the peer's comm ID: duplicates
	byRemoteQP map[qpKey]*conn     // live conns by the peer's QP: stale connections
	sidrByPeer map[sidrKey]*conn   // passive SIDR resolutions: duplicates
	listeners  map[uint64]*listener

	tx      ring[outMAD]
	events  ring[Event]
	scratch [mad.Len]byte // where answers that are not kept are built
	c       Counters
}

type remoteKey struct {
	commID uint32
	guid   uint64
}

type qpKey struct {
	qpn  wire.QPN
	guid uint64
}

type sidrKey struct {
	requestID uint32
	peer      [16]byte
}

type outMAD struct {
	to netip.Addr
	b  [mad.Len]byte
}

// listener is a service ID someone accepts connections on.
type listener struct {
	serviceID uint64
	backlog   int
	pending   int // requests handed to the owner and not answered yet
}

// NewEngine returns an engine with no connections and no listeners.
func NewEngine(cfg Config) *Engine {
	cfg.setDefaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	e := &Engine{
		cfg:        cfg,
		rng:        rng,
		tidHi:      uint64(rng.Uint32()) << 32,
		conns:      make(map[ConnID]*conn),
		byRemote:   make(map[remoteKey]*conn),
		byRemoteQP: make(map[qpKey]*conn),
		sidrByPeer: make(map[sidrKey]*conn),
		listeners:  make(map[uint64]*listener),
	}
	e.tx.max = cfg.MaxConns + txSlack
	e.events.max = cfg.MaxConns * maxEventsPerConn
	return e
}

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Counters returns the engine's counters.
func (e *Engine) Counters() Counters { return e.c }

// Len returns the number of connections the engine holds, in every state.
func (e *Engine) Len() int { return len(e.conns) }

// State returns a connection's state, and false if the engine holds no such connection.
func (e *Engine) State(id ConnID) (State, bool) {
	c := e.conns[id]
	if c == nil {
		return StateIdle, false
	}
	return c.state, true
}

// Listen starts accepting connection requests and SIDR requests for serviceID (mad.ServiceID makes
// rdma_cm's). backlog bounds the requests the owner has not answered yet; beyond it a REQ is dropped
// and counted (DropBacklog) so that the active side retries later, as Linux's rdma_cm does when its
// listen backlog is full. backlog 0 means Config.Backlog.
func (e *Engine) Listen(serviceID uint64, backlog int) error {
	if _, ok := e.listeners[serviceID]; ok {
		return ErrServiceInUse
	}
	if backlog <= 0 {
		backlog = e.cfg.Backlog
	}
	e.listeners[serviceID] = &listener{serviceID: serviceID, backlog: backlog}
	return nil
}

// Unlisten stops accepting requests for serviceID: later REQs get REJ invalid service ID. Requests
// already handed to the owner stay its own to answer.
func (e *Engine) Unlisten(serviceID uint64) {
	delete(e.listeners, serviceID)
}

// HandleMAD takes a MAD that arrived on QP1 from the peer with GID from: the payload of a UD SEND
// whose Q_Key was GSIQKey. It never panics and keeps nothing of b: bad input is dropped and counted.
func (e *Engine) HandleMAD(now time.Time, from netip.Addr, b []byte) {
	e.c.Received++
	m, err := mad.ParseCM(b)
	switch {
	case errors.Is(err, mad.ErrNotCM):
		e.drop(&e.c.DropNotCM)
		return
	case errors.Is(err, mad.ErrCMClassVersion):
		e.drop(&e.c.DropClassVersion)
		return
	case errors.Is(err, mad.ErrUnknownAttribute):
		e.drop(&e.c.DropUnknownAttribute)
		return
	case err != nil:
		e.drop(&e.c.DropMalformed)
		return
	}
	attr := m.Header().AttributeID()
	e.c.Rcvd[attr-mad.AttrConnectRequest]++
	switch attr {
	case mad.AttrConnectRequest:
		e.rcvREQ(now, from, m)
	case mad.AttrMRA:
		e.rcvMRA(now, m)
	case mad.AttrConnectReject:
		e.rcvREJ(now, m)
	case mad.AttrConnectReply:
		e.rcvREP(now, from, m)
	case mad.AttrReadyToUse:
		e.rcvRTU(now, m)
	case mad.AttrDisconnectRequest:
		e.rcvDREQ(now, from, m)
	case mad.AttrDisconnectReply:
		e.rcvDREP(now, m)
	case mad.AttrSIDRRequest:
		e.rcvSIDRReq(now, from, m)
	case mad.AttrSIDRReply:
		e.rcvSIDRRep(now, m)
	default:
		// LAP and APR: alternate paths do not exist on RoCE, and Linux ignores both there
		// (cm_lap_handler, cm_apr_handler).
		e.drop(&e.c.DropUnsupported)
	}
}

// Advance runs the timers due at now: retransmissions, retries running out, owners too slow to answer,
// timewait ending.
func (e *Engine) Advance(now time.Time) {
	for _, c := range e.conns {
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			e.expire(now, c)
		}
	}
}

// NextDeadline returns when Advance next has work, or the zero Time when no timer runs.
func (e *Engine) NextDeadline() time.Time {
	var d time.Time
	for _, c := range e.conns {
		if !c.deadline.IsZero() && (d.IsZero() || c.deadline.Before(d)) {
			d = c.deadline
		}
	}
	return d
}

// PollMAD takes the next MAD to send: it appends its 256 bytes to dst and says which GID they go to,
// as a UD SEND from QP1 to QP1 with Q_Key GSIQKey. ok is false when nothing is queued.
func (e *Engine) PollMAD(dst []byte) (to netip.Addr, b []byte, ok bool) {
	m, ok := e.tx.peek()
	if !ok {
		return netip.Addr{}, dst, false
	}
	to, b = m.to, append(dst, m.b[:]...)
	e.tx.pop()
	return to, b, true
}

// PollEvent takes the next event for the owner; ok is false when none is queued.
func (e *Engine) PollEvent() (ev Event, ok bool) {
	ev, ok = e.events.peek()
	if !ok {
		return Event{}, false
	}
	e.events.pop()
	if c := e.conns[ev.ID]; c != nil {
		c.pending--
		e.maybeFree(c)
	}
	return ev, true
}

// newID returns a fresh communication ID: random, not 0, not held by a connection.
func (e *Engine) newID() ConnID {
	for {
		id := ConnID(e.rng.Uint32())
		if id != 0 && e.conns[id] == nil {
			return id
		}
	}
}

// newConn registers a connection in state Idle; the caller moves it to its first state.
func (e *Engine) newConn(peer netip.Addr) *conn {
	c := &conn{id: e.newID(), peer: peer}
	e.conns[c.id] = c
	return c
}

// setState moves c to s through the transition table. A move the table lacks is a bug in this package,
// never the peer's doing: it is counted (TransitionErrors) and refused, and nothing panics.
func (e *Engine) setState(c *conn, s State) bool {
	if !canMove(c.state, s) {
		e.c.TransitionErrors++
		return false
	}
	c.state = s
	if s == StateTimewait || s == StateIdle {
		e.unindexQP(c)
	}
	if s == StateIdle {
		c.deadline = time.Time{}
		e.unindexRemote(c)
		e.release(c)
		e.maybeFree(c)
	}
	return true
}

// release gives back the listener backlog place of a request the owner had not answered.
func (e *Engine) release(c *conn) {
	if c.listener != nil {
		c.listener.pending--
		c.listener = nil
	}
}

// maybeFree forgets an idle connection once its owner has polled all its events.
func (e *Engine) maybeFree(c *conn) {
	if c.state == StateIdle && c.pending <= 0 {
		if e.conns[c.id] == c {
			delete(e.conns, c.id)
		}
	}
}

func (e *Engine) indexRemote(c *conn) bool {
	k := remoteKey{c.remoteID, c.remoteGUID}
	if o := e.byRemote[k]; o != nil && o != c {
		return false
	}
	e.byRemote[k] = c
	c.indexedRemote = true
	return true
}

func (e *Engine) unindexRemote(c *conn) {
	if c.indexedRemote {
		k := remoteKey{c.remoteID, c.remoteGUID}
		if e.byRemote[k] == c {
			delete(e.byRemote, k)
		}
		c.indexedRemote = false
	}
	if c.indexedSIDR {
		k := sidrKey{c.remoteID, c.peer.As16()}
		if e.sidrByPeer[k] == c {
			delete(e.sidrByPeer, k)
		}
		c.indexedSIDR = false
	}
}

func (e *Engine) indexQP(c *conn) {
	k := qpKey{c.qp.DestQPN, c.remoteGUID}
	if e.byRemoteQP[k] == nil {
		e.byRemoteQP[k] = c
		c.indexedQP = true
	}
}

func (e *Engine) unindexQP(c *conn) {
	if c.indexedQP {
		k := qpKey{c.qp.DestQPN, c.remoteGUID}
		if e.byRemoteQP[k] == c {
			delete(e.byRemoteQP, k)
		}
		c.indexedQP = false
	}
}

// emit queues an event about c, with a copy of private data p. Abandoned connections report nothing.
func (e *Engine) emit(c *conn, ev Event, p []byte) {
	if c.abandoned {
		return
	}
	if c.pending >= maxEventsPerConn || !e.events.canPush() {
		e.drop(&e.c.DropEventQueueFull)
		return
	}
	ev.ID, ev.ServiceID, ev.Peer = c.id, c.serviceID, c.peer
	if ev.PeerCAGUID == 0 {
		ev.PeerCAGUID = c.remoteGUID
	}
	if len(p) > 0 {
		ev.PrivateData = append([]byte(nil), p...)
	}
	e.events.push(ev)
	c.pending++
}

// queue puts a whole MAD on the outgoing queue, addressed to to.
func (e *Engine) queue(to netip.Addr, b []byte) {
	if !e.tx.canPush() {
		e.drop(&e.c.DropTxQueueFull)
		return
	}
	o := e.tx.pushSlot()
	o.to = to
	copy(o.b[:], b)
	attr := mad.AttributeID(binary.BigEndian.Uint16(b[16:]))
	if attr >= mad.AttrConnectRequest && attr <= mad.AttrAlternatePathResp {
		e.c.Sent[attr-mad.AttrConnectRequest]++
	}
	if attr == mad.AttrConnectReject {
		e.c.RejectsSent[min(int(binary.BigEndian.Uint16(b[mad.HeaderLen+10:])), len(e.c.RejectsSent)-1)]++
	}
}

// send builds m with transaction ID tid into buf, c's retransmission buffer (requests) or answer
// buffer (responses), where the bytes stay for resending, and queues it to c's peer.
func (e *Engine) send(c *conn, buf *[mad.Len]byte, tid uint64, m mad.Message) {
	b, err := mad.AppendCM(buf[:0], tid, m)
	e.out(c.peer, b, err)
}

// sendOnce builds m in the engine's scratch buffer and queues it to to: answers that are not kept.
func (e *Engine) sendOnce(to netip.Addr, tid uint64, m mad.Message) {
	b, err := mad.AppendCM(e.scratch[:0], tid, m)
	e.out(to, b, err)
}

// out queues a MAD just built. Building fails only for private data longer than its message allows,
// which the owner's calls refuse beforehand: a failure is a bug, counted.
func (e *Engine) out(to netip.Addr, b []byte, err error) {
	if err != nil || len(b) != mad.Len {
		e.c.BuildErrors++
		return
	}
	e.queue(to, b)
}

// resend queues the kept bytes of buf again: a retransmission or the answer to a duplicate.
func (e *Engine) resend(c *conn, buf *[mad.Len]byte) {
	e.queue(c.peer, buf[:])
}

func (e *Engine) drop(reason *uint64) {
	*reason++
	e.c.Dropped++
}

// newTID returns the transaction ID of a request c starts (REQ, DREQ, SIDR_REQ): the engine's high
// half and the connection's ID, as Linux's cm_form_tid.
func (e *Engine) newTID(c *conn) uint64 { return e.tidHi | uint64(c.id) }

// issueREJ answers a MAD of no connection with a REJ, keeping nothing: the IDs swapped, the
// transaction ID echoed (Linux cm_issue_rej).
func (e *Engine) issueREJ(to netip.Addr, m mad.MAD, reason mad.RejectReason, rejected mad.MessageType, ari []byte) {
	d := mad.Comm(m.Data())
	f := mad.REJFields{LocalCommID: d.RemoteCommID(), RemoteCommID: d.LocalCommID(), MessageRejected: rejected,
		Reason: reason, ARI: ari}
	// Built through the concrete type, not AppendCM's interface: answering a flood allocates nothing.
	b, err := f.Append(e.scratch[:0], m.Header().TransactionID())
	e.out(to, b, err)
}

// guidARI returns the ARI of a REJ with reason timeout: this CA's GUID, big-endian (Linux sends its
// node_guid).
func (e *Engine) guidARI() []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], e.cfg.CAGUID)
	return b[:]
}

// gidEqual compares GIDs as 16 bytes, so that an IPv4 address equals its IPv4-mapped GID.
func gidEqual(a, b netip.Addr) bool { return a.As16() == b.As16() }

// ring is a bounded FIFO that grows its storage as it fills, up to max entries.
type ring[T any] struct {
	buf     []T
	head, n int
	max     int
}

func (r *ring[T]) canPush() bool { return r.n < r.max }

// pushSlot makes room for one more entry at the tail and returns it, zeroed. The caller checked canPush.
func (r *ring[T]) pushSlot() *T {
	if r.n == len(r.buf) {
		nb := make([]T, min(max(2*len(r.buf), 8), r.max))
		for i := range r.n {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	p := &r.buf[(r.head+r.n)%len(r.buf)]
	var zero T
	*p = zero
	r.n++
	return p
}

func (r *ring[T]) push(v T) { *r.pushSlot() = v }

func (r *ring[T]) peek() (T, bool) {
	if r.n == 0 {
		var zero T
		return zero, false
	}
	return r.buf[r.head], true
}

func (r *ring[T]) pop() {
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
}

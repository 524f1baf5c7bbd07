package goroce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
)

// Endpoint is what two peers exchange out of band to connect their queue pairs: where the QP is
// (GID and UDP port), its number, the first PSN it sends and the largest path MTU its device allows.
// ibv_rc_pingpong and perftest exchange the same facts less the port and MTU; RDMA CM carries them
// in its REQ and REP.
//
// An Endpoint has a binary form of 26 bytes (MarshalBinary) and a text form (String, ParseEndpoint,
// MarshalText), for example
//
//	000011:a1b2c3@127.0.0.1:4791/4096
//
// the QPN and PSN as 6 hex digits each, the address and port, and the MTU in bytes.
type Endpoint struct {
	GID  GID
	Port uint16 // the device's UDP port; 0 stands for DefaultPort
	QPN  QPN
	PSN  PSN
	MTU  MTU // the largest path MTU the device allows; 0 if unknown
}

// endpointVersion is the first byte of an Endpoint's binary form.
const endpointVersion = 1

// EndpointLen is the length of an Endpoint's binary form.
const EndpointLen = 26

// ErrBadEndpoint is the error of an Endpoint that does not parse.
var ErrBadEndpoint = errors.New("goroce: malformed endpoint")

// AppendBinary appends e's binary form to b: a version byte (1), the GID (16 bytes), the port (2),
// the QPN (3), the PSN (3) and the MTU code (1), integers big-endian.
func (e Endpoint) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, endpointVersion)
	b = append(b, e.GID[:]...)
	b = binary.BigEndian.AppendUint16(b, e.Port)
	b = append(b, byte(e.QPN>>16), byte(e.QPN>>8), byte(e.QPN))
	b = append(b, byte(e.PSN>>16), byte(e.PSN>>8), byte(e.PSN))
	return append(b, byte(e.MTU)), nil
}

// MarshalBinary returns e's binary form (see AppendBinary).
func (e Endpoint) MarshalBinary() ([]byte, error) {
	return e.AppendBinary(make([]byte, 0, EndpointLen))
}

// UnmarshalBinary parses the binary form; anything else is an ErrBadEndpoint.
func (e *Endpoint) UnmarshalBinary(b []byte) error {
	if len(b) != EndpointLen || b[0] != endpointVersion {
		return fmt.Errorf("%w: %d bytes, version %d", ErrBadEndpoint, len(b), firstByte(b))
	}
	var out Endpoint
	copy(out.GID[:], b[1:17])
	out.Port = binary.BigEndian.Uint16(b[17:19])
	out.QPN = QPN(uint32(b[19])<<16 | uint32(b[20])<<8 | uint32(b[21]))
	out.PSN = PSN(uint32(b[22])<<16 | uint32(b[23])<<8 | uint32(b[24]))
	out.MTU = MTU(b[25])
	if out.MTU != 0 && !out.MTU.Valid() {
		return fmt.Errorf("%w: MTU code %d", ErrBadEndpoint, b[25])
	}
	*e = out
	return nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

// String returns the text form: QPN:PSN@address:port/MTU, with /MTU left out when it is unknown.
func (e Endpoint) String() string {
	s := fmt.Sprintf("%06x:%06x@%v", uint32(e.QPN), uint32(e.PSN), netip.AddrPortFrom(e.GID.Addr(), e.port()))
	if e.MTU != 0 {
		s += "/" + strconv.Itoa(e.MTU.Bytes())
	}
	return s
}

// MarshalText returns the text form.
func (e Endpoint) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText parses the text form, as ParseEndpoint.
func (e *Endpoint) UnmarshalText(b []byte) error {
	out, err := ParseEndpoint(string(b))
	if err == nil {
		*e = out
	}
	return err
}

// ParseEndpoint parses the text form String returns.
func ParseEndpoint(s string) (Endpoint, error) {
	bad := func(why string) (Endpoint, error) {
		return Endpoint{}, fmt.Errorf("%w: %q: %s", ErrBadEndpoint, s, why)
	}
	ids, where, ok := strings.Cut(s, "@")
	if !ok {
		return bad("no @")
	}
	qpnText, psnText, ok := strings.Cut(ids, ":")
	if !ok {
		return bad("no QPN:PSN")
	}
	var e Endpoint
	qpn, err1 := strconv.ParseUint(qpnText, 16, 24)
	psn, err2 := strconv.ParseUint(psnText, 16, 24)
	if err1 != nil || err2 != nil {
		return bad("QPN and PSN are 24-bit hex numbers")
	}
	e.QPN, e.PSN = QPN(qpn), PSN(psn)
	if i := strings.LastIndexByte(where, '/'); i >= 0 {
		n, err := strconv.Atoi(where[i+1:])
		m, ok := MTUFromBytes(n)
		if err != nil || !ok {
			return bad("MTU is 256, 512, 1024, 2048 or 4096")
		}
		e.MTU, where = m, where[:i]
	}
	ap, err := netip.ParseAddrPort(where)
	if err != nil {
		return bad(err.Error())
	}
	e.GID, e.Port = GIDFromAddr(ap.Addr()), ap.Port()
	return e, nil
}

// Addr returns the UDP address of the endpoint's device.
func (e Endpoint) Addr() netip.AddrPort { return netip.AddrPortFrom(e.GID.Addr(), e.port()) }

func (e Endpoint) port() uint16 {
	if e.Port == 0 {
		return DefaultPort
	}
	return e.Port
}

// AH returns an address handle for UD sends to the endpoint's device.
func (e Endpoint) AH() *AddressHandle {
	return &AddressHandle{DGID: e.GID, HopLimit: 64, Port: e.Port}
}

// Deprecated: RemoteInfo is the old name of Endpoint.
type RemoteInfo = Endpoint

// Endpoint returns what a peer needs to connect to q: its device's GID, port and largest path MTU,
// its QPN and the PSN its first packet carries.
func (q *QP) Endpoint() Endpoint {
	return Endpoint{GID: q.dev.gid, Port: q.dev.local.Port(), QPN: q.qpn, PSN: q.psn, MTU: q.dev.dp.MaxMTU(netip.Addr{})}
}

// Deprecated: use Endpoint.
func (q *QP) Info() Endpoint { return q.Endpoint() }

// ConnectOptions are the attributes Connect gives a queue pair. Every field means what it says,
// zero included; start from DefaultConnectOptions and change what differs. A nil *ConnectOptions
// means the defaults.
type ConnectOptions struct {
	// MTU is the path MTU; 0 chooses the largest both ends allow: the peer's Endpoint.MTU (1024 when
	// unknown, as from ibv_rc_pingpong), and what the local link allows toward it (its MTU less 80
	// bytes of headers, as rxe computes it: 1024 on a 1500-byte Ethernet, 4096 on loopback).
	MTU MTU
	// Access is what the peer may do to this QP's regions: RemoteWrite, RemoteRead, RemoteAtomic.
	Access Access
	// Timeout is the local ACK timeout, 4.096 us * 2^Timeout; 0 waits forever.
	Timeout uint8
	// RetryCnt is how many times a request is retransmitted after a timeout or a NAK of a PSN
	// sequence error before it fails with ErrRetryExceeded (0..7).
	RetryCnt uint8
	// RNRRetry is how many times a request is sent again after the peer said it had no receive posted
	// before it fails with ErrRNRRetryExceeded (0..6); 7 retries forever, as in ibverbs.
	RNRRetry uint8
	// MinRNRTimer is the RNR NAK timer code this QP asks the peer to wait when it has no receive
	// posted: 12 is 0.64 ms, 14 is 1.28 ms (IBTA Vol 1 table 45).
	MinRNRTimer uint8
	// RdAtomic bounds the READs and atomics outstanding each way (max_rd_atomic and
	// max_dest_rd_atomic).
	RdAtomic uint8
	// QKey is a UD QP's Q_Key.
	QKey QKey
}

// DefaultConnectOptions returns the defaults: the largest MTU both ends allow, every remote access
// right, Timeout 14 (67 ms), RetryCnt 7, RNRRetry 6, MinRNRTimer 12 (0.64 ms), RdAtomic 16, QKey 0.
//
// RNRRetry 6 makes a SEND to a peer that has no receive posted fail with ErrRNRRetryExceeded after 7
// RNR NAKs instead of retrying forever, as ibverbs' 7 does: with the usual RNR timer (12, which goroce
// peers and ibv_rc_pingpong ask for) that is a few milliseconds. A program whose receiver may fall
// behind for longer sets RNRRetry 7, or has the receiving side ask for a longer MinRNRTimer.
func DefaultConnectOptions() ConnectOptions {
	return ConnectOptions{Access: RemoteWrite | RemoteRead | RemoteAtomic, Timeout: 14, RetryCnt: 7, RNRRetry: 6,
		MinRNRTimer: 12, RdAtomic: 16}
}

// Connect moves q from RESET (or INIT) to RTS: an RC or UC QP connected to peer, a UD QP ready to send
// anywhere (peer is then ignored: pass Endpoint{}). opts nil means DefaultConnectOptions.
//
// Connect both ends before either sends: a packet that reaches a QP before its Connect is dropped
// (Stats.DropNotReady), and the sender recovers only when its ACK timeout fires. The usual order is
// the out-of-band exchange of Endpoints, Connect on both sides, then a message saying so (as
// ibv_rc_pingpong's server and client do). A QP in RESET takes no receives: post them after Connect
// and before saying so, or call Init first and post them before Connect.
func (q *QP) Connect(peer Endpoint, opts *ConnectOptions) error {
	o := DefaultConnectOptions()
	if opts != nil {
		o = *opts
	}
	if q.typ != UD && (peer.QPN == 0 || !peer.GID.Addr().IsValid()) {
		return fmt.Errorf("%w: connecting to %v: no QPN or address", ErrBadConfig, peer)
	}
	if o.MTU == 0 {
		theirs := peer.MTU
		if theirs == 0 {
			theirs = MTU1024 // unknown, as from ibv_rc_pingpong
		}
		o.MTU = min(theirs, q.dev.dp.MaxMTU(peer.GID.Addr()))
	}
	av := AddressHandle{DGID: peer.GID, HopLimit: 64, TrafficClass: q.tc}
	err := q.dq.Connect(&qp.ConnectParams{AccessFlags: wireAccess(o.Access), QKey: o.QKey,
		AV: av.engine(), PathMTU: o.MTU, DestQPN: peer.QPN, RQPSN: peer.PSN, SQPSN: q.psn, Timeout: o.Timeout,
		RetryCnt: o.RetryCnt, RNRRetry: o.RNRRetry, MinRNRTimer: o.MinRNRTimer, RdAtomic: o.RdAtomic},
		peer.Addr())
	if err != nil && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	return err
}

// wireAccess keeps the rights a QP's access flags can hold.
func wireAccess(a Access) mr.Access { return mr.Access(a &^ LocalWrite) }

// Init moves q from RESET to INIT, where it takes receives but no packets, as ibv_rc_pingpong does
// before its exchange: receives posted then are ready for the peer's first SEND. Connect takes it on
// from there.
func (q *QP) Init() error {
	a := Attr{State: StateInit}
	mask := AttrState | AttrAccessFlags
	if q.typ == UD {
		mask = AttrState | AttrQKey
	}
	return q.Modify(&a, mask)
}

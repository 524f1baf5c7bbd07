// Package conn is goroce's datagram layer: batched UDP I/O behind a small interface, with a Linux
// implementation (recvmmsg/sendmmsg, UDP GSO and GRO, per-message TOS, DF with predictable IP
// identification, SO_REUSEPORT groups steered by destination QPN) and an in-memory network for tests.
// The device runtime is written against Network and Conn only.
package conn

import (
	"errors"
	"net/netip"
	"os"
	"time"
)

// Message is one datagram of a batch.
type Message struct {
	// Buf holds the datagram: on write, the bytes to send; on read, the buffer to fill (its capacity
	// is what may be filled; after ReadBatch, Buf[:N] is the datagram).
	Buf []byte
	// N is the number of bytes received.
	N int
	// Addr is the remote address: the source on read, the destination on write.
	Addr netip.AddrPort
	// Local is the address a received datagram was sent to (IP_PKTINFO), when known.
	Local netip.Addr
	// TOS is the IPv4 TOS or IPv6 traffic class byte (DSCP and ECN bits): the one received
	// (IP_RECVTOS / IPV6_RECVTCLASS), or the one to send with.
	TOS uint8
	// Truncated reports a received datagram larger than Buf; its bytes past cap(Buf) are lost.
	Truncated bool
	// SegSize, when non-zero, makes Buf a run of datagrams of SegSize bytes each, the last one
	// possibly shorter, all with the same source, destination and TOS. On write the run leaves in
	// one UDP GSO send (UDP_SEGMENT) and the kernel cuts it into datagrams; a Conn whose Offload has
	// no GSO refuses such a message (ErrGSO). On read it is a run the kernel coalesced (UDP_GRO), to
	// be split by the reader. Zero: Buf is one datagram.
	SegSize int
	// Pieces, on write to a Conn whose Offload has Gather, holds the message's bytes in order, and
	// Buf is not used: the kernel gathers them (one iovec each), so that bytes kept elsewhere, a
	// payload in registered memory, are copied once, by the kernel. At most MaxPieces.
	Pieces [][]byte
}

// MaxPieces bounds the pieces of one message (Message.Pieces): Linux's UIO_MAXIOV.
const MaxPieces = 1024

// Len returns the bytes of a message to write: Buf's, or all of its Pieces'.
func (m *Message) Len() int {
	if m.Pieces == nil {
		return len(m.Buf)
	}
	n := 0
	for _, p := range m.Pieces {
		n += len(p)
	}
	return n
}

// Flatten appends a message's bytes to b: Buf, or its Pieces one after the other.
func (m *Message) Flatten(b []byte) []byte {
	if m.Pieces == nil {
		return append(b, m.Buf...)
	}
	for _, p := range m.Pieces {
		b = append(b, p...)
	}
	return b
}

// segments returns how many datagrams a run of n bytes in segments of seg holds.
func segments(n, seg int) int {
	if seg <= 0 || n <= seg {
		return 1
	}
	return (n + seg - 1) / seg
}

// Segments calls f with each datagram of a message: Buf[:N] as a whole, or its SegSize pieces.
func (m *Message) Segments(f func(seg []byte)) {
	b := m.Buf[:m.N]
	if m.SegSize <= 0 {
		f(b)
		return
	}
	for len(b) > 0 {
		n := min(m.SegSize, len(b))
		f(b[:n])
		b = b[n:]
	}
}

// Conn is a batched datagram socket. ReadBatch is called from one goroutine and WriteBatch from
// another (or the same); Close may be called from any goroutine and unblocks ReadBatch.
type Conn interface {
	// ReadBatch blocks until at least one datagram arrives, then fills up to len(msgs) of them and
	// returns how many. After Close it returns ErrClosed.
	ReadBatch(msgs []Message) (int, error)
	// WriteBatch sends msgs in order and returns how many were sent. A datagram the network refuses
	// (for example, too large for the path) is counted as sent and dropped, like any lost packet;
	// only errors that concern the socket itself are returned.
	WriteBatch(msgs []Message) (int, error)
	// SetReadDeadline makes a ReadBatch that is blocked now or starts later return
	// os.ErrDeadlineExceeded once t has passed; the zero time removes the deadline. Any goroutine
	// may call it: a time in the past wakes a blocked reader at once, which is how a reader is
	// interrupted.
	SetReadDeadline(t time.Time) error
	// Offload reports what the Conn does with segmented messages.
	Offload() Offload
	// LocalAddr returns the bound address.
	LocalAddr() netip.AddrPort
	// BatchSize is the largest batch one call moves.
	BatchSize() int
	// Close closes the socket.
	Close() error
}

// Offload says which UDP segmentation offloads a Conn uses.
type Offload struct {
	// GSO is the most segments one write message may carry (Message.SegSize); 0 means none.
	GSO int
	// GRO reports that reads may return coalesced runs (Message.SegSize); read buffers should then
	// hold MaxGROSize bytes.
	GRO bool
	// Gather reports that writes take messages in Pieces.
	Gather bool
}

// A WaitReporter is a Conn that can tell whether its last ReadBatch waited for a datagram. The device's
// receive loop gives the Go scheduler a turn only when its reads have not waited for a while: see
// datapath's shard.yield.
type WaitReporter interface {
	// Waited reports whether the last ReadBatch found nothing queued and waited. Only the goroutine
	// that made that call may ask, before it makes another.
	Waited() bool
}

// A Poller is a Conn that can also read without waiting. The device's receive loop drains its socket
// this way before it fires a timer that came due while it was not running, so that a response already
// queued is seen before a retransmission it makes needless.
type Poller interface {
	// PollBatch is ReadBatch, except that with nothing queued it returns 0 and no error at once,
	// whatever the read deadline.
	PollBatch(msgs []Message) (int, error)
}

// A Joiner is a Conn of a ListenShards group that receives nothing until it joins the group
// (Options.JoinLazily). Conns of groups that join at once need not implement it.
type Joiner interface {
	// Join makes the Conn take the datagrams the group's steering sends it. Conns join in index
	// order. Joining twice does nothing.
	Join() error
	// Joined reports whether the Conn takes its datagrams: it joined, or was in its group from
	// the start.
	Joined() bool
}

// Network opens Conns: the host's UDP stack (UDP) or an in-memory network (MemNetwork).
type Network interface {
	// Listen binds a Conn to addr; port 0 picks a free port.
	Listen(addr netip.AddrPort, opts Options) (Conn, error)
	// ListenShards binds n Conns to addr (n >= 1; a port is required) that share its datagrams:
	// each RoCEv2 datagram goes to the Conn at index (BTH destination QPN mod n), so that the
	// packets of a queue pair always reach the same Conn. Where the network cannot steer by QPN it
	// spreads by a hash of the source instead, which keeps each flow on one Conn. The address must
	// be free: a group never silently shares it with another process. With Options.JoinLazily the
	// Conns after the first receive nothing until they join (Joiner).
	ListenShards(addr netip.AddrPort, n int, opts Options) ([]Conn, error)
}

// QPNOffset is where the 24-bit destination QPN sits in a UDP payload that starts with a BTH:
// bytes 5 to 7 (IBTA Vol 1 9.2, the BTH's second word is a reserved byte and DestQP).
const QPNOffset = 5

// ShardOf returns the index, among n, of the shard a datagram's destination QPN steers it to; a
// datagram too short to carry a BTH goes to shard 0.
func ShardOf(payload []byte, n int) int {
	if len(payload) < QPNOffset+3 || n <= 1 {
		return 0
	}
	qpn := uint32(payload[QPNOffset])<<16 | uint32(payload[QPNOffset+1])<<8 | uint32(payload[QPNOffset+2])
	return int(qpn % uint32(n))
}

// Limits of segmented messages.
const (
	// MaxSegments bounds the segments of one GSO write: the kernel's UDP_MAX_SEGMENTS
	// (include/linux/udp.h), 64 until recent kernels raised it to 128; 64 works everywhere.
	MaxSegments = 64
	// MaxGSOSize bounds the bytes of one GSO write: the largest UDP payload over IPv4, 65535 less
	// the IPv4 and UDP headers. A GRO read is never larger.
	MaxGSOSize = 65535 - 20 - 8
	// MaxGROSize is the read buffer that holds any coalesced run.
	MaxGROSize = 65535
)

// Errors of Conns.
var (
	// ErrClosed is returned by a Conn used after Close.
	ErrClosed = errors.New("conn: closed")
	// ErrGSO is returned, wrapped with the kernel's reason, by a WriteBatch whose GSO message the
	// kernel refused (EIO where the device cannot checksum it, EINVAL, EOPNOTSUPP...). The Conn has
	// turned GSO off: Offload().GSO is 0 from then on. The count WriteBatch returns says which
	// message failed; it and those after it were not sent, and the caller sends them again as
	// single datagrams.
	ErrGSO = errors.New("conn: UDP GSO refused")
	// ErrDeadline is os.ErrDeadlineExceeded: ReadBatch's error when its deadline passed.
	ErrDeadline = os.ErrDeadlineExceeded
	// ErrSendOnly is returned by ReadBatch and PollBatch on a socket opened with
	// Options.SendOnly.
	ErrSendOnly = errors.New("conn: socket is send-only")
)

// BusyPolling returns c with a ReadBatch that polls for up to d (PollBatch, without sleeping) before it
// waits as c's does: what a program that busy-polls a UDP socket does, the baseline for a goroce device
// with Config.BusyPoll. c must be a Poller; other Conns, and d <= 0, are returned as they are.
func BusyPolling(c Conn, d time.Duration) Conn {
	p, ok := c.(Poller)
	if !ok || d <= 0 {
		return c
	}
	return &busyPolling{Conn: c, p: p, d: d}
}

type busyPolling struct {
	Conn
	p Poller
	d time.Duration
}

func (b *busyPolling) ReadBatch(msgs []Message) (int, error) {
	end := time.Now().Add(b.d)
	for {
		if n, err := b.p.PollBatch(msgs); n > 0 || err != nil {
			return n, err
		}
		if time.Now().After(end) {
			return b.Conn.ReadBatch(msgs)
		}
	}
}

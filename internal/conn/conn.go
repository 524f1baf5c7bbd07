// Package conn is goroce's datagram layer: batched UDP I/O behind a small interface, with a Linux
// implementation (recvmmsg/sendmmsg, per-message TOS, DF with IP identification 0) and an in-memory
// network for tests. The device runtime is written against Conn only.
package conn

import (
	"errors"
	"net/netip"
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
	// LocalAddr returns the bound address.
	LocalAddr() netip.AddrPort
	// BatchSize is the largest batch one call moves.
	BatchSize() int
	// Close closes the socket.
	Close() error
}

// ErrClosed is returned by a Conn used after Close.
var ErrClosed = errors.New("conn: closed")

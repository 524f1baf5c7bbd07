//go:build !linux

package conn

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// UDPConn is the portable Conn: one datagram per system call through net.UDPConn, without
// DF/IP-ID control, TOS or destination address on receive, or truncation detection. It exists
// so that goroce builds and its tests run off Linux; RoCEv2 peers need the Linux one.
//
// Concurrency: ReadBatch calls serialize on rmu, WriteBatch calls on wmu.
type UDPConn struct {
	udp     *net.UDPConn
	local   netip.AddrPort
	batch   int
	recvBuf int
	sendBuf int
	closed  atomic.Bool
	stats   counters
	rmu     sync.Mutex
	wmu     sync.Mutex
}

var _ Conn = (*UDPConn)(nil)

// Listen opens a UDP socket bound to addr. See the Linux version for what it sets up there.
func Listen(addr netip.AddrPort, opts Options) (Conn, error) {
	c, err := ListenUDP(addr, opts)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// UDP is the host's UDP stack as a Network.
var UDP Network = udpNetwork{}

type udpNetwork struct{}

func (udpNetwork) Listen(addr netip.AddrPort, opts Options) (Conn, error) { return Listen(addr, opts) }

// ListenShards binds one socket: steering by QPN needs Linux's reuseport BPF.
func (udpNetwork) ListenShards(addr netip.AddrPort, n int, opts Options) ([]Conn, error) {
	if n != 1 {
		return nil, fmt.Errorf("conn: listen %v with %d shards: %w", addr, n, errors.ErrUnsupported)
	}
	c, err := Listen(addr, opts)
	if err != nil {
		return nil, err
	}
	return []Conn{c}, nil
}

// ListenUDP is Listen returning the concrete type, for Stats and BufferSizes.
func ListenUDP(addr netip.AddrPort, opts Options) (*UDPConn, error) {
	if !addr.IsValid() {
		return nil, fmt.Errorf("conn: listen: invalid address %v", addr)
	}
	network := "udp4"
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		network = "udp6"
	}
	udp, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("conn: listen: %w", err)
	}
	c := &UDPConn{udp: udp, local: udp.LocalAddr().(*net.UDPAddr).AddrPort(), batch: opts.batchSize()}
	if n := opts.recvBuffer(); n > 0 && udp.SetReadBuffer(n) == nil {
		c.recvBuf = n
	}
	if n := opts.sendBuffer(); n > 0 && udp.SetWriteBuffer(n) == nil {
		c.sendBuf = n
	}
	return c, nil
}

// BufferSizes returns the buffer sizes requested and accepted (the effective ones are not
// portably readable).
func (c *UDPConn) BufferSizes() (recv, send int) { return c.recvBuf, c.sendBuf }

func (c *UDPConn) mapErr(err error) error {
	switch {
	case c.closed.Load() || errors.Is(err, net.ErrClosed):
		return ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return ErrDeadline
	}
	return err
}

// Offload reports no offloads: the portable path sends and receives single datagrams.
func (c *UDPConn) Offload() Offload { return Offload{} }

// SetReadDeadline sets the deadline of ReadBatch; see Conn.
func (c *UDPConn) SetReadDeadline(t time.Time) error { return c.udp.SetReadDeadline(t) }

// ReadBatch blocks for one datagram and returns it; the portable path reads one at a time.
func (c *UDPConn) ReadBatch(msgs []Message) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return 0, ErrClosed
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	m := &msgs[0]
	n, addr, err := c.udp.ReadFromUDPAddrPort(m.Buf[:cap(m.Buf)])
	if err != nil {
		return 0, c.mapErr(err)
	}
	m.N, m.Addr, m.Local, m.TOS, m.Truncated, m.SegSize = n, netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()), netip.Addr{}, 0, false, 0
	c.stats.readBatches.Add(1)
	c.stats.datagramsIn.Add(1)
	c.stats.bytesIn.Add(uint64(n))
	return 1, nil
}

// WriteBatch sends msgs one by one; per-datagram errors are dropped and counted as on Linux.
func (c *UDPConn) WriteBatch(msgs []Message) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return 0, ErrClosed
	}
	for i := range msgs {
		m := &msgs[i]
		if segments(len(m.Buf), m.SegSize) > 1 {
			return i, fmt.Errorf("%w: no GSO off Linux", ErrGSO)
		}
		c.stats.writeBatches.Add(1)
		c.stats.datagramsOut.Add(1)
		if !m.Addr.IsValid() {
			c.stats.dropBadAddr.Add(1)
			continue
		}
		_, err := c.udp.WriteToUDPAddrPort(m.Buf, m.Addr)
		switch {
		case err == nil:
			c.stats.bytesOut.Add(uint64(len(m.Buf)))
		case errors.Is(err, syscall.EMSGSIZE):
			c.stats.dropTooBig.Add(1)
		case errors.Is(err, syscall.ECONNREFUSED):
			c.stats.dropRefused.Add(1)
		case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
			c.stats.dropUnreachable.Add(1)
		case errors.Is(err, syscall.ENOBUFS):
			c.stats.dropNoBuffer.Add(1)
		default:
			c.stats.datagramsOut.Add(^uint64(0))
			return i, c.mapErr(err)
		}
	}
	return len(msgs), nil
}

// closeSocket closes the socket once Close has set closed.
func (c *UDPConn) closeSocket() error { return c.udp.Close() }

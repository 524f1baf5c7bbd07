package conn

import "net/netip"

// The methods of UDPConn that do not depend on how a platform moves batches (udp_linux.go with
// recvmmsg/sendmmsg, udp_other.go one datagram per call).

// Stats returns a snapshot of the counters.
func (c *UDPConn) Stats() Stats { return c.stats.snapshot() }

// LocalAddr returns the bound address.
func (c *UDPConn) LocalAddr() netip.AddrPort { return c.local }

// BatchSize is the largest batch one ReadBatch or WriteBatch moves: one system call on Linux.
func (c *UDPConn) BatchSize() int { return c.batch }

// Close closes the socket, unblocking a ReadBatch. Closing twice returns nil.
func (c *UDPConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	return c.closeSocket()
}

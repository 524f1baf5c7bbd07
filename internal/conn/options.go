package conn

import "sync/atomic"

// Defaults for Options fields left zero.
const (
	// DefaultBatchSize is the number of datagrams one ReadBatch or WriteBatch system call moves,
	// as in wireguard-go's conn.IdealBatchSize.
	DefaultBatchSize = 64
	// MaxBatchSize bounds BatchSize: the kernel's UIO_MAXIOV caps sendmmsg/recvmmsg's vlen.
	MaxBatchSize = 1024
	// DefaultRecvBuffer is the requested SO_RCVBUF. limits.md: a sender windowed to a quarter of
	// the receive buffer loses nothing on loopback; 4 MiB is net.core.rmem_max on the reference
	// machine, so it is granted even without SO_RCVBUFFORCE.
	DefaultRecvBuffer = 4 << 20
	// DefaultSendBuffer is the requested SO_SNDBUF.
	DefaultSendBuffer = 1 << 20
)

// Options configures Listen. The zero value gives the defaults above.
type Options struct {
	// BatchSize is the most datagrams one system call moves; 0 means DefaultBatchSize. It is
	// clamped to [1, MaxBatchSize].
	BatchSize int
	// RecvBuffer is the SO_RCVBUF to ask for, in bytes; 0 means DefaultRecvBuffer and a negative
	// value keeps the kernel default. SO_RCVBUFFORCE is tried first (it needs CAP_NET_ADMIN and
	// may exceed net.core.rmem_max), then SO_RCVBUF.
	RecvBuffer int
	// SendBuffer is the SO_SNDBUF to ask for, like RecvBuffer; 0 means DefaultSendBuffer.
	SendBuffer int
	// AlwaysTOS attaches an IP_TOS (IPV6_TCLASS) control message to every datagram written, even
	// with Message.TOS zero. Without it the control message is only built when TOS is non-zero,
	// and a TOS of zero sends with the socket's default (zero).
	AlwaysTOS bool
	// GSO asks for UDP generic segmentation offload on write (UDP_SEGMENT), where the kernel has
	// it: see Offload.
	GSO bool
	// GRO asks for UDP generic receive offload (UDP_GRO): reads may return coalesced runs.
	GRO bool
	// SendOnly opens a socket that is only written to (on Linux; elsewhere it is ignored). It
	// stays out of the Go netpoller, whose registration asks for write readiness too: Linux wakes
	// a socket's epoll watchers whenever it frees a datagram the socket sent (sock_wfree, at once
	// on loopback), and so woke a runtime thread blocked in the netpoller once a write, for
	// nothing. A write that finds the send buffer full waits in poll(2) instead. ReadBatch and
	// PollBatch fail with ErrSendOnly.
	SendOnly bool
	// JoinLazily, for ListenShards, binds only the first socket at once; each of the others joins
	// the group when Joiner.Join is called, and receives nothing before. The group's steering
	// program (classic BPF, run for every datagram the group receives: 0.1 to 0.2 us of the
	// sender's sendmmsg on loopback) is attached when the second socket joins, and the first socket
	// takes SO_REUSEPORT only then (a socket that has it pays the kernel's group selection for
	// every datagram, about 0.08 us of the sender's sendmmsg), so that a group that never needs a
	// second socket pays for neither. Sockets must join in index order.
	JoinLazily bool
}

func (o Options) batchSize() int {
	switch {
	case o.BatchSize <= 0:
		return DefaultBatchSize
	case o.BatchSize > MaxBatchSize:
		return MaxBatchSize
	}
	return o.BatchSize
}

func (o Options) recvBuffer() int {
	if o.RecvBuffer == 0 {
		return DefaultRecvBuffer
	}
	return o.RecvBuffer
}

func (o Options) sendBuffer() int {
	if o.SendBuffer == 0 {
		return DefaultSendBuffer
	}
	return o.SendBuffer
}

// Stats is a snapshot of a Conn's counters. Drops are counted by reason; a datagram counted
// as a drop on write is also counted in DatagramsOut, since WriteBatch reports it as sent.
type Stats struct {
	DatagramsIn  uint64 // datagrams returned by ReadBatch
	BytesIn      uint64 // bytes returned by ReadBatch (after truncation)
	DatagramsOut uint64 // datagrams WriteBatch reported as sent, including dropped ones
	BytesOut     uint64 // bytes of the datagrams the kernel (or network) accepted
	ReadBatches  uint64 // ReadBatch calls that returned data
	WriteBatches uint64 // WriteBatch system calls (or calls, for in-memory conns)

	DropTruncated   uint64 // received datagrams larger than their buffer (MSG_TRUNC)
	DropRefused     uint64 // ECONNREFUSED: an ICMP port unreachable came back
	DropTooBig      uint64 // EMSGSIZE: larger than the path MTU with DF set, or than 64 KiB
	DropUnreachable uint64 // EHOSTUNREACH, ENETUNREACH and the like
	DropNoBuffer    uint64 // ENOBUFS: the kernel or device queue was full
	DropBadAddr     uint64 // destination invalid or of the wrong address family
	DropOverflow    uint64 // in-memory network: the receiver's queue was full
	DropUnknownDest uint64 // in-memory network: nothing bound at the destination
	DropFiltered    uint64 // in-memory network filter, Lossy: deliberately dropped
	MarkedCE        uint64 // MarkCE: datagrams whose ECN field was set to CE
	GSORefused      uint64 // GSO writes the kernel refused, after which the Conn stopped using GSO
	SteerFailed     uint64 // 1 on the first Conn of a group whose QPN steering the kernel refused
}

// StatsOf returns c's counters if c keeps any (every Conn this package returns does).
func StatsOf(c Conn) (Stats, bool) {
	s, ok := c.(interface{ Stats() Stats })
	if !ok {
		return Stats{}, false
	}
	return s.Stats(), true
}

// counters is the live form of Stats.
type counters struct {
	datagramsIn, bytesIn, datagramsOut, bytesOut, readBatches, writeBatches atomic.Uint64

	dropTruncated, dropRefused, dropTooBig, dropUnreachable, dropNoBuffer, dropBadAddr atomic.Uint64
	dropOverflow, dropUnknownDest, dropFiltered, markedCE                              atomic.Uint64
	gsoRefused, steerFailed                                                            atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		DatagramsIn:     c.datagramsIn.Load(),
		BytesIn:         c.bytesIn.Load(),
		DatagramsOut:    c.datagramsOut.Load(),
		BytesOut:        c.bytesOut.Load(),
		ReadBatches:     c.readBatches.Load(),
		WriteBatches:    c.writeBatches.Load(),
		DropTruncated:   c.dropTruncated.Load(),
		DropRefused:     c.dropRefused.Load(),
		DropTooBig:      c.dropTooBig.Load(),
		DropUnreachable: c.dropUnreachable.Load(),
		DropNoBuffer:    c.dropNoBuffer.Load(),
		DropBadAddr:     c.dropBadAddr.Load(),
		DropOverflow:    c.dropOverflow.Load(),
		DropUnknownDest: c.dropUnknownDest.Load(),
		DropFiltered:    c.dropFiltered.Load(),
		MarkedCE:        c.markedCE.Load(),
		GSORefused:      c.gsoRefused.Load(),
		SteerFailed:     c.steerFailed.Load(),
	}
}

// Add returns the field-wise sum of s and t.
func (s Stats) Add(t Stats) Stats {
	s.DatagramsIn += t.DatagramsIn
	s.BytesIn += t.BytesIn
	s.DatagramsOut += t.DatagramsOut
	s.BytesOut += t.BytesOut
	s.ReadBatches += t.ReadBatches
	s.WriteBatches += t.WriteBatches
	s.DropTruncated += t.DropTruncated
	s.DropRefused += t.DropRefused
	s.DropTooBig += t.DropTooBig
	s.DropUnreachable += t.DropUnreachable
	s.DropNoBuffer += t.DropNoBuffer
	s.DropBadAddr += t.DropBadAddr
	s.DropOverflow += t.DropOverflow
	s.DropUnknownDest += t.DropUnknownDest
	s.DropFiltered += t.DropFiltered
	s.MarkedCE += t.MarkedCE
	s.GSORefused += t.GSORefused
	s.SteerFailed += t.SteerFailed
	return s
}

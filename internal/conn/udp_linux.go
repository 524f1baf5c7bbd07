//go:build linux

package conn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// oobSize is the control buffer per received datagram: a TOS/TCLASS message (CmsgSpace(4)), a
// PKTINFO message (CmsgSpace(20) for in6_pktinfo) and a UDP_GRO message (CmsgSpace(4)), with room
// to spare.
const oobSize = 96

// UDPConn is the Linux Conn: an unconnected UDP socket driven with recvmmsg/sendmmsg through
// the Go netpoller (a send-only one stays out of it: Options.SendOnly), with UDP GSO and GRO where
// asked for and available. Each direction owns preallocated mmsghdr, iovec, sockaddr and control
// arrays, so ReadBatch and WriteBatch allocate nothing in steady state.
//
// Concurrency: ReadBatch calls serialize on rmu, WriteBatch calls on wmu; a reader and a writer
// run in parallel. Close may be called from any goroutine, any number of times; it unblocks a
// ReadBatch waiting in the poller. Lock order: none (rmu and wmu are never held together).
type UDPConn struct {
	file      *os.File // the socket; see fromNet
	raw       syscall.RawConn
	local     netip.AddrPort
	v6        bool
	batch     int
	alwaysTOS bool
	recvBuf   int // SO_RCVBUF as the kernel reports it
	sendBuf   int // SO_SNDBUF as the kernel reports it
	gro       bool
	gso       atomic.Bool // UDP_SEGMENT works; cleared when the kernel refuses a GSO write
	closed    atomic.Bool
	sendOnly  bool // out of the netpoller: see Options.SendOnly
	stats     counters
	group     *shardGroup // for a socket ListenShards left out of its group until Join; else nil
	joined    bool        // Join bound it; guarded by group.mu

	rmu    sync.Mutex // guards the fields below, the receive side
	rhdr   []unix.Mmsghdr
	riov   []unix.Iovec
	rname  []unix.RawSockaddrInet6
	roob   []byte
	rn     int        // entries handed to recvmmsg
	rgot   int        // entries recvmmsg filled
	rerr   unix.Errno // recvmmsg's error, other than EAGAIN
	rfn    func(fd uintptr) bool
	pfn    func(fd uintptr) // PollBatch's call: recvmmsg, rempty set if nothing was queued
	rempty bool
	rwait  bool // the last ReadBatch found nothing queued at least once, and waited (Waited)

	wmu   sync.Mutex // guards the fields below, the send side
	whdr  []unix.Mmsghdr
	wiov  []unix.Iovec
	wpcs  []unix.Iovec // the iovecs of messages in Pieces, MaxPieces for one batch
	wpn   int          // wpcs entries in use
	wname []unix.RawSockaddrInet6
	woob  []byte
	wn    int
	wgot  int
	werr  unix.Errno
	wfn   func(fd uintptr) bool
}

var _ Conn = (*UDPConn)(nil)

// Listen opens a RoCEv2 UDP socket bound to addr (normally port 4791; port 0 picks one), with
// DF set (IP_PMTUDISC_DO: see the identification facts below), TOS and destination address
// reported on receive, GSO and GRO where opts asks for them and the kernel has them, and the
// buffer sizes opts asks for.
//
// The IPv4 identification, which the RoCEv2 ICRC covers, as Linux sets it on an unconnected
// socket with IP_PMTUDISC_DO (read from the wire on loopback, kernels 6.1 and 6.18): a plain
// datagram carries 0, and the segments of one GSO write carry 0, 1, 2, ... in order, starting
// again at 0 with every write, because the kernel numbers the segments of a super-packet from its
// identification (net/ipv4/af_inet.c, inet_gso_segment) when it segments in software. A NIC that
// segments in hardware numbers them itself.
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

// ListenShards binds n sockets to addr in one SO_REUSEPORT group and attaches a classic BPF program
// to the group that picks the socket at index QPN mod n (see steerProgram). A datagram reaches the
// program with the UDP header pulled (net/core/sock_reuseport.c, run_bpf_filter), so offsets count
// from the UDP payload, where the BTH starts. Where the kernel refuses the program the group keeps
// the kernel's hash of the 4-tuple. With Options.JoinLazily only the first socket is bound; the
// others are opened unbound and bind when joined (UDPConn.Join), the program attached just before the
// second does: until then the kernel runs no program for the group's datagrams.
func (udpNetwork) ListenShards(addr netip.AddrPort, n int, opts Options) ([]Conn, error) {
	if n < 1 {
		return nil, fmt.Errorf("conn: listen %v: %d shards", addr, n)
	}
	if n == 1 {
		c, err := Listen(addr, opts)
		if err != nil {
			return nil, err
		}
		return []Conn{c}, nil
	}
	// Port 0: the kernel picks a port for a lone socket, then the group binds it. Another socket may
	// take the port in between; then the next attempt picks another.
	for attempt := 0; ; attempt++ {
		conns, err := listenGroup(addr, n, opts)
		if addr.Port() != 0 || attempt == 8 || !errors.Is(err, unix.EADDRINUSE) {
			return conns, err
		}
	}
}

func listenGroup(addr netip.AddrPort, n int, opts Options) ([]Conn, error) {
	// SO_REUSEPORT would let this group share the address with another process of the same user
	// that bound it the same way, each silently getting part of the other's traffic. So the address
	// must first be free for a socket without it.
	probe, err := ListenUDP(addr, Options{RecvBuffer: -1, SendBuffer: -1, BatchSize: 1})
	if err != nil {
		return nil, err
	}
	addr = probe.LocalAddr()
	probe.Close()
	var conns []Conn
	fail := func(err error) ([]Conn, error) {
		for _, c := range conns {
			c.Close()
		}
		return nil, err
	}
	// A lazy group's first socket binds without SO_REUSEPORT, which it takes when the second joins
	// (Join): a socket bound with it pays the kernel's reuseport selection for every datagram, group
	// of one or not.
	c0, err := listenUDP(addr, opts, !opts.JoinLazily)
	if err != nil {
		return fail(err)
	}
	conns = append(conns, c0)
	g := &shardGroup{leader: c0, n: n, formed: !opts.JoinLazily}
	for i := 1; i < n; i++ {
		var c *UDPConn
		if opts.JoinLazily {
			c, err = dormantUDP(c0.local, opts)
			if err == nil {
				c.group = g
			}
		} else {
			c, err = listenUDP(addr, opts, true)
		}
		if err != nil {
			return fail(err)
		}
		conns = append(conns, c)
	}
	if !opts.JoinLazily {
		g.steer()
	}
	return conns, nil
}

// shardGroup is a reuseport group whose sockets after the first join when the caller asks
// (Options.JoinLazily, Joiner).
type shardGroup struct {
	leader  *UDPConn // conns[0], bound from the start
	n       int      // the sockets the group will have: the steering program's modulus
	mu      sync.Mutex
	formed  bool // the leader has SO_REUSEPORT: set when the second socket joins a lazy group
	steered bool // the steering program is attached (or the kernel refused it: see Stats.SteerFailed)
}

// form gives a lazy group's leader SO_REUSEPORT, once, so that the next socket can bind next to it.
// The kernel makes the group when that socket binds: it finds the leader bound with the option set
// and gives it a group of its own first (net/core/sock_reuseport.c, reuseport_add_sock). The caller
// holds g.mu.
func (g *shardGroup) form() error {
	if g.formed {
		return nil
	}
	var serr error
	if err := g.leader.raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return os.NewSyscallError("setsockopt SO_REUSEPORT", serr)
	}
	g.formed = true
	return nil
}

// steer attaches the steering program to the group, once. The caller holds g.mu, or has the group
// to itself.
func (g *shardGroup) steer() {
	if g.steered {
		return
	}
	g.steered = true
	var serr error
	if err := g.leader.raw.Control(func(fd uintptr) { serr = attachSteering(int(fd), g.n) }); err != nil {
		serr = err
	}
	if serr != nil {
		g.leader.stats.steerFailed.Store(1)
	}
}

// dormantUDP opens a socket configured as listenUDP would for a reuseport group at addr, but
// unbound: it receives nothing until Join binds it, and waits in the netpoller meanwhile.
func dormantUDP(addr netip.AddrPort, opts Options) (*UDPConn, error) {
	v6 := addr.Addr().Is6() && !addr.Addr().Is4In6()
	family := unix.AF_INET
	if v6 {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("conn: listen %v: %w", addr, os.NewSyscallError("socket", err))
	}
	c := &UDPConn{local: addr, v6: v6, batch: opts.batchSize(), alwaysTOS: opts.AlwaysTOS}
	err = os.NewSyscallError("setsockopt SO_REUSEPORT", unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1))
	if err == nil && v6 {
		err = os.NewSyscallError("setsockopt IPV6_V6ONLY", unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1))
	}
	if err == nil {
		err = c.configure(fd, opts)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("conn: listen %v: %w", addr, err)
	}
	c.alloc()
	c.file = os.NewFile(uintptr(fd), "goroce-udp") // non-blocking: the netpoller takes it
	if c.raw, err = c.file.SyscallConn(); err != nil {
		c.file.Close()
		return nil, fmt.Errorf("conn: listen %v: %w", addr, err)
	}
	return c, nil
}

// Join binds a socket that ListenShards left out of its group (Options.JoinLazily), so that it
// takes its share of the group's datagrams; the group's steering program is attached first, when
// the group gains its second socket. It does nothing for a socket already in its group. See Joiner.
func (c *UDPConn) Join() error {
	g := c.group
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.joined {
		return nil
	}
	if c.closed.Load() {
		return ErrClosed
	}
	// The steering program goes on the group before a second socket binds, so that no datagram is
	// steered by hash meanwhile; a leader bound without SO_REUSEPORT has no group to put it on until
	// then, and it goes on right after.
	formed := g.formed
	if formed {
		g.steer()
	} else if err := g.form(); err != nil {
		return fmt.Errorf("conn: joining %v: %w", c.local, err)
	}
	var sa unix.Sockaddr
	if a := c.local.Addr(); c.v6 {
		sa = &unix.SockaddrInet6{Port: int(c.local.Port()), Addr: a.As16(), ZoneId: scopeID(a.Zone())}
	} else {
		sa = &unix.SockaddrInet4{Port: int(c.local.Port()), Addr: a.Unmap().As4()}
	}
	var berr error
	if err := c.raw.Control(func(fd uintptr) { berr = unix.Bind(int(fd), sa) }); err != nil {
		return err
	}
	if berr != nil {
		return fmt.Errorf("conn: joining %v: %w", c.local, os.NewSyscallError("bind", berr))
	}
	if !formed {
		g.steer()
	}
	c.joined = true
	return nil
}

// Joined reports whether the socket is in its group: see Joiner.
func (c *UDPConn) Joined() bool {
	g := c.group
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return c.joined
}

// steerProgram is the classic BPF program of a reuseport group of n sockets: load the BTH's second
// word, keep its low 24 bits (the destination QPN) and return it mod n. A datagram shorter than
// the load ends the program with 0: socket 0.
func steerProgram(n int) []unix.SockFilter {
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: QPNOffset - 1},
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xffffff},
		{Code: unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K, K: uint32(n)},
		{Code: unix.BPF_RET | unix.BPF_A},
	}
}

func attachSteering(fd, n int) error {
	prog := steerProgram(n)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fprog)
	runtime.KeepAlive(prog)
	return os.NewSyscallError("setsockopt SO_ATTACH_REUSEPORT_CBPF", err)
}

// ListenUDP is Listen returning the concrete type, for Stats and BufferSizes.
func ListenUDP(addr netip.AddrPort, opts Options) (*UDPConn, error) {
	return listenUDP(addr, opts, false)
}

func listenUDP(addr netip.AddrPort, opts Options, reusePort bool) (*UDPConn, error) {
	if !addr.IsValid() {
		return nil, fmt.Errorf("conn: listen: invalid address %v", addr)
	}
	v6 := addr.Addr().Is6() && !addr.Addr().Is4In6()
	network := "udp4"
	if v6 {
		network = "udp6"
	} else {
		addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	}
	lc := net.ListenConfig{}
	if reusePort {
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = os.NewSyscallError("setsockopt SO_REUSEPORT", unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1))
			}); err != nil {
				return err
			}
			return serr
		}
	}
	pc, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return nil, fmt.Errorf("conn: listen: %w", err)
	}
	udp := pc.(*net.UDPConn)
	raw, err := udp.SyscallConn()
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("conn: listen: %w", err)
	}
	c := &UDPConn{
		raw:       raw,
		local:     udp.LocalAddr().(*net.UDPAddr).AddrPort(),
		v6:        v6,
		batch:     opts.batchSize(),
		alwaysTOS: opts.AlwaysTOS,
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = c.configure(int(fd), opts) }); err != nil {
		serr = err
	}
	if serr != nil {
		udp.Close()
		return nil, fmt.Errorf("conn: listen %v: %w", addr, serr)
	}
	c.alloc()
	c.sendOnly = opts.SendOnly
	if err := c.fromNet(udp); err != nil {
		udp.Close()
		return nil, fmt.Errorf("conn: listen %v: %w", addr, err)
	}
	return c, nil
}

// fromNet moves the socket from udp, which set it up, to an *os.File of its own: a duplicate of the
// descriptor, in the netpoller as udp's was, and closes udp. The os.File's RawConn returns the
// poller's errors as they are, where the net.UDPConn's wraps each in a new *net.OpError: a read that
// a deadline or a kick (a deadline in the past) ended cost an allocation, and the datapath kicks its
// reader whenever another goroutine hands it work (0.001 to 0.002 allocations a packet in a 64 KiB
// WRITE stream, all of them these).
func (c *UDPConn) fromNet(udp *net.UDPConn) error {
	var nfd int
	var derr error
	if err := c.raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return err
	}
	if derr != nil {
		return os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", derr)
	}
	if c.sendOnly {
		// A descriptor in blocking mode stays out of the netpoller (os.NewFile); every write passes
		// MSG_DONTWAIT, and sendmmsg waits in poll(2) for room.
		if err := unix.SetNonblock(nfd, false); err != nil {
			unix.Close(nfd)
			return os.NewSyscallError("fcntl", err)
		}
	}
	f := os.NewFile(uintptr(nfd), "goroce-udp") // non-blocking, as udp's descriptor was, unless send-only: the netpoller takes it
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	udp.Close() // the original descriptor leaves the netpoller; the socket lives on in f
	c.file, c.raw = f, raw
	return nil
}

// configure sets the socket options; see Listen.
func (c *UDPConn) configure(fd int, opts Options) error {
	type opt struct {
		level, name, value int
		what               string
	}
	set := []opt{
		{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER"},
		{unix.IPPROTO_IP, unix.IP_RECVTOS, 1, "IP_RECVTOS"},
		{unix.IPPROTO_IP, unix.IP_PKTINFO, 1, "IP_PKTINFO"},
	}
	if c.v6 {
		set = []opt{
			{unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, "IPV6_MTU_DISCOVER"},
			{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS"},
			{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO"},
			// rxe sends RoCEv2 over IPv6 with a zero UDP checksum, as RFC 6935 allows tunnels to (the
			// ICRC covers the payload); without this option the kernel drops such datagrams
			// (Udp6InCsumErrors). goroce's own datagrams carry a checksum, which rxe also accepts.
			{unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX"},
		}
	}
	for _, o := range set {
		if err := unix.SetsockoptInt(fd, o.level, o.name, o.value); err != nil {
			return os.NewSyscallError("setsockopt "+o.what, err)
		}
	}
	// GSO needs no option, only a kernel that knows UDP_SEGMENT (4.18): reading it tells.
	if opts.GSO {
		if _, err := unix.GetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_SEGMENT); err == nil {
			c.gso.Store(true)
		}
	}
	if opts.GRO {
		c.gro = unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
	}
	setBuffer(fd, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, opts.recvBuffer())
	setBuffer(fd, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, opts.sendBuffer())
	var err error
	if c.recvBuf, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF); err != nil {
		return os.NewSyscallError("getsockopt SO_RCVBUF", err)
	}
	if c.sendBuf, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF); err != nil {
		return os.NewSyscallError("getsockopt SO_SNDBUF", err)
	}
	return nil
}

// setBuffer asks for size bytes with the privileged option first (it ignores the rmem_max /
// wmem_max cap), falling back silently to the capped one. A negative size keeps the default.
func setBuffer(fd, force, plain, size int) {
	if size < 0 {
		return
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size) == nil {
		return
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, size) // best effort: the kernel clamps
}

// alloc builds the per-direction arrays and points each header at its slots once; only buffer
// pointers and lengths change per call.
func (c *UDPConn) alloc() {
	n := c.batch
	c.rhdr, c.riov, c.rname, c.roob = make([]unix.Mmsghdr, n), make([]unix.Iovec, n), make([]unix.RawSockaddrInet6, n), make([]byte, n*oobSize)
	c.whdr, c.wiov, c.wname, c.woob = make([]unix.Mmsghdr, n), make([]unix.Iovec, n), make([]unix.RawSockaddrInet6, n), make([]byte, n*wctlSpace)
	c.wpcs = make([]unix.Iovec, MaxPieces)
	for i := range n {
		h := &c.rhdr[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&c.rname[i]))
		h.Iov = &c.riov[i]
		h.SetIovlen(1)
		h.Control = &c.roob[i*oobSize]
		h = &c.whdr[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&c.wname[i]))
		h.Iov = &c.wiov[i]
		h.SetIovlen(1)
	}
	c.rfn = func(fd uintptr) bool {
		if c.recvmmsg(fd) {
			return true
		}
		c.rwait = true
		return false
	}
	c.pfn = func(fd uintptr) { c.rempty = !c.recvmmsg(fd) }
	c.wfn = c.sendmmsg
}

// BufferSizes returns the socket's SO_RCVBUF and SO_SNDBUF as the kernel reports them, which
// is twice the payload bytes granted (Linux doubles the request to account for overhead).
func (c *UDPConn) BufferSizes() (recv, send int) { return c.recvBuf, c.sendBuf }

// Offload reports GSO (MaxSegments per write) while the kernel takes it, GRO if enabled, and Gather.
func (c *UDPConn) Offload() Offload {
	o := Offload{GRO: c.gro, Gather: true}
	if c.gso.Load() {
		o.GSO = MaxSegments
	}
	return o
}

// SetReadDeadline sets the deadline of ReadBatch; see Conn.
func (c *UDPConn) SetReadDeadline(t time.Time) error { return c.file.SetReadDeadline(t) }

// recvmmsg and sendmmsg make their system calls with RawSyscall6, which does not tell the Go scheduler
// that the thread is entering the kernel. Both pass MSG_DONTWAIT, so neither ever blocks: waiting is
// the netpoller's job. Syscall6 would have the runtime wake its sysmon thread whenever it sleeps (it
// does whenever every P is idle, as in a ping-pong between packets), and take the P away from a call
// that ran past a sysmon tick (a sendmmsg of 64 KiB runs takes tens of microseconds), each a thread
// wake-up on a 2-CPU machine that the peer process needed. Between two processes (goroce perf
// send_lat -s 16 -n 40000, the client) futex calls fell from 0.47 to 0.16 a round trip, nanosleep
// (sysmon's) from 0.49 to 0.02 and context switches from 1.81 to 1.14.

// recvmmsg is the poller callback of ReadBatch: false asks the poller to wait for readability.
func (c *UDPConn) recvmmsg(fd uintptr) bool {
	for {
		if systraceOn {
			systrace(sysRecv, fd)
		}
		n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.rhdr[0])), uintptr(c.rn), unix.MSG_DONTWAIT, 0, 0)
		if systraceOn {
			k := sysRecvData
			if e == unix.EAGAIN {
				k = sysRecvEmpty
			}
			systrace(k, fd)
		}
		switch e {
		case 0:
			c.rgot, c.rerr = int(n), 0
			return true
		case unix.EAGAIN:
			return false
		case unix.EINTR:
			continue
		}
		c.rgot, c.rerr = 0, e
		return true
	}
}

// waitWritable waits until fd has room to send, or sendPollSlice passes: a send-only socket, out of
// the netpoller, waits in poll(2), a blocking system call the Go scheduler sees. The caller checks
// whether the socket was closed in between.
func waitWritable(fd int) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	_, _ = unix.Poll(pfd, sendPollSlice)
}

// sendPollSlice is how long, in milliseconds, a send-only socket's write waits for room before it
// looks again whether the socket was closed.
const sendPollSlice = 10

// sendmmsg is the poller callback of WriteBatch.
func (c *UDPConn) sendmmsg(fd uintptr) bool {
	for {
		if systraceOn {
			systrace(sysSend, fd)
		}
		n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&c.whdr[0])), uintptr(c.wn), unix.MSG_DONTWAIT, 0, 0)
		if systraceOn {
			systrace(sysSent, fd)
		}
		switch e {
		case 0:
			c.wgot, c.werr = int(n), 0
			return true
		case unix.EAGAIN:
			if !c.sendOnly {
				return false
			}
			if c.closed.Load() {
				c.wgot, c.werr = 0, unix.EBADF // WriteBatch returns ErrClosed
				return true
			}
			waitWritable(int(fd))
			continue
		case unix.EINTR:
			continue
		}
		c.wgot, c.werr = 0, e
		return true
	}
}

// pollErr maps an error of the netpoller (not of the system call) to ErrClosed or ErrDeadline
// where it is one.
func (c *UDPConn) pollErr(err error) error {
	switch {
	case c.closed.Load() || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed):
		return ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return ErrDeadline
	}
	return err
}

// ReadBatch blocks until at least one datagram arrives, or the read deadline passes, and fills up
// to min(len(msgs), BatchSize()) of them: Buf[:N], Addr, Local, TOS, Truncated and, for a run GRO
// coalesced, SegSize. Each Buf may be filled to its capacity.
func (c *UDPConn) ReadBatch(msgs []Message) (int, error) { return c.readBatch(msgs, true) }

// Waited reports whether the last ReadBatch found the socket empty and waited in the netpoller (the
// goroutine parked, and the scheduler had a turn), rather than return what was already queued. Only the
// goroutine that made that call may ask, before it makes another. See WaitReporter.
func (c *UDPConn) Waited() bool { return c.rwait }

// PollBatch is ReadBatch without the wait: it returns 0 and no error at once when nothing is queued,
// whatever the read deadline. See Poller.
func (c *UDPConn) PollBatch(msgs []Message) (int, error) { return c.readBatch(msgs, false) }

func (c *UDPConn) readBatch(msgs []Message, block bool) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return 0, ErrClosed
	}
	if c.sendOnly {
		return 0, ErrSendOnly
	}
	n := min(len(msgs), c.batch)
	if n == 0 {
		return 0, nil
	}
	for {
		for i := range n {
			b := msgs[i].Buf[:cap(msgs[i].Buf)]
			iov := &c.riov[i]
			if len(b) > 0 {
				iov.Base = &b[0]
			} else {
				iov.Base = nil
			}
			iov.SetLen(len(b))
			h := &c.rhdr[i]
			h.Hdr.Namelen = unix.SizeofSockaddrInet6
			h.Hdr.SetControllen(oobSize)
			h.Hdr.Flags = 0
			h.Len = 0
		}
		c.rn = n
		var err error
		c.rempty, c.rwait = false, false
		if block {
			err = c.raw.Read(c.rfn)
		} else {
			// Control runs the call on the descriptor without the poller, so no deadline stops it.
			err = c.raw.Control(c.pfn)
		}
		for i := range n {
			c.riov[i].Base = nil // do not keep the caller's buffers reachable
		}
		if err != nil {
			return 0, c.pollErr(err)
		}
		if c.rempty {
			return 0, nil
		}
		if c.rerr == 0 {
			break
		}
		if peerErr(c.rerr) {
			// A queued ICMP error (with IP_RECVERR, or on a connected socket): not ours to return.
			c.stats.dropRefused.Add(1)
			continue
		}
		return 0, os.NewSyscallError("recvmmsg", c.rerr)
	}
	got := c.rgot
	var bytes, trunc, dgrams uint64
	for i := range got {
		h := &c.rhdr[i]
		m := &msgs[i]
		m.N = int(h.Len)
		m.Truncated = h.Hdr.Flags&unix.MSG_TRUNC != 0
		if m.Truncated {
			trunc++
		}
		bytes += uint64(m.N)
		m.Addr = c.sockaddr(&c.rname[i])
		m.Local, m.TOS, m.SegSize = parseControl(c.roob[i*oobSize : i*oobSize+int(h.Hdr.Controllen)])
		if m.SegSize >= m.N {
			m.SegSize = 0 // a run of one
		}
		dgrams += uint64(segments(m.N, m.SegSize))
	}
	c.stats.readBatches.Add(1)
	c.stats.datagramsIn.Add(dgrams)
	c.stats.bytesIn.Add(bytes)
	if trunc > 0 {
		c.stats.dropTruncated.Add(trunc)
	}
	return got, nil
}

// sockaddr decodes a received source address.
func (c *UDPConn) sockaddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	if sa.Family == unix.AF_INET {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	}
	a := netip.AddrFrom16(sa.Addr)
	if sa.Scope_id != 0 && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) {
		a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10)) // rare; allocates
	}
	return netip.AddrPortFrom(a, port)
}

// parseControl extracts the destination address, TOS and GRO segment size from received control
// messages without allocating (unix.ParseSocketControlMessage allocates).
func parseControl(b []byte) (local netip.Addr, tos uint8, segSize int) {
	hdr := unix.CmsgLen(0)
	for len(b) >= hdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		l := int(h.Len)
		if l < hdr || l > len(b) {
			break
		}
		data := b[hdr:l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS && len(data) >= 1:
			tos = data[0] // Linux delivers IP_TOS as one byte
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			local = netip.AddrFrom4(([4]byte)(data[8:12])) // in_pktinfo.ipi_addr: the header destination
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS && len(data) >= 4:
			tos = uint8(binary.NativeEndian.Uint32(data))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			local = netip.AddrFrom16(([16]byte)(data[:16]))
		case h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			segSize = int(binary.NativeEndian.Uint32(data)) // net/ipv4/udp.c udp_cmsg_recv: an int
		}
		next := unix.CmsgSpace(l - hdr)
		if next >= len(b) {
			break
		}
		b = b[next:]
	}
	return local, tos, segSize
}

// The control buffer per sent message: an IP_TOS or IPV6_TCLASS int and a UDP_SEGMENT uint16.
var (
	tosSpace  = unix.CmsgSpace(4)
	wctlSpace = tosSpace + unix.CmsgSpace(2)
)

// WriteBatch sends msgs in order in system calls of up to BatchSize messages and returns how
// many were sent. Datagrams the kernel refuses individually (EMSGSIZE, ECONNREFUSED,
// unreachable, ENOBUFS) or that have an unusable destination are counted as sent and dropped,
// by reason in Stats; a GSO message the kernel refuses ends the call with ErrGSO; other errors
// concern the socket.
func (c *UDPConn) WriteBatch(msgs []Message) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return 0, ErrClosed
	}
	sent := 0
	for sent < len(msgs) {
		k := 0
		c.wpn = 0
		for k < c.batch && sent+k < len(msgs) && c.wpn+len(msgs[sent+k].Pieces) <= len(c.wpcs) && c.prepareWrite(k, &msgs[sent+k]) {
			k++
		}
		if k == 0 {
			m := &msgs[sent]
			n := segments(m.Len(), m.SegSize)
			if n > 1 && !c.gso.Load() {
				return sent, fmt.Errorf("%w: GSO is off on this socket", ErrGSO)
			}
			c.stats.dropBadAddr.Add(uint64(n)) // or more than MaxPieces
			c.stats.datagramsOut.Add(uint64(n))
			sent++
			continue
		}
		c.wn = k
		err := c.raw.Write(c.wfn)
		for i := range k {
			c.wiov[i].Base = nil
		}
		clear(c.wpcs[:c.wpn]) // do not keep the pieces' memory reachable
		if err != nil {
			return sent, c.pollErr(err)
		}
		if c.werr == unix.EBADF && c.closed.Load() { // a send-only write waiting for room saw Close
			return sent, ErrClosed
		}
		c.stats.writeBatches.Add(1)
		var bytes, dgrams uint64
		for i := range c.wgot {
			m := &msgs[sent+i]
			n := m.Len()
			bytes += uint64(n)
			dgrams += uint64(segments(n, m.SegSize))
		}
		c.stats.bytesOut.Add(bytes)
		c.stats.datagramsOut.Add(dgrams)
		sent += c.wgot
		if c.werr == 0 {
			continue
		}
		// The message at msgs[sent] failed with werr.
		m := &msgs[sent]
		if segments(m.Len(), m.SegSize) > 1 && gsoRefused(c.werr) {
			c.gso.Store(false)
			c.stats.gsoRefused.Add(1)
			return sent, fmt.Errorf("%w: %v", ErrGSO, c.werr)
		}
		if ctr := c.dropCounter(c.werr); ctr != nil {
			n := uint64(segments(m.Len(), m.SegSize))
			ctr.Add(n)
			c.stats.datagramsOut.Add(n)
			sent++
			continue
		}
		return sent, os.NewSyscallError("sendmmsg", c.werr)
	}
	return sent, nil
}

// prepareWrite fills header slot i for m, or reports false if m's destination is unusable. A message
// in Pieces takes its iovecs from wpcs, which the caller has checked can hold them.
func (c *UDPConn) prepareWrite(i int, m *Message) bool {
	size := m.Len()
	if segments(size, m.SegSize) > 1 && !c.gso.Load() {
		return false
	}
	sa := &c.wname[i]
	h := &c.whdr[i].Hdr
	a := m.Addr.Addr()
	if !a.IsValid() || m.Addr.Port() == 0 {
		return false
	}
	if c.v6 {
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		if z := a.Zone(); z != "" {
			sa.Scope_id = scopeID(z)
		}
		h.Namelen = unix.SizeofSockaddrInet6
	} else {
		if !a.Unmap().Is4() {
			return false
		}
		*(*unix.RawSockaddrInet4)(unsafe.Pointer(sa)) = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.Unmap().As4()}
		h.Namelen = unix.SizeofSockaddrInet4
	}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], m.Addr.Port())

	if m.Pieces != nil {
		if len(m.Pieces) == 0 {
			return false
		}
		iovs := c.wpcs[c.wpn : c.wpn+len(m.Pieces)]
		for k, p := range m.Pieces {
			iovs[k].Base = unsafe.SliceData(p)
			iovs[k].SetLen(len(p))
		}
		h.Iov = &iovs[0]
		h.SetIovlen(len(iovs))
		c.wpn += len(iovs)
	} else {
		iov := &c.wiov[i]
		if len(m.Buf) > 0 {
			iov.Base = &m.Buf[0]
		} else {
			iov.Base = nil
		}
		iov.SetLen(len(m.Buf))
		h.Iov = iov
		h.SetIovlen(1)
	}

	oob := c.woob[i*wctlSpace : (i+1)*wctlSpace]
	n := 0
	if m.TOS != 0 || c.alwaysTOS {
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		ch.Level, ch.Type = unix.IPPROTO_IP, unix.IP_TOS
		if c.v6 {
			ch.Level, ch.Type = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
		}
		ch.SetLen(unix.CmsgLen(4))
		binary.NativeEndian.PutUint32(oob[unix.CmsgLen(0):], uint32(m.TOS))
		n = tosSpace
	}
	if segments(size, m.SegSize) > 1 {
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&oob[n]))
		ch.Level, ch.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
		ch.SetLen(unix.CmsgLen(2))
		binary.NativeEndian.PutUint16(oob[n+unix.CmsgLen(0):], uint16(m.SegSize))
		n += unix.CmsgSpace(2)
	}
	if n == 0 {
		h.Control = nil
	} else {
		h.Control = &oob[0]
	}
	h.SetControllen(n)
	return true
}

// gsoRefused reports the errors with which the kernel refuses a GSO write it cannot do at all:
// EIO where the route's device cannot checksum it (net/ipv4/udp.c, udp_send_skb), EINVAL for a
// segment larger than the path MTU or a socket without checksums, and EOPNOTSUPP or ENOPROTOOPT
// where UDP_SEGMENT is unknown.
func gsoRefused(e unix.Errno) bool {
	switch e {
	case unix.EIO, unix.EINVAL, unix.EOPNOTSUPP, unix.ENOPROTOOPT:
		return true
	}
	return false
}

// scopeID resolves an IPv6 zone (an interface name or index) to a scope ID; 0 if unknown.
func scopeID(zone string) uint32 {
	if n, err := strconv.ParseUint(zone, 10, 32); err == nil {
		return uint32(n)
	}
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return uint32(ifi.Index)
	}
	return 0
}

// peerErr reports errors that describe one datagram's fate on the network rather than the socket.
func peerErr(e unix.Errno) bool {
	switch e {
	case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENETDOWN:
		return true
	}
	return false
}

// dropCounter returns the counter for a per-datagram send error, or nil for a socket error.
func (c *UDPConn) dropCounter(e unix.Errno) *atomic.Uint64 {
	switch e {
	case unix.EMSGSIZE:
		return &c.stats.dropTooBig
	case unix.ECONNREFUSED:
		return &c.stats.dropRefused
	case unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENETDOWN, unix.EPERM, unix.EACCES:
		return &c.stats.dropUnreachable // EPERM/EACCES: a firewall rule or a broadcast address
	case unix.ENOBUFS:
		return &c.stats.dropNoBuffer
	case unix.EAFNOSUPPORT, unix.EADDRNOTAVAIL, unix.EDESTADDRREQ:
		return &c.stats.dropBadAddr
	case unix.EFAULT:
		// A piece's memory is gone: a region its program unmapped while a packet sent from it by
		// reference (Message.Pieces) was still on its way out.
		return &c.stats.dropBadAddr
	}
	return nil
}

// closeSocket closes the socket once Close has set closed.
func (c *UDPConn) closeSocket() error { return c.file.Close() }

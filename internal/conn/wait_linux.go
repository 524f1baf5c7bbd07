package conn

import (
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// How a UDPConn waits. A socket in Go's netpoller shares the runtime's one epoll set, and every
// datagram that arrives wakes whichever thread is blocked in it, whether or not a goroutine waits on
// this socket. A sender streaming RDMA WRITEs never waits on its socket: it takes the ACKs as they
// come, without blocking, between sends. But with GOMAXPROCS 2 or more the runtime keeps an idle
// thread asleep in epoll_wait, and each ACK woke it for nothing: 5,000 to 25,000 context switches a
// second at a 64 KiB WRITE sender between two processes on a 2-CPU machine (400 with GOMAXPROCS=1).
// TCP never sees this: its ACKs do not reach user space.
//
// So once Listen has set the socket up, the UDPConn takes it out of the netpoller: it keeps a
// duplicate of the descriptor and closes the net.UDPConn, which removes the original from the
// runtime's epoll set (the socket, its options, its reuseport group and its steering program live on
// in the duplicate). A blocking read sleeps in epoll_pwait2(2) on an epoll set of its own, made at
// the first such read, holding the socket and an eventfd that SetReadDeadline signals when a sleeping
// reader must look at a new deadline; a writer whose send buffer is full sleeps in ppoll(2). These
// are blocking system calls: the kernel wakes exactly the thread that reads, and the runtime gives
// the sleeping goroutine's P to another thread if work appears for it (sysmon, within a tick of 20
// us to 10 ms, as for any blocking call; the datapath yields before it reads when it has woken a
// goroutine, so that goroutine does not wait for that). Close shuts the socket down, which wakes every
// sleeper on it (inet_shutdown wakes even an unconnected UDP socket's), then closes the descriptors
// once no call is inside.
//
// Measured with goroce perf write_bw between two processes, 40,000 WRITEs of 64 KiB, four interleaved
// pairs against GOROCE_NETPOLL=1: 2-10% more data a second (median 6%), from 2% more to 9% less CPU,
// and a fifth to a tenth of the sender's context switches; the ping-pong p50 against raw UDP's no
// worse (1.43 against 1.54, medians of five).
//
// GOROCE_NETPOLL=1 keeps sockets in the netpoller.
var selfWait = !strings.EqualFold(os.Getenv("GOROCE_NETPOLL"), "1")

// monoBase is the origin of the deadlines a self-waiting UDPConn keeps: nanoseconds on the monotonic
// clock since the package started.
var monoBase = time.Now()

func monoNow() int64 { return int64(time.Since(monoBase)) }

// detach takes c's socket out of the netpoller (see selfWait): c.fd is a duplicate of the
// descriptor, and the net.UDPConn is closed. On error c is unchanged.
func (c *UDPConn) detach() error {
	var nfd int
	var derr error
	if err := c.raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return err
	}
	if derr != nil {
		return os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", derr)
	}
	c.udp.Close() // the original descriptor leaves the epoll set; the socket lives on in nfd
	c.udp, c.raw = nil, nil
	c.fd = nfd
	c.wpoll = [1]unix.PollFd{{Fd: int32(nfd), Events: unix.POLLOUT}}
	return nil
}

// initWait makes the eventfd and the epoll set a reader sleeps in, on the first blocking read (a
// socket that only sends needs neither). The caller holds rmu.
func (c *UDPConn) initWait() error {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("eventfd", err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, c.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.fd)})
	}
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)})
	}
	if err != nil {
		unix.Close(efd)
		if epfd >= 0 {
			unix.Close(epfd)
		}
		return os.NewSyscallError("epoll", err)
	}
	c.efd, c.epfd = efd, epfd
	c.rpoll = [2]unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	return nil
}

// control runs f on the socket's descriptor.
func (c *UDPConn) control(f func(fd uintptr)) error {
	if c.fd >= 0 {
		f(uintptr(c.fd))
		return nil
	}
	return c.raw.Control(f)
}

// setDeadline is SetReadDeadline of a self-waiting UDPConn: 0 is no deadline, and any time before
// now (a kick) is stored as 1, which has passed.
func (c *UDPConn) setDeadline(t time.Time) {
	var d int64
	if !t.IsZero() {
		d = max(int64(t.Sub(monoBase)), 1)
	}
	c.deadline.Store(d)
	if c.waiting.Load() {
		// The reader stored waiting (after initWait made efd) before it read the deadline: it
		// either sees d or wakes here.
		var one = [8]byte{1}
		_, _ = unix.Write(c.efd, one[:])
	}
}

// waitRead is the blocking read of a self-waiting UDPConn: it calls recvmmsg until datagrams come or
// it fails, sleeping (see sleep) while the socket is empty, until the read deadline passes or c closes.
// The caller holds rmu.
func (c *UDPConn) waitRead() error {
	if c.epfd < 0 {
		if err := c.initWait(); err != nil {
			return err
		}
	}
	for {
		if c.closed.Load() {
			return ErrClosed
		}
		if c.recvmmsg(uintptr(c.fd)) {
			return nil
		}
		c.waiting.Store(true)
		d := c.deadline.Load()
		var ts *unix.Timespec
		if d != 0 {
			left := d - monoNow()
			if left <= 0 {
				c.waiting.Store(false)
				return ErrDeadline
			}
			c.rts = unix.NsecToTimespec(left)
			ts = &c.rts
		}
		if c.closed.Load() {
			c.waiting.Store(false)
			return ErrClosed
		}
		kicked, err := c.sleep(ts)
		c.waiting.Store(false)
		if kicked {
			var buf [8]byte
			_, _ = unix.Read(c.efd, buf[:]) // a deadline moved: look at it again
		}
		if err != nil && err != unix.EINTR {
			return err
		}
	}
}

// sleep waits until the socket is readable, the eventfd is signalled or ts (nil: no limit) passes,
// in epoll_pwait2(2) on an epoll set of its own (kernels from 5.11; ppoll(2) before them). It
// reports whether the eventfd was signalled.
func (c *UDPConn) sleep(ts *unix.Timespec) (kicked bool, err error) {
	if !noPwait2.Load() {
		var tsp uintptr
		if ts != nil {
			tsp = uintptr(unsafe.Pointer(ts))
		}
		n, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT2, uintptr(c.epfd), uintptr(unsafe.Pointer(&c.revents[0])), uintptr(len(c.revents)), tsp, 0, 0)
		switch e {
		case 0:
			for i := range int(n) {
				if c.revents[i].Fd == int32(c.efd) {
					kicked = true
				}
			}
			return kicked, nil
		case unix.EINTR:
			return false, unix.EINTR
		case unix.ENOSYS:
			noPwait2.Store(true)
		default:
			return false, os.NewSyscallError("epoll_pwait2", e)
		}
	}
	c.rpoll[0].Revents, c.rpoll[1].Revents = 0, 0
	if _, err := unix.Ppoll(c.rpoll[:], ts, nil); err != nil {
		if err == unix.EINTR {
			return false, err
		}
		return false, os.NewSyscallError("ppoll", err)
	}
	return c.rpoll[1].Revents != 0, nil
}

// noPwait2 is set once the kernel has said it has no epoll_pwait2.
var noPwait2 atomic.Bool

// waitWrite is the write of a self-waiting UDPConn: it calls sendmmsg until the kernel takes a
// message or refuses one, sleeping in ppoll while the send buffer is full. The caller holds wmu.
func (c *UDPConn) waitWrite() error {
	for {
		if c.closed.Load() {
			return ErrClosed
		}
		if c.sendmmsg(uintptr(c.fd)) {
			return nil
		}
		c.wpoll[0].Revents = 0
		if _, err := unix.Ppoll(c.wpoll[:], nil, nil); err != nil && err != unix.EINTR {
			return os.NewSyscallError("ppoll", err)
		}
	}
}

// closeSelf closes a self-waiting UDPConn after closed was set: shutting the socket down wakes every
// ppoll on it, and the descriptors close once no ReadBatch or WriteBatch is inside.
func (c *UDPConn) closeSelf() error {
	_ = unix.Shutdown(c.fd, unix.SHUT_RDWR) // ENOTCONN on an unconnected socket, but it wakes the pollers
	c.rmu.Lock()
	c.wmu.Lock()
	err := unix.Close(c.fd)
	if c.epfd >= 0 {
		unix.Close(c.efd)
		unix.Close(c.epfd)
	}
	c.wmu.Unlock()
	c.rmu.Unlock()
	if err != nil {
		return os.NewSyscallError("close", err)
	}
	return nil
}

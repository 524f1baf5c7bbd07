//go:build goroce_systrace

package conn

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Built with -tags goroce_systrace, UDPConn records the start and the end of each sendmmsg and
// recvmmsg, and SyscallProfile tells how the time of a ping-pong splits between the kernel and the
// program around it. It measures the machinery between system calls, which pprof smears: on a
// machine where each system call costs a flush of the TLB, the cost of what runs after one lands on
// whatever touches memory first. Each record reads the clock, about 0.1 us after a system call, so
// the figures are for comparing one program with another under the same build, not absolute.

const systraceOn = true

type sysEvent struct {
	at   int64 // nanoseconds since sysEpoch
	fd   int32
	kind sysKind
}

type sysKind uint8

const (
	sysSend      sysKind = iota // sendmmsg starts
	sysSent                     // sendmmsg returned
	sysRecv                     // recvmmsg starts
	sysRecvData                 // recvmmsg returned datagrams (or an error)
	sysRecvEmpty                // recvmmsg found nothing (EAGAIN)
)

// sysCallNames names a system call by the event that ends it.
var sysCallNames = [...]string{sysSent: "sendmmsg", sysRecvData: "recvmmsg with data", sysRecvEmpty: "recvmmsg finding none"}

var (
	sysEpoch  = time.Now()
	sysEvents = make([]sysEvent, 1<<22) // 64 MiB: half a million round trips of a ping-pong; later calls go unrecorded
	sysNext   atomic.Int64
)

func systrace(kind sysKind, fd uintptr) {
	if i := sysNext.Add(1) - 1; i < int64(len(sysEvents)) {
		sysEvents[i] = sysEvent{at: int64(time.Since(sysEpoch)), fd: int32(fd), kind: kind}
	}
}

// SyscallProfile returns the medians of what was recorded since the last call, and forgets it. Call
// it once the traffic has stopped. In a ping-pong, each side's round is: a recvmmsg that returns
// the request, the program's work up to its sendmmsg (receive to send), the sendmmsg, the work up to
// its next recvmmsg (send to read), which finds nothing, and a wait in the netpoller. Send to peer's
// read runs from a sendmmsg's start to the start of the recvmmsg that returns it: the kernel's
// delivery, the peer's wake-up and its way back to its read. Where the kernel runs the woken peer on
// the sender's CPU (as on the guests goroce is measured on), the sender's work after its send is part
// of it.
func SyscallProfile() string {
	n := min(sysNext.Swap(0), int64(len(sysEvents)))
	ev := sysEvents[:n]
	spans := map[string][]int64{}
	add := func(k string, d int64) { spans[k] = append(spans[k], d) }
	end := func(i int) (sysEvent, bool) { // the event that ends the system call started at i
		for j := i + 1; j < len(ev); j++ {
			if ev[j].fd == ev[i].fd {
				return ev[j], true
			}
		}
		return sysEvent{}, false
	}
	for i, e := range ev {
		switch e.kind {
		case sysSend, sysRecv:
			if f, ok := end(i); ok {
				add(sysCallNames[f.kind], f.at-e.at)
			}
			if e.kind != sysSend {
				break
			}
			// To the read that returns what it sent: the peer's wake-up and its way to the read.
			for j := i + 1; j < len(ev); j++ {
				if f, ok := end(j); ok && ev[j].kind == sysRecv && f.kind == sysRecvData {
					add("send to peer's read", ev[j].at-e.at)
					break
				}
			}
		case sysRecvData: // the other side waits for this one's send
			for j := i + 1; j < len(ev); j++ {
				if ev[j].kind == sysSend {
					add("receive to send", ev[j].at-e.at)
					break
				}
			}
		case sysSent: // to this side's next read, the one that finds nothing
			for j := i + 1; j < len(ev); j++ {
				if f, ok := end(j); ok && ev[j].kind == sysRecv && f.kind == sysRecvEmpty {
					add("send to read", ev[j].at-e.at)
					break
				}
			}
		}
	}
	var b strings.Builder
	for _, k := range []string{"receive to send", "send to read", "send to peer's read", "sendmmsg", "recvmmsg with data", "recvmmsg finding none"} {
		v := spans[k]
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		fmt.Fprintf(&b, "%-22s %8d  p25 %6.2f us  p50 %6.2f us  p75 %6.2f us\n", k, len(v),
			float64(v[len(v)/4])/1e3, float64(v[len(v)/2])/1e3, float64(v[len(v)*3/4])/1e3)
	}
	return b.String()
}

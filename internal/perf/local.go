package perf

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/conn"
)

// The measurements in this file run inside one process, as `goroce perf loopback` always made
// them: two goroce devices, or two raw UDP sockets, side by side.

// localPair opens two sides on a and b with their QPs connected to each other.
func localPair(a, b netip.Addr, s Spec) (*side, *side, error) {
	sa, err := openSide(a, s)
	if err != nil {
		return nil, nil, err
	}
	sb, err := openSide(b, s)
	if err != nil {
		sa.close()
		return nil, nil, err
	}
	if err = sa.connect(sb.infos(), s.MTU); err == nil {
		err = sb.connect(sa.infos(), s.MTU)
	}
	if err != nil {
		sa.close()
		sb.close()
		return nil, nil, err
	}
	return sa, sb, nil
}

// localWrite streams RDMA WRITEs from a device on a to one on b, in this process.
func localWrite(ctx context.Context, s Spec, a, b netip.Addr) (Result, error) {
	res := newResult()
	sa, sb, err := localPair(a, b, s)
	if err != nil {
		return res, err
	}
	defer sa.close()
	defer sb.close()
	wr := func(i int) goroce.SendWR {
		return goroce.SendWR{Opcode: goroce.WRRDMAWrite, SGL: []goroce.SGE{sa.mr.SGE(i*sa.slot, s.Size)},
			RemoteAddr: sb.mr.Addr() + uint64(i*sb.slot), RKey: sb.mr.RKey()}
	}
	// The allocations per packet count A's packets only, as the command always did: B's receive
	// path runs in this process too, so the figure covers A's send and receive paths and B's.
	total, iv, err := runStreams(ctx, sa, s, wr, nil)
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	res.Messages, res.Bytes, res.Elapsed = total.counted, total.counted*uint64(s.Size), s.Duration
	res.Gbps = gbps(res.Bytes, res.Elapsed)
	res.Allocs = iv.allocs
	res.setCPU(&iv.cpu, nil)
	st := sa.dev.Stats()
	res.noteStats("A", st)
	res.noteStats("B", sb.dev.Stats())
	noteGSO(&res, s, st, nil)
	return res, nil
}

// localUDP runs conn.RawThroughput between two sockets on a and b, with the spec's datagrams and
// window, and counts each datagram's RoCE payload.
func localUDP(ctx context.Context, s Spec, a, b netip.Addr) (Result, error) {
	res := newResult()
	ca, cb, err := rawPair(a, b)
	if err != nil {
		return res, err
	}
	defer ca.Close()
	defer cb.Close()
	var cpu cpuSpan
	cpu.begin()
	r, err := conn.RawThroughput(ctx, ca, cb, s.Size, s.Window, s.Duration)
	cpu.end()
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	res.setCPU(&cpu, nil)
	res.Messages, res.Elapsed = r.Received, r.Elapsed
	res.Bytes = r.Received * uint64(s.Payload)
	res.Gbps = gbps(res.Bytes, res.Elapsed)
	if r.Loss > 0 {
		res.notef("loss %.3f%%", 100*r.Loss)
	}
	return res, nil
}

// localPingPong measures SEND round trips between two devices on a and b, in this process: b
// echoes from its own goroutine.
func localPingPong(ctx context.Context, s Spec, a, b netip.Addr) (Result, error) {
	res := newResult()
	sa, sb, err := localPair(a, b, s)
	if err != nil {
		return res, err
	}
	defer sa.close()
	defer sb.close()
	if err := postRecvs(sb, 0, s.Size); err != nil {
		return res, err
	}
	ectx, cancel := context.WithCancel(ctx)
	var echoed atomic.Uint64
	echoErr := make(chan error, 1)
	go func() { echoErr <- echoLoop(ectx, sb, s, &echoed) }()
	samples, cpu, err := pingLoop(ctx, sa, s, nil)
	cancel()
	if eerr := <-echoErr; err == nil {
		err = eerr
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	rttResult(&res, samples)
	res.setCPU(&cpu, nil)
	st := sa.dev.Stats()
	res.PacketsPerRTT = float64(packets(st)) / float64(s.Pings+pingWarmup)
	res.noteStats("A", st)
	res.noteStats("B", sb.dev.Stats())
	return res, nil
}

// localUDPPingPong runs conn.RawPingPong between two sockets on a and b.
func localUDPPingPong(ctx context.Context, s Spec, a, b netip.Addr) (Result, error) {
	res := newResult()
	ca, cb, err := rawPair(a, b)
	if err != nil {
		return res, err
	}
	defer ca.Close()
	defer cb.Close()
	var cpu cpuSpan
	cpu.begin()
	r, err := conn.RawPingPong(ctx, conn.BusyPolling(ca, s.BusyPoll), conn.BusyPolling(cb, s.BusyPoll), s.Size, s.Pings)
	cpu.end()
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	res.setCPU(&cpu, nil)
	res.RTTP50, res.RTTP99, res.Pings = r.RTTP50, r.RTTP99, int(r.Received)
	if r.Loss > 0 {
		res.notef("%.3f%% of pings sent again", 100*r.Loss)
	}
	return res, nil
}

// rawPair opens two UDP sockets without offloads on a and b.
func rawPair(a, b netip.Addr) (conn.Conn, conn.Conn, error) {
	ca, err := conn.Listen(netip.AddrPortFrom(a, 0), conn.Options{})
	if err != nil {
		return nil, nil, err
	}
	cb, err := conn.Listen(netip.AddrPortFrom(b, 0), conn.Options{})
	if err != nil {
		ca.Close()
		return nil, nil, err
	}
	return ca, cb, nil
}

// IdleResult is the memory of connected idle queue pairs.
type IdleResult struct {
	QPs       int
	HeapBytes int64         // heap in use after, less before
	Elapsed   time.Duration // creating and connecting them
}

// Idle creates n connected idle RC QPs on one device at addr, their peer at peer (which never
// answers, and need not exist), and measures the heap they take.
func Idle(n int, addr, peer netip.Addr) (IdleResult, error) {
	d, err := goroce.Open(goroce.Config{Addr: addr, MaxQPs: n + 16})
	if err != nil {
		return IdleResult{}, fmt.Errorf("open a goroce device on %v: %w", addr, err)
	}
	defer d.Close()
	pd, err := d.AllocPD()
	if err != nil {
		return IdleResult{}, err
	}
	cq, err := d.CreateCQ(1024)
	if err != nil {
		return IdleResult{}, err
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	qps := make([]*goroce.QP, 0, n)
	gid := goroce.GIDFromAddr(peer)
	start := time.Now()
	for i := range n {
		q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			return IdleResult{}, fmt.Errorf("QP %d: %w", i, err)
		}
		if err := q.Connect(goroce.Endpoint{QPN: goroce.QPN(0x100 + i), PSN: 1, GID: gid}, nil); err != nil {
			return IdleResult{}, fmt.Errorf("QP %d: %w", i, err)
		}
		qps = append(qps, q)
	}
	elapsed := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(qps)
	return IdleResult{QPs: len(qps), HeapBytes: int64(after.HeapInuse) - int64(before.HeapInuse), Elapsed: elapsed}, nil
}

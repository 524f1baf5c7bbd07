package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/wire"
)

func init() {
	register(command{"perf", "measure goroce: against raw UDP (perf loopback), or as a perftest peer (perf write_bw, read_lat, ...)", runPerf})
}

type perfOptions struct {
	duration time.Duration
	msg      int
	depth    int
	pings    int
	idleQPs  int
	only     string
}

func runPerf(args []string) error {
	if len(args) > 0 {
		if t := findPerftest(args[0]); t != nil {
			return runPerftest(t, args[1:])
		}
	}
	if len(args) == 0 || args[0] != "loopback" {
		fmt.Fprintln(os.Stderr, "usage: goroce perf loopback [-d duration] [-msg bytes] [-depth n] [-pings n] [-idle-qps n] [-only write|pingpong|idle]")
		perftestUsage(os.Stderr)
		return errUsage
	}
	fs := flag.NewFlagSet("perf loopback", flag.ContinueOnError)
	o := perfOptions{}
	fs.DurationVar(&o.duration, "d", 3*time.Second, "how long each throughput run lasts")
	fs.IntVar(&o.msg, "msg", 64<<10, "RDMA WRITE message size")
	fs.IntVar(&o.depth, "depth", 16, "WRITEs kept outstanding")
	fs.IntVar(&o.pings, "pings", 20000, "round trips of the ping-pong runs")
	fs.IntVar(&o.idleQPs, "idle-qps", 10000, "connected idle RC QPs for the memory run")
	fs.StringVar(&o.only, "only", "", "run one measurement: write, pingpong or idle")
	if err := fs.Parse(args[1:]); err != nil {
		return errUsage
	}
	return perfLoopback(os.Stdout, o)
}

// perfLoopback runs goroce and the raw UDP path side by side on loopback and prints the ratios the
// project's goals are stated in.
func perfLoopback(w io.Writer, o perfOptions) error {
	fmt.Fprintf(w, "goroce perf loopback: %d CPUs, GOMAXPROCS %d, %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if o.only == "" || o.only == "write" {
		if err := perfWrite(w, o); err != nil {
			return err
		}
	}
	if o.only == "" || o.only == "pingpong" {
		if err := perfPingPong(w, o); err != nil {
			return err
		}
	}
	if o.only == "" || o.only == "idle" {
		if err := perfIdle(w, o); err != nil {
			return err
		}
	}
	return nil
}

// perfPair is two devices with one connected RC QP each.
type perfPair struct {
	a, b     *goroce.Device
	pda, pdb *goroce.PD
	cqa, cqb *goroce.CQ
	qa, qb   *goroce.QP
}

func newPerfPair(a, b string, mtu wire.MTU) (*perfPair, error) {
	p := &perfPair{}
	var err error
	if p.a, err = goroce.Open(goroce.Config{Addr: netip.MustParseAddr(a)}); err != nil {
		return nil, err
	}
	if p.b, err = goroce.Open(goroce.Config{Addr: netip.MustParseAddr(b)}); err != nil {
		p.a.Close()
		return nil, err
	}
	p.pda, _ = p.a.AllocPD()
	p.pdb, _ = p.b.AllocPD()
	p.cqa, _ = p.a.CreateCQ(4096)
	p.cqb, _ = p.b.CreateCQ(4096)
	init := func(cq *goroce.CQ) goroce.QPInit {
		return goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1024, MaxRecvWR: 1024}
	}
	p.qa, _ = p.pda.CreateQP(init(p.cqa))
	p.qb, _ = p.pdb.CreateQP(init(p.cqb))
	opts := goroce.ConnectOptions{MTU: mtu}
	if err := p.qa.Connect(p.qb.Info(), opts); err != nil {
		return nil, err
	}
	if err := p.qb.Connect(p.qa.Info(), opts); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *perfPair) close() {
	p.a.Close()
	p.b.Close()
}

// perfWrite streams RDMA WRITEs of o.msg bytes at MTU 4096 and compares with raw UDP datagrams the size
// of a WRITE MIDDLE packet, with the same batching and a window as deep as goroce's PSN window.
func perfWrite(w io.Writer, o perfOptions) error {
	fmt.Fprintf(w, "\n== RC RDMA WRITE, %d-byte messages, MTU 4096, one QP, %d outstanding, %v\n", o.msg, o.depth, o.duration)
	p, err := newPerfPair("127.0.3.1", "127.0.3.2", wire.MTU4096)
	if err != nil {
		return err
	}
	defer p.close()
	src, err := p.pda.AllocMR(o.msg, goroce.LocalWrite)
	if err != nil {
		return err
	}
	dst, err := p.pdb.AllocMR(o.msg, goroce.LocalWrite|goroce.RemoteWrite)
	if err != nil {
		return err
	}
	wr := goroce.SendWR{Opcode: goroce.WRWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{src.SGE(0, o.msg)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration+30*time.Second)
	defer cancel()
	wcs := make([]goroce.Completion, 64)
	post := func() error { return p.qa.PostSend(&wr) }
	for i := 0; i < o.depth; i++ {
		if err := post(); err != nil {
			return err
		}
	}
	// Warm up, then measure.
	var ms0, ms1 runtime.MemStats
	warm := time.Now().Add(o.duration / 10)
	measuring := false
	var start time.Time
	var done uint64
	s0 := p.a.Stats()
	for {
		n, err := p.cqa.Wait(ctx, wcs)
		if err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return fmt.Errorf("WRITE failed: %v", wc.Status)
			}
		}
		now := time.Now()
		if !measuring && now.After(warm) {
			measuring, start = true, now
			s0 = p.a.Stats()
			runtime.ReadMemStats(&ms0)
		} else if measuring {
			done += uint64(n)
			if now.Sub(start) >= o.duration {
				break
			}
		}
		for i := 0; i < n; i++ {
			if err := post(); err != nil {
				return err
			}
		}
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	s1 := p.a.Stats()
	gbps := float64(done) * float64(o.msg) * 8 / elapsed.Seconds() / 1e9
	pkts := (s1.TxPackets - s0.TxPackets) + (s1.RxPackets - s0.RxPackets)
	allocs := float64(ms1.Mallocs-ms0.Mallocs) / float64(max(pkts, 1))
	fmt.Fprintf(w, "goroce:  %6.2f Gb/s goodput, %d messages, retransmissions %d, %.3f allocations per packet (A's send + receive path, %d packets)\n",
		gbps, done, s1.QP.CompleterRetryErr-s0.QP.CompleterRetryErr, allocs, pkts)

	// The raw path: datagrams the size of a WRITE MIDDLE transport packet (BTH + 4096 + ICRC), one way,
	// with 128 in flight like goroce's PSN window.
	size := wire.BTHLen + 4096 + wire.ICRCLen
	raw, err := rawPair("127.0.3.3", "127.0.3.4")
	if err != nil {
		return err
	}
	defer raw[0].Close()
	defer raw[1].Close()
	r, err := conn.RawThroughput(context.Background(), raw[0], raw[1], size, 128, o.duration)
	if err != nil {
		return err
	}
	rawPayload := r.Gbps * 4096 / float64(size)
	fmt.Fprintf(w, "raw UDP: %6.2f Gb/s of %d-byte datagrams (%.2f Gb/s of the 4096-byte payloads they would carry), loss %.2f%%\n",
		r.Gbps, size, rawPayload, r.Loss*100)
	fmt.Fprintf(w, "ratio:   goroce / raw = %.0f%%  (goal: at least 70%%)\n", 100*gbps/rawPayload)
	return nil
}

func rawPair(a, b string) ([2]conn.Conn, error) {
	var out [2]conn.Conn
	for i, s := range []string{a, b} {
		c, err := conn.Listen(netip.AddrPortFrom(netip.MustParseAddr(s), goroce.DefaultPort), conn.Options{})
		if err != nil {
			if i == 1 {
				out[0].Close()
			}
			return out, err
		}
		out[i] = c
	}
	return out, nil
}

// perfPingPong measures the round trip of a 16-byte SEND answered by a 16-byte SEND, against a raw
// UDP ping-pong of the same transport packet size.
func perfPingPong(w io.Writer, o perfOptions) error {
	fmt.Fprintf(w, "\n== 16-byte SEND ping-pong, %d round trips\n", o.pings)
	p, err := newPerfPair("127.0.3.5", "127.0.3.6", wire.MTU1024)
	if err != nil {
		return err
	}
	defer p.close()
	ma, _ := p.pda.RegMR(make([]byte, 16), goroce.LocalWrite)
	mb, _ := p.pdb.RegMR(make([]byte, 16), goroce.LocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// B echoes every message it receives, from its own goroutine.
	errc := make(chan error, 1)
	go func() {
		wcs := make([]goroce.Completion, 16)
		for i := 0; i < 512; i++ {
			if err := p.qb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{mb.SGE(0, 16)}}); err != nil {
				errc <- err
				return
			}
		}
		for got := 0; got < o.pings+100; {
			n, err := p.cqb.Wait(ctx, wcs)
			if err != nil {
				errc <- err
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Opcode == goroce.CompRecv {
					got++
					if err := p.qb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{mb.SGE(0, 16)}}); err != nil {
						errc <- err
						return
					}
					if err := p.qb.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: mb.Bytes()}); err != nil {
						errc <- err
						return
					}
				}
			}
		}
		errc <- nil
	}()
	wcs := make([]goroce.Completion, 16)
	rtts := make([]time.Duration, 0, o.pings)
	for i := 0; i < o.pings+100; i++ {
		if err := p.qa.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{ma.SGE(0, 16)}}); err != nil {
			return err
		}
		t0 := time.Now()
		if err := p.qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: ma.Bytes()}); err != nil {
			return err
		}
		for answered := false; !answered; {
			n, err := p.cqa.Wait(ctx, wcs)
			if err != nil {
				return err
			}
			for _, wc := range wcs[:n] {
				if wc.Status != goroce.StatusSuccess {
					return fmt.Errorf("ping failed: %v", wc.Status)
				}
				if wc.Opcode == goroce.CompRecv {
					answered = true
				}
			}
		}
		if i >= 100 { // the first hundred warm up
			rtts = append(rtts, time.Since(t0))
		}
	}
	if err := <-errc; err != nil {
		return err
	}
	slices.Sort(rtts)
	p50, p99 := rtts[len(rtts)/2], rtts[len(rtts)*99/100]
	fmt.Fprintf(w, "goroce:  RTT p50 %v, p99 %v\n", p50.Round(100*time.Nanosecond), p99.Round(100*time.Nanosecond))
	raw, err := rawPair("127.0.3.7", "127.0.3.8")
	if err != nil {
		return err
	}
	defer raw[0].Close()
	defer raw[1].Close()
	r, err := conn.RawPingPong(context.Background(), raw[0], raw[1], wire.BTHLen+16+wire.ICRCLen, o.pings)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "raw UDP: RTT p50 %v, p99 %v (32-byte datagrams, the size of a 16-byte SEND_ONLY)\n", r.RTTP50.Round(100*time.Nanosecond), r.RTTP99.Round(100*time.Nanosecond))
	fmt.Fprintf(w, "ratio:   goroce / raw p50 = %.2fx  (goal: at most 1.5x)\n", float64(p50)/float64(r.RTTP50))
	return nil
}

// perfIdle creates connected idle RC QPs on one device and reports the memory they take.
func perfIdle(w io.Writer, o perfOptions) error {
	fmt.Fprintf(w, "\n== %d connected idle RC QPs on one device\n", o.idleQPs)
	d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("127.0.3.9"), MaxQPs: o.idleQPs + 16})
	if err != nil {
		return err
	}
	defer d.Close()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(1024)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	qps := make([]*goroce.QP, 0, o.idleQPs)
	peer := goroce.GIDFromAddr(netip.MustParseAddr("127.0.3.10"))
	start := time.Now()
	for i := 0; i < o.idleQPs; i++ {
		q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			return err
		}
		if err := q.Connect(goroce.RemoteInfo{QPN: wire.QPN(0x100 + i), PSN: 1, GID: peer}, goroce.ConnectOptions{}); err != nil {
			return err
		}
		qps = append(qps, q)
	}
	elapsed := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	mib := float64(after.HeapInuse-before.HeapInuse) / (1 << 20)
	fmt.Fprintf(w, "goroce:  %.1f MiB of heap for %d QPs (%.1f KiB each), created and connected in %v  (goal: under 200 MiB)\n",
		mib, len(qps), mib*1024/float64(len(qps)), elapsed.Round(time.Millisecond))
	runtime.KeepAlive(qps)
	return nil
}

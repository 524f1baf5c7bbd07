package perf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/wire"
)

const (
	// recvDepth is the receives a SEND or ping-pong receiver keeps posted on each QP, far more than
	// the sender keeps outstanding, so that a receiver's goroutine falling behind is not an RNR NAK.
	recvDepth = 512
	// pingWarmup round trips start every ping-pong run unmeasured.
	pingWarmup = 100
	// drainTimeout bounds a throughput run past its interval: the wait for the last completions.
	// A run still waiting then has stalled, and fails.
	drainTimeout = 10 * time.Second
	// pingTimeout bounds one goroce round trip; a longer one has stalled, and fails the run.
	pingTimeout = 10 * time.Second
	// serverStopTimeout bounds the wait for a server's goroutines once told to stop.
	serverStopTimeout = 10 * time.Second
)

// side is one process's goroce objects for a measurement: a device, a protection domain, a region
// cut into one slot per QP, and one CQ and one RC QP per slot.
type side struct {
	dev  *goroce.Device
	pd   *goroce.PD
	mr   *goroce.MR
	slot int
	cqs  []*goroce.CQ
	qps  []*goroce.QP
}

// openSide opens a device on addr and creates s.QPs queue pairs, each with its CQ and a slot of
// s.Size bytes of one region.
func openSide(addr netip.Addr, s Spec) (*side, error) {
	cfg := goroce.Config{Addr: addr, BusyPoll: s.BusyPoll}
	if !s.GSO {
		cfg.GSO = goroce.GSOOff
	}
	dev, err := goroce.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("open a goroce device on %v: %w", addr, err)
	}
	sd := &side{dev: dev, slot: s.Size}
	if err := sd.create(s); err != nil {
		dev.Close()
		return nil, fmt.Errorf("goroce device on %v: %w", addr, err)
	}
	return sd, nil
}

func (sd *side) create(s Spec) error {
	var err error
	if sd.pd, err = sd.dev.AllocPD(); err != nil {
		return err
	}
	access := goroce.LocalWrite | goroce.RemoteWrite | goroce.RemoteRead
	if sd.mr, err = sd.pd.AllocMR(max(s.QPs, 1)*s.Size, access); err != nil {
		return err
	}
	// The send queue holds the depth and the one extra request that makes the last one signaled.
	sendWR := s.Depth + 1
	for range max(s.QPs, 1) {
		cq, err := sd.dev.CreateCQ(sendWR + recvDepth + 16)
		if err != nil {
			return err
		}
		q, err := sd.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq, MaxSendWR: sendWR, MaxRecvWR: recvDepth})
		if err != nil {
			return err
		}
		sd.cqs, sd.qps = append(sd.cqs, cq), append(sd.qps, q)
	}
	return nil
}

// close closes the device, which flushes and frees everything on it.
func (sd *side) close() { sd.dev.Close() }

// infos returns what the peer needs to connect to each QP.
func (sd *side) infos() []goroce.Endpoint {
	out := make([]goroce.Endpoint, len(sd.qps))
	for i, q := range sd.qps {
		out[i] = q.Endpoint()
	}
	return out
}

// region returns what the peer needs to reach the slots.
func (sd *side) region() *MRInfo {
	return &MRInfo{Addr: sd.mr.Addr(), RKey: uint32(sd.mr.RKey()), Slot: sd.slot}
}

// connect connects QP i to peer[i] at path MTU mtu.
func (sd *side) connect(peer []goroce.Endpoint, mtu int) error {
	if len(peer) != len(sd.qps) {
		return fmt.Errorf("peer has %d QPs, this side %d", len(peer), len(sd.qps))
	}
	m, ok := goroce.MTUFromBytes(mtu)
	if !ok {
		return fmt.Errorf("MTU %d", mtu)
	}
	opts := goroce.DefaultConnectOptions()
	opts.MTU = m
	for i, q := range sd.qps {
		if err := q.Connect(peer[i], &opts); err != nil {
			return fmt.Errorf("connect QP %v to %v: %w", q.QPN(), peer[i], err)
		}
	}
	return nil
}

// packets returns the device's packets, sent and received.
func packets(s goroce.Stats) uint64 { return s.TxPackets + s.RxPackets }

// opcode returns the work request of a goroce stream kind.
func opcode(k Kind) goroce.WROpcode {
	switch k {
	case GoroceRead:
		return goroce.WRRDMARead
	case GoroceSend:
		return goroce.WRSend
	}
	return goroce.WRRDMAWrite
}

// streamCount is what one QP of a throughput run completed.
type streamCount struct {
	counted   uint64 // messages whose completion was seen in the interval
	completed uint64 // messages completed in all
}

// stream keeps s.Depth copies of wr outstanding on q, one in s.CQMod signaled, until w ends, then
// waits for the last to complete. A signaled completion stands for every request before it: its
// WRID is the count of requests posted before it.
func stream(ctx context.Context, q *goroce.QP, cq *goroce.CQ, wr goroce.SendWR, s Spec, w window) (streamCount, error) {
	depth, mod := uint64(s.Depth), uint64(max(s.CQMod, 1))
	wcs := make([]goroce.Completion, 64)
	var c streamCount
	var posted uint64
	post := func(signaled bool) error {
		wr.WRID, wr.Flags = posted, 0
		if signaled {
			wr.Flags = goroce.Signaled
		}
		if err := q.PostSend(&wr); err != nil {
			return fmt.Errorf("QP %v: post %v number %d: %w", q.QPN(), wr.Opcode, posted, err)
		}
		posted++
		return nil
	}
	for stopping := false; !stopping || c.completed < posted; {
		for !stopping && posted-c.completed < depth {
			if err := post((posted+1)%mod == 0); err != nil {
				return c, err
			}
		}
		n, err := cq.Wait(ctx, wcs)
		if err != nil {
			return c, fmt.Errorf("QP %v: waiting for completions, %d of %d completed: %w", q.QPN(), c.completed, posted, err)
		}
		now := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return c, fmt.Errorf("QP %v: %v number %d completed with %v", q.QPN(), wr.Opcode, wc.WRID, wc.Status)
			}
			if done := wc.WRID + 1; done > c.completed {
				if w.in(now) {
					c.counted += done - c.completed
				}
				c.completed = done
			}
		}
		if !stopping && !now.Before(w.end) {
			stopping = true
			if posted%mod != 0 { // the last request is unsignaled: one more that is
				if err := post(true); err != nil {
					return c, err
				}
			}
		}
	}
	return c, nil
}

// interval is what runStreams measured over the timed interval, besides the messages.
type interval struct {
	allocs float64 // heap allocations per packet of the device; NaN if not measured
	cpu    cpuSpan // this process's CPU time
}

// runStreams runs stream on every QP of sd at once, each on its own goroutine, the request of QP i
// built by wr(i). At the interval's start it snapshots the process's allocations, CPU time and the
// device's counters and calls atStart. It returns the sum of the counts, with the allocations per
// packet and the CPU time of the interval.
func runStreams(ctx context.Context, sd *side, s Spec, wr func(i int) goroce.SendWR, atStart func() error) (streamCount, interval, error) {
	w := newWindow(s)
	mctx, cancel := context.WithDeadline(ctx, w.end.Add(drainTimeout))
	defer cancel()
	counts := make([]streamCount, len(sd.qps))
	errs := make([]error, len(sd.qps)+1)
	var wg sync.WaitGroup
	for i := range sd.qps {
		wg.Go(func() {
			counts[i], errs[i] = stream(mctx, sd.qps[i], sd.cqs[i], wr(i), s, w)
			if errs[i] != nil {
				cancel()
			}
		})
	}
	iv := interval{allocs: math.NaN()}
	var ms0, ms1 runtime.MemStats
	if sleepUntil(mctx, w.start) {
		runtime.ReadMemStats(&ms0)
		st0 := sd.dev.Stats()
		if errs[len(sd.qps)] = iv.cpu.beginAfter(atStart); errs[len(sd.qps)] != nil {
			cancel()
		}
		if sleepUntil(mctx, w.end) {
			iv.cpu.end()
			runtime.ReadMemStats(&ms1)
			st1 := sd.dev.Stats()
			iv.allocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(max(packets(st1)-packets(st0), 1))
		}
	}
	wg.Wait()
	var total streamCount
	for _, c := range counts {
		total.counted += c.counted
		total.completed += c.completed
	}
	if err := ctx.Err(); err != nil {
		return total, iv, err
	}
	return total, iv, errors.Join(errs...)
}

// sleepUntil sleeps until t and reports whether ctx was still alive then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// goroceStream runs a throughput measurement against the child: WRITEs into its region, READs of
// it, or SENDs to its receives, on s.QPs queue pairs at once.
func goroceStream(ctx context.Context, ch *Child, s Spec, local, remote netip.Addr) (Result, error) {
	res := newResult()
	sd, err := openSide(local, s)
	if err != nil {
		return res, err
	}
	defer sd.close()
	ep, err := ch.start(ctx, s, remote.String(), Endpoint{QPs: sd.infos()})
	if err != nil {
		return res, err
	}
	defer ch.cleanup()
	if ep.MR == nil || ep.MR.Slot < s.Size {
		return res, fmt.Errorf("%w: start: no region of %d-byte slots in the reply", ErrChild, s.Size)
	}
	if err := sd.connect(ep.QPs, s.MTU); err != nil {
		return res, err
	}
	op := opcode(s.Kind)
	wr := func(i int) goroce.SendWR {
		w := goroce.SendWR{Opcode: op, SGL: []goroce.SGE{sd.mr.SGE(i*sd.slot, s.Size)}}
		if op != goroce.WRSend {
			w.RemoteAddr, w.RKey = ep.MR.Addr+uint64(i*ep.MR.Slot), wire.RKey(ep.MR.RKey)
		}
		return w
	}
	total, iv, err := runStreams(ctx, sd, s, wr, func() error { return ch.mark(ctx) })
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	rep, err := ch.stop(ctx)
	if err != nil {
		return res, err
	}
	res.Messages, res.Bytes, res.Elapsed = total.counted, total.counted*uint64(s.Size), s.Duration
	res.Gbps = gbps(res.Bytes, res.Elapsed)
	res.Allocs = iv.allocs
	res.setCPU(&iv.cpu, &rep)
	if rep.Marked && rep.Packets > 0 {
		res.PeerAllocs = float64(rep.Mallocs) / float64(rep.Packets)
	}
	local0 := sd.dev.Stats()
	res.noteStats("this side", local0)
	if rep.Stats != nil {
		res.noteStats("child", *rep.Stats)
	}
	noteGSO(&res, s, local0, rep.Stats)
	if s.Kind == GoroceSend && rep.Messages != total.completed {
		res.notef("MISMATCH: the child completed %d receives for %d SENDs completed here", rep.Messages, total.completed)
	}
	return res, nil
}

// noteGSO notes where the data's sender did not send as the spec asked: no GSO writes with GSO on
// (GOROCE_GSO=off, or a kernel without UDP GSO), or GSO writes with it off (GOROCE_GSO=on).
func noteGSO(res *Result, s Spec, local goroce.Stats, peer *goroce.Stats) {
	data, who := local, "this side"
	if s.Kind == GoroceRead {
		if peer == nil {
			return
		}
		data, who = *peer, "child"
	}
	switch {
	case s.GSO && data.TxGSO == 0:
		res.notef("%s sent no GSO writes: GSO was not in use", who)
	case !s.GSO && data.TxGSO > 0:
		res.notef("%s sent %d GSO writes with GSO off (GOROCE_GSO overrides the configuration)", who, data.TxGSO)
	}
}

// gorocePingPong measures round trips of a small SEND the child echoes.
func gorocePingPong(ctx context.Context, ch *Child, s Spec, local, remote netip.Addr) (Result, error) {
	res := newResult()
	sd, err := openSide(local, s)
	if err != nil {
		return res, err
	}
	defer sd.close()
	ep, err := ch.start(ctx, s, remote.String(), Endpoint{QPs: sd.infos()})
	if err != nil {
		return res, err
	}
	defer ch.cleanup()
	if err := sd.connect(ep.QPs, s.MTU); err != nil {
		return res, err
	}
	samples, cpu, err := pingLoop(ctx, sd, s, func() error { return ch.mark(ctx) })
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	rep, err := ch.stop(ctx)
	if err != nil {
		return res, err
	}
	rttResult(&res, samples)
	res.setCPU(&cpu, &rep)
	st := sd.dev.Stats()
	res.PacketsPerRTT = float64(packets(st)) / float64(s.Pings+pingWarmup)
	res.noteStats("this side", st)
	if rep.Stats != nil {
		res.noteStats("child", *rep.Stats)
	}
	return res, nil
}

// rttResult fills in the round-trip figures of samples.
func rttResult(res *Result, samples []time.Duration) {
	slices.Sort(samples)
	res.Pings = len(samples)
	res.RTTP50, res.RTTP99 = Percentile(samples, 0.50), Percentile(samples, 0.99)
}

// pingLoop sends s.Pings+pingWarmup SENDs of s.Size bytes on the first QP of sd, one at a time,
// each after posting the receive of its answer, and returns the round trips after the warm-up and
// this process's CPU time over them. After the warm-up it calls mark, if set.
// One context serves every wait, as a program would use one: the CQ registers it once.
func pingLoop(ctx context.Context, sd *side, s Spec, mark func() error) ([]time.Duration, cpuSpan, error) {
	q, cq := sd.qps[0], sd.cqs[0]
	buf := sd.mr.Bytes()[:s.Size]
	recv := goroce.RecvWR{SGL: []goroce.SGE{sd.mr.SGE(0, s.Size)}}
	send := goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: buf}
	wcs := make([]goroce.Completion, 16)
	samples := make([]time.Duration, 0, s.Pings)
	lctx, stop, answered := stallWatch(ctx, pingTimeout)
	defer stop()
	var cpu cpuSpan
	fail := func(i int, err error) ([]time.Duration, cpuSpan, error) {
		if cause := context.Cause(lctx); ctx.Err() == nil && cause != nil {
			err = cause
		}
		return nil, cpu, fmt.Errorf("ping %d: %w", i, err)
	}
	for i := range s.Pings + pingWarmup {
		if i == pingWarmup {
			if err := cpu.beginAfter(mark); err != nil {
				return fail(i, err)
			}
		}
		if err := q.PostRecv(&recv); err != nil {
			return fail(i, fmt.Errorf("post receive: %w", err))
		}
		t0 := time.Now()
		if err := q.PostSend(&send); err != nil {
			return fail(i, fmt.Errorf("post SEND: %w", err))
		}
		for got := false; !got; {
			n, err := cq.Wait(lctx, wcs)
			if err != nil {
				return fail(i, err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != goroce.StatusSuccess {
					return fail(i, fmt.Errorf("%v completed with %v", wc.Opcode, wc.Status))
				}
				if wc.Opcode == goroce.CompRecv {
					got = true
				}
			}
		}
		rtt := time.Since(t0)
		answered.Add(1)
		if i >= pingWarmup {
			samples = append(samples, rtt)
		}
	}
	cpu.end()
	return samples, cpu, nil
}

// stallWatch returns a context that ends with ctx, or when the counter it returns has not moved
// for a whole period d, its cause then saying so; stop ends the watch.
func stallWatch(ctx context.Context, d time.Duration) (context.Context, func(), *atomic.Uint64) {
	wctx, cancel := context.WithCancelCause(ctx)
	var n atomic.Uint64
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(d)
		defer t.Stop()
		last := n.Load()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if cur := n.Load(); cur != last {
				last = cur
				continue
			}
			cancel(fmt.Errorf("no answer within %v", d))
			return
		}
	}()
	return wctx, func() { close(done); cancel(nil) }, &n
}

// postRecvs posts recvDepth receives of n bytes into slot i on QP i of sd, before the peer
// sends: a SEND finding none would be answered with an RNR NAK and sent again later.
func postRecvs(sd *side, i, n int) error {
	recv := goroce.RecvWR{SGL: []goroce.SGE{sd.mr.SGE(i*sd.slot, n)}}
	for range recvDepth {
		if err := sd.qps[i].PostRecv(&recv); err != nil {
			return fmt.Errorf("QP %v: post receive: %w", sd.qps[i].QPN(), err)
		}
	}
	return nil
}

// echoLoop answers every SEND that arrives on the first QP of sd with a SEND of the same size,
// posting a receive for each one consumed (postRecvs posted the first ones), until ctx ends. It
// counts the receives in *n.
func echoLoop(ctx context.Context, sd *side, s Spec, n *atomic.Uint64) error {
	q, cq := sd.qps[0], sd.cqs[0]
	recv := goroce.RecvWR{SGL: []goroce.SGE{sd.mr.SGE(0, s.Size)}}
	send := goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: sd.mr.Bytes()[:s.Size]}
	wcs := make([]goroce.Completion, 16)
	for {
		k, err := cq.Wait(ctx, wcs)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("echo: %w", err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != goroce.StatusSuccess {
				return fmt.Errorf("echo: %v completed with %v", wc.Opcode, wc.Status)
			}
			if wc.Opcode != goroce.CompRecv {
				continue
			}
			n.Add(1)
			if err := q.PostRecv(&recv); err != nil {
				return fmt.Errorf("echo: post receive: %w", err)
			}
			if err := q.PostSend(&send); err != nil {
				return fmt.Errorf("echo: post SEND: %w", err)
			}
		}
	}
}

// receiveLoop posts a receive of a slot on QP i of sd for each one consumed (postRecvs posted the
// first ones) until ctx ends, counting the messages and bytes received.
func receiveLoop(ctx context.Context, sd *side, i int, msgs, bytes *atomic.Uint64) error {
	q, cq := sd.qps[i], sd.cqs[i]
	recv := goroce.RecvWR{SGL: []goroce.SGE{sd.mr.SGE(i*sd.slot, sd.slot)}}
	wcs := make([]goroce.Completion, 64)
	for {
		k, err := cq.Wait(ctx, wcs)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("QP %v: receive: %w", q.QPN(), err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != goroce.StatusSuccess {
				return fmt.Errorf("QP %v: %v completed with %v", q.QPN(), wc.Opcode, wc.Status)
			}
			if wc.Opcode != goroce.CompRecv {
				continue
			}
			msgs.Add(1)
			bytes.Add(uint64(wc.ByteLen))
			if err := q.PostRecv(&recv); err != nil {
				return fmt.Errorf("QP %v: post receive: %w", q.QPN(), err)
			}
		}
	}
}

// goroceServer is the child's side of a goroce measurement: a device whose QPs are connected to
// the parent's, and for SEND and ping-pong one goroutine per QP that receives (and echoes).
type goroceServer struct {
	sd       *side
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	msgs     atomic.Uint64
	bytes    atomic.Uint64
	errMu    sync.Mutex
	err      error
	marked   bool
	mallocs0 uint64
	packets0 uint64
}

func startGoroceServer(s Spec, addr netip.Addr, peer *Endpoint) (*goroceServer, Endpoint, error) {
	if peer == nil || len(peer.QPs) != max(s.QPs, 1) {
		return nil, Endpoint{}, fmt.Errorf("start %s: want %d peer QPs", s.Kind, max(s.QPs, 1))
	}
	sd, err := openSide(addr, s)
	if err != nil {
		return nil, Endpoint{}, err
	}
	if err := sd.connect(peer.QPs, s.MTU); err != nil {
		sd.close()
		return nil, Endpoint{}, err
	}
	if s.Kind == GoroceSend || s.Kind == GorocePingPong {
		for i := range sd.qps {
			if err := postRecvs(sd, i, s.Size); err != nil {
				sd.close()
				return nil, Endpoint{}, err
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &goroceServer{sd: sd, cancel: cancel}
	run := func(f func() error) {
		g.wg.Go(func() {
			if err := f(); err != nil {
				g.fail(err)
			}
		})
	}
	switch s.Kind {
	case GoroceSend:
		for i := range sd.qps {
			run(func() error { return receiveLoop(ctx, sd, i, &g.msgs, &g.bytes) })
		}
	case GorocePingPong:
		run(func() error { return echoLoop(ctx, sd, s, &g.msgs) })
	}
	return g, Endpoint{QPs: sd.infos(), MR: sd.region()}, nil
}

func (g *goroceServer) fail(err error) {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	if g.err == nil {
		g.err = err
	}
}

func (g *goroceServer) mark() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	g.marked, g.mallocs0, g.packets0 = true, ms.Mallocs, packets(g.sd.dev.Stats())
}

func (g *goroceServer) stop() PeerReport {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st := g.sd.dev.Stats()
	g.cancel()
	if !waitTimeout(&g.wg, serverStopTimeout) {
		g.fail(fmt.Errorf("the receiving goroutines did not stop within %v", serverStopTimeout))
	} else {
		g.drain()
	}
	g.sd.close()
	rep := PeerReport{Stats: &st, Messages: g.msgs.Load(), Bytes: g.bytes.Load(), Marked: g.marked}
	if g.marked {
		rep.Mallocs, rep.Packets = ms.Mallocs-g.mallocs0, packets(st)-g.packets0
	}
	if g.err != nil {
		rep.Err = g.err.Error()
	}
	return rep
}

// drain counts the receives that completed after the receiving goroutines last looked.
func (g *goroceServer) drain() {
	wcs := make([]goroce.Completion, 64)
	for _, cq := range g.sd.cqs {
		for n := cq.Poll(wcs); n > 0; n = cq.Poll(wcs) {
			for _, wc := range wcs[:n] {
				if wc.Status == goroce.StatusSuccess && wc.Opcode == goroce.CompRecv {
					g.msgs.Add(1)
					g.bytes.Add(uint64(wc.ByteLen))
				}
			}
		}
	}
}

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

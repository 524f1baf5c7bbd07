package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/goroce/goroce"
)

// promptLimit bounds the wait for a step the peer answers at once, having nothing to do before it
// (no traffic of its own). A peer that does not answer waits at another step: the settings differ.
// Steps that follow the peer's traffic wait as long as the run takes.
var promptLimit = 60 * time.Second

// run runs one side on conn: the exchange, the traffic and the report.
func run(ctx context.Context, conn net.Conn, o Options, client bool, w io.Writer) (res Result, err error) {
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	defer func() {
		if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
	}()
	sh, _ := o.Test.shape()
	tcpPeer := addrOf(conn.RemoteAddr())
	local := o.Addr.Unmap()
	if !local.IsValid() {
		if local = addrOf(conn.LocalAddr()); !local.IsValid() {
			return res, fmt.Errorf("no IP address to open the device on: the connection is from %v", conn.LocalAddr())
		}
	}
	pc := NewConn(conn, client)
	ch, _ := conn.(*cmChannel)
	var dev *goroce.Device
	if ch != nil {
		pc.cm, dev = true, ch.dev
		o.RDMACM = true
	}
	mtu := goroce.MTU4096
	if o.MTU != 0 {
		mtu = o.MTU
	}
	h := Hello{RemoteVersion: Version, PageSize: os.Getpagesize(), CacheLine: cacheLine, MTU: mtu}
	if !o.NoVersionExchange {
		if h, err = pc.Hello(os.Getpagesize(), mtu); err != nil {
			return res, err
		}
	}
	res.Hello = h
	p, err := newPeer(dev, local, sh, o, client, h.PageSize)
	if err != nil {
		return res, err
	}
	defer p.close()
	defer p.cmDisconnect()
	defer func() {
		st := p.dev.Stats()
		res.Stats = &st
	}()
	res.Locals, res.Local = p.local, p.local[0]
	e := &exchange{ctx: ctx, pc: pc, p: p, o: &p.o, client: client, w: w, res: &res, hello: h, tcpPeer: tcpPeer}
	p.printInfo(w, h)
	if ch != nil {
		if err := e.cmConnect(ch); err != nil {
			return res, err
		}
	}
	switch {
	case sh.lat:
		return res, e.latency()
	case sh.verb == Send:
		return res, e.sendBW()
	}
	return res, e.bw()
}

// exchange is one side of a run after Hello: the key exchange, its barriers, the traffic between them
// and the reports, in the order perftest 6.06's programs take them.
type exchange struct {
	ctx     context.Context
	pc      *Conn
	p       *peer
	o       *Options
	client  bool
	w       io.Writer
	res     *Result
	hello   Hello
	tcpPeer netip.Addr
}

// mismatch returns the error of a step that found the peer running other settings.
func mismatch(step, format string, a ...any) error {
	return &MismatchError{Step: step, Reason: fmt.Sprintf(format, a...)}
}

// handshake exchanges a key message, limited by promptLimit where the peer answers at once.
func (e *exchange) handshake(d Dest, step string, prompt bool) (Dest, error) {
	return e.handshakeThen(d, step, prompt, nil)
}

// handshakeThen is handshake with a server's look at the run between the client's message and its
// answer (Conn.xchgThen).
func (e *exchange) handshakeThen(d Dest, step string, prompt bool, read func() error) (Dest, error) {
	limit := time.Duration(0)
	if prompt {
		limit = promptLimit
	}
	b, err := e.pc.xchgThen(e.pc.keyMsg(d), step, e.pc.keyValid(), limit, read)
	if err != nil {
		return Dest{}, err
	}
	r, err := e.pc.parseKey(b)
	if err != nil {
		return Dest{}, mismatch(step, "the peer's message is no key message: %v", err)
	}
	return r, nil
}

// addresses exchanges every QP's key message, in QP order: the first handshakes of every test. A
// peer with fewer QPs goes on with its next step, a barrier that carries its first QP's key again.
func (e *exchange) addresses() error {
	n := len(e.p.qps)
	rem := make([]Dest, n)
	for i := range n {
		step := fmt.Sprintf("exchanging the keys of QP %d", i)
		d, err := e.handshake(e.p.local[i], step, true)
		if err != nil {
			return err
		}
		for j := range i {
			if d.QPN == rem[j].QPN {
				return mismatch(step, "the peer sent the key of its QP %d again where this side expected its QP %d's: it runs fewer QPs than this side's %d (-q differs)", j, i, n)
			}
		}
		rem[i] = d
	}
	e.p.rem, e.res.Remotes, e.res.Remote = rem, rem, rem[0]
	return nil
}

// unexpected is the error of a handshake whose key message is not the one the step carries.
func (e *exchange) unexpected(step string, d Dest, want int) error {
	for i, r := range e.p.rem {
		if d.QPN != r.QPN {
			continue
		}
		if i == want {
			return mismatch(step, "the peer's key message of QP %d changed from %+v to %+v", i, r, d)
		}
		return mismatch(step, "the peer sent the key of its QP %d where this step carries its QP %d's: it takes other steps (-q, -b, -a or the test differ)", i, want)
	}
	return mismatch(step, "the peer sent the key of a QP it has not announced (QPN %#x): it runs more QPs than this side's %d (-q differs)", uint32(d.QPN), len(e.p.qps))
}

// again exchanges every QP's key message a second time, as perftest does once the QPs are connected
// (when it prints the remote addresses); each must be what the first exchange said.
func (e *exchange) again() error {
	for i := range e.p.qps {
		step := fmt.Sprintf("exchanging the keys of QP %d again", i)
		d, err := e.handshake(e.p.local[i], step, true)
		if err != nil {
			return err
		}
		if d != e.p.rem[i] {
			return e.unexpected(step, d, i)
		}
		e.p.printDest(e.w, "remote", d)
	}
	return nil
}

// sync is a barrier: a handshake of the first QP's key message, which the peer's must be again.
func (e *exchange) sync(step string, prompt bool) error { return e.syncThen(step, prompt, nil) }

// syncThen is sync with a server's look at the run before it answers (Conn.xchgThen).
func (e *exchange) syncThen(step string, prompt bool, read func() error) error {
	d, err := e.handshakeThen(e.p.local[0], step, prompt, read)
	if err != nil {
		return err
	}
	if d != e.p.rem[0] {
		return e.unexpected(step, d, 0)
	}
	return nil
}

// close is ctx_close_connection: a last barrier and "done".
func (e *exchange) close(prompt bool) error {
	if err := e.sync("closing the connection", prompt); err != nil {
		return err
	}
	return e.pc.Close()
}

// connect connects the QPs and prints their local addresses.
func (e *exchange) connect() error {
	if err := e.p.connect(e.p.rem, e.hello.MTU, e.tcpPeer); err != nil {
		return err
	}
	for _, d := range e.p.local {
		e.p.printDest(e.w, "local", d)
	}
	return nil
}

// reportUnit returns the unit a report's bandwidths are in, found from its own figures: its average
// bandwidth is its message rate times its size in that unit. 0 if the figures do not say.
func reportUnit(r BWReport) float64 {
	if r.BWAvg <= 0 || r.MsgRate <= 0 || r.Size == 0 {
		return 0
	}
	f := float64(r.Size) * r.MsgRate * 1e6 / r.BWAvg
	for _, u := range []float64{mb, gbit} {
		if math.Abs(f/u-1) < 0.01 {
			return u
		}
	}
	return 0
}

// checkReport checks that the peer's report is of the same run as this side's: the same message
// size, the same number of messages in a counted run, bandwidths in the same unit. hint says what a
// difference would most likely come from at this step.
func (e *exchange) checkReport(r BWReport, size int, step, hint string) error {
	o := e.o
	counted := o.Duration == 0 && !o.RunInfinitely
	switch {
	case r.Size != uint64(size):
		return mismatch(step, "the peer reports %d-byte messages where this side's are %d: %s", r.Size, size, hint)
	case counted && r.Iters != uint64(o.Iters*o.QPs):
		return mismatch(step, "the peer reports %d messages where this side's run has %d (-n, -q or -D differ)", r.Iters, o.Iters*o.QPs)
	}
	ours := float64(mb)
	if o.ReportGbits {
		ours = gbit
	}
	if u := reportUnit(r); u != 0 && u != ours {
		if o.ReportGbits {
			return mismatch(step, "the peer reports bandwidths in MB/s, this side in Gbit/s (--report_gbits differs)")
		}
		return mismatch(step, "the peer reports bandwidths in Gbit/s, this side in MB/s (--report_gbits differs)")
	}
	return nil
}

// sum is what a bidirectional run prints: both sides' figures added (print_full_bw_report).
func sum(mine, theirs BWReport) BWReport {
	return BWReport{Size: mine.Size, Iters: mine.Iters, BWPeak: mine.BWPeak + theirs.BWPeak,
		BWAvg: mine.BWAvg + theirs.BWAvg, MsgRate: mine.MsgRate + theirs.MsgRate}
}

// bidirectionalReport exchanges the reports of a bidirectional size, checks the peer's and prints
// their sum, and with ReportBoth each apart.
func (e *exchange) bidirectionalReport(r BWReport, size int) error {
	const step = "exchanging the reports of a bidirectional run"
	rem, err := e.pc.ExchangeReports(r, e.hello.RemoteVersion)
	if err != nil {
		return err
	}
	if err := e.checkReport(rem, size, step, "-b differs (a unidirectional server reports nothing of its own), or -s or -a"); err != nil {
		return err
	}
	s := sum(r, rem)
	e.res.BW = append(e.res.BW, s)
	e.o.printBW(e.w, s)
	if e.o.ReportBoth && !e.o.All {
		for _, x := range []struct {
			title string
			r     BWReport
		}{{"Local", r}, {"Remote", rem}} {
			fmt.Fprintln(e.w, resultLine)
			fmt.Fprintf(e.w, "\n %s results: \n", x.title)
			fmt.Fprintln(e.w, resultLine)
			e.o.printBWHeader(e.w)
			e.o.printBW(e.w, x.r)
			if x.title == "Local" {
				fmt.Fprintln(e.w, resultLine)
			}
		}
	}
	return nil
}

// printPeriod prints and keeps the figures of one period of --run_infinitely.
func (e *exchange) printPeriod(r BWReport) {
	e.res.BW = append(e.res.BW, r)
	e.o.printBW(e.w, r)
}

// checkLimits fails a run none of whose lines reached -w or -y, as perftest ends: "Error: BW result
// is below bw limit".
func (e *exchange) checkLimits() error {
	o := e.o
	if len(e.res.BW) == 0 || (o.LimitBW == 0 && o.LimitMsgRate == 0) {
		return nil
	}
	bwOK, rateOK := o.LimitBW == 0, o.LimitMsgRate == 0
	for _, r := range e.res.BW {
		bwOK = bwOK || r.BWAvg >= o.LimitBW
		rateOK = rateOK || r.MsgRate >= o.LimitMsgRate
	}
	switch {
	case !bwOK:
		return fmt.Errorf("%w: BW result is below bw limit (-w %g)", ErrBelowLimit, o.LimitBW)
	case !rateOK:
		return fmt.Errorf("%w: msg rate is below msg_rate limit (-y %g)", ErrBelowLimit, o.LimitMsgRate)
	}
	return nil
}

// bw runs a WRITE, READ or atomic bandwidth test (write_bw.c, read_bw.c, atomic_bw.c in 6.06):
//
//	key messages of every QP; connect; key messages of every QP again; barrier (after RTR)
//	server:                barrier (the client's traffic is over); reports; close
//	client, per size:      traffic; then barrier; reports (the server's is empty); close
//	bidirectional, per size: barrier; traffic; [barrier, with -a]; reports, both printing their sum; close
//
// The unidirectional server and a bidirectional side take the same steps: what tells them apart is
// the traffic. A unidirectional client's requests arrive before its barrier, a bidirectional side's
// after; and a unidirectional server reports nothing, a bidirectional one its own run.
func (e *exchange) bw() error {
	p, o, w := e.p, e.o, e.w
	if err := e.addresses(); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return err
	}
	if err := e.again(); err != nil {
		return err
	}
	// What a server has received when the client has just connected: a client starts its traffic once
	// it has the server's answer to this barrier.
	var connected uint64
	err := e.syncThen("synchronizing after connecting the QPs", true, func() error {
		connected = p.rcvdPkts()
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w, resultLine)
	o.printBWHeader(w)
	sizes := o.Sizes()
	if !e.client && !o.Bidirectional {
		// The client drives the traffic; this side's device answers it. perftest's server then waits
		// for the client's report.
		const step = "waiting for the end of the client's traffic"
		err := e.syncThen(step, false, func() error {
			if p.rcvdPkts() == connected {
				return mismatch(step, "the client synchronized before it sent any request, as a bidirectional client does: -b differs (or the test)")
			}
			return nil
		})
		if err != nil {
			return err
		}
		r, err := e.pc.ExchangeReports(BWReport{}, e.hello.RemoteVersion)
		if err != nil {
			return err
		}
		if err := e.checkReport(r, sizes[len(sizes)-1], "exchanging reports", "-s or -a differ"); err != nil {
			return err
		}
		e.res.BW = append(e.res.BW, r)
		o.printBW(w, r)
		fmt.Fprintln(w, resultLine)
		return e.close(true)
	}
	var last BWReport
	for k, size := range sizes {
		if o.WarmUp {
			if err := p.warmUp(e.ctx, size); err != nil {
				return err
			}
		}
		if o.Bidirectional {
			// A bidirectional client sends its first request after this barrier; a unidirectional
			// one has sent them all before.
			const step = "synchronizing before the bidirectional traffic"
			err := e.syncThen(step, true, func() error {
				if k == 0 && !o.WarmUp && p.rcvdPkts() != connected {
					return mismatch(step, "the client sent requests before this barrier, as a unidirectional client does: -b differs (or --perform_warm_up)")
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		if o.RunInfinitely {
			_, err := p.stream(e.ctx, size, e.printPeriod)
			return err
		}
		r, err := p.stream(e.ctx, size, nil)
		if err != nil {
			return err
		}
		last = r
		if !o.Bidirectional {
			e.res.BW = append(e.res.BW, r)
			o.printBW(w, r)
			continue
		}
		if o.All {
			if err := e.sync("synchronizing after the bidirectional traffic", false); err != nil {
				return err
			}
		}
		if err := e.bidirectionalReport(r, size); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, resultLine)
	if !o.Bidirectional {
		const step = "exchanging reports"
		if err := e.sync("synchronizing after the traffic", true); err != nil {
			return err
		}
		rem, err := e.pc.ExchangeReports(last, e.hello.RemoteVersion)
		if err != nil {
			return err
		}
		// perftest's unidirectional server sends a report it never filled in; one that describes this
		// very run is a bidirectional server's.
		if rem.Size == last.Size && rem.Iters == last.Iters && rem.BWAvg > 0 {
			return mismatch(step, "the server reports a run of its own, as a bidirectional server does: -b differs")
		}
	}
	if err := e.close(true); err != nil {
		return err
	}
	return e.checkLimits()
}

// sendBW runs ib_send_bw (send_bw.c in 6.06):
//
//	key messages of every QP; connect; barrier; key messages of every QP again
//	per size: post receives; barrier; traffic; [bidirectional counted runs: reports]; [-a: barrier]
//	close
//
// Both sides measure and print: the client its SENDs, the server its receives; a bidirectional side
// the sum of both sides' reports.
func (e *exchange) sendBW() error {
	p, o, w := e.p, e.o, e.w
	if err := e.addresses(); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return err
	}
	if err := e.sync("synchronizing after connecting the QPs", true); err != nil {
		return err
	}
	if err := e.again(); err != nil {
		return err
	}
	fmt.Fprintln(w, resultLine)
	o.printBWHeader(w)
	timed := o.Duration > 0 || o.RunInfinitely
	g := &guard{pc: e.pc, step: "SEND traffic"}
	for _, size := range o.Sizes() {
		if !e.client || o.Bidirectional {
			for i := range p.qps {
				limit := o.Iters
				if timed {
					limit = o.RxDepth
				}
				if err := p.postRecvs(i, limit); err != nil {
					return err
				}
			}
		}
		if err := e.sync("synchronizing before the traffic", true); err != nil {
			return err
		}
		var r BWReport
		var err error
		switch {
		case o.Bidirectional:
			r, err = p.bidirectional(e.ctx, size, g)
		case e.client:
			r, err = p.stream(e.ctx, size, e.printPeriod)
		default:
			r, err = p.receive(e.ctx, size, g, e.printPeriod)
		}
		if err != nil || o.RunInfinitely {
			return err
		}
		if !o.Bidirectional || o.Duration > 0 {
			e.res.BW = append(e.res.BW, r)
			o.printBW(w, r)
		} else if err := e.bidirectionalReport(r, size); err != nil {
			return err
		}
		if o.All {
			if err := e.sync("synchronizing after the traffic", true); err != nil {
				return err
			}
		}
	}
	fmt.Fprintln(w, resultLine)
	if e.client && !o.Bidirectional {
		// A bidirectional server sends SENDs too, which find no receive here; it waits for them
		// forever (perftest's RNR retry is infinite) instead of closing the connection.
		base := p.rnrSent()
		e.pc.check = func() error {
			if p.rnrSent() > base {
				return mismatch("closing the connection", "the peer sends SENDs to this side, which posts no receives, as to a bidirectional client: -b differs")
			}
			return nil
		}
		defer func() { e.pc.check = nil }()
	}
	if err := e.close(true); err != nil {
		var m *MismatchError
		if !e.client && !o.Bidirectional && errors.As(err, &m) {
			m.Reason += "; a bidirectional client waits for this side's SENDs (-b differs)"
		}
		return err
	}
	if e.client || o.Bidirectional {
		return e.checkLimits()
	}
	return nil
}

// latency runs a latency test: ib_read_lat, ib_atomic_lat, ib_send_lat and ib_write_lat, on one QP.
// Their exchanges are the key messages, the test's number of barriers before the traffic (one per
// size too for SEND), and a last barrier and "done" but for ib_write_lat, which just closes the
// connection.
func (e *exchange) latency() error {
	p, o, w := e.p, e.o, e.w
	sh := p.sh
	timed := o.Duration > 0
	if err := e.addresses(); err != nil {
		return err
	}
	p.printDest(w, "local", p.local[0])
	p.printDest(w, "remote", p.rem[0])
	fmt.Fprintln(w, resultLine)
	if err := p.connect(p.rem, e.hello.MTU, e.tcpPeer); err != nil {
		return err
	}
	for i := 1; i < sh.pre; i++ {
		if err := e.sync("synchronizing before the traffic", true); err != nil {
			return err
		}
	}
	// ib_read_lat's and ib_atomic_lat's server only answers with its device: it prints no results.
	passive := !e.client && (sh.verb == Read || sh.verb == Atomic)
	switch {
	case passive:
	case timed:
		fmt.Fprint(w, latDurHeader)
	default:
		fmt.Fprint(w, latHeader)
	}
	rtt := 2
	if sh.verb == Read || sh.verb == Atomic {
		rtt = 1
	}
	g := &guard{pc: e.pc, step: "latency traffic"}
	for _, size := range o.Sizes() {
		if sh.verb == Send {
			limit := o.Iters
			if timed {
				limit = o.RxDepth
			}
			if err := p.postRecvs(0, limit); err != nil {
				return err
			}
		}
		if sh.perSize {
			if err := e.sync("synchronizing before the traffic", true); err != nil {
				return err
			}
		}
		if passive {
			continue
		}
		samples, count, err := p.latency(e.ctx, size, g)
		if err != nil {
			return err
		}
		if timed {
			l := latDurReport(size, count, (&span{margin: o.margin(), total: o.Duration}).window(), rtt)
			e.res.Lat = append(e.res.Lat, l)
			printLatDur(w, l)
			continue
		}
		o.printHistogram(w, samples)
		if l, ok := latReport(size, o.Iters, samples); ok {
			e.res.Lat = append(e.res.Lat, l)
			printLat(w, l)
		}
	}
	fmt.Fprintln(w, resultLine)
	if !sh.close {
		return nil
	}
	return e.close(!passive)
}

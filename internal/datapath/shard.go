package datapath

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// A shard is driven by one goroutine at a time, the holder of drive. The driver runs step in a loop:
// file the deadlines other goroutines reported, fire the timers that are due, then read the socket
// until a packet comes or the armed deadline passes, and handle what came.
//
// Normally the driver is the shard's background goroutine. A goroutine in CQ.Wait whose CQ's QPs all
// live on this shard takes the shard instead (driveFor): it interrupts the background driver's read
// (kick: a read deadline in the past), takes drive and steps until its CQ has a completion. When it
// lets go it keeps the shard for Linger more (lingerUntil): a request-reply loop's next Wait comes
// within microseconds and takes the shard straight back, without waking the background goroutine,
// which takes over only once the linger has passed (lingerTimer; it looks less often the longer the
// waiter keeps renewing the linger, see maxLingerSlack). In such a loop the waiting
// goroutine is thus the one the kernel wakes when the reply arrives, as with a plain UDP socket, and
// the background goroutine sleeps. Only one waiter drives at a time: another one parks on its CQ,
// and while any waiter is parked a waiter that lets go hands the shard straight back to the
// background goroutine, so that parked waiters never wait for a linger to pass.
//
// Wake-ups cost more than anything else on this path: a thread that went to sleep takes microseconds
// to wake, and Go's timers wake the thread blocked in the netpoller whenever one is armed earlier
// than its sleep. So the driver arms the socket's read deadline only to move it earlier, never later:
// when a QP's deadline moves out, the old one fires, finds nothing due, and the new one is armed then
// (once per retransmission timeout, not once per packet). Other goroutines kick the shard only when
// what they file is due before the armed deadline (fileDeadline), or when a QP has work (markReady).
// A deadline that keeps moving out, such as the tail-loss probe of a request-reply loop, would still
// wake the driver once per probe timeout for nothing; after such a stale wake the driver arms loss
// timers a little late (staleSlack).

// groBatch is the receive batch of a shard reading with GRO: each message may be a 64 KiB run.
const groBatch = 16

// plainBatch is the receive batch without GRO.
const plainBatch = 64

type shard struct {
	d     *Datapath
	idx   int
	conn  conn.Conn
	waits conn.WaitReporter // conn, if it tells whether a read waited; else nil

	drive       sync.Mutex
	bgDriving   atomic.Bool   // the background goroutine holds drive
	want        atomic.Int32  // waiters parked until drive is free: the background goroutine lets go and stays away
	free        chan struct{} // cap 1: tells a waiter in want that drive is free
	inStep      atomic.Bool   // the driver is handling packets or timers, not blocked in a read
	lingerUntil atomic.Int64  // unix nanoseconds: until then a waiter's linger holds the shard
	lingerArmed atomic.Bool   // lingerTimer is running
	lingerTimer *time.Timer
	lingerSlack time.Duration // added to the next check of a renewed linger; the background goroutine's
	bgWake      chan struct{}
	kicked      atomic.Bool
	armed       atomic.Int64 // the read deadline armed, unix nanoseconds; 0 when none is known
	staleSlack  atomic.Int64 // nanoseconds added to loss timers while deadline wakes find nothing due (see arm); written by the driver
	nready      atomic.Int32 // len(ready)
	joined      bool         // its socket takes its datagrams (Datapath.join); guarded by d.mu

	// Owned by the driver.
	waitCQ        *CQ // the CQ of the waiter that drives, if a waiter does
	waitSolicited bool
	lastNow       time.Time // the driver's last clock reading since it took drive; zero before one, and after a read its deadline ended
	yielded       time.Time // when a driver last gave up the processor (yield) or waited in a read
	timerWoke     bool      // the last read ended at the deadline armed for a timer, not at a kick
	rx            rxState
	tx            *txBatch
	timers        timerHeap
	work          []*QP
	clockT        Timer // for clocks other than the real one: fires kick at the next deadline

	mu    sync.Mutex // guards ready and each QP's queued flag
	ready []*QP
}

func newShard(d *Datapath, idx int, c conn.Conn) *shard {
	s := &shard{d: d, idx: idx, conn: c, bgWake: make(chan struct{}, 1), free: make(chan struct{}, 1), tx: getTxBatch()}
	s.waits, _ = c.(conn.WaitReporter)
	s.lingerTimer = time.NewTimer(time.Hour)
	s.lingerTimer.Stop()
	s.rx.init(c)
	if !d.cfg.RealClock {
		s.clockT = d.clock.NewTimer(time.Hour)
		s.clockT.Stop()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for {
				select {
				case <-s.clockT.C():
					s.kick()
				case <-d.done:
					return
				}
			}
		}()
	}
	return s
}

// kick makes the shard's current or next driver step without blocking in a read.
func (s *shard) kick() {
	s.kicked.Store(true)
	s.armed.Store(0)
	_ = s.conn.SetReadDeadline(time.Unix(1, 0))
}

func (s *shard) wakeBackground() {
	select {
	case s.bgWake <- struct{}{}:
	default:
	}
}

// markReady asks the shard's driver to pump q and file its deadline, now.
func (s *shard) markReady(q *QP) {
	s.enqueue(q)
	s.kick()
}

// fileDeadline asks the shard's driver to file q's deadline, next: at once if next comes before the
// deadline the driver has armed (with the slack the driver would arm it with), else at its next
// step, which comes by then.
func (s *shard) fileDeadline(q *QP, next deadline) {
	s.enqueue(q)
	if a := s.armed.Load(); a == 0 || s.slacked(next).UnixNano() < a {
		s.kick()
	}
}

func (s *shard) enqueue(q *QP) {
	s.mu.Lock()
	if !q.queued {
		q.queued = true
		s.ready = append(s.ready, q)
		s.nready.Add(1)
	}
	s.mu.Unlock()
}

// file puts q's next deadline in the heap unless an earlier or equal one is there. The caller drives s;
// q may belong to another shard, whose driver is then asked to file it.
func (s *shard) file(q *QP) {
	q.mu.Lock()
	var next deadline
	if !q.closed {
		next = q.deadline()
	}
	ok := next.before(q.scheduled)
	if ok && q.shard != s {
		q.mu.Unlock()
		q.shard.fileDeadline(q, next)
		return
	}
	if ok {
		q.scheduled = next.at
	}
	q.mu.Unlock()
	if ok {
		s.timers.push(timerEntry{at: next.at, qp: q, loss: next.loss})
	}
}

// background is the shard's own goroutine: it drives whenever no waiter does and no waiter's linger
// holds the shard.
func (s *shard) background() {
	d := s.d
	defer d.wg.Done()
	for {
		for !s.takeBackground() {
			select {
			case <-s.bgWake:
			case <-s.lingerTimer.C:
				s.lingerArmed.Store(false)
			case <-d.done:
				return
			}
		}
		s.bgDriving.Store(true)
		for s.want.Load() == 0 { // until a waiter asks for the shard
			if err := s.step(); err != nil {
				s.bgDriving.Store(false)
				s.drive.Unlock()
				return
			}
			// A completion woke a goroutine parked on a CQ: let it run before the next read. In a
			// request-reply exchange it posts its reply now, which carries the ACK the engine holds
			// back (AckDelay).
			if d.woke.Swap(false) {
				runtime.Gosched()
			}
		}
		s.bgDriving.Store(false)
		s.drive.Unlock()
		s.handOver()
	}
}

// takeBackground takes drive for the background goroutine unless a waiter's linger holds it, in which
// case it arms lingerTimer for the linger's end.
func (s *shard) takeBackground() bool {
	if s.d.closing.Load() {
		return false
	}
	if s.want.Load() != 0 {
		s.handOver() // the shard is free as far as this goroutine knows: a waiter takes it
		return false
	}
	if wait := s.lingerUntil.Load() - time.Now().UnixNano(); wait > 0 {
		if !s.lingerArmed.Swap(true) {
			s.lingerTimer.Reset(time.Duration(wait) + s.lingerSlack)
			// The waiter keeps coming back: look again later each time, up to maxLingerSlack
			// past the linger's end.
			s.lingerSlack = min(max(2*s.lingerSlack, s.d.cfg.Linger), maxLingerSlack)
		}
		return false
	}
	if !s.drive.TryLock() {
		return false
	}
	s.lingerSlack = 0
	return true
}

// maxLingerSlack bounds how long past a waiter's linger the background goroutine may take to notice
// that it ended, after the waiter kept renewing it. Each look is a timer firing and a goroutine woken,
// which in a request-reply loop came once a linger (a millisecond), in the middle of round trips: in
// one process, where the loop's two ends share the CPUs with it, the round trip's p99 against raw
// UDP's had a median of 2.70 over four rounds of `goroce perf loopback -procs 1 -only pingpong`
// (2.37 to 7.03), against 1.85 (1.53 to 2.88) with no look at all. Looking back off to every few
// milliseconds keeps that rare, and a loop that stops leaves its shard's packets unread for at most
// Linger plus this.
//
// The bound is maxTimerBackoff, as for the deadline slack, and for the same reason: a timer due within
// a few milliseconds makes every sleep of the netpoller dearer on some virtual machines (see
// maxTimerBackoff), and this one is pending for as long as a loop runs.
const maxLingerSlack = maxTimerBackoff

// maxTimerBackoff bounds how late a timer that a request-reply loop keeps pushing out is looked at:
// the linger's end (maxLingerSlack) and a deadline that moved out (maxStaleSlack, the tail-loss
// probe's). While either is pending due within a few milliseconds, the netpoller sleeps with a
// timeout that short, and on a paravirtualized guest (PVM, AMD EPYC, Linux 6.18) every such sleep
// made the wake-up that ends it dearer: a plain Go UDP ping-pong between two processes took 31 to 33
// us (p50) with a read deadline 3 ms ahead against 25 to 28 without. With both bounds at 3 ms a loop
// always had one pending 1 to 4 ms ahead. Raising both to 16 ms took the two-process ping-pong's p50
// against raw UDP's from a median of 1.26 (1.22 to 1.29) to 1.19 (1.17 to 1.25), and its CPU per
// round trip from 1.29 to 1.20, over ten rounds of `goroce perf loopback -procs both -only pingpong
// -runs 3` (five; five more with -procs 2), each the median of its 3 runs, the builds interleaved; 8 ms
// gave 1.21 (1.18 to 1.23) over five. The one-process figures did not move. The price: a loop that
// stops leaves its shard unread for up to Linger plus 16 ms, and a tail loss that follows a run of
// stale wakes is probed up to 16 ms late, still four times sooner than the ACK timeout (67 ms by
// default).
const maxTimerBackoff = 16 * time.Millisecond

// tryDrive drives the shard from a goroutine waiting on cq, if it can take it at once, until cq holds
// a completion, done is closed or the socket fails. It returns false, having done nothing, when
// another goroutine drives the shard: the caller then announces that it wants the shard (want) and
// parks, on cq and on free. See the top of the file.
func (s *shard) tryDrive(cq *CQ, solicited bool, done <-chan struct{}) bool {
	if !s.drive.TryLock() {
		return false
	}
	s.driveLocked(cq, solicited, done)
	return true
}

// driveLocked is tryDrive once drive is held; it lets go of it.
func (s *shard) driveLocked(cq *CQ, solicited bool, done <-chan struct{}) {
	cq.driving.Store(s)
	s.waitCQ, s.waitSolicited = cq, solicited
	s.lastNow = time.Time{}
	for !cq.ready(solicited) {
		select {
		case <-done:
		default:
			if s.step() == nil {
				continue
			}
		}
		break
	}
	s.waitCQ = nil
	cq.driving.Store(nil)
	s.letGo()
}

// letGo lets go of drive, held by a waiter: it keeps the shard for the linger, or hands it over
// at once when goroutines are parked on it.
func (s *shard) letGo() {
	d := s.d
	if d.parked.Load() > 0 {
		// Goroutines wait for a driver, to notify them or to hand them the shard: no linger.
		s.lingerUntil.Store(0)
		s.drive.Unlock()
		s.handOver()
		return
	}
	s.lingerUntil.Store(s.realNow().Add(d.cfg.Linger).UnixNano())
	s.drive.Unlock()
	// A waiter that announced itself after the check above saw drive held, and parked: it must hear
	// that the shard is free (it checked drive after announcing, so one of the two sees the other).
	if s.want.Load() > 0 {
		s.handOver()
	}
	if !s.lingerArmed.Swap(true) {
		s.lingerTimer.Reset(d.cfg.Linger)
	}
}

// covered reports whether the read deadline armed already wakes the driver by next, a deadline
// nextDeadline returned, with the slack arm would give it: arm would leave it as it is.
func (s *shard) covered(next deadline) bool {
	a := s.armed.Load()
	return a != 0 && (next.at.IsZero() || s.wakeAt(next).UnixNano() >= a)
}

// realNow returns the time on the real clock for the driver, which holds drive: the reading its last
// step took (microseconds old: the step has just run, and a linger measured from it is that much
// shorter), or a fresh one when there is none or the datapath's clock is not the real one.
func (s *shard) realNow() time.Time {
	if s.lastNow.IsZero() || !s.d.cfg.RealClock {
		return time.Now()
	}
	return s.lastNow
}

// handOver passes the free shard on: to a waiter that wants it, or else to the background goroutine.
func (s *shard) handOver() {
	if s.want.Load() > 0 {
		select {
		case s.free <- struct{}{}:
		default:
		}
		return
	}
	s.wakeBackground()
}

// waitFor parks a goroutine waiting on cq while another goroutine drives the shard, until a completion
// comes (a driver notifies cq), the shard is free for it to drive, ctx ends or the datapath closes. It
// announces itself in want first, so that a background driver lets go and does not come back, and a
// driving waiter that lets go hands the shard over rather than keep it for its linger.
func (s *shard) waitFor(ctx context.Context, cq *CQ, solicited bool) {
	d := s.d
	s.want.Add(1)
	if s.drive.TryLock() {
		s.want.Add(-1)
		s.driveLocked(cq, solicited, ctx.Done())
		return
	}
	if s.bgDriving.Load() {
		s.kick()
		d.stats.handovers.Add(1)
	}
	d.parked.Add(1)
	select {
	case <-cq.notify:
	case <-s.free:
	case <-ctx.Done():
	case <-d.done:
	}
	d.parked.Add(-1)
	s.want.Add(-1)
	// The background driver let go of the shard because this goroutine wanted it, but the goroutine
	// may not take it: its context ended, or its completion came with the hand-off and its Wait
	// returns. If no one drives, the shard must not be left undriven (its packets unread until the
	// next Wait): the goroutine lets go of it as a driving waiter does, keeping it for the linger
	// (its next Wait comes soon in a request-reply loop) with the background goroutine armed to take
	// over after, or handing it on to a parked waiter. If another goroutine drives, it hands the shard
	// on when it lets go, and sees want without this goroutine (want was lowered before drive was
	// tried): waking the background goroutine here would only make it take the shard from the next
	// Wait, a hand-over each way per completion when several waiters share the shard.
	if s.drive.TryLock() {
		s.lastNow = time.Time{} // read by the last driver, maybe long ago: letGo reads the clock
		s.letGo()
	}
}

// step runs one round of the driver: deadlines filed by others, due timers, then one read (or none,
// after a kick) and its packets. It returns the socket's error once it is closed.
func (s *shard) step() error {
	d := s.d
	s.inStep.Store(true)
	s.collectReady()
	next := s.nextDeadline()
	// With no work, no timer wake to account for and the next deadline, slack included, no earlier
	// than the one armed, there is nothing to fire (a deadline that has passed ends the read at once,
	// and the step after it fires) and nothing to arm, so the clock, dear right after a system call,
	// is left unread: in a request-reply loop, nearly every step before a read, since the deadline
	// armed there is a tail-loss probe's, slack included, and the next is a later probe's.
	if len(s.work) > 0 || s.timerWoke || !s.covered(next) {
		now := d.clock.Now()
		s.lastNow = now
		drained := due(next.at, now) && s.drainBeforeTimers(now)
		fired := s.fireTimers(now)
		if s.timerWoke {
			s.timerWoke = false
			s.noteTimerWake(fired > 0)
		}
		pumped := len(s.work) > 0
		s.pumpAll(s.work, now)
		s.work = s.work[:0]
		// The waiter that drives has its completion: it goes back to its program without reading,
		// so the read deadline is left as it is. In a request-reply loop the deadline to arm here is
		// the ACK held for company, which leaves with the reply the program posts next; arming it
		// would cost a thread wake-up, which Go's runtime starts whenever a timer moves while no
		// thread waits in the netpoller, for a read that does not happen.
		if c := s.waitCQ; c != nil && c.ready(s.waitSolicited) {
			s.inStep.Store(false)
			return nil
		}
		if drained || fired > 0 || pumped {
			next = s.nextDeadline() // what it found, fired or sent moved the deadlines
		}
		s.arm(next, now)
	}
	// A deadline filed after collectReady either shows in nready here or saw the deadline just armed
	// (fileDeadline enqueues before it reads armed), so it is never left for later than it is due.
	if s.kicked.Swap(false) {
		s.armed.Store(0)
		s.inStep.Store(false)
		return nil
	}
	if s.nready.Load() != 0 {
		s.inStep.Store(false)
		return nil
	}
	// A completion for the waiter that drives, pushed while inStep held (by a timer above, or by
	// another goroutine), kicked no one: it shows here. One pushed after this check kicks.
	s.inStep.Store(false)
	if c := s.waitCQ; c != nil && c.ready(s.waitSolicited) {
		return nil
	}
	n, waited, err := s.read()
	switch {
	case err == conn.ErrDeadline:
		s.lastNow = time.Time{} // the read may have waited long: no reading is recent
		s.armed.Store(0)
		s.timerWoke = !s.kicked.Load() // a kick ends a read the same way; it is no timer's
		d.stats.deadlineWakes.Add(1)
		return nil
	case err != nil:
		if err == conn.ErrClosed || d.closing.Load() {
			return conn.ErrClosed
		}
		d.stats.rxErrors.Add(1)
		return nil
	}
	s.inStep.Store(true)
	now := d.clock.Now()
	s.lastNow = now
	if waited {
		s.yielded = now // the goroutine parked in the read: the scheduler has had its turn
	}
	s.receive(n, now)
	s.inStep.Store(false)
	s.yield(now)
	return nil
}

// read reads a batch for step, and reports whether the goroutine parked in the netpoller for it. A
// waiter that drives with Config.BusyPoll set first polls the socket without sleeping for up to that
// long; a kick (a completion from elsewhere, a deadline filed, ctx's end) ends the polling, and the
// read that follows returns at once.
func (s *shard) read() (n int, waited bool, err error) {
	d := s.d
	if d.cfg.BusyPoll > 0 && s.waitCQ != nil && d.cfg.RealClock {
		if p, ok := s.conn.(conn.Poller); ok {
			n, err = s.busyPoll(p)
			if n > 0 || err != nil {
				return n, false, err
			}
		}
	}
	n, err = s.conn.ReadBatch(s.rx.msgs)
	return n, err == nil && s.waits != nil && s.waits.Waited(), err
}

// busyPoll polls the socket for a waiter that drives with Config.BusyPoll set, for up to that long or
// until a kick, and returns 0 and no error when nothing came. read asks the Conn whether it polls
// only with BusyPoll set: the type assertion's cache, cold after a system call, cost a ping-pong's
// read a memory access every time.
func (s *shard) busyPoll(p conn.Poller) (n int, err error) {
	d := s.d
	end := time.Now().Add(d.cfg.BusyPoll)
	for !s.kicked.Load() {
		if n, err = p.PollBatch(s.rx.msgs); n > 0 || err != nil {
			if n > 0 {
				d.stats.busyPolls.Add(1)
			}
			return n, err
		}
		if time.Now().After(end) {
			d.stats.busyPollMisses.Add(1)
			break
		}
	}
	return 0, nil
}

// yieldEvery is how long a driver runs at most before it lets the Go scheduler look at the network.
const yieldEvery = time.Millisecond

// yield gives up the processor (runtime.Gosched) if the driver has neither done so nor waited in a
// read (conn.WaitReporter) for yieldEvery.
//
// A driver whose reads always find data never parks, and the datapath's system calls are raw (see
// conn.UDPConn), out of the scheduler's sight. Go's scheduler keeps a thread blocked in the netpoller
// only while that thread has nothing else to run: a thread that finds a goroutine to run by polling
// without blocking hands the watch to no one. And sysmon, which otherwise polls the network every
// 10 ms and preempts a goroutine that has run for 10 ms, sleeps from the moment every processor is
// idle until a timer or a scheduler-visible system call wakes it. So a busy driver could hold its
// processor for as long as it stayed busy while another shard's socket filled and the other processor
// sat idle: 94 ms in one trace of `goroce perf loopback -procs 2 -only read -qps 2`, long enough for
// the peer's ACK timeout. Gosched wakes a thread for an idle processor (the runtime's wakep), and that
// thread polls the network. A driver that waits in its reads, as in a ping-pong, parks each time and
// needs no turn given: yielding there anyway, once a millisecond, cost the one-process ping-pong about
// 10 us at p99 (the thread it wakes competes with the next round trip).
func (s *shard) yield(now time.Time) {
	if now.Sub(s.yielded) < yieldEvery {
		return
	}
	s.yielded = now
	s.d.stats.yields.Add(1)
	runtime.Gosched()
}

// arm makes the next read return by next (staleSlack late if it is a loss timer's), moving the armed
// deadline only earlier (see the top of the file). With no deadline known armed (after a kick or a
// timeout) it arms next, or none.
func (s *shard) arm(next deadline, now time.Time) {
	at := s.wakeAt(next)
	a := s.armed.Load()
	switch {
	case a != 0 && (at.IsZero() || at.UnixNano() >= a):
		return
	case a == 0 && at.IsZero():
		if s.clockT == nil {
			_ = s.conn.SetReadDeadline(time.Time{})
		} else {
			_ = s.conn.SetReadDeadline(time.Time{})
			s.clockT.Stop()
		}
		s.armed.Store(noDeadline)
		return
	}
	s.armed.Store(at.UnixNano())
	s.d.stats.deadlineArms.Add(1)
	if s.clockT == nil {
		_ = s.conn.SetReadDeadline(at)
		return
	}
	_ = s.conn.SetReadDeadline(time.Time{})
	s.clockT.Reset(max(at.Sub(now), 0))
}

// noDeadline is the armed value when the socket has no read deadline: every deadline is earlier.
const noDeadline = 1<<63 - 1

// Slack for deadlines that keep moving out: the loss timers (qp.QP.Deadline), the local ACK timeout
// and the tail-loss probe. A request-reply loop's requester restarts its tail-loss probe
// (qp.Config.MinProbe, 1 ms) with every request, and the reply cancels it: the deadline armed for
// the first probe fires, finds nothing due, and the next one is armed, once a millisecond per side
// for as long as the loop runs. Each such wake is a thread woken in a process that has nothing to
// do, and between two processes on two CPUs it takes its CPU from the peer: `goroce perf loopback
// -procs both -only pingpong -runs 3`, three rounds with the probe on and off, gave a two-process
// p50 against raw UDP's of 1.36, 1.37 and 1.41 with it and 1.25, 1.18 and 1.29 without, and CPU per
// round trip against raw UDP's of 1.44, 1.28 and 1.31 against 1.17, 1.12 and 1.18.
//
// After a wake that found nothing due, loss timers are armed staleSlack late, doubling from
// minStaleSlack up to maxStaleSlack with each further such wake, and back to 0 once a wake finds a
// timer due. The cost is a probe or timeout that many milliseconds late when a loss comes after a
// run of stale wakes: a probe at most 17 ms after the last packet instead of 1 (see maxTimerBackoff).
// The other deadlines (an ACK held for company, a paced packet, the end of an RNR wait) are armed as
// they are. The slack goes by the kind of deadline, not by how far away it is, so that a step can
// tell without reading the clock that the deadline armed already covers the next one (covered).
const (
	minStaleSlack = 500 * time.Microsecond
	maxStaleSlack = maxTimerBackoff
)

// slacked returns when to wake for the deadline next: staleSlack late if it is a loss timer's.
func (s *shard) slacked(next deadline) time.Time {
	if next.loss && !next.at.IsZero() {
		if slack := s.staleSlack.Load(); slack > 0 {
			return next.at.Add(time.Duration(slack))
		}
	}
	return next.at
}

// wakeAt returns when the driver must wake for next, the heap's earliest deadline (nextDeadline): as
// slacked says, but no later than a live deadline of another kind that the heap holds behind next,
// which the slack must not delay (another QP's RNR wait ending, say, just after a probe).
func (s *shard) wakeAt(next deadline) time.Time {
	at := s.slacked(next)
	if !at.After(next.at) || len(s.timers) < 2 { // no slack, or nothing behind next
		return at
	}
	return s.timers.earliestOther(0, at, liveOther)
}

// earliestOther returns the earliest deadline in the subtree of the heap at i that live says is still
// its QP's and no loss timer's, if it comes before limit, else limit. A subtree holds nothing earlier
// than its root, so it looks only where limit may be beaten. Entries it finds stale stay for
// nextDeadline.
func (h timerHeap) earliestOther(i int, limit time.Time, live func(*timerEntry) bool) time.Time {
	if i >= len(h) || !h[i].at.Before(limit) {
		return limit
	}
	if e := &h[i]; !e.loss && live(e) {
		return e.at // nothing below it is earlier
	}
	return h.earliestOther(2*i+2, h.earliestOther(2*i+1, limit, live), live)
}

// liveOther reports whether e is still its QP's deadline, and no loss timer's.
func liveOther(e *timerEntry) bool {
	q := e.qp
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || !q.scheduled.Equal(e.at) {
		return false
	}
	cur := q.deadline()
	return cur.at.Equal(e.at) && !cur.loss
}

// noteTimerWake records what the step after a deadline wake found: timers due, or none.
func (s *shard) noteTimerWake(due bool) {
	if due {
		s.staleSlack.Store(0)
		return
	}
	s.staleSlack.Store(int64(min(max(2*time.Duration(s.staleSlack.Load()), minStaleSlack), maxStaleSlack)))
	s.d.stats.staleWakes.Add(1)
}

// collectReady moves the QPs other goroutines enqueued into the work list and files their deadlines.
func (s *shard) collectReady() {
	if s.nready.Load() == 0 {
		return
	}
	s.mu.Lock()
	start := len(s.work)
	s.work = append(s.work, s.ready...)
	for _, q := range s.ready {
		q.queued = false
	}
	clear(s.ready)
	s.ready = s.ready[:0]
	s.nready.Store(0)
	s.mu.Unlock()
	for _, q := range s.work[start:] {
		s.file(q)
	}
}

// due reports whether the deadline at, nextDeadline's answer, has come by now. nextDeadline looks past
// the heap's stale entries: in a ping-pong the entry of the ACK held for company, which left with the
// reply, is due at nearly every step, and draining the socket for it cost a recvmmsg in a quarter of
// the round trips.
func due(at, now time.Time) bool { return !at.IsZero() && !at.After(now) }

// maxDrainBatches bounds drainBeforeTimers: a socket that never runs dry does not hold the timers off.
const maxDrainBatches = 4

// drainBeforeTimers takes what the socket already holds before due timers fire. A driver that did not
// run for a while (its process descheduled on a loaded host, a GC pause) wakes with its timers past
// due and, often, the very ACKs that would have stopped them waiting in the socket: firing first
// would resend what the peer has, and count a retry against retry_cnt for nothing. A Conn that cannot
// poll (conn.Poller) is left as it is. It reports whether it received anything.
func (s *shard) drainBeforeTimers(now time.Time) (received bool) {
	p, ok := s.conn.(conn.Poller)
	if !ok {
		return false
	}
	for range maxDrainBatches {
		n, err := p.PollBatch(s.rx.msgs)
		if err != nil || n == 0 {
			break
		}
		received = true
		s.d.stats.drains.Add(1)
		s.receive(n, now)
	}
	return received
}

// fireTimers runs the engines whose deadline has come, adds them to the work list and returns how
// many there were.
func (s *shard) fireTimers(now time.Time) (fired int) {
	for s.timers.Len() > 0 && !s.timers[0].at.After(now) {
		e := s.timers.pop()
		q := e.qp
		q.mu.Lock()
		live := q.scheduled.Equal(e.at)
		if live {
			q.scheduled = time.Time{}
			if !q.closed {
				q.eng.Advance(now)
			}
		}
		q.mu.Unlock()
		if live {
			s.work = append(s.work, q)
			fired++
		}
	}
	return fired
}

// nextDeadline returns the earliest deadline a QP still has, dropping and refiling heap entries that
// no longer match their QP's deadline: an ACK held back for company that left with the reply leaves
// its entry behind, and waking for it would cost a ping-pong a wake-up per round trip.
func (s *shard) nextDeadline() deadline {
	for s.timers.Len() > 0 {
		e := s.timers[0]
		q := e.qp
		q.mu.Lock()
		if !q.scheduled.Equal(e.at) {
			q.mu.Unlock()
			s.timers.pop() // superseded by an earlier entry
			continue
		}
		var cur deadline
		if !q.closed {
			cur = q.deadline()
		}
		if cur.at.Equal(e.at) {
			q.mu.Unlock()
			return cur
		}
		s.timers.pop()
		q.scheduled = cur.at
		q.mu.Unlock()
		if !cur.at.IsZero() {
			s.timers.push(timerEntry{at: cur.at, qp: q, loss: cur.loss})
		}
	}
	return deadline{}
}

// A deadline is when a QP next needs its driver (qp.QP.Deadline), and whether it is a loss timer's,
// which the driver may run late (staleSlack).
type deadline struct {
	at   time.Time
	loss bool
}

// before reports whether d is a deadline that comes before t, which may be the zero time for none:
// whether a QP's deadline must be filed, t being the one filed (QP.scheduled).
func (d deadline) before(t time.Time) bool {
	return !d.at.IsZero() && (t.IsZero() || d.at.Before(t))
}

// deadline returns q's next deadline. The caller holds q.mu.
func (q *QP) deadline() deadline {
	at, loss := q.eng.Deadline()
	return deadline{at, loss}
}

// rxState is the receive side of a shard, owned by its driver.
type rxState struct {
	msgs    []conn.Message
	bufs    [][]byte
	v       verifier
	info    qp.RxInfo
	touched []*QP
	last    *QP         // the QP lookup found last
	trace   TraceRecord // handed to the Tracer for each packet, reused (the Tracer must not keep it)
}

func (r *rxState) init(c conn.Conn) {
	size, batch := maxPacket, plainBatch
	if c.Offload().GRO {
		size, batch = conn.MaxGROSize, groBatch
	}
	batch = min(batch, c.BatchSize())
	r.msgs = make([]conn.Message, batch)
	r.bufs = make([][]byte, batch)
	for i := range r.bufs {
		r.bufs[i] = make([]byte, rxSkew+size)[rxSkew:]
		r.msgs[i].Buf = r.bufs[i]
	}
	r.v = verifier{rec: wire.IDRecovery{RequireDF: true}}
}

// rxSkew is where a receive buffer starts past an 8-byte boundary of its allocation: 4, so that the
// payload after a 12-byte BTH (the middle packets of every message, SENDs) or a BTH and RETH (28
// bytes: WRITE_FIRST and WRITE_ONLY) starts 8-byte aligned, in every segment of a GRO run too (full
// segments are 16+4096 bytes apart). The copy of the payload into a region, whose addresses are
// usually page-aligned, then runs at memmove's full speed: from a 16-byte-aligned destination with
// 2 KiB or more, Go's memmove uses REP MOVSQ where the CPU prefers it, which copies at half the speed
// or less when the source is not 8-byte aligned (measured: 15 against 31 GB/s for 4 KiB; the copy was
// the largest user-space cost of a receiving process).
const rxSkew = 4

// timerEntry is a QP's deadline in the heap. Entries are not removed when a deadline changes: an entry
// that no longer matches its QP's scheduled deadline is skipped when it comes up.
type timerEntry struct {
	at   time.Time
	qp   *QP
	loss bool // a loss timer's (qp.QP.Deadline) when filed
}

// timerHeap is a binary min-heap of deadlines, written out rather than through container/heap so that
// scheduling a timer does not allocate.
type timerHeap []timerEntry

func (h timerHeap) Len() int { return len(h) }

func (h *timerHeap) push(e timerEntry) {
	*h = append(*h, e)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if !a[i].at.Before(a[p].at) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *timerHeap) pop() timerEntry {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = timerEntry{}
	a = a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].at.Before(a[m].at) {
			m = l
		}
		if r < len(a) && a[r].at.Before(a[m].at) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}

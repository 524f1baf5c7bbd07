package datapath

import (
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
// until a packet comes or the next deadline passes, and handle what came.
//
// Normally the driver is the shard's background goroutine. A goroutine in CQ.Wait whose CQ's QPs all
// live on this shard takes the shard instead (driveFor): it counts itself in waiters, interrupts the
// background driver's read (kick: a read deadline in the past), takes drive and steps until its CQ
// has a completion. When it lets go it keeps the shard for Linger more (lingerUntil): a ping-pong's
// next Wait comes within microseconds and takes the shard straight back, without waking the
// background goroutine. Only when no Wait comes does the background goroutine, woken by lingerTimer,
// take over again. In a request-reply exchange the waiting goroutine is thus the one the kernel
// wakes when the reply arrives, as with a plain UDP socket.
//
// kick makes whoever drives now, or next, run a step without reading first: other goroutines kick a
// shard when they file an earlier deadline (markReady) or when a waiter wants the shard.

// groBatch is the receive batch of a shard reading with GRO: each message may be a 64 KiB run.
const groBatch = 16

// plainBatch is the receive batch without GRO.
const plainBatch = 64

type shard struct {
	d    *Datapath
	idx  int
	conn conn.Conn

	drive       sync.Mutex
	waiters     atomic.Int32
	lingerUntil atomic.Int64 // unix nanoseconds
	lingerTimer *time.Timer
	bgWake      chan struct{}
	kicked      atomic.Bool

	// Owned by the driver.
	rx       rxState
	tx       *txBatch
	timers   timerHeap
	work     []*QP
	deadline time.Time // the socket's read deadline as last set, if deadlineSet
	// deadlineSet is false when the socket's deadline is not known to be deadline: after a kick,
	// which moves it to the past, or after a read that hit it.
	deadlineSet bool
	clockT      Timer // for clocks other than the real one: fires kick at the next deadline

	mu    sync.Mutex // guards ready and each QP's queued flag
	ready []*QP
}

func newShard(d *Datapath, idx int, c conn.Conn) *shard {
	s := &shard{d: d, idx: idx, conn: c, bgWake: make(chan struct{}, 1), tx: getTxBatch()}
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
	_ = s.conn.SetReadDeadline(time.Unix(1, 0))
}

func (s *shard) wakeBackground() {
	select {
	case s.bgWake <- struct{}{}:
	default:
	}
}

// markReady asks the shard's driver to file q's deadline (and pump it).
func (s *shard) markReady(q *QP) {
	s.mu.Lock()
	if !q.queued {
		q.queued = true
		s.ready = append(s.ready, q)
	}
	s.mu.Unlock()
	s.kick()
}

// file puts q's next deadline in the heap unless an earlier or equal one is there. The caller drives s;
// q may belong to another shard, whose driver is then asked to file it.
func (s *shard) file(q *QP) {
	if q.shard != s {
		q.shard.markReady(q)
		return
	}
	q.mu.Lock()
	var at time.Time
	if !q.closed {
		at = q.eng.NextDeadline()
	}
	ok := !at.IsZero() && (q.scheduled.IsZero() || at.Before(q.scheduled))
	if ok {
		q.scheduled = at
	}
	q.mu.Unlock()
	if ok {
		s.timers.push(timerEntry{at: at, qp: q})
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
			case <-d.done:
				return
			}
		}
		for s.waiters.Load() == 0 {
			if err := s.step(); err != nil {
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
		s.drive.Unlock()
	}
}

// takeBackground takes drive for the background goroutine if no waiter wants it and no linger holds it.
func (s *shard) takeBackground() bool {
	if s.d.closing.Load() || s.waiters.Load() != 0 {
		return false
	}
	if wait := s.lingerUntil.Load() - time.Now().UnixNano(); wait > 0 {
		s.lingerTimer.Reset(time.Duration(wait))
		return false
	}
	return s.drive.TryLock()
}

// driveFor drives the shard from a goroutine waiting on cq until cq holds a completion, done is
// closed or the socket fails. See the top of the file.
func (s *shard) driveFor(cq *CQ, done <-chan struct{}) {
	s.waiters.Add(1)
	s.lingerTimer.Stop()
	if !s.drive.TryLock() {
		s.kick()
		s.d.stats.handovers.Add(1)
		s.drive.Lock()
	}
	cq.driving.Store(s)
	for cq.cq.Len() == 0 {
		select {
		case <-done:
		default:
			if s.step() == nil {
				continue
			}
		}
		break
	}
	cq.driving.Store(nil)
	s.lingerUntil.Store(time.Now().Add(s.d.cfg.Linger).UnixNano())
	s.drive.Unlock()
	if s.waiters.Add(-1) == 0 {
		s.lingerTimer.Reset(s.d.cfg.Linger)
	}
}

// step runs one round of the driver: deadlines filed by others, due timers, then one read (or none,
// after a kick) and its packets. It returns the socket's error once it is closed.
func (s *shard) step() error {
	d := s.d
	s.collectReady()
	now := d.clock.Now()
	s.fireTimers(now)
	s.pumpAll(s.work)
	s.work = s.work[:0]

	if at := s.nextDeadline(); !s.deadlineSet || !at.Equal(s.deadline) {
		s.setDeadline(at)
	}
	if s.kicked.Swap(false) {
		s.deadlineSet = false
		return nil
	}
	n, err := s.conn.ReadBatch(s.rx.msgs)
	switch {
	case err == conn.ErrDeadline:
		s.deadlineSet = false
		return nil
	case err != nil:
		if err == conn.ErrClosed || d.closing.Load() {
			return conn.ErrClosed
		}
		d.stats.rxErrors.Add(1)
		return nil
	}
	s.receive(n)
	return nil
}

// setDeadline makes the next read return at at (zero: never), through the socket or the clock's timer.
func (s *shard) setDeadline(at time.Time) {
	s.deadline, s.deadlineSet = at, true
	if s.clockT == nil {
		if at.IsZero() {
			_ = s.conn.SetReadDeadline(time.Time{})
		} else {
			_ = s.conn.SetReadDeadline(at)
		}
		return
	}
	_ = s.conn.SetReadDeadline(time.Time{})
	if at.IsZero() {
		s.clockT.Stop()
	} else {
		s.clockT.Reset(max(at.Sub(s.d.clock.Now()), 0))
	}
}

// collectReady moves the QPs other goroutines marked ready into the work list and files their
// deadlines.
func (s *shard) collectReady() {
	s.mu.Lock()
	start := len(s.work)
	s.work = append(s.work, s.ready...)
	for _, q := range s.ready {
		q.queued = false
	}
	clear(s.ready)
	s.ready = s.ready[:0]
	s.mu.Unlock()
	for _, q := range s.work[start:] {
		s.file(q)
	}
}

// fireTimers runs the engines whose deadline has come and adds them to the work list.
func (s *shard) fireTimers(now time.Time) {
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
		}
	}
}

// nextDeadline returns the earliest deadline a QP still has, dropping and refiling heap entries that
// no longer match their QP's deadline: an ACK held back for company that left with the reply leaves
// its entry behind, and waking for it would cost a ping-pong a wake-up per round trip.
func (s *shard) nextDeadline() time.Time {
	for s.timers.Len() > 0 {
		e := s.timers[0]
		q := e.qp
		q.mu.Lock()
		if !q.scheduled.Equal(e.at) {
			q.mu.Unlock()
			s.timers.pop() // superseded by an earlier entry
			continue
		}
		var cur time.Time
		if !q.closed {
			cur = q.eng.NextDeadline()
		}
		if cur.Equal(e.at) {
			q.mu.Unlock()
			return e.at
		}
		s.timers.pop()
		q.scheduled = cur
		q.mu.Unlock()
		if !cur.IsZero() {
			s.timers.push(timerEntry{at: cur, qp: q})
		}
	}
	return time.Time{}
}

// rxState is the receive side of a shard, owned by its driver.
type rxState struct {
	msgs    []conn.Message
	bufs    [][]byte
	v       verifier
	info    qp.RxInfo
	touched []*QP
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
		r.bufs[i] = make([]byte, size)
		r.msgs[i].Buf = r.bufs[i]
	}
	r.v = verifier{rec: wire.IDRecovery{RequireDF: true}}
}

// timerEntry is a QP's deadline in the heap. Entries are not removed when a deadline changes: an entry
// that no longer matches its QP's scheduled deadline is skipped when it comes up.
type timerEntry struct {
	at time.Time
	qp *QP
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

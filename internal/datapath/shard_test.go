package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// TestWaitersShareShardWithoutHandovers runs request-reply loops on several QPs of one shard, each
// with its own CQ and goroutine, and checks that each Wait costs about one wait: a waiter that finds
// the shard free when it leaves keeps it as a driving waiter does. Waking the background goroutine
// there instead (7b6ae90) made the background goroutine take the shard between a waiter's completion
// and the next Wait, and waiters went round park, wake and park again: 25 to 170 waits a round trip
// on the in-memory network (a 4-QP stream between two processes moved a tenth of the bytes).
func TestWaitersShareShard(t *testing.T) {
	network := conn.NewMemNetwork()
	addrA := netip.MustParseAddrPort("10.0.0.1:4791")
	addrB := netip.MustParseAddrPort("10.0.0.2:4791")
	open := func(a netip.AddrPort) *Datapath {
		d, err := Open(Config{Network: network, Addr: a, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	da, db := open(addrA), open(addrB)
	mem := mr.NewTable()
	pd := mem.AllocPD()
	newQP := func(d *Datapath) (*QP, *CQ) {
		cq := d.NewCQ(64)
		q, err := d.NewQP(QPConfig{Engine: qp.Config{Type: qp.RC, PD: pd, Memory: mem, MaxSendWR: 16, MaxRecvWR: 16,
			MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		return q, cq
	}
	connect := func(q *QP, peer *QP, at netip.AddrPort) {
		err := q.Connect(&qp.ConnectParams{PathMTU: wire.MTU1024, DestQPN: peer.QPN(), Timeout: 14, RetryCnt: 7,
			RNRRetry: 7, MinRNRTimer: 12, RdAtomic: 1, AV: qp.AddressHandle{DGID: netip.AddrFrom4(at.Addr().As4()).As16()}}, at)
		if err != nil {
			t.Fatal(err)
		}
	}
	const pairs, rounds = 4, 300
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*pairs)
	loop := func(q *QP, cq *CQ, first bool) {
		defer wg.Done()
		wcs := make([]qp.Completion, 8)
		send := qp.SendWR{Opcode: qp.WRSend} // empty: the receives have no buffer
		for range 4 {
			if err := q.PostRecv(&qp.RecvWR{}); err != nil {
				errs <- err
				return
			}
		}
		if first {
			if err := q.PostSend(&send); err != nil {
				errs <- err
				return
			}
		}
		for got := 0; got < rounds; {
			if err := cq.Wait(ctx, false); err != nil {
				errs <- fmt.Errorf("QP %v after %d rounds: %w", q.QPN(), got, err)
				return
			}
			for _, wc := range wcs[:cq.Engine().Poll(wcs)] {
				if wc.Status != qp.StatusSuccess {
					errs <- fmt.Errorf("QP %v: %v", q.QPN(), wc.Status)
					return
				}
				if wc.Opcode != qp.CompRecv {
					continue
				}
				got++
				if err := q.PostRecv(&qp.RecvWR{}); err != nil {
					errs <- err
					return
				}
				if got < rounds || !first {
					if err := q.PostSend(&send); err != nil {
						errs <- err
						return
					}
				}
			}
		}
	}
	for range pairs {
		qa, cqa := newQP(da)
		qb, cqb := newQP(db)
		connect(qa, qb, addrB)
		connect(qb, qa, addrA)
		wg.Add(2)
		go loop(qa, cqa, true)
		go loop(qb, cqb, false)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, d := range []*Datapath{da, db} {
		s := d.Stats()
		waits := s.DrivenWaits + s.ParkedWaits
		t.Logf("%v: %d driven waits, %d parked, %d hand-overs", d.LocalAddr(), s.DrivenWaits, s.ParkedWaits, s.Handovers)
		if s.DrivenWaits == 0 || waits > 4*pairs*rounds {
			t.Errorf("%v: %d waits (%d driven) for %d round trips", d.LocalAddr(), waits, s.DrivenWaits, pairs*rounds)
		}
	}
}

// tickClock is a Clock whose every reading is tick after the one before. Its timers never fire.
type tickClock struct {
	mu   sync.Mutex
	now  time.Time
	tick time.Duration
}

func (c *tickClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.tick)
	return c.now
}

func (c *tickClock) NewTimer(time.Duration) Timer { return idleTimer{} }

type idleTimer struct{}

func (idleTimer) C() <-chan time.Time { return nil }
func (idleTimer) Reset(time.Duration) {}
func (idleTimer) Stop()               {}

// feedConn is a shard's socket that returns one junk datagram (malformed: the shard drops it) per
// ReadBatch, when the test feeds one, and says whether that read waited as the test says.
type feedConn struct {
	feed   chan bool // one per read: whether it waited
	waited bool
	closed chan struct{}
}

func (c *feedConn) ReadBatch(msgs []conn.Message) (int, error) {
	select {
	case w := <-c.feed:
		c.waited = w
		msgs[0].Buf[0] = 0xff
		msgs[0].N, msgs[0].Addr = 1, dstAP
		return 1, nil
	case <-c.closed:
		return 0, conn.ErrClosed
	}
}
func (c *feedConn) Waited() bool                                { return c.waited }
func (c *feedConn) WriteBatch(msgs []conn.Message) (int, error) { return len(msgs), nil }
func (c *feedConn) SetReadDeadline(time.Time) error             { return nil }
func (c *feedConn) Offload() conn.Offload                       { return conn.Offload{} }
func (c *feedConn) LocalAddr() netip.AddrPort                   { return srcAP }
func (c *feedConn) BatchSize() int                              { return 8 }
func (c *feedConn) Close() error                                { close(c.closed); return nil }

// feedNetwork hands out one feedConn as a datapath's only shard.
type feedNetwork struct{ c *feedConn }

func (n feedNetwork) Listen(netip.AddrPort, conn.Options) (conn.Conn, error) {
	return nil, errors.New("feedNetwork: no send sockets")
}
func (n feedNetwork) ListenShards(netip.AddrPort, int, conn.Options) ([]conn.Conn, error) {
	return []conn.Conn{n.c}, nil
}

// TestBusyDriverYields checks that a driver whose reads keep finding data gives up its processor once
// per yieldEvery of its clock, and no more often, and that one whose reads wait does not (shard.yield):
// each datagram here is read in a step of its own, and the clock moves 100 us at every reading.
func TestBusyDriverYields(t *testing.T) {
	fc := &feedConn{feed: make(chan bool), closed: make(chan struct{})}
	clk := &tickClock{now: time.Unix(1e9, 0), tick: 100 * time.Microsecond}
	d, err := Open(Config{Network: feedNetwork{fc}, Addr: srcAP, Shards: 1, Clock: clk, NoGRO: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	read := func(reads int, waited bool) (yields uint64, elapsed time.Duration) {
		t.Helper()
		y0, start := d.Stats().Yields, clk.Now()
		for range reads {
			fc.feed <- waited
		}
		// The last datagram is read once the feed is taken; wait for it to be dropped.
		for deadline := time.Now().Add(10 * time.Second); d.Stats().DropMalformed < uint64(reads); {
			if time.Now().After(deadline) {
				t.Fatalf("%d datagrams fed, %d read", reads, d.Stats().DropMalformed)
			}
			time.Sleep(time.Millisecond)
		}
		return d.Stats().Yields - y0, clk.Now().Sub(start)
	}
	// Each step reads the clock at least twice, so 40 steps take 8 ms of it at least.
	yields, elapsed := read(40, false)
	if most := uint64(elapsed / yieldEvery); yields < 4 || yields > most {
		t.Errorf("%d yields in %v of the driver's clock over 40 reads that found data, want 4 to %d (one per %v)", yields, elapsed, most, yieldEvery)
	}
	d.stats.dropMalformed.Store(0)
	if yields, elapsed = read(40, true); yields != 0 {
		t.Errorf("%d yields in %v over 40 reads that waited, want none", yields, elapsed)
	}
}

// TestStaleSlack walks the slack a shard arms loss timers with: it grows with each deadline wake that
// finds nothing due (0.5, 1, 2, 4, 8, then 16 ms at most), never touches another deadline (an ACK
// waiting for company), and goes back to 0 at the first wake that finds a timer due. A deadline armed
// with its slack covers a later loss timer, so that a step leaves the clock unread, but not an
// earlier one, nor another kind of deadline due before the one armed.
func TestStaleSlack(t *testing.T) {
	d, err := Open(Config{Network: conn.NewMemNetwork(), Addr: netip.MustParseAddrPort("10.0.0.1:4791"), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := d.shards[0]
	now := time.Unix(1000, 0)
	probe := deadline{at: now.Add(time.Millisecond), loss: true}
	ack := deadline{at: now.Add(25 * time.Microsecond)}
	check := func(step string, want time.Duration) {
		t.Helper()
		if got := s.slacked(probe).Sub(probe.at); got != want {
			t.Errorf("%s: a probe is armed %v late, want %v", step, got, want)
		}
		if got := s.slacked(ack); !got.Equal(ack.at) {
			t.Errorf("%s: an ACK held for company is armed %v late, want on time", step, got.Sub(ack.at))
		}
		if got := s.slacked(deadline{loss: true}); !got.IsZero() {
			t.Errorf("%s: no deadline became %v", step, got)
		}
		s.armed.Store(0)
		s.arm(probe, now)
		if got := time.Duration(s.armed.Load() - probe.at.UnixNano()); got != want {
			t.Errorf("%s: arm armed a probe %v late, want %v", step, got, want)
		}
		later := deadline{at: probe.at.Add(100 * time.Microsecond), loss: true}
		if !s.covered(later) {
			t.Errorf("%s: a probe 100 us later than the one armed is not covered", step)
		}
		if got, wantCovered := s.covered(deadline{at: later.at}), want <= 100*time.Microsecond; got != wantCovered {
			t.Errorf("%s: a deadline 100 us after the probe that is no loss timer's is covered: %v, want %v", step, got, wantCovered)
		}
		if earlier := (deadline{at: probe.at.Add(-time.Microsecond), loss: true}); s.covered(earlier) {
			t.Errorf("%s: an earlier probe is covered", step)
		}
	}
	check("at first", 0)
	for i, want := range []time.Duration{500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond,
		8 * time.Millisecond, 16 * time.Millisecond, 16 * time.Millisecond} {
		s.noteTimerWake(false)
		check(fmt.Sprintf("after %d stale wakes", i+1), want)
	}
	if got := d.Stats().StaleWakes; got != 7 {
		t.Errorf("StaleWakes = %d, want 7", got)
	}
	s.noteTimerWake(true)
	check("after a wake with a timer due", 0)
}

// TestSlackSparesOtherDeadlines: a loss timer at the heap's head is armed with its slack, but never
// past a deadline of another kind behind it that is still its QP's (another QP's RNR wait ending just
// after a probe, say), which the slack must not delay. Stale entries and loss timers behind the head
// do not count, nor does a deadline past the slack.
func TestSlackSparesOtherDeadlines(t *testing.T) {
	t1 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t1.Add(d) }
	stale, live := &QP{}, &QP{}
	isLive := func(e *timerEntry) bool { return e.qp == live }
	var h timerHeap
	for _, e := range []timerEntry{
		{at: at(0), qp: live, loss: true}, // the head: a probe
		{at: at(20 * time.Microsecond), qp: live, loss: true},
		{at: at(50 * time.Microsecond), qp: stale},
		{at: at(100 * time.Microsecond), qp: live}, // an RNR wait's end
		{at: at(30 * time.Millisecond), qp: live},
		{at: at(70 * time.Microsecond), qp: stale},
	} {
		h.push(e)
	}
	limit := at(16 * time.Millisecond)
	if got := h.earliestOther(0, limit, isLive); !got.Equal(at(100 * time.Microsecond)) {
		t.Errorf("earliest live deadline of another kind: %v after the head, want 100us", got.Sub(t1))
	}
	if got := h.earliestOther(0, at(90*time.Microsecond), isLive); !got.Equal(at(90 * time.Microsecond)) {
		t.Errorf("with a limit of 90us: %v, want the limit", got.Sub(t1))
	}
	if got := h.earliestOther(0, limit, func(*timerEntry) bool { return false }); !got.Equal(limit) {
		t.Errorf("with every entry stale: %v, want the limit", got.Sub(t1))
	}

	// wakeAt: the slack applies to a loss timer at the head only; a QP that is closed is stale.
	closed := &QP{closed: true, scheduled: at(100 * time.Microsecond)}
	s := &shard{timers: timerHeap{{at: at(0), qp: closed, loss: true}, {at: at(100 * time.Microsecond), qp: closed}}}
	s.staleSlack.Store(int64(16 * time.Millisecond))
	if got := s.wakeAt(deadline{at: at(0), loss: true}); !got.Equal(limit) {
		t.Errorf("a probe with only a closed QP's deadline behind it wakes at %v, want the slack's 16ms", got.Sub(t1))
	}
	if got := s.wakeAt(deadline{at: at(0)}); !got.Equal(t1) {
		t.Errorf("a deadline of another kind at the head wakes at %v, want on time", got.Sub(t1))
	}
}

package datapath

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/goroce/goroce/qp"
)

// CQ is a completion queue as the datapath sees it: the engines' ring, and the ways a goroutine waits
// on it. While all its QPs live on one shard (its home), a waiter drives that shard itself; otherwise
// it parks until a driver's completion notifies it.
type CQ struct {
	d       *Datapath
	cq      *qp.CQ
	notify  chan struct{}
	home    atomic.Pointer[shard] // nil while no QP or QPs on several shards use the CQ
	driving atomic.Pointer[shard] // the shard a waiter drives for this CQ now

	mu      sync.Mutex // guards the fields below
	mixed   bool       // QPs of several shards use the CQ
	ctx     context.Context
	ctxStop func() bool
}

// NewCQ returns a CQ of n entries.
func (d *Datapath) NewCQ(n int) *CQ {
	c := &CQ{d: d, cq: qp.NewCQ(n), notify: make(chan struct{}, 1)}
	c.cq.SetNotify(c.wake)
	return c
}

// Engine returns the engines' CQ.
func (c *CQ) Engine() *qp.CQ { return c.cq }

// wake runs when an armed CQ gets a completion: it interrupts the shard a waiter drives for the CQ, or
// wakes a parked waiter.
func (c *CQ) wake() {
	if s := c.driving.Load(); s != nil {
		// The driver checks the CQ after every step: only one blocked in a read needs a kick.
		if !s.inStep.Load() {
			s.kick()
		}
		return
	}
	select {
	case c.notify <- struct{}{}:
		c.d.woke.Store(true)
	default:
	}
}

// attach records that a QP of shard s uses the CQ.
func (c *CQ) attach(s *shard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch h := c.home.Load(); {
	case c.mixed:
	case h == nil:
		c.home.Store(s)
	case h != s:
		c.mixed = true
		c.home.Store(nil)
	}
}

// Wait blocks until the CQ holds a completion, ctx ends or the datapath closes, then moves up to
// len(wc) completions into wc (len(wc) must be positive). A waiter on a CQ with a home shard drives
// the shard meanwhile (see shard.driveFor).
func (c *CQ) Wait(ctx context.Context, wc []qp.Completion) (int, error) {
	d := c.d
	for {
		if n := c.cq.Poll(wc); n > 0 {
			return n, nil
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if d.closing.Load() {
			return 0, ErrClosed
		}
		c.cq.Arm(false)
		if c.cq.Len() > 0 {
			continue
		}
		if s := c.home.Load(); s != nil && d.cfg.Linger >= 0 {
			c.watch(ctx)
			if s.tryDrive(c, ctx.Done()) {
				d.stats.drivenWaits.Add(1)
				continue
			}
			d.stats.parkedWaits.Add(1)
			s.waitFor(ctx, c)
			continue
		}
		d.stats.parkedWaits.Add(1)
		d.parked.Add(1)
		select {
		case <-c.notify:
		case <-ctx.Done():
			d.parked.Add(-1)
			return 0, ctx.Err()
		case <-d.done:
			d.parked.Add(-1)
			if n := c.cq.Poll(wc); n > 0 {
				return n, nil
			}
			return 0, ErrClosed
		}
		d.parked.Add(-1)
	}
}

// watch makes ctx's end interrupt the shard a waiter drives for the CQ. The registration is kept for
// the next Wait with the same context, so that a loop of Waits costs no allocation.
func (c *CQ) watch(ctx context.Context) {
	if ctx.Done() == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == ctx {
		return
	}
	if c.ctxStop != nil {
		c.ctxStop()
	}
	c.ctx = ctx
	c.ctxStop = context.AfterFunc(ctx, func() {
		if s := c.driving.Load(); s != nil {
			s.kick()
		}
	})
}

// Close drops the CQ's context registration.
func (c *CQ) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctxStop != nil {
		c.ctxStop()
		c.ctxStop, c.ctx = nil, nil
	}
}

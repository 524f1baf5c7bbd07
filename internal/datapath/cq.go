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
	d        *Datapath
	cq       *qp.CQ
	notify   chan struct{}
	notified atomic.Bool // the armed CQ got its notification
	closed   atomic.Bool
	home     atomic.Pointer[shard] // nil while no QP or QPs on several shards use the CQ
	driving  atomic.Pointer[shard] // the shard a waiter drives for this CQ now
	// Owner is the API's object for the CQ, for the events it reports.
	Owner any

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

// wake runs when an armed CQ gets a completion: it marks the CQ notified and interrupts the shard a
// waiter drives for the CQ, or wakes a parked waiter.
func (c *CQ) wake() {
	c.notified.Store(true)
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

// ready reports whether a waiter can stop: the CQ holds a completion, or for a solicited-only wait, a
// solicited or error completion came since it armed the CQ; or the CQ is closed.
func (c *CQ) ready(solicited bool) bool {
	if c.closed.Load() {
		return true
	}
	if solicited {
		return c.notified.Load()
	}
	return c.cq.Len() > 0
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

// Wait blocks until the CQ holds a completion, or with solicited until a solicited or error completion
// arrives (ibv_req_notify_cq with solicited_only), ctx ends or the datapath closes. A waiter on a CQ
// with a home shard drives the shard meanwhile (see shard.tryDrive).
func (c *CQ) Wait(ctx context.Context, solicited bool) error {
	d := c.d
	c.notified.Store(false)
	if solicited {
		c.cq.Arm(true) // once: only a solicited or error completion ends the wait
	}
	for {
		if !solicited {
			c.cq.Arm(false) // before each look: a completion pushed after it notifies
		}
		if d.closing.Load() || c.closed.Load() {
			return ErrClosed
		}
		if c.ready(solicited) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if s := c.home.Load(); s != nil && d.cfg.Linger >= 0 {
			c.watch(ctx)
			if s.tryDrive(c, solicited, ctx.Done()) {
				d.stats.drivenWaits.Add(1)
				continue
			}
			d.stats.parkedWaits.Add(1)
			s.waitFor(ctx, c, solicited)
			continue
		}
		d.stats.parkedWaits.Add(1)
		d.parked.Add(1)
		select {
		case <-c.notify:
		case <-ctx.Done():
		case <-d.done:
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

// Close ends the CQ's waits with ErrClosed and drops its context registration.
func (c *CQ) Close() {
	c.closed.Store(true)
	c.wake()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctxStop != nil {
		c.ctxStop()
		c.ctxStop, c.ctx = nil, nil
	}
}

package qp

import (
	"errors"
	"sync"
	"sync/atomic"
)

// ErrCQOverflow reports a completion queue that was full when a completion arrived. The completion is
// lost and the CQ is marked overflowed; the QP that produced it enters the error state. IBTA Vol 1
// 11.4.2.1 (CQ overrun is an error).
var ErrCQOverflow = errors.New("qp: completion queue overflow")

// CQ is a completion queue: a bounded ring of completions that one or more queue pairs push to and the
// application polls. It mirrors struct ibv_cq.
//
// A CQ is the hand-off point between QP owners and the application, so its methods are safe for
// concurrent use; mu guards every field below it. count mirrors n for Len, which a waiter calls
// between every two reads of its socket.
type CQ struct {
	count      atomic.Int32
	mu         sync.Mutex
	ring       []Completion
	head, n    int
	overflowed bool
	armed      bool // a notification is requested for the next completion
	solicited  bool // the notification is only for solicited or error completions
	notify     func()
}

// NewCQ returns a completion queue that holds up to capacity completions (at least 1).
func NewCQ(capacity int) *CQ {
	return &CQ{ring: make([]Completion, max(capacity, 1))}
}

// Cap returns how many completions the CQ holds.
func (c *CQ) Cap() int { return len(c.ring) }

// Len returns how many completions are waiting to be polled.
func (c *CQ) Len() int { return int(c.count.Load()) }

// Poll moves up to len(dst) completions, oldest first, into dst and returns how many it moved. It
// mirrors ibv_poll_cq.
func (c *CQ) Poll(dst []Completion) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := min(len(dst), c.n)
	for i := 0; i < k; i++ {
		dst[i] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n -= k
	c.count.Store(int32(c.n))
	return k
}

// Overflowed reports whether a completion was ever lost because the CQ was full.
func (c *CQ) Overflowed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overflowed
}

// SetNotify sets the function called when an armed CQ receives a completion. It runs on the goroutine
// that pushed the completion, without the CQ's lock held, and must not block.
func (c *CQ) SetNotify(fn func()) {
	c.mu.Lock()
	c.notify = fn
	c.mu.Unlock()
}

// Arm requests one notification for the next completion, or with solicitedOnly for the next solicited
// or error completion. It mirrors ibv_req_notify_cq: notifications are one-shot.
func (c *CQ) Arm(solicitedOnly bool) {
	c.mu.Lock()
	c.armed, c.solicited = true, solicitedOnly
	c.mu.Unlock()
}

// push appends wc. solicited marks a receive completion of a message with the SE bit.
func (c *CQ) push(wc *Completion, solicited bool) error {
	c.mu.Lock()
	if c.n == len(c.ring) {
		c.overflowed = true
		c.mu.Unlock()
		return ErrCQOverflow
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = *wc
	c.n++
	c.count.Store(int32(c.n))
	var fn func()
	if c.armed && (!c.solicited || solicited || wc.Status != StatusSuccess) {
		c.armed = false
		fn = c.notify
	}
	c.mu.Unlock()
	if fn != nil {
		fn()
	}
	return nil
}

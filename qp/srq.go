package qp

import (
	"errors"
	"sync"

	"github.com/goroce/goroce/mr"
)

// Errors of posting receives.
var (
	ErrQueueFull  = errors.New("qp: work queue full")
	ErrTooManySGE = errors.New("qp: too many scatter/gather elements")
)

// recvWQE is a posted receive: the work request's ID and a copy of its SGL.
type recvWQE struct {
	id  uint64
	sgl []mr.SGE // points into a per-slot array of maxSGE elements
	len uint64   // total length of sgl
}

// recvRing is a bounded FIFO of receive WQEs. Like the send queue it grows to its capacity as needed
// and reuses each slot's SGL storage.
type recvRing struct {
	slots    []recvWQE
	sges     [][]mr.SGE
	capacity int
	maxSGE   int
	head, n  int
}

func newRecvRing(capacity, maxSGE int) recvRing {
	capacity, maxSGE = max(capacity, 1), max(maxSGE, 1)
	r := recvRing{capacity: capacity, maxSGE: maxSGE}
	r.resize(min(capacity, initialSlots))
	return r
}

func (r *recvRing) resize(n int) {
	slots := make([]recvWQE, n)
	sges := make([][]mr.SGE, n)
	for i := 0; i < len(r.slots); i++ {
		j := (r.head + i) % len(r.slots)
		slots[i], sges[i] = r.slots[j], r.sges[j]
	}
	for i := range sges {
		if sges[i] == nil {
			sges[i] = make([]mr.SGE, 0, r.maxSGE)
		}
	}
	r.slots, r.sges, r.head = slots, sges, 0
}

func (r *recvRing) push(wr *RecvWR) error {
	if len(wr.SGL) > r.maxSGE {
		return ErrTooManySGE
	}
	if r.n == len(r.slots) {
		if r.n == r.capacity {
			return ErrQueueFull
		}
		r.resize(min(2*len(r.slots), r.capacity))
	}
	i := (r.head + r.n) % len(r.slots)
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	r.slots[i] = recvWQE{id: wr.ID, sgl: append(r.sges[i][:0], wr.SGL...), len: total}
	r.n++
	return nil
}

// front returns the oldest WQE, or nil.
func (r *recvRing) front() *recvWQE {
	if r.n == 0 {
		return nil
	}
	return &r.slots[r.head]
}

func (r *recvRing) pop() {
	r.head = (r.head + 1) % len(r.slots)
	r.n--
}

// SRQ is a shared receive queue: receive buffers that several queue pairs consume from. It mirrors
// struct ibv_srq. Its methods are safe for concurrent use; mu guards the fields below it.
type SRQ struct {
	mu      sync.Mutex
	ring    recvRing
	limit   int    // when armed, an event fires once fewer than limit WQEs remain
	onLimit func() // called without mu held
}

// NewSRQ returns a shared receive queue of capacity receives with up to maxSGE elements each.
func NewSRQ(capacity, maxSGE int) *SRQ {
	return &SRQ{ring: newRecvRing(capacity, maxSGE)}
}

// PostRecv posts a receive. It mirrors ibv_post_srq_recv.
func (s *SRQ) PostRecv(wr *RecvWR) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ring.push(wr)
}

// Len returns the number of posted receives.
func (s *SRQ) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ring.n
}

// ArmLimit asks for fn to be called once, when fewer than limit receives remain; it mirrors setting
// srq_limit with ibv_modify_srq and the IBV_EVENT_SRQ_LIMIT_REACHED event.
func (s *SRQ) ArmLimit(limit int, fn func()) {
	s.mu.Lock()
	s.limit, s.onLimit = limit, fn
	s.mu.Unlock()
}

// take removes the oldest receive and returns a copy of it with its SGL copied into sgl.
func (s *SRQ) take(sgl []mr.SGE) (recvWQE, bool) {
	s.mu.Lock()
	w := s.ring.front()
	if w == nil {
		s.mu.Unlock()
		return recvWQE{}, false
	}
	out := recvWQE{id: w.id, len: w.len, sgl: sgl[:copy(sgl, w.sgl)]}
	s.ring.pop()
	var fn func()
	if s.onLimit != nil && s.ring.n < s.limit {
		fn, s.onLimit = s.onLimit, nil
	}
	s.mu.Unlock()
	if fn != nil {
		fn()
	}
	return out, true
}

func (s *SRQ) maxSGE() int { return s.ring.maxSGE }

func (r *recvRing) clear() { r.head, r.n = 0, 0 }

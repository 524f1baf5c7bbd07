package qp

import (
	"errors"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// ErrNoRdAtomic reports a READ or atomic posted on a QP whose max_rd_atomic is 0: it could never start.
var ErrNoRdAtomic = errors.New("qp: READ or atomic on a QP with max_rd_atomic 0")

// ErrBadInline reports an Inline request that is a READ or also names an SGL: inline data comes from
// SendWR.InlineData alone.
var ErrBadInline = errors.New("qp: inline send must carry its data in InlineData and no SGL")

// sendWQE is a posted send work request and the requester's and completer's progress on it.
type sendWQE struct {
	wr     SendWR // SGL points into the slot's own storage, AH into ah
	ah     AddressHandle
	length uint32 // message length: the SGL's total, or 8 for atomics
	inline []byte // a copy of the data of an Inline request

	started  bool     // the next packet continues the message rather than starting it
	assigned bool     // firstPSN and lastPSN are set; a go-back-N retry keeps them
	sent     bool     // every packet was sent at least once
	firstPSN wire.PSN // PSN of the first packet
	lastPSN  wire.PSN // PSN of the last packet (of the last READ response)
	offset   uint32   // next byte the requester sends
}

// packets returns how many PSNs a message of n bytes takes at mtu: at least one.
func packets(n uint32, mtu int) uint32 {
	if n == 0 {
		return 1
	}
	return (n + uint32(mtu) - 1) / uint32(mtu)
}

// sendRing is the send queue: a bounded FIFO of WQEs. Slots, and each slot's SGL and inline storage,
// are allocated as the queue first grows to need them and then reused, so an idle QP costs little and
// posting allocates nothing in steady state.
type sendRing struct {
	slots     []sendWQE
	sges      [][]mr.SGE // per slot, cap maxSGE
	inlineBuf [][]byte   // per slot, grown to the largest inline message seen
	capacity  int
	maxSGE    int
	maxInline int
	head, n   int
}

// initialSlots is how many slots a queue starts with before it grows toward its capacity.
const initialSlots = 4

func newSendRing(capacity, maxSGE, maxInline int) sendRing {
	capacity, maxSGE = max(capacity, 1), max(maxSGE, 1)
	r := sendRing{capacity: capacity, maxSGE: maxSGE, maxInline: maxInline}
	r.resize(min(capacity, initialSlots))
	return r
}

// resize moves the ring into n slots, oldest first at index 0.
func (r *sendRing) resize(n int) {
	slots := make([]sendWQE, n)
	sges := make([][]mr.SGE, n)
	inl := make([][]byte, n)
	for i := 0; i < len(r.slots); i++ {
		j := (r.head + i) % len(r.slots)
		slots[i], sges[i], inl[i] = r.slots[j], r.sges[j], r.inlineBuf[j]
	}
	for i := range sges {
		if sges[i] == nil {
			sges[i] = make([]mr.SGE, 0, r.maxSGE)
		}
	}
	r.slots, r.sges, r.inlineBuf, r.head = slots, sges, inl, 0
}

func (r *sendRing) at(i int) *sendWQE {
	j := r.head + i
	if j >= len(r.slots) {
		j -= len(r.slots)
	}
	return &r.slots[j]
}

func (r *sendRing) front() *sendWQE {
	if r.n == 0 {
		return nil
	}
	return &r.slots[r.head]
}

func (r *sendRing) pop() {
	r.slots[r.head] = sendWQE{}
	r.head++
	if r.head == len(r.slots) {
		r.head = 0
	}
	r.n--
}

// unpush takes back the WQE push just added.
func (r *sendRing) unpush() {
	r.n--
	*r.at(r.n) = sendWQE{}
}

func (r *sendRing) clear() {
	for r.n > 0 {
		r.pop()
	}
	r.head = 0
}

// push validates wr and copies it into the next slot.
func (r *sendRing) push(wr *SendWR, t Type) (*sendWQE, error) {
	if len(wr.SGL) > r.maxSGE {
		return nil, ErrTooManySGE
	}
	if t == UD && wr.AH == nil {
		return nil, ErrNoAH
	}
	inline := wr.Flags&Inline != 0
	var length uint32
	switch {
	case wr.Opcode.isAtomic():
		if inline || len(wr.SGL) != 1 || wr.SGL[0].Length != 8 {
			return nil, ErrBadAtomic
		}
		length = 8
	case inline:
		if wr.Opcode == WRRead || len(wr.SGL) != 0 {
			return nil, ErrBadInline
		}
		if len(wr.InlineData) > r.maxInline {
			return nil, ErrInlineTooLong
		}
		length = uint32(len(wr.InlineData))
	default:
		n, err := mr.SGLength(wr.SGL)
		if err != nil {
			return nil, ErrMessageTooLong
		}
		length = n
	}
	if r.n == len(r.slots) {
		if r.n == r.capacity {
			return nil, ErrQueueFull
		}
		r.resize(min(2*len(r.slots), r.capacity))
	}
	i := r.head + r.n
	if i >= len(r.slots) {
		i -= len(r.slots)
	}
	w := &r.slots[i]
	// The fields are copied one by one, never *wr whole: a copy of *wr would let the caller's SGL,
	// AH and InlineData escape (the compiler cannot see that they are replaced below), and every
	// post of a work request built on the caller's stack would allocate.
	*w = sendWQE{length: length, wr: SendWR{ID: wr.ID, Opcode: wr.Opcode, Flags: wr.Flags, Imm: wr.Imm,
		InvalidateRKey: wr.InvalidateRKey, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey, CompareAdd: wr.CompareAdd,
		Swap: wr.Swap, RemoteQPN: wr.RemoteQPN, RemoteQKey: wr.RemoteQKey}}
	w.wr.SGL = append(r.sges[i][:0], wr.SGL...)
	if wr.AH != nil {
		w.ah = *wr.AH
		w.wr.AH = &w.ah
	}
	if inline {
		if cap(r.inlineBuf[i]) < int(length) {
			r.inlineBuf[i] = make([]byte, 0, max(int(length), 64))
		}
		w.inline = r.inlineBuf[i][:length]
		copy(w.inline, wr.InlineData)
		w.wr.InlineData = nil
	}
	r.n++
	return w, nil
}

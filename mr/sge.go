package mr

import "github.com/goroce/goroce/wire"

// SGE is a scatter/gather element of a work request: Length bytes at address Addr (in the IOVA space
// of the region LKey names). It mirrors struct ibv_sge.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   wire.LKey
}

// SGLength returns the total length of sgl: the length of the message a send work request carries. It
// fails with ErrLength above MaxMessage. Scatter and Gather accept longer lists.
func SGLength(sgl []SGE) (uint32, error) {
	n := sgTotal(sgl)
	if n > MaxMessage {
		return 0, ErrLength
	}
	return uint32(n), nil
}

// sgTotal sums the lengths of sgl; len(sgl) < 2^32 keeps it from overflowing.
func sgTotal(sgl []SGE) uint64 {
	var n uint64
	for i := range sgl {
		n += uint64(sgl[i].Length)
	}
	return n
}

// Gather copies len(dst) bytes of the message sgl describes, starting offset bytes into it, to dst: the
// send path's copy of one packet's payload. Each element touched is checked with its lkey against pd;
// gather needs no access right (local read is always allowed). Elements of length 0 are skipped
// without a key check. It fails with ErrLength if the list holds fewer than offset+len(dst) bytes,
// before copying anything; on a protection error dst is partly written.
func (t *Table) Gather(pd *PD, sgl []SGE, offset uint64, dst []byte) error {
	return t.sg(pd, sgl, offset, dst, 0)
}

// GatherRefs is Gather without the copy: it appends to refs the pieces of registered memory that hold
// n bytes of the message sgl describes, starting offset bytes into it, one per element touched, and
// returns the extended refs. The checks and errors are Gather's. The send path hands the pieces to the
// socket, so that the kernel's copy is the only one; the pieces stay readable after the region is
// deregistered (Go keeps the memory), and what they hold is whatever the memory holds when the kernel
// copies it, as a NIC's DMA reads the memory when it sends.
func (t *Table) GatherRefs(pd *PD, sgl []SGE, offset uint64, n int, refs [][]byte) ([][]byte, error) {
	err := t.walk(pd, sgl, offset, n, 0, func(r *Region, mem []byte) {
		r.race.read(mem)
		refs = append(refs, mem)
	})
	return refs, err
}

// Scatter copies src into the buffer sgl describes, starting offset bytes into it: the receive path's
// placement of one SEND packet's payload. Every element touched needs LocalWrite. It fails with
// ErrLength if src does not fit, before writing anything; on a protection error the buffer is partly
// written, as IBTA leaves a receive buffer undefined when its work request completes in error.
func (t *Table) Scatter(pd *PD, sgl []SGE, offset uint64, src []byte) error {
	return t.sg(pd, sgl, offset, src, LocalWrite)
}

// sg copies len(b) bytes out of the message sgl describes from offset (want 0), or into it (want
// LocalWrite).
func (t *Table) sg(pd *PD, sgl []SGE, offset uint64, b []byte, want Access) error {
	return t.walk(pd, sgl, offset, len(b), want, func(r *Region, mem []byte) {
		r.race.lock()
		if want == 0 {
			copy(b, mem)
		} else {
			copy(mem, b)
		}
		r.race.unlock()
		b = b[len(mem):]
	})
}

// walk hands f, element by element, the region memory that holds n bytes of the message sgl
// describes from offset, each piece checked with its element's lkey against pd for want, and its
// region read-locked while f runs. It fails with ErrLength, before calling f, if the list is too
// short.
func (t *Table) walk(pd *PD, sgl []SGE, offset uint64, n int, want Access, f func(r *Region, mem []byte)) error {
	if n <= 0 {
		return nil
	}
	total := sgTotal(sgl)
	if offset > total || uint64(n) > total-offset {
		return ErrLength
	}
	for i := range sgl {
		if n == 0 {
			break
		}
		s := &sgl[i]
		if offset >= uint64(s.Length) {
			offset -= uint64(s.Length)
			continue
		}
		// An element that wraps past 2^64 is refused as a whole, even the part below the wrap.
		if _, ok := checkedEnd(s.Addr, uint64(s.Length)); !ok {
			return ErrBounds
		}
		k := min(uint64(s.Length)-offset, uint64(n))
		r, off, err := t.check(pd, uint32(s.LKey), false, s.Addr+offset, k, want)
		if err != nil {
			return err
		}
		f(r, r.buf[off:off+int(k):off+int(k)])
		r.mu.RUnlock()
		n -= int(k)
		offset = 0
	}
	return nil
}

// CheckSGL checks, as a post does before queueing a work request, that every element of sgl lies inside
// a valid region of pd under its local key with the rights want asks for (LocalWrite where the device
// will write the memory), and that none wraps past 2^64. Elements of length 0 are not checked (IBTA Vol
// 1 C9-88). The region may still be deregistered before the work request runs: its execution checks
// again.
func (t *Table) CheckSGL(pd *PD, sgl []SGE, want Access) error {
	for i := range sgl {
		s := &sgl[i]
		if s.Length == 0 {
			continue
		}
		if _, ok := checkedEnd(s.Addr, uint64(s.Length)); !ok {
			return ErrBounds
		}
		r, _, err := t.check(pd, uint32(s.LKey), false, s.Addr, uint64(s.Length), want)
		if err != nil {
			return err
		}
		r.mu.RUnlock()
	}
	return nil
}

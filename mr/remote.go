package mr

import "github.com/goroce/goroce/wire"

// CheckRemote checks that a peer of a QP in pd may access length bytes at va through key with the
// rights in want, without touching memory: for example at the first packet of an RDMA WRITE or at an
// RDMA READ request. A later WriteRemote or ReadRemote checks again, so a region deregistered in
// between is still caught.
func (t *Table) CheckRemote(pd *PD, key wire.RKey, va uint64, length uint32, want Access) error {
	r, _, err := t.check(pd, uint32(key), true, va, uint64(length), want)
	if r != nil {
		r.mu.RUnlock()
	}
	return err
}

// WriteRemote copies src to va in the region key names, for an RDMA WRITE packet of a QP in pd. It
// needs RemoteWrite. Nothing is written unless the whole range passes the check.
func (t *Table) WriteRemote(pd *PD, key wire.RKey, va uint64, src []byte) error {
	r, off, err := t.check(pd, uint32(key), true, va, uint64(len(src)), RemoteWrite)
	if r == nil {
		return err
	}
	r.race.lock()
	copy(r.buf[off:], src)
	r.race.unlock()
	r.mu.RUnlock()
	return nil
}

// ReadRemote copies len(dst) bytes at va in the region key names into dst, for an RDMA READ response
// of a QP in pd. It needs RemoteRead.
func (t *Table) ReadRemote(pd *PD, key wire.RKey, va uint64, dst []byte) error {
	r, off, err := t.check(pd, uint32(key), true, va, uint64(len(dst)), RemoteRead)
	if r == nil {
		return err
	}
	r.race.lock()
	copy(dst, r.buf[off:])
	r.race.unlock()
	r.mu.RUnlock()
	return nil
}

// ReadRemoteRef is ReadRemote without the copy: it returns the n bytes at va in the region key names,
// the region's own memory, for an RDMA READ response sent by reference (see GatherRefs).
func (t *Table) ReadRemoteRef(pd *PD, key wire.RKey, va uint64, n int) ([]byte, error) {
	r, off, err := t.check(pd, uint32(key), true, va, uint64(n), RemoteRead)
	if r == nil {
		return nil, err
	}
	b := r.buf[off : off+n : off+n]
	r.race.read(b)
	r.mu.RUnlock()
	return b, nil
}

// CompareSwap executes an atomic compare-and-swap on the 8 bytes at va in the region key names, for a
// QP in pd: if the value equals compare it becomes swap. It returns the value before the operation. It
// needs RemoteAtomic and an 8-byte aligned va; the value is in host byte order, as in rxe.
func (t *Table) CompareSwap(pd *PD, key wire.RKey, va, compare, swap uint64) (uint64, error) {
	r, off, err := t.check(pd, uint32(key), true, va, atomicSize, RemoteAtomic)
	if r == nil {
		return 0, err
	}
	r.race.lock()
	orig := compareSwap(r.buf[off:off+atomicSize], compare, swap)
	r.race.unlock()
	r.mu.RUnlock()
	return orig, nil
}

// FetchAdd executes an atomic fetch-and-add of add to the 8 bytes at va in the region key names, for a
// QP in pd, and returns the value before the addition. Requirements are as for CompareSwap.
func (t *Table) FetchAdd(pd *PD, key wire.RKey, va, add uint64) (uint64, error) {
	r, off, err := t.check(pd, uint32(key), true, va, atomicSize, RemoteAtomic)
	if r == nil {
		return 0, err
	}
	r.race.lock()
	orig := fetchAdd(r.buf[off:off+atomicSize], add)
	r.race.unlock()
	r.mu.RUnlock()
	return orig, nil
}

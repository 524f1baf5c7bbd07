package mr

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/goroce/goroce/wire"
)

// modelRegion is the reference model's view of a region: plain fields and a slow, obviously correct
// check.
type modelRegion struct {
	r             *Region
	pd            *PD
	iova, size    uint64
	access        Access
	invalidatable bool
	invalidated   bool
	lkey, rkey    uint32
}

// modelCheck is the reference for Table.check: a linear search over live regions, bit-by-bit rights,
// and bounds as "the first and last byte both lie in the region, and the last does not wrap".
func modelCheck(regions []*modelRegion, pd *PD, key uint32, remote bool, va, length uint64, want Access) (*modelRegion, uint64, error) {
	if length == 0 {
		return nil, 0, nil
	}
	if length > 1<<31 {
		return nil, 0, ErrLength
	}
	if want&RemoteAtomic != 0 && length != 8 {
		return nil, 0, ErrLength
	}
	var m *modelRegion
	for _, c := range regions {
		k := c.lkey
		if remote {
			k = c.rkey
		}
		if k == key && !c.invalidated {
			m = c
		}
	}
	switch {
	case m == nil:
		return nil, 0, ErrBadKey
	case m.pd != pd:
		return nil, 0, ErrWrongPD
	}
	for _, bit := range []Access{LocalWrite, RemoteWrite, RemoteRead, RemoteAtomic, MWBind} {
		if want&bit != 0 && m.access&bit == 0 {
			return nil, 0, ErrPermission
		}
	}
	// Every byte va..va+length-1 must be a region byte; byte i of the access is va+i, which must
	// not wrap.
	first, last := va, va+length-1
	if last < first || first < m.iova || last > m.iova+m.size-1 {
		return nil, 0, ErrBounds
	}
	if want&RemoteAtomic != 0 && va%8 != 0 {
		return nil, 0, ErrMisaligned
	}
	return m, va - m.iova, nil
}

// TestCheckMatchesModel drives a table and the model through random registrations, deregistrations,
// invalidations and checks, and requires the same answer from both for every check.
func TestCheckMatchesModel(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0x6d72))
	defer func() {
		if t.Failed() {
			t.Logf("replay with seed %d", seed)
		}
	}()
	tb := NewTable()
	pds := []*PD{tb.AllocPD(), tb.AllocPD(), tb.AllocPD()}
	accesses := []Access{0, LocalWrite, RemoteRead, LocalWrite | RemoteWrite, LocalWrite | RemoteAtomic, allRemote, allRemote | MWBind}
	var live []*modelRegion
	var oldKeys []uint32

	randomIOVA := func() (uint64, bool) {
		switch rng.IntN(4) {
		case 0:
			return 0, false // default: the buffer's address
		case 1:
			return math.MaxUint64 - 64 - rng.Uint64N(64), true
		case 2:
			return rng.Uint64N(4) * 0x100, true // overlapping IOVA ranges
		}
		return rng.Uint64() >> rng.IntN(64), true
	}
	randomKey := func() (uint32, bool) {
		remote := rng.IntN(2) == 0
		switch n := rng.IntN(10); {
		case n < 5 && len(live) > 0:
			m := live[rng.IntN(len(live))]
			if rng.IntN(8) == 0 {
				return m.rkey, !remote // the other kind's key
			}
			if remote {
				return m.rkey, true
			}
			return m.lkey, false
		case n < 8 && len(oldKeys) > 0:
			return oldKeys[rng.IntN(len(oldKeys))], remote
		}
		return rng.Uint32(), remote
	}
	randomVA := func() uint64 {
		if len(live) == 0 || rng.IntN(8) == 0 {
			return rng.Uint64()
		}
		m := live[rng.IntN(len(live))]
		switch rng.IntN(3) {
		case 0:
			return m.iova + rng.Uint64N(m.size+1)
		case 1:
			return m.iova + m.size - rng.Uint64N(16)
		}
		return m.iova - rng.Uint64N(4)
	}
	randomLength := func() uint64 {
		switch rng.IntN(6) {
		case 0:
			return 0
		case 1:
			return 8
		case 2:
			return 1<<31 - 2 + rng.Uint64N(4)
		case 3:
			return rng.Uint64N(1 << 32)
		}
		return 1 + rng.Uint64N(80)
	}

	var checks, hits int
	outcomes := map[error]int{}
	for step := range 40000 {
		switch op := rng.IntN(20); {
		case op == 0 && len(live) < 300: // register
			pd := pds[rng.IntN(len(pds))]
			size := 1 + rng.IntN(64)
			var opts []Option
			iova, chosen := randomIOVA()
			if chosen {
				opts = append(opts, WithIOVA(iova))
			}
			inv := rng.IntN(2) == 0
			if inv {
				opts = append(opts, Invalidatable())
			}
			access := accesses[rng.IntN(len(accesses))]
			buf := make([]byte, size)
			r, err := tb.Register(pd, buf, access, opts...)
			if chosen && iova > math.MaxUint64-uint64(size) {
				if err != ErrIOVARange {
					t.Fatalf("step %d: Register at %#x+%d = %v, want ErrIOVARange", step, iova, size, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: Register: %v", step, err)
			}
			live = append(live, &modelRegion{r: r, pd: pd, iova: r.IOVA(), size: uint64(size), access: access,
				invalidatable: inv, lkey: uint32(r.LKey()), rkey: uint32(r.RKey())})
		case op == 1 && len(live) > 0: // deregister
			i := rng.IntN(len(live))
			m := live[i]
			if err := tb.Deregister(m.r); err != nil {
				t.Fatalf("step %d: Deregister: %v", step, err)
			}
			oldKeys = append(oldKeys, m.lkey, m.rkey)
			live = append(live[:i], live[i+1:]...)
		case op == 2: // invalidate
			key, remote := randomKey()
			pd := pds[rng.IntN(len(pds))]
			var want error = ErrBadKey
			var target *modelRegion
			for _, m := range live {
				if (remote && m.rkey == key) || (!remote && m.lkey == key) {
					target = m
				}
			}
			switch {
			case target == nil:
			case target.pd != pd:
				want = ErrWrongPD
			case !target.invalidatable:
				want = ErrNotInvalidatable
			default:
				want = nil
			}
			var err error
			if remote {
				err = tb.RemoteInvalidate(pd, wire.RKey(key))
			} else {
				err = tb.LocalInvalidate(pd, lkeyOf(key))
			}
			if err != want {
				t.Fatalf("step %d: invalidate(key %#x, remote %v) = %v, want %v", step, key, remote, err, want)
			}
			if err == nil {
				target.invalidated = true
			}
		case op == 3 && len(live) > 0: // revalidate
			m := live[rng.IntN(len(live))]
			err := tb.Revalidate(m.r)
			if !m.invalidated {
				if err != ErrStillValid {
					t.Fatalf("step %d: Revalidate of a valid region = %v", step, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: Revalidate = %v", step, err)
			}
			oldKeys = append(oldKeys, m.lkey, m.rkey)
			m.lkey, m.rkey, m.invalidated = uint32(m.r.LKey()), uint32(m.r.RKey()), false
		default: // check
			pd := pds[rng.IntN(len(pds))]
			if rng.IntN(50) == 0 {
				pd = nil
			}
			key, remote := randomKey()
			va, length := randomVA(), randomLength()
			want := accesses[rng.IntN(len(accesses))]
			if len(live) > 0 && rng.IntN(2) == 0 {
				// Aim near one region: its key, its PD, rights it has, a range at or around its edges.
				m := live[rng.IntN(len(live))]
				key, remote = m.lkey, rng.IntN(2) == 0
				if remote {
					key = m.rkey
				}
				if rng.IntN(4) != 0 {
					pd = m.pd
				}
				want = m.access & accesses[rng.IntN(len(accesses))]
				length = 1 + rng.Uint64N(m.size)
				if rng.IntN(3) == 0 {
					length = 8
				}
				va = m.iova + rng.Uint64N(m.size) - rng.Uint64N(2)
			}
			r, off, err := tb.check(pd, key, remote, va, length, want)
			if r != nil {
				r.mu.RUnlock()
			}
			m, moff, merr := modelCheck(live, pd, key, remote, va, length, want)
			checks++
			if err != merr || (m == nil) != (r == nil) || (m != nil && (m.r != r || uint64(off) != moff)) {
				t.Fatalf("step %d: check(key %#x remote %v, va %#x, len %d, %v) = (%v, %d, %v), model (%v, %d, %v)",
					step, key, remote, va, length, want, r != nil, off, err, m != nil, moff, merr)
			}
			if err == nil && length > 0 {
				hits++
			}
			outcomes[err]++
		}
	}
	// Guard against a generator that never reaches the interesting cases.
	if hits < checks/50 {
		t.Fatalf("only %d of %d checks succeeded: the generator does not exercise valid accesses", hits, checks)
	}
	for _, e := range []error{nil, ErrBadKey, ErrWrongPD, ErrPermission, ErrBounds, ErrMisaligned, ErrLength} {
		if outcomes[e] == 0 {
			t.Errorf("no check ended in %v: the generator misses a case", e)
		}
	}
	t.Logf("%d checks, %d hits, outcomes %v", checks, hits, outcomes)
}

package mr

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestAtomicsSum runs FetchAdd and CompareSwap increments from many goroutines, on memory whose real
// address is aligned (sync/atomic path) and misaligned under an aligned IOVA (striped-lock path), and
// checks that no increment was lost and every FetchAdd saw a distinct old value.
func TestAtomicsSum(t *testing.T) {
	const goroutines, perG = 8, 2000
	for _, skew := range []int{0, 4, 3} {
		tb := NewTable()
		pd := tb.AllocPD()
		buf := guardedBuf(t, 16, skew)
		r := mustRegister(t, tb, pd, buf, allRemote, WithIOVA(0x7000))
		if _, aligned := word(buf); aligned != (skew == 0) {
			t.Fatalf("skew %d: aligned path %v", skew, aligned)
		}
		key := r.RKey()
		seen := make([]atomic.Bool, goroutines*perG)
		var wg sync.WaitGroup
		var failed atomic.Value
		for range goroutines {
			wg.Go(func() {
				for range perG {
					orig, err := tb.FetchAdd(pd, key, 0x7000, 1)
					if err != nil || orig >= uint64(len(seen)) || seen[orig].Swap(true) {
						failed.Store(errors.New("FetchAdd returned a repeated or bad value"))
						return
					}
					for { // CompareSwap increment of the second word
						cur, err := tb.FetchAdd(pd, key, 0x7008, 0)
						if err != nil {
							failed.Store(err)
							return
						}
						if got, err := tb.CompareSwap(pd, key, 0x7008, cur, cur+1); err == nil && got == cur {
							break
						}
					}
				}
			})
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			t.Fatalf("skew %d: %v", skew, err)
		}
		var want [16]byte
		putNative(want[:8], goroutines*perG)
		putNative(want[8:], goroutines*perG)
		if !bytes.Equal(buf, want[:]) {
			t.Fatalf("skew %d: words %x, want %x", skew, buf, want)
		}
	}
}

// TestDeregisterRace has writers, readers, atomics and scatters hammer a region while it is
// deregistered. Each worker keeps to its own 32 bytes, so the workers do not race with each other. Any access that starts after Deregister returned must fail, and the memory must not
// change after Deregister returned.
func TestDeregisterRace(t *testing.T) {
	for _, op := range []string{"deregister", "invalidate"} {
		t.Run(op, func(t *testing.T) {
			const workers, after = 6, 200
			tb := NewTable()
			pd := tb.AllocPD()
			buf := guardedBuf(t, workers*32, 0)
			r := mustRegister(t, tb, pd, buf, allRemote, Invalidatable(), WithIOVA(0x9000))
			rkey, lkey := r.RKey(), r.LKey()

			var revoked atomic.Bool // set once the revocation has returned
			var successes atomic.Int64
			var late atomic.Int64 // accesses started after revocation that succeeded
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					src := bytes.Repeat([]byte{byte(w + 1)}, 8)
					dst := make([]byte, 16)
					own := 0x9000 + uint64(w)*32
					for i, seenAfter := 0, 0; seenAfter < after; i++ {
						started := revoked.Load()
						var err error
						switch (w + i) % 4 {
						case 0:
							err = tb.WriteRemote(pd, rkey, own+uint64(i%2)*8, src)
						case 1:
							err = tb.ReadRemote(pd, rkey, own, dst)
						case 2:
							_, err = tb.FetchAdd(pd, rkey, own+16, 1)
						case 3:
							err = tb.Scatter(pd, []SGE{{own + 24, 8, lkey}}, 0, src)
						}
						if err == nil {
							successes.Add(1)
							if started {
								late.Add(1)
							}
						} else if err != ErrBadKey {
							t.Errorf("worker %d: unexpected %v", w, err)
							return
						}
						if started {
							seenAfter++
						}
					}
				})
			}
			for successes.Load() < 1000 { // let accesses get going; no timing involved
			}
			var err error
			if op == "deregister" {
				err = tb.Deregister(r)
			} else {
				err = tb.RemoteInvalidate(pd, rkey)
			}
			if err != nil {
				t.Fatal(err)
			}
			snapshot := append([]byte{}, buf...)
			revoked.Store(true)
			wg.Wait()
			if n := late.Load(); n != 0 {
				t.Fatalf("%d accesses succeeded after %s returned", n, op)
			}
			if !bytes.Equal(buf, snapshot) {
				t.Fatalf("memory changed after %s returned", op)
			}
		})
	}
}

// TestDeregisterRaceMapped does the same over mmap'd memory: a write landing after Deregister would
// fault on the unmapped pages and crash the test.
func TestDeregisterRaceMapped(t *testing.T) {
	const workers, rounds = 4, 20
	tb := NewTable()
	pd := tb.AllocPD()
	for range rounds {
		r, err := tb.Alloc(pd, 8192, allRemote)
		if err != nil {
			t.Fatal(err)
		}
		key, va := r.RKey(), r.IOVA()
		var stop, started atomic.Bool
		var ops atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				src := make([]byte, 1024)
				own := va + uint64(w)*1024
				for i := 0; !stop.Load(); i++ {
					after := started.Load()
					var err error
					if (w+i)%2 == 0 {
						err = tb.WriteRemote(pd, key, own, src)
					} else {
						_, err = tb.FetchAdd(pd, key, va+8192-8*uint64(w+1), 1)
					}
					if after && err == nil {
						t.Error("access succeeded after Deregister returned")
						return
					}
					ops.Add(1)
				}
			})
		}
		for ops.Load() < 100 {
		}
		if err := tb.Deregister(r); err != nil {
			t.Fatal(err)
		}
		started.Store(true)
		target := ops.Load() + 100
		for ops.Load() < target {
		}
		stop.Store(true)
		wg.Wait()
	}
}

// TestConcurrentRegistration registers and deregisters from several goroutines while others look
// keys up, so the race detector sees the slot table's publication.
func TestConcurrentRegistration(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			buf := make([]byte, 64)
			for i := range 3000 {
				r := mustRegister(t, tb, pd, buf, allRemote)
				if err := tb.WriteRemote(pd, r.RKey(), r.IOVA(), []byte{byte(g), byte(i)}); err != nil {
					t.Error(err)
					return
				}
				if err := tb.Deregister(r); err != nil {
					t.Error(err)
					return
				}
				if err := tb.CheckRemote(pd, r.RKey(), r.IOVA(), 1, RemoteRead); err != ErrBadKey {
					t.Errorf("deregistered key: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

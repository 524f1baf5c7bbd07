package qp

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// fuzzResponder is a responder QP with three regions inside guarded buffers: one a peer may write,
// one it may only read, and a receive buffer.
type fuzzResponder struct {
	l                  *link
	arena              []byte
	writable, readOnly *mr.Region
	recv               *mr.Region
	rStart             int
	snapshot           []byte
}

const fuzzGuard = 64

func newFuzzResponder(t testing.TB) *fuzzResponder {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.psnB = 0
	o.psnA = 0
	f := &fuzzResponder{l: newLink(t, o)}
	h := f.l.b
	// arena: guard | writable 1024 | guard | read-only 1024 | guard | recv 1024 | guard
	f.arena = make([]byte, 4*fuzzGuard+3*1024)
	for i := range f.arena {
		f.arena[i] = byte(0xA5 ^ i)
	}
	var err error
	off := fuzzGuard
	f.writable, err = h.mem.Register(h.pd, f.arena[off:off+1024], mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic, mr.Invalidatable())
	must(t, err)
	off += 1024 + fuzzGuard
	f.rStart = off
	f.readOnly, err = h.mem.Register(h.pd, f.arena[off:off+1024], mr.RemoteRead)
	must(t, err)
	off += 1024 + fuzzGuard
	f.recv, err = h.mem.Register(h.pd, f.arena[off:off+1024], mr.LocalWrite)
	must(t, err)
	for i := 0; i < 8; i++ {
		must(t, h.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: sge(f.recv, i*128, 128)}))
	}
	f.snapshot = bytes.Clone(f.arena)
	return f
}

// patch makes random inputs reach valid memory: an rkey below 4 names one of the regions, and a VA
// below 64 KiB is an offset into it.
func (f *fuzzResponder) patch(p wire.Packet) {
	regions := []*mr.Region{f.writable, f.readOnly, f.recv, f.writable}
	fix := func(key wire.RKey, va uint64) (wire.RKey, uint64) {
		if key < 4 {
			r := regions[key]
			key = r.RKey()
			if va < 1<<16 {
				va += r.IOVA()
			}
		}
		return key, va
	}
	if r := p.RETH(); r != nil {
		k, va := fix(r.RKey(), r.VA())
		r.Encode(&wire.RETHFields{VA: va, RKey: k, DMALen: r.DMALen()})
	}
	if a := p.AtomicETH(); a != nil {
		k, va := fix(a.RKey(), a.VA())
		a.Encode(&wire.AtomicETHFields{VA: va, RKey: k, SwapAdd: a.SwapAdd(), Compare: a.Compare()})
	}
	if i := p.IETH(); i != nil && i.RKey() < 4 {
		i.SetRKey(regions[i.RKey()].RKey())
	}
}

// check asserts nothing outside the writable region and the receive buffer changed.
func (f *fuzzResponder) check(t *testing.T) {
	wEnd := fuzzGuard + 1024
	recvStart := f.rStart + 1024 + fuzzGuard
	for i := range f.arena {
		inWritable := i >= fuzzGuard && i < wEnd
		inRecv := i >= recvStart && i < recvStart+1024
		if !inWritable && !inRecv && f.arena[i] != f.snapshot[i] {
			t.Fatalf("byte %d outside the writable regions changed", i)
		}
	}
}

// FuzzResponder feeds arbitrary packets, one after another, to an RC responder with registered
// memory: it never panics, never writes outside what a valid request could write, and keeps its
// response queue bounded.
func FuzzResponder(f *testing.F) {
	seed := func(fields ...wire.Fields) []byte {
		var out []byte
		for _, fl := range fields {
			fl.BTH.PKey = wire.DefaultPKey
			fl.BTH.DestQP = 0x22
			var payload []byte
			if fl.BTH.Opcode.Info().Payload {
				payload = bytes.Repeat([]byte{0x5A}, int(fl.RETH.DMALen%200))
			}
			b, _ := wire.Append(nil, &fl, payload)
			out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
			out = append(out, b...)
		}
		return out
	}
	bth := func(op wire.Opcode, psn wire.PSN) wire.BTHFields {
		return wire.BTHFields{Opcode: op, PSN: psn, AckReq: true}
	}
	f.Add(seed(wire.Fields{BTH: bth(wire.RCWriteOnly, 0), RETH: wire.RETHFields{VA: 100, RKey: 0, DMALen: 64}}))
	f.Add(seed(wire.Fields{BTH: bth(wire.RCWriteOnly, 0), RETH: wire.RETHFields{VA: 100, RKey: 1, DMALen: 64}}))
	f.Add(seed(wire.Fields{BTH: bth(wire.RCSendOnly, 0), RETH: wire.RETHFields{DMALen: 100}},
		wire.Fields{BTH: bth(wire.RCReadRequest, 1), RETH: wire.RETHFields{VA: 0, RKey: 1, DMALen: 600}},
		wire.Fields{BTH: bth(wire.RCReadRequest, 1), RETH: wire.RETHFields{VA: 256, RKey: 1, DMALen: 344}}))
	f.Add(seed(wire.Fields{BTH: bth(wire.RCFetchAdd, 0), AtomicETH: wire.AtomicETHFields{VA: 8, RKey: 0, SwapAdd: 5}},
		wire.Fields{BTH: bth(wire.RCCompareSwap, 1), AtomicETH: wire.AtomicETHFields{VA: 16, RKey: 3, SwapAdd: 5}},
		wire.Fields{BTH: bth(wire.RCFetchAdd, 0), AtomicETH: wire.AtomicETHFields{VA: 8, RKey: 0, SwapAdd: 5}}))
	f.Add(seed(wire.Fields{BTH: bth(wire.RCWriteFirst, 0), RETH: wire.RETHFields{VA: 0, RKey: 0, DMALen: 600}},
		wire.Fields{BTH: bth(wire.RCWriteMiddle, 1)}, wire.Fields{BTH: bth(wire.RCWriteLast, 2)}))
	f.Add(seed(wire.Fields{BTH: bth(wire.RCSendOnlyInvalidate, 0), IETH: 0},
		wire.Fields{BTH: bth(wire.RCWriteOnly, 1), RETH: wire.RETHFields{VA: 0, RKey: 0, DMALen: 8}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		fr := newFuzzResponder(t)
		q := fr.l.b.qp
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			pkt := bytes.Clone(in[:n])
			in = in[n:]
			p, err := wire.Parse(pkt)
			if err != nil {
				continue
			}
			fr.patch(p)
			q.HandlePacket(fr.l.now, p, nil)
			if q.rsp.jobs.n > len(q.rsp.jobs.slots) {
				t.Fatal("response queue overran its ring")
			}
			for i := 0; i < 64; i++ {
				out, _, ok := q.AppendPacket(fr.l.now, nil)
				if !ok {
					break
				}
				if _, err := wire.Parse(out); err != nil {
					t.Fatalf("responder built an invalid packet: %v", err)
				}
			}
			fr.check(t)
		}
	})
}

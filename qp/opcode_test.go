package qp

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func expectCompletions(t *testing.T, cq *CQ, want ...Completion) {
	t.Helper()
	got := poll(cq)
	if len(got) != len(want) {
		t.Fatalf("completions %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("completion %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// CONFORMANCE R1, A1: a SEND of 3000 bytes at MTU 1024 is FIRST, MIDDLE, LAST with AckReq on the last,
// answered by one ACK.
func TestSendMultiPacket(t *testing.T) {
	l := newLink(t, defaultOpts())
	src := l.a.reg(t, 3000, mr.LocalWrite)
	fill(src.Bytes(), 1)
	dst := l.b.reg(t, 4096, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 7, SGL: sge(dst, 0, 4096)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 3000)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_FIRST psn=256 +1024",
		"-> SEND_MIDDLE psn=257 +1024",
		"-> SEND_LAST psn=258 A +952",
		"<- ACKNOWLEDGE psn=258 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 3000})
	expectCompletions(t, l.b.rcq, Completion{WRID: 7, Opcode: CompRecv, QPN: 0x22, ByteLen: 3000})
	if !bytes.Equal(dst.Bytes()[:3000], src.Bytes()) {
		t.Fatal("data differs")
	}
}

// Every opcode end to end, at every MTU, with data checked on both sides; and again with packets
// built by AppendPacketRefs, whose payloads of RefMin bytes or more leave as pieces of the regions:
// the same packets on the wire.
func TestEveryOpcodeEveryMTU(t *testing.T) {
	ladders := map[string]string{}
	for _, byRef := range []bool{false, true} {
		testEveryOpcode(t, byRef, ladders)
	}
}

func testEveryOpcode(t *testing.T, byRef bool, ladders map[string]string) {
	for _, mtu := range []wire.MTU{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU2048, wire.MTU4096} {
		for _, size := range []int{0, 1, mtu.Bytes() - 1, mtu.Bytes(), mtu.Bytes() + 1, 3*mtu.Bytes() + 5} {
			o := defaultOpts()
			o.mtu = mtu
			o.byRef = byRef
			l := newLink(t, o)
			a, b := l.a, l.b
			src := a.reg(t, 13000, mr.LocalWrite)
			fill(src.Bytes(), byte(size))
			local := a.reg(t, 30000, mr.LocalWrite)
			remote := b.reg(t, 50000, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic)
			fill(remote.Bytes()[26000:40000], 99)
			recv := b.reg(t, 40000, mr.LocalWrite)
			for i := 0; i < 3; i++ {
				must(t, b.qp.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: sge(recv, i*13000, 13000)}))
			}
			now := l.now
			wrs := []SendWR{
				{ID: 1, Opcode: WRSend, SGL: sge(src, 0, size)},
				{ID: 2, Opcode: WRSendImm, Imm: 0xABCD, SGL: sge(src, 0, size)},
				{ID: 3, Opcode: WRWrite, SGL: sge(src, 0, size), RemoteAddr: remote.IOVA(), RKey: remote.RKey()},
				{ID: 4, Opcode: WRWriteImm, Imm: 5, SGL: sge(src, 0, size), RemoteAddr: remote.IOVA() + 13000, RKey: remote.RKey()},
				{ID: 5, Opcode: WRRead, SGL: sge(local, 0, size), RemoteAddr: remote.IOVA() + 26000, RKey: remote.RKey()},
				{ID: 6, Opcode: WRFetchAdd, SGL: sge(local, 20000, 8), RemoteAddr: remote.IOVA() + 40000, RKey: remote.RKey(), CompareAdd: 3},
				{ID: 7, Opcode: WRCompareSwap, SGL: sge(local, 20008, 8), RemoteAddr: remote.IOVA() + 40000, RKey: remote.RKey(), CompareAdd: 3, Swap: 77},
			}
			for i := range wrs {
				wrs[i].Flags = Signaled
				must(t, a.qp.PostSend(now, &wrs[i]))
			}
			l.run(time.Second)
			name := mtu.String() + "/" + itoa(size)
			got := poll(a.scq)
			if len(got) != len(wrs) {
				t.Fatalf("%s: %d send completions: %+v\n%s", name, len(got), got, l.ladderString())
			}
			for i, wc := range got {
				if wc.Status != StatusSuccess || wc.WRID != wrs[i].ID {
					t.Fatalf("%s: completion %d: %+v\n%s", name, i, wc, l.ladderString())
				}
			}
			rc := poll(b.rcq)
			if len(rc) != 3 || rc[0].ByteLen != uint32(size) || rc[1].Imm != 0xABCD || rc[1].Flags != WithImm ||
				rc[2].Opcode != CompRecvRDMAWithImm || rc[2].ByteLen != uint32(size) || rc[2].Imm != 5 {
				t.Fatalf("%s: receive completions %+v", name, rc)
			}
			want := src.Bytes()[:size]
			for i, got := range [][]byte{recv.Bytes()[:size], recv.Bytes()[13000 : 13000+size], remote.Bytes()[:size],
				remote.Bytes()[13000 : 13000+size], local.Bytes()[:size]} {
				w := want
				if i == 4 {
					w = remote.Bytes()[26000 : 26000+size]
				}
				if !bytes.Equal(got, w) {
					t.Fatalf("%s: data %d differs", name, i)
				}
			}
			if v := binary.NativeEndian.Uint64(remote.Bytes()[40000:]); v != 77 {
				t.Fatalf("%s: atomic target %d, want 3 then swapped to 77", name, v)
			}
			if v := binary.NativeEndian.Uint64(local.Bytes()[20000:]); v != 0 {
				t.Fatalf("%s: fetch-add original %d", name, v)
			}
			if v := binary.NativeEndian.Uint64(local.Bytes()[20008:]); v != 3 {
				t.Fatalf("%s: compare-swap original %d", name, v)
			}
			if !byRef {
				ladders[name] = l.ladderString()
				continue
			}
			if l.ladderString() != ladders[name] {
				t.Fatalf("%s: by reference:\n%s\nby copy:\n%s", name, l.ladderString(), ladders[name])
			}
			// SEND, SEND with immediate, two WRITEs and the READ's responses: five packets or more
			// carry a payload of RefMin bytes or more whenever one packet's share of size is that big.
			if full := min(size, mtu.Bytes()); (full >= RefMin) != (l.refPackets >= 5) {
				t.Fatalf("%s: %d packets with payload pieces", name, l.refPackets)
			}
		}
	}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

package datapath

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// The per-packet work of the datapath, one piece at a time: placing packets in GSO runs, sealing and
// verifying ICRCs, building a stream's packets (pump) and handling a received one. The benchmarks
// report per-packet CPU and allocations (which must stay 0); the whole-device figures are in the root
// package's benchmarks and `goroce perf loopback`.

var (
	srcAP = netip.MustParseAddrPort("10.0.0.1:49200")
	dstAP = netip.MustParseAddrPort("10.0.0.2:4791")
)

// TestPlace walks the rules that cut a stream of packets into GSO runs: equal sizes join, one shorter
// packet ends a run, a longer one, another destination or TOS, GSO off, or a full run starts a new one.
func TestPlace(t *testing.T) {
	other := netip.MustParseAddrPort("10.0.0.3:4791")
	type pkt struct {
		n   int
		dst netip.AddrPort
		tos uint8
		gso bool
	}
	p := func(n int) pkt { return pkt{n: n, dst: dstAP, gso: true} }
	for _, tc := range []struct {
		name    string
		maxSegs int
		pkts    []pkt
		runs    [][]int // each message's segment sizes
		ids     []uint16
	}{
		{"64 KiB WRITE", 64, append([]pkt{p(4128)}, repeat(p(4112), 15)...),
			[][]int{{4128, 4112}, repeat(4112, 14)}, []uint16{0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}},
		{"short last ends a run", 64, []pkt{p(1000), p(1000), p(500), p(1000)},
			[][]int{{1000, 1000, 500}, {1000}}, []uint16{0, 1, 2, 0}},
		{"longer starts a run", 64, []pkt{p(100), p(200)}, [][]int{{100}, {200}}, []uint16{0, 0}},
		{"destination", 64, []pkt{p(100), {n: 100, dst: other, gso: true}}, [][]int{{100}, {100}}, []uint16{0, 0}},
		{"TOS", 64, []pkt{p(100), {n: 100, dst: dstAP, tos: 2, gso: true}}, [][]int{{100}, {100}}, []uint16{0, 0}},
		{"GSO not allowed", 64, []pkt{{n: 100, dst: dstAP}, {n: 100, dst: dstAP}}, [][]int{{100}, {100}}, []uint16{0, 0}},
		{"no GSO on the socket", 0, []pkt{p(100), p(100)}, [][]int{{100}, {100}}, []uint16{0, 0}},
		{"segment limit", 3, repeat(p(100), 4), [][]int{{100, 100, 100}, {100}}, []uint16{0, 1, 2, 0}},
		{"64 KiB limit", 64, repeat(p(4112), 17), [][]int{repeat(4112, 15), {4112, 4112}}, append(seq(15), 0, 1)},
	} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gather=%v", tc.name, gather), func(t *testing.T) {
				tb := getTxBatch()
				defer putTxBatch(tb)
				var ids []uint16
				for i, pk := range tc.pkts {
					start := len(tb.arena)
					tb.arena = append(tb.arena, make([]byte, pk.n)...)
					tb.arena[start] = byte(i) // so that a segment shows where it came from
					ids = append(ids, tb.place(tb.arena[start:], pk.n, pk.dst, pk.tos, tc.maxSegs, pk.gso, gather))
					if gather {
						tb.addArena(start, len(tb.arena))
						tb.msgs[len(tb.msgs)-1].Pieces = tb.pieces[tb.first:]
					}
				}
				var runs [][]int
				i := 0
				for _, m := range tb.msgs {
					if gather {
						if len(m.Pieces) != 1 {
							t.Errorf("a message of contiguous packets in %d pieces", len(m.Pieces))
						}
						m.Buf, m.Pieces = m.Flatten(nil), nil
					}
					m.N = len(m.Buf)
					var sizes []int
					m.Segments(func(s []byte) {
						if s[0] != byte(i) {
							t.Errorf("segment %d holds packet %d", i, s[0])
						}
						i++
						sizes = append(sizes, len(s))
					})
					runs = append(runs, sizes)
				}
				if !equalRuns(runs, tc.runs) || !equalIDs(ids, tc.ids) {
					t.Errorf("runs %v ids %v, want %v %v", runs, ids, tc.runs, tc.ids)
				}
				tb.reset()
			})
		}
	}
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func seq(n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(i)
	}
	return out
}

func equalRuns(a, b [][]int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

func equalIDs(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// writeMiddle returns a sealed RC WRITE_MIDDLE packet with a 4096-byte payload, as segment id of a run.
func writeMiddle(id uint16) []byte {
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCWriteMiddle, PKey: wire.DefaultPKey, DestQP: 0x1234, PSN: 7}}
	pkt, err := wire.Append(nil, &f, make([]byte, 4096))
	if err != nil {
		panic(err)
	}
	seal(pkt, srcAP, dstAP, id)
	return pkt
}

// verifyCase is a verify call of TestSealVerify and TestICRCSeeds: its mode and guess, and whether
// the packet must verify.
type verifyCase struct {
	mode  ICRCMode
	guess uint16
	want  bool
}

// TestSealVerify: a packet sealed for identification i verifies with the guess i (the fast path a
// GRO run from a goroce sender takes), with a wrong guess through the identification's recovery,
// and not at all in strict mode unless the guess is right; a flipped payload bit never verifies.
func TestSealVerify(t *testing.T) {
	var v verifier
	v.rec.RequireDF = true
	pkt := writeMiddle(5)
	p, err := wire.Parse(pkt)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []verifyCase{
		{ICRCRecoverID, 5, true}, {ICRCRecoverID, 0, true}, {ICRCStrict, 0, false}, {ICRCOff, 0, true},
	} {
		id, got := v.verify(tc.mode, srcAP, dstAP, p, tc.guess)
		if got != tc.want {
			t.Errorf("mode %d guess %d: %v, want %v", tc.mode, tc.guess, got, tc.want)
		}
		if got && tc.mode == ICRCRecoverID && id != 5 {
			t.Errorf("mode %d guess %d: identification %d, want the sealed 5", tc.mode, tc.guess, id)
		}
	}
	pkt[100] ^= 1
	if _, ok := v.verify(ICRCRecoverID, srcAP, dstAP, p, 5); ok {
		t.Error("a corrupted payload verified")
	}
}

// TestICRCSeeds seals small packets (an ACK, a 16-byte SEND, the largest seeded packet and a larger
// one) through a port's seeds twice over, with two identifications, and verifies them through a verifier's, over IPv4 and
// IPv6: the ICRC must be seal's every time; the seeds of small IPv4 packets must be remembered, and
// the others' not; and verify must behave as it does without seeds (TestSealVerify), from a
// remembered seed too: over IPv4 a wrong guess recovers the identification, or fails in strict mode
// (which also fails a packet sealed with a non-zero identification); a damaged packet always fails.
func TestICRCSeeds(t *testing.T) {
	// Rounds 2 and 3 find the seeds rounds 0 and 1 left.
	v6src, v6dst := netip.MustParseAddrPort("[fd00::1]:49152"), netip.MustParseAddrPort("[fd00::2]:4791")
	for _, ap := range [][2]netip.AddrPort{{srcAP, dstAP}, {v6src, v6dst}} {
		src, dst := ap[0], ap[1]
		var seeds icrcSeeds
		var v verifier
		v.rec.RequireDF = true
		// An ACK, SENDs of 16, 48 and 52 bytes: 20, 32, 64 and 68 bytes with BTH and ICRC.
		for _, size := range []int{-1, 16, seededMax - 16, seededMax - 12} {
			for round, id := range []uint16{3, 4, 3, 4} { // the same headers but for the identification
				f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: 0x1234, PSN: 7}}
				payload := make([]byte, max(size, 0))
				for i := range payload {
					payload[i] = byte(i*7 + size)
				}
				if size < 0 {
					f.BTH.Opcode, f.AETH = wire.RCAcknowledge, wire.AETHFields{MSN: 9}
				}
				pkt, err := wire.Append(nil, &f, payload)
				if err != nil {
					t.Fatal(err)
				}
				n := len(pkt)
				want := append([]byte(nil), pkt...)
				seal(want, src, dst, id)
				seeds.seal(pkt, src, dst, id)
				if !bytes.Equal(pkt, want) {
					t.Fatalf("%v, %d bytes, round %d: sealed through seeds % x, want % x", src, n, round, pkt[n-4:], want[n-4:])
				}
				remembered := slices.Contains(seeds.keys[:], seedKey{src: src, dst: dst, n: uint16(n), id: id})
				if wantKept := src.Addr().Is4() && n <= seededMax; remembered != wantKept {
					t.Fatalf("%v, %d bytes: seed remembered %v, want %v", src, n, remembered, wantKept)
				}
				p, err := wire.Parse(pkt)
				if err != nil {
					t.Fatal(err)
				}
				for _, tc := range []verifyCase{
					{ICRCRecoverID, id, true}, {ICRCRecoverID, 0, true}, {ICRCStrict, id, false}, {ICRCStrict, 0, false},
				} {
					if !src.Addr().Is4() {
						tc.want = true // IPv6 has no identification
					}
					got, ok := v.verify(tc.mode, src, dst, p, tc.guess)
					if ok != tc.want || ok && src.Addr().Is4() && got != id {
						t.Errorf("%v, %d bytes, round %d, mode %d, guess %d: identification %d, %v; want %v", src, n, round, tc.mode, tc.guess, got, ok, tc.want)
					}
				}
				pkt[n-5] ^= 1
				if _, ok := v.verify(ICRCRecoverID, src, dst, p, id); ok {
					t.Errorf("%v, %d bytes, round %d: a damaged packet verified", src, n, round)
				}
			}
		}
	}
}

func BenchmarkSeal4K(b *testing.B) {
	pkt := writeMiddle(0)
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		seal(pkt, srcAP, dstAP, uint16(i))
	}
}

func BenchmarkVerify4K(b *testing.B) {
	for _, bc := range []struct {
		name  string
		guess uint16
	}{{"guessed", 3}, {"recovered", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			var v verifier
			v.rec.RequireDF = true
			p, _ := wire.Parse(writeMiddle(3))
			b.SetBytes(int64(p.Len()))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := v.verify(ICRCRecoverID, srcAP, dstAP, p, bc.guess); !ok {
					b.Fatal("does not verify")
				}
			}
		})
	}
}

// streamQP returns a datapath on an in-memory network, with received ICRCs checked as mode says (the
// check has a benchmark of its own), one RC QP in RTS toward a peer QP 0x1234 that does not exist,
// both starting at PSN 0, and an MR of size bytes that the QP may read from and the peer write to.
// The QP has no ACK timer (Timeout 0): benchmarks drive it with a clock that stands still, against
// which a timer would come due in real time and retransmit behind their back.
func streamQP(tb testing.TB, size int, mode ICRCMode, opts ...func(*Config)) (*Datapath, *QP, *mr.Region) {
	tb.Helper()
	cfg := Config{Network: conn.NewMemNetwork(), Addr: srcAP, Shards: 1, ICRC: mode}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := Open(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	mem := mr.NewTable()
	pd := mem.AllocPD()
	r, err := mem.Alloc(pd, size, mr.LocalWrite|mr.RemoteWrite)
	if err != nil {
		tb.Fatal(err)
	}
	cq := d.NewCQ(1 << 16)
	q, err := d.NewQP(QPConfig{Engine: qp.Config{Type: qp.RC, PD: pd, Memory: mem, MaxSendWR: 1024, MaxRecvWR: 16,
		MaxSendSGE: 1, MaxRecvSGE: 1}, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		tb.Fatal(err)
	}
	err = q.Connect(&qp.ConnectParams{AccessFlags: mr.RemoteWrite, PathMTU: wire.MTU4096, DestQPN: 0x1234,
		Timeout: 0, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, RdAtomic: 16,
		AV: qp.AddressHandle{DGID: netip.MustParseAddr("::ffff:10.0.0.2").As16(), HopLimit: 64}}, netip.AddrPortFrom(dstAP.Addr(), 0))
	if err != nil {
		tb.Fatal(err)
	}
	// Connect readied the QP with its shard, whose driver pumps it at its next step: let that step
	// pass, or it could pump the QP concurrently with a test that drives it by hand.
	s := d.shards[0]
	for deadline := time.Now().Add(10 * time.Second); s.nready.Load() != 0 || s.inStep.Load(); {
		if time.Now().After(deadline) {
			tb.Fatal("the shard's driver never took up the new QP")
		}
		runtime.Gosched()
	}
	return d, q, r
}

// countTracer counts the packets it is shown, by direction, and keeps nothing.
type countTracer struct{ sent, received int }

func (c *countTracer) TracePacket(r *TraceRecord) {
	if r.Sent {
		c.sent++
	} else {
		c.received++
	}
}

// TestTracingAllocs checks that a Tracer costs the datapath no allocation: the records it is handed
// are reused, as its contract (must not keep the record) allows. Both directions: a requester's
// packets pumped, a responder's received.
func TestTracingAllocs(t *testing.T) {
	ct := &countTracer{}
	d, q, r := streamQP(t, 4096, ICRCOff, func(c *Config) { c.Tracer = ct })
	s := d.shards[0]
	now := time.Now()
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCWriteOnly, PKey: wire.DefaultPKey, DestQP: q.qpn},
		RETH: wire.RETHFields{VA: r.IOVA(), RKey: r.RKey(), DMALen: 4096}}
	pkt, _ := wire.Append(nil, &f, make([]byte, 4096))
	var psn wire.PSN
	if n := testing.AllocsPerRun(200, func() {
		wire.BTH(pkt).SetPSN(psn)
		psn = psn.Add(1)
		s.receivePacket(pkt, dstAP, srcAP.Addr(), 0, 0, now)
		clear(s.rx.touched)
		s.rx.touched = s.rx.touched[:0]
	}); n != 0 {
		t.Errorf("receiving with a tracer: %v allocations a packet, want 0", n)
	}
	if ct.received == 0 {
		t.Fatal("the tracer saw no received packet")
	}
	// The requester's side: rounds of 16 one-packet WRITEs (a batch's worth, so that nothing is
	// flushed into the in-memory network, which copies), posted before the count starts, then
	// pumped with the count running. Eight rounds stay within the 128 PSNs a requester sends unacked.
	wr := qp.SendWR{Opcode: qp.WRWrite, SGL: []mr.SGE{{Addr: r.IOVA(), Length: 4096, LKey: r.LKey()}}, RemoteAddr: 0x1000, RKey: 1}
	tb := getTxBatch()
	defer putTxBatch(tb)
	p := q.port
	var mallocs, sent uint64
	for range 8 {
		q.mu.Lock()
		for range 16 {
			if err := q.eng.PostSend(now, &wr); err != nil {
				t.Fatal(err)
			}
		}
		q.mu.Unlock()
		before := ct.sent
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		p.mu.Lock()
		p.pump(q, tb, now)
		tb.reset()
		p.mu.Unlock()
		runtime.ReadMemStats(&m1)
		mallocs += m1.Mallocs - m0.Mallocs
		sent += uint64(ct.sent - before)
	}
	if sent != 8*16 {
		t.Fatalf("the tracer saw %d packets sent, want %d", sent, 8*16)
	}
	if mallocs != 0 {
		t.Errorf("sending with a tracer: %d allocations for %d packets, want 0", mallocs, sent)
	}
}

// BenchmarkPumpWrite measures a requester's side of a 64 KiB WRITE at MTU 4096: building its 16
// packets into a batch (segmentation, gather from the region, GSO placement, sealing), and taking in
// the ACK that acknowledges them. Nothing is sent: the figure is the CPU around the system call.
func BenchmarkPumpWrite(b *testing.B) {
	const size = 64 << 10
	_, q, r := streamQP(b, size, ICRCOff)
	wr := qp.SendWR{Opcode: qp.WRWrite, SGL: []mr.SGE{{Addr: r.IOVA(), Length: size, LKey: r.LKey()}}, RemoteAddr: 0x1000, RKey: 1}
	ack := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCAcknowledge, PKey: wire.DefaultPKey, DestQP: q.qpn},
		AETH: wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid)}}
	ackBuf := make([]byte, 0, 64)
	tb := getTxBatch()
	now := time.Now()
	b.SetBytes(size)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		q.mu.Lock()
		err := q.eng.PostSend(now, &wr)
		q.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
		// The shard's driver may have pumped the request first, when a deadline filed before came
		// due: this loop does not own the QP as a program's sends would. Then its packets went out,
		// and the ACK below still acknowledges them.
		q.port.mu.Lock()
		q.port.pump(q, tb, now)
		tb.reset() // not sent: the packets' cost is the building
		q.port.mu.Unlock()
		ack.BTH.PSN = wire.PSN(16*i + 15)
		ack.AETH.MSN = wire.MSN(i + 1)
		pkt, _ := wire.Append(ackBuf[:0], &ack, nil)
		p, err := wire.Parse(pkt)
		if err != nil {
			b.Fatal(err)
		}
		q.mu.Lock()
		q.eng.HandlePacket(now, p, nil)
		q.mu.Unlock()
	}
	if c := q.Counters(); c.CompleterRetryErr != 0 {
		b.Fatalf("the requester retried: %+v", c)
	}
}

// BenchmarkReceiveWrite measures a responder's side of one received 4 KiB WRITE packet: parse,
// demultiplexing, the peer check, the responder's checks and the copy into the region; the ICRC check,
// benchmarked above, is off here. Each packet carries the next PSN, as a stream's do.
func BenchmarkReceiveWrite(b *testing.B) {
	d, q, r := streamQP(b, 4096, ICRCOff)
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCWriteOnly, PKey: wire.DefaultPKey, DestQP: q.qpn},
		RETH: wire.RETHFields{VA: r.IOVA(), RKey: r.RKey(), DMALen: 4096}}
	pkt, _ := wire.Append(nil, &f, make([]byte, 4096))
	s := d.shards[0]
	now := time.Now()
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		wire.BTH(pkt).SetPSN(wire.PSN(i).Add(0))
		s.receivePacket(pkt, dstAP, srcAP.Addr(), 0, 0, now)
		clear(s.rx.touched)
		s.rx.touched = s.rx.touched[:0]
	}
	if c := q.Counters(); c.OutOfSeqRequest != 0 || c.DuplicateRequest != 0 || c.RcvdPkts == 0 {
		b.Fatalf("the responder did not take the stream in order: %+v", c)
	}
}

// BenchmarkReceiveGRORun measures a responder's side of a 64 KiB WRITE at MTU 4096 arriving as one
// GRO run in the shard's own receive buffer, as a stream's data does: per segment the parse, the ICRC
// check, the responder and the copy into the region (page-aligned), and the ACK built and sent at the
// end. Filling the buffer, a stand-in for the kernel's copy, is not timed.
func BenchmarkReceiveGRORun(b *testing.B) {
	const size = 64 << 10
	d, q, r := streamQP(b, size, ICRCRecoverID)
	s := d.shards[0]
	if len(s.rx.msgs) == 0 || cap(s.rx.bufs[0]) < (size/4096-1)*(4096+wire.BTHLen+wire.ICRCLen) {
		b.Skip("no GRO-sized receive buffer")
	}
	local := netip.AddrPortFrom(srcAP.Addr(), d.local.Port())
	build := func(psn wire.PSN) []byte {
		var run []byte
		for k := range size / 4096 {
			op := wire.RCWriteMiddle
			f := wire.Fields{BTH: wire.BTHFields{PKey: wire.DefaultPKey, DestQP: q.qpn, PSN: psn.Add(uint32(k))}}
			switch k {
			case 0:
				op = wire.RCWriteFirst
				f.RETH = wire.RETHFields{VA: r.IOVA(), RKey: r.RKey(), DMALen: size}
			case size/4096 - 1:
				op, f.BTH.AckReq = wire.RCWriteLast, true
			}
			f.BTH.Opcode = op
			start := len(run)
			run, _ = wire.Append(run, &f, make([]byte, 4096))
			seal(run[start:], dstAP, local, uint16(max(k-1, 0))) // the run's segment k-1
		}
		return run
	}
	// The first packet is 16 bytes longer (RETH): a GRO run's segments are all SegSize but the
	// last, so the run starts at the second packet, as goroce sends it (WRITE_FIRST on its own).
	b.SetBytes(size - 4096)
	b.ReportAllocs()
	var psn wire.PSN
	for b.Loop() {
		b.StopTimer()
		first := build(psn)
		psn = psn.Add(size / 4096)
		firstLen := 4096 + wire.BTHLen + wire.RETHLen + wire.ICRCLen
		m := &s.rx.msgs[0]
		m.N = copy(m.Buf[:cap(m.Buf)], first[:firstLen])
		m.Addr, m.Local = dstAP, srcAP.Addr()
		s.receive(1, time.Now())
		m = &s.rx.msgs[0]
		m.N = copy(m.Buf[:cap(m.Buf)], first[firstLen:])
		m.Addr, m.Local, m.SegSize = dstAP, srcAP.Addr(), 4096+wire.BTHLen+wire.ICRCLen
		b.StartTimer()
		s.receive(1, time.Now())
	}
	if c := q.Counters(); c.OutOfSeqRequest != 0 || c.DuplicateRequest != 0 || c.RcvdPkts == 0 {
		b.Fatalf("the responder did not take the stream in order: %+v", c)
	}
	if st := d.Stats(); st.DropICRC != 0 {
		b.Fatalf("%d packets failed the ICRC", st.DropICRC)
	}
}

// optsNetwork records the Options each socket is opened with.
type optsNetwork struct {
	conn.Network
	listen, shards []conn.Options
}

func (n *optsNetwork) Listen(addr netip.AddrPort, opts conn.Options) (conn.Conn, error) {
	n.listen = append(n.listen, opts)
	return n.Network.Listen(addr, opts)
}

func (n *optsNetwork) ListenShards(addr netip.AddrPort, k int, opts conn.Options) ([]conn.Conn, error) {
	n.shards = append(n.shards, opts)
	return n.Network.ListenShards(addr, k, opts)
}

// TestSendSocketsSendOnly: the sockets a QP sends from are opened send-only, out of the netpoller
// (conn.Options.SendOnly), and the receive sockets are not.
func TestSendSocketsSendOnly(t *testing.T) {
	n := &optsNetwork{Network: conn.NewMemNetwork()}
	d, err := Open(Config{Network: n, Addr: srcAP, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mem := mr.NewTable()
	cq := d.NewCQ(16)
	if _, err := d.NewQP(QPConfig{Engine: qp.Config{Type: qp.RC, PD: mem.AllocPD(), Memory: mem, MaxSendWR: 4, MaxRecvWR: 4,
		MaxSendSGE: 1, MaxRecvSGE: 1}, SendCQ: cq, RecvCQ: cq}); err != nil {
		t.Fatal(err)
	}
	if len(n.shards) == 0 || len(n.listen) == 0 {
		t.Fatalf("%d receive and %d send sockets opened, want some of each", len(n.shards), len(n.listen))
	}
	for _, o := range n.shards {
		if o.SendOnly {
			t.Errorf("a receive socket was opened send-only: %+v", o)
		}
	}
	for _, o := range n.listen {
		if !o.SendOnly {
			t.Errorf("a send socket was opened with the netpoller: %+v", o)
		}
	}
}

package goroce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/internal/datapath"
	"github.com/goroce/goroce/internal/testaddr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// testPair is two devices and a connected RC queue pair on each.
type testPair struct {
	a, b     *Device
	pda, pdb *PD
	cqa, cqb *CQ
	qa, qb   *QP
}

// newDevices opens two devices, over the in-memory network if mem is set, else over UDP loopback.
func newDevices(t testing.TB, mem *conn.MemNetwork, wrap func(conn.Conn) conn.Conn) (*Device, *Device) {
	t.Helper()
	var cfg Config
	if mem != nil {
		cfg.Network = rawNetwork{mem}
	}
	if wrap != nil {
		base := conn.UDP
		if mem != nil {
			base = mem
		}
		cfg.Network = rawNetwork{conn.WrapNetwork(base, wrap)}
	}
	return openDevices(t, cfg)
}

// openDevices opens two devices with cfg, each on an address of its own (testaddr.Pair), closed when
// the test ends.
func openDevices(t testing.TB, cfg Config) (*Device, *Device) {
	t.Helper()
	a, b := testaddr.Pair()
	open := func(addr netip.Addr) *Device {
		cfg.Addr = addr
		d, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	return open(a), open(b)
}

func newPair(t testing.TB, mem *conn.MemNetwork, typ QPType, opts ConnectOptions) *testPair {
	t.Helper()
	p := &testPair{}
	p.a, p.b = newDevices(t, mem, nil)
	p.connect(t, typ, opts)
	return p
}

// newPairConfig is newPair over the host's sockets, each device opened with cfg (openDevices).
func newPairConfig(t testing.TB, cfg Config, typ QPType, opts ConnectOptions) *testPair {
	t.Helper()
	p := &testPair{}
	p.a, p.b = openDevices(t, cfg)
	p.connect(t, typ, opts)
	return p
}

func (p *testPair) connect(t testing.TB, typ QPType, opts ConnectOptions) {
	t.Helper()
	var err error
	p.pda, _ = p.a.AllocPD()
	p.pdb, _ = p.b.AllocPD()
	p.cqa, _ = p.a.CreateCQ(1024)
	p.cqb, _ = p.b.CreateCQ(1024)
	p.qa, err = p.pda.CreateQP(QPInit{Type: typ, SendCQ: p.cqa, RecvCQ: p.cqa, MaxSendWR: 512, MaxRecvWR: 512})
	must(t, err)
	p.qb, err = p.pdb.CreateQP(QPInit{Type: typ, SendCQ: p.cqb, RecvCQ: p.cqb, MaxSendWR: 512, MaxRecvWR: 512})
	must(t, err)
	must(t, p.qa.Connect(p.qb.Endpoint(), withDefaults(opts)))
	must(t, p.qb.Connect(p.qa.Endpoint(), withDefaults(opts)))
}

// withDefaults is the tests' shorthand: o with its zero fields but MTU taken from
// DefaultConnectOptions.
func withDefaults(o ConnectOptions) *ConnectOptions {
	d := DefaultConnectOptions()
	if o.Access == 0 {
		o.Access = d.Access
	}
	if o.Timeout == 0 {
		o.Timeout = d.Timeout
	}
	if o.RetryCnt == 0 {
		o.RetryCnt = d.RetryCnt
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = d.RNRRetry
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = d.MinRNRTimer
	}
	if o.RdAtomic == 0 {
		o.RdAtomic = d.RdAtomic
	}
	return &o
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wait collects n completions from cq, failing the test after a generous deadline.
func wait(t testing.TB, cq *CQ, n int) []Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []Completion
	buf := make([]Completion, 64)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf)
		if err != nil {
			t.Fatalf("waiting for %d completions, have %d: %+v: %v", n, len(out), out, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// observe orders the test after everything q's engine has done so far: the engine runs under q's lock,
// so taking it makes memory the engine wrote visible to the test (and to the race detector, which
// cannot see that an ACK coming back through a socket implies the write before it).
func observe(q *QP) { q.Counters() }

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// exerciseEveryOpcode runs every opcode once over p and checks the data on both sides.
func exerciseEveryOpcode(t *testing.T, p *testPair, size int) {
	t.Helper()
	src, err := p.pda.RegMR(make([]byte, size), LocalWrite)
	must(t, err)
	fill(src.Bytes(), uint64(size))
	local, err := p.pda.RegMR(make([]byte, size+16), LocalWrite)
	must(t, err)
	at := (3*size + 7) &^ 7 // the atomic target, 8-byte aligned
	remote, err := p.pdb.AllocMR(at+8, LocalWrite|RemoteWrite|RemoteRead|RemoteAtomic)
	must(t, err)
	fill(remote.Bytes()[2*size:3*size], 99)
	binary.NativeEndian.PutUint64(remote.Bytes()[at:], 40)
	recv, err := p.pdb.RegMR(make([]byte, 2*size), LocalWrite)
	must(t, err)
	must(t, p.qb.PostRecv(&RecvWR{WRID: 1, SGL: []SGE{recv.SGE(0, size)}}))
	must(t, p.qb.PostRecv(&RecvWR{WRID: 2, SGL: []SGE{recv.SGE(size, size)}}))
	wrs := []SendWR{
		{WRID: 1, Opcode: WRSend, SGL: []SGE{src.SGE(0, size)}},
		{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: remote.Addr(), RKey: remote.RKey()},
		{WRID: 3, Opcode: WRRDMAWriteImm, Imm: 0x1234, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: remote.Addr() + uint64(size), RKey: remote.RKey()},
		{WRID: 4, Opcode: WRRDMARead, SGL: []SGE{local.SGE(0, size)}, RemoteAddr: remote.Addr() + uint64(2*size), RKey: remote.RKey()},
		{WRID: 5, Opcode: WRFetchAdd, SGL: []SGE{local.SGE(size, 8)}, RemoteAddr: remote.Addr() + uint64(at), RKey: remote.RKey(), CompareAdd: 2},
		{WRID: 6, Opcode: WRCompareSwap, SGL: []SGE{local.SGE(size+8, 8)}, RemoteAddr: remote.Addr() + uint64(at), RKey: remote.RKey(), CompareAdd: 42, Swap: 7},
	}
	for i := range wrs {
		wrs[i].Flags = Signaled
		must(t, p.qa.PostSend(&wrs[i]))
	}
	got := wait(t, p.cqa, len(wrs))
	for i, wc := range got {
		if wc.Status != StatusSuccess || wc.WRID != wrs[i].WRID {
			t.Fatalf("send completion %d: %+v", i, wc)
		}
	}
	rc := wait(t, p.cqb, 2)
	observe(p.qb)
	if rc[0].ByteLen != uint32(size) || rc[1].Opcode != CompRecvRDMAWithImm || rc[1].Imm != 0x1234 {
		t.Fatalf("receive completions %+v", rc)
	}
	want := src.Bytes()
	for i, b := range [][]byte{recv.Bytes()[:size], remote.Bytes()[:size], remote.Bytes()[size : 2*size]} {
		if !bytes.Equal(b, want) {
			t.Fatalf("data %d differs", i)
		}
	}
	if !bytes.Equal(local.Bytes()[:size], remote.Bytes()[2*size:3*size]) {
		t.Fatal("READ data differs")
	}
	if binary.NativeEndian.Uint64(local.Bytes()[size:]) != 40 || binary.NativeEndian.Uint64(local.Bytes()[size+8:]) != 42 ||
		binary.NativeEndian.Uint64(remote.Bytes()[at:]) != 7 {
		t.Fatal("atomics wrong")
	}
}

func TestEveryOpcodeMemNetwork(t *testing.T) {
	p := newPair(t, conn.NewMemNetwork(), RC, ConnectOptions{})
	exerciseEveryOpcode(t, p, 5000)
}

func TestEveryOpcodeLoopback(t *testing.T) {
	p := newPair(t, nil, RC, ConnectOptions{MTU: MTU4096})
	exerciseEveryOpcode(t, p, 10000)
}

// Messages from 1 byte to 16 MiB over real sockets, data verified.
func TestMessageSizesLoopback(t *testing.T) {
	p := newPair(t, nil, RC, ConnectOptions{MTU: MTU4096})
	const max = 16 << 20
	src, err := p.pda.AllocMR(max, LocalWrite)
	must(t, err)
	fill(src.Bytes(), 3)
	dst, err := p.pdb.AllocMR(max, LocalWrite|RemoteWrite)
	must(t, err)
	for _, n := range []int{1, 3, 4095, 4096, 4097, 65536, 1 << 20, max} {
		clear(dst.Bytes()[:n])
		// The peer's engine writes the region next: the race detector must see it follow this
		// goroutine's accesses, and it cannot see the order a socket gives (see observe).
		observe(p.qb)
		must(t, p.qa.PostSend(&SendWR{WRID: uint64(n), Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, n)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
		wc := wait(t, p.cqa, 1)[0]
		observe(p.qb)
		if wc.Status != StatusSuccess || !bytes.Equal(src.Bytes()[:n], dst.Bytes()[:n]) {
			t.Fatalf("%d bytes: %+v", n, wc)
		}
	}
}

// 64 QPs at once between two devices, each moving its own data.
func TestManyQPsLoopback(t *testing.T) {
	a, b := newDevices(t, nil, nil)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	cqa, _ := a.CreateCQ(4096)
	cqb, _ := b.CreateCQ(4096)
	const nqp, size = 64, 20000
	src, err := pda.AllocMR(nqp*size, LocalWrite)
	must(t, err)
	fill(src.Bytes(), 5)
	dst, err := pdb.AllocMR(nqp*size, LocalWrite)
	must(t, err)
	for i := 0; i < nqp; i++ {
		qa, err := pda.CreateQP(QPInit{Type: RC, SendCQ: cqa, RecvCQ: cqa})
		must(t, err)
		qb, err := pdb.CreateQP(QPInit{Type: RC, SendCQ: cqb, RecvCQ: cqb})
		must(t, err)
		must(t, qa.Connect(qb.Endpoint(), nil))
		must(t, qb.Connect(qa.Endpoint(), nil))
		must(t, qb.PostRecv(&RecvWR{WRID: uint64(i), SGL: []SGE{dst.SGE(i*size, size)}}))
		must(t, qa.PostSend(&SendWR{WRID: uint64(i), Opcode: WRSend, Flags: Signaled, SGL: []SGE{src.SGE(i*size, size)}}))
	}
	for _, wc := range wait(t, cqa, nqp) {
		if wc.Status != StatusSuccess {
			t.Fatalf("%+v", wc)
		}
	}
	for _, wc := range wait(t, cqb, nqp) {
		if wc.Status != StatusSuccess || wc.ByteLen != size {
			t.Fatalf("%+v", wc)
		}
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("data differs")
	}
}

// A responder without a registration, or without the right access, gives the requester the status a
// libibverbs user expects.
func TestRemoteErrorsLoopback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		access Access
		rkey   func(*MR) wire.RKey
		want   Status
	}{
		{"no registration", 0, func(*MR) wire.RKey { return 0x12345678 }, StatusRemAccessErr},
		{"read-only region", RemoteRead, func(m *MR) wire.RKey { return m.RKey() }, StatusRemAccessErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, nil, RC, ConnectOptions{})
			src, _ := p.pda.RegMR(make([]byte, 64), LocalWrite)
			access := tc.access
			if access == 0 {
				access = RemoteRead
			}
			remote, _ := p.pdb.RegMR(make([]byte, 64), access)
			must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRRDMAWrite, SGL: []SGE{src.SGE(0, 64)}, RemoteAddr: remote.Addr(), RKey: tc.rkey(remote)}))
			if wc := wait(t, p.cqa, 1)[0]; wc.Status != tc.want {
				t.Fatalf("status %v, want %v", wc.Status, tc.want)
			}
		})
	}
}

// Loss induced on both sides is recovered by retransmission, data intact.
func TestLossRecoveredLoopback(t *testing.T) {
	p := &testPair{}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	p.a, p.b = newDevices(t, nil, func(c conn.Conn) conn.Conn { seed++; return conn.Lossy(c, 5, seed) })
	p.connect(t, RC, ConnectOptions{Timeout: 12, RetryCnt: 7}) // 16 ms: a loaded CI machine must not time out spuriously
	const size = 1 << 20
	src, _ := p.pda.AllocMR(size, LocalWrite)
	fill(src.Bytes(), 8)
	dst, _ := p.pdb.AllocMR(size, LocalWrite|RemoteWrite|RemoteRead)
	back, _ := p.pda.AllocMR(size, LocalWrite)
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	must(t, p.qa.PostSend(&SendWR{WRID: 2, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{back.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	for _, wc := range wait(t, p.cqa, 2) {
		if wc.Status != StatusSuccess {
			t.Fatalf("%+v\nrequester %+v\nresponder %+v\ndevice A %+v\ndevice B %+v", wc, p.qa.Counters(), p.qb.Counters(), p.a.Stats(), p.b.Stats())
		}
	}
	observe(p.qb)
	if !bytes.Equal(src.Bytes(), dst.Bytes()) || !bytes.Equal(src.Bytes(), back.Bytes()) {
		t.Fatal("data differs")
	}
	if c := p.qa.Counters(); c.CompleterRetryErr == 0 {
		t.Fatalf("no retransmission under 5%% loss: %+v", c)
	}
}

// API misuse gets an immediate, matchable error.
func TestAPIMisuse(t *testing.T) {
	p := newPair(t, conn.NewMemNetwork(), RC, ConnectOptions{})
	cq, _ := p.a.CreateCQ(8)
	q, err := p.pda.CreateQP(QPInit{Type: RC, SendCQ: cq, RecvCQ: cq})
	must(t, err)
	if err := q.PostSend(&SendWR{Opcode: WRSend}); !errors.Is(err, ErrBadState) {
		t.Errorf("post send in RESET: %v", err)
	}
	other, _ := p.a.AllocPD()
	foreign, _ := other.RegMR(make([]byte, 64), LocalWrite)
	if err := p.qa.PostSend(&SendWR{WRID: 9, Opcode: WRSend, SGL: []SGE{foreign.SGE(0, 64)}}); !errors.Is(err, ErrBadSGE) {
		t.Errorf("lkey of another PD: %v", err)
	}
	ud, _ := p.pda.CreateQP(QPInit{Type: UD, SendCQ: cq, RecvCQ: cq})
	must(t, ud.Connect(Endpoint{}, withDefaults(ConnectOptions{QKey: 1})))
	if err := ud.PostSend(&SendWR{Opcode: WRSend}); !errors.Is(err, ErrBadWR) {
		t.Errorf("UD send without an AH: %v", err)
	}
	if err := cq.Close(); !errors.Is(err, ErrBusy) {
		t.Errorf("closing a CQ in use: %v", err)
	}
	if _, err := p.pda.CreateQP(QPInit{Type: RC, SendCQ: p.cqb, RecvCQ: p.cqb}); !errors.Is(err, ErrForeign) {
		t.Errorf("CQ of another device: %v", err)
	}
	p.a.Close()
	if err := p.qa.PostSend(&SendWR{Opcode: WRSend}); !errors.Is(err, ErrClosed) {
		t.Errorf("post on a closed device: %v", err)
	}
	if _, err := p.a.AllocPD(); !errors.Is(err, ErrClosed) {
		t.Errorf("alloc on a closed device: %v", err)
	}
}

// Garbage sent to the device's port is dropped and counted; nothing else happens.
func TestGarbageDropped(t *testing.T) {
	mem := conn.NewMemNetwork()
	p := newPair(t, mem, RC, ConnectOptions{})
	evil, err := mem.Listen(netip.MustParseAddrPort("127.9.9.9:4791"), conn.Options{})
	must(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	var msgs []conn.Message
	for i := 0; i < 2000; i++ {
		b := make([]byte, rng.IntN(200))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		msgs = append(msgs, conn.Message{Buf: b, Addr: p.b.LocalAddr()})
	}
	// Valid packets for a QPN that does not exist, and for the real QP from the wrong address.
	for _, qpn := range []wire.QPN{0x777, p.qb.QPN()} { // unknown QPN; the QP, from a stranger
		f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: qpn}}
		pkt, _ := wire.Append(nil, &f, []byte("hi"))
		ip, udp := headers(evil.LocalAddr(), p.b.LocalAddr(), len(pkt))
		must(t, wire.SetICRC(ip, udp, pkt))
		msgs = append(msgs, conn.Message{Buf: pkt, Addr: p.b.LocalAddr()})
	}
	for len(msgs) > 0 {
		n, err := evil.WriteBatch(msgs[:min(len(msgs), evil.BatchSize())])
		must(t, err)
		msgs = msgs[n:]
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := p.b.Stats()
		dropped := s.DropMalformed + s.DropICRC + s.DropUnknownQPN + s.DropWrongPeer
		if s.DropUnknownQPN == 1 && s.DropWrongPeer == 1 && dropped == s.RxPackets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	// The connection still works.
	exerciseEveryOpcode(t, p, 100)
}

// Close flushes outstanding work with flush errors and leaves no goroutine behind.
func TestCloseLeaksNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		a, b := newDevices(t, nil, nil)
		pd, _ := a.AllocPD()
		cq, _ := a.CreateCQ(64)
		q, _ := pd.CreateQP(QPInit{Type: RC, SendCQ: cq, RecvCQ: cq})
		must(t, q.Connect(Endpoint{QPN: 0x999, GID: b.GID()}, nil))
		must(t, q.PostRecv(&RecvWR{WRID: 1}))
		must(t, q.PostSend(&SendWR{WRID: 2, Opcode: WRSend})) // to a QPN b does not have: never acknowledged
		must(t, a.Close())
		must(t, b.Close())
		wcs := make([]Completion, 8)
		n := cq.Poll(wcs)
		if n != 2 || wcs[0].Status != StatusWRFlushErr || wcs[1].Status != StatusWRFlushErr {
			t.Fatalf("completions after close: %+v", wcs[:n])
		}
	}
	for i := 0; ; i++ {
		if runtime.NumGoroutine() <= before {
			break
		}
		if i > 1000 {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

// Concurrent posters on many goroutines against one QP.
func TestConcurrentPosting(t *testing.T) {
	p := newPair(t, conn.NewMemNetwork(), RC, ConnectOptions{})
	src, _ := p.pda.RegMR(make([]byte, 4096), LocalWrite)
	dst, _ := p.pdb.RegMR(make([]byte, 4096), LocalWrite|RemoteWrite)
	var wg sync.WaitGroup
	const per = 50
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				for {
					err := p.qa.PostSend(&SendWR{WRID: uint64(g*per + i), Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(g*1024, 1024)}, RemoteAddr: dst.Addr() + uint64(g*1024), RKey: dst.RKey()})
					if err == nil {
						break
					}
					if !errors.Is(err, qp.ErrQueueFull) {
						panic(fmt.Sprint(err))
					}
					time.Sleep(time.Microsecond)
				}
			}
		}(g)
	}
	wg.Wait()
	for _, wc := range wait(t, p.cqa, 4*per) {
		if wc.Status != StatusSuccess {
			t.Fatalf("%+v", wc)
		}
	}
	// The in-memory network neither loses nor reorders: packets that arrive out of sequence were sent
	// out of sequence by goroutines racing to send one QP's packets.
	if a, b := p.qa.Counters(), p.qb.Counters(); b.OutOfSeqRequest != 0 || a.CompleterRetryErr != 0 {
		t.Fatalf("packets left out of order: responder out_of_seq_request %d, requester retries %d", b.OutOfSeqRequest, a.CompleterRetryErr)
	}
}

// IPv6: GIDs are the addresses themselves and the ICRC covers the IPv6 header.
func TestIPv6MemNetwork(t *testing.T) {
	mem := conn.NewMemNetwork()
	open := func(s string) *Device {
		addr := netip.MustParseAddr(s)
		d, err := Open(Config{Addr: addr, Network: rawNetwork{mem}})
		must(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	p := &testPair{a: open("fd00::1"), b: open("fd00::2")}
	if p.a.GID().String() != "fd00::1" {
		t.Fatalf("GID %v", p.a.GID())
	}
	p.connect(t, RC, ConnectOptions{})
	exerciseEveryOpcode(t, p, 3000)
	if s := p.b.Stats(); s.DropICRC != 0 || s.RxPackets == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// UD between two devices: the receive buffer starts with the 40-byte GRH holding the sender's IPv4
// header.
func TestUDMemNetwork(t *testing.T) {
	p := newPair(t, conn.NewMemNetwork(), UD, ConnectOptions{QKey: 0x1234})
	src, _ := p.pda.RegMR([]byte("datagram!"), LocalWrite)
	dst, _ := p.pdb.RegMR(make([]byte, 100), LocalWrite)
	must(t, p.qb.PostRecv(&RecvWR{WRID: 1, SGL: []SGE{dst.SGE(0, 100)}}))
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{src.SGE(0, 9)},
		AH: p.qb.Endpoint().AH(), RemoteQPN: p.qb.QPN(), RemoteQKey: 0x1234}))
	wc := wait(t, p.cqb, 1)[0]
	if wc.Status != StatusSuccess || wc.ByteLen != 49 || wc.SrcQP != p.qa.QPN() || wc.Flags&WithGRH == 0 {
		t.Fatalf("%+v", wc)
	}
	grh := dst.Bytes()[:40]
	src4 := p.a.LocalAddr().Addr().As4()
	if grh[20] != 0x45 || !bytes.Equal(grh[32:36], src4[:]) || string(dst.Bytes()[40:49]) != "datagram!" {
		t.Fatalf("receive buffer %x", dst.Bytes()[:49])
	}
}

// DCQCN on real loopback sockets: the sender's packets are marked CE on the way (a wrapper that
// marks), the receiver answers with CNPs, and the sender's rate comes down; the data still arrives.
func TestDCQCNLoopback(t *testing.T) {
	a, b := testaddr.Pair()
	params := congestion.DefaultParams(10e9)
	open := func(addr netip.Addr, mark bool) *Device {
		cfg := Config{Addr: addr, DCQCN: &params}
		if mark {
			cfg.Network = rawNetwork{conn.WrapNetwork(conn.UDP, func(c conn.Conn) conn.Conn { return conn.MarkCE(c, 20, 1) })}
		}
		d, err := Open(cfg)
		must(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	p := &testPair{a: open(a, true), b: open(b, false)}
	p.connect(t, RC, ConnectOptions{MTU: MTU4096})
	if r, ok := p.qa.CongestionRate(); !ok || r != 10e9 {
		t.Fatalf("initial rate %v %v, want line rate", r, ok)
	}
	const size = 8 << 20
	src, _ := p.pda.AllocMR(size, LocalWrite)
	fill(src.Bytes(), 11)
	dst, _ := p.pdb.AllocMR(size, LocalWrite|RemoteWrite)
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	if wc := wait(t, p.cqa, 1)[0]; wc.Status != StatusSuccess {
		t.Fatalf("%+v", wc)
	}
	observe(p.qb)
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("data differs")
	}
	sb, ca := p.b.Stats(), p.qa.Counters()
	rate, _ := p.qa.CongestionRate()
	t.Logf("CE received by B %d, CNPs sent by B %d, CNPs received by A %d, A's rate now %.2f Gb/s", sb.CERcvd, sb.CNPSent, ca.RcvdCNP, rate/1e9)
	if sb.CERcvd == 0 || sb.CNPSent == 0 || ca.RcvdCNP == 0 {
		t.Fatal("no CNP round trip")
	}
	if sb.CNPSent > sb.CERcvd {
		t.Fatal("more CNPs than marked packets")
	}
	if rate >= 10e9 {
		t.Fatalf("rate %v did not come down", rate)
	}
}

// Closing a QP right after its last receive still acknowledges the message: the ACK waiting for
// company under AckDelay leaves before the QP goes, so the peer completes without a retransmission.
func TestCloseSendsPendingAck(t *testing.T) {
	p := newPair(t, conn.NewMemNetwork(), RC, ConnectOptions{})
	must(t, p.qb.PostRecv(&RecvWR{WRID: 1}))
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRSend, Flags: Signaled}))
	wait(t, p.cqb, 1)
	must(t, p.qb.Close())
	if wc := wait(t, p.cqa, 1)[0]; wc.Status != StatusSuccess {
		t.Fatalf("%+v", wc)
	}
	if c := p.qa.Counters(); c.CompleterRetryErr != 0 {
		t.Fatalf("the requester retransmitted: %+v", c)
	}
}

// A QP's traffic class goes into the TOS byte of every packet it sends, as grh.traffic_class does.
func TestTrafficClass(t *testing.T) {
	mem := conn.NewMemNetwork()
	var mu sync.Mutex
	seen := map[uint8]int{}
	mem.SetFilter(func(m *conn.Message, from netip.AddrPort) conn.Verdict {
		mu.Lock()
		seen[m.TOS]++
		mu.Unlock()
		return conn.Verdict{}
	})
	a, b := newDevices(t, mem, nil)
	p := &testPair{a: a, b: b}
	p.pda, _ = a.AllocPD()
	p.pdb, _ = b.AllocPD()
	p.cqa, _ = a.CreateCQ(16)
	p.cqb, _ = b.CreateCQ(16)
	var err error
	p.qa, err = p.pda.CreateQP(QPInit{Type: RC, SendCQ: p.cqa, RecvCQ: p.cqa, TrafficClass: 0xb8}) // DSCP 46 (EF)
	must(t, err)
	p.qb, err = p.pdb.CreateQP(QPInit{Type: RC, SendCQ: p.cqb, RecvCQ: p.cqb})
	must(t, err)
	must(t, p.qa.Connect(p.qb.Endpoint(), nil))
	must(t, p.qb.Connect(p.qa.Endpoint(), nil))
	must(t, p.qb.PostRecv(&RecvWR{WRID: 1}))
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRSend, Flags: Signaled}))
	wait(t, p.cqa, 1)
	mu.Lock()
	defer mu.Unlock()
	if seen[0xb8] != 1 || seen[0] != 1 || len(seen) != 2 {
		t.Fatalf("TOS bytes seen: %v; want one 0xb8 (A's SEND) and one 0 (B's ACK)", seen)
	}
}

// headers returns the IPv4 and UDP headers a datagram of n bytes from src to dst travels in, as the
// kernel writes them from an IP_PMTUDISC_DO socket: identification 0, DF.
func headers(src, dst netip.AddrPort, n int) (ip, udp []byte) {
	ip = make([]byte, 20)
	ip[0], ip[6], ip[8], ip[9] = 0x45, 0x40, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+n))
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	udp = make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+n))
	return ip, udp
}

// An RC request with a reserved opcode at the expected PSN is NAKed invalid request on the wire, and
// the responder's QP enters ERR (CONFORMANCE L5; rxe drops it silently).
func TestReservedOpcodeNAKed(t *testing.T) {
	mem := conn.NewMemNetwork()
	p := newPair(t, mem, RC, ConnectOptions{})
	// The stranger speaks from the peer's address: RC QPs check the address, not the source port.
	evil, err := mem.Listen(netip.AddrPortFrom(p.a.LocalAddr().Addr(), 0), conn.Options{})
	must(t, err)
	defer evil.Close()
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: p.qb.QPN(),
		PSN: p.qa.Endpoint().PSN}}
	pkt, _ := wire.Append(nil, &f, []byte("resv"))
	pkt[0] = 0x1F
	ip, udp := headers(evil.LocalAddr(), p.b.LocalAddr(), len(pkt))
	must(t, wire.SetICRC(ip, udp, pkt))
	_, err = evil.WriteBatch([]conn.Message{{Buf: pkt, Addr: p.b.LocalAddr()}})
	must(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for p.qb.State() != StateErr || p.qb.Counters().NAKsSent[wire.NAKInvalidRequest] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("state %v, counters %+v, device %+v", p.qb.State(), p.qb.Counters(), p.b.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if s := p.b.Stats(); s.DropMalformed != 0 {
		t.Fatalf("the reserved opcode was dropped as malformed: %+v", s)
	}
}

// eventTracer records what the last Packet call saw, and keeps nothing.
type eventTracer struct {
	dir    Direction
	resent string
	n      int
}

func (t *eventTracer) Packet(e *TraceEvent) {
	t.dir, t.resent = e.Dir, e.Resent
	t.n++
}

func (t *eventTracer) Completion(time.Time, Completion) {}

// TestTracerAdapterAllocs: handing the program's Tracer a packet costs no allocation, and each
// event says what its record did.
func TestTracerAdapterAllocs(t *testing.T) {
	et := &eventTracer{}
	a := tracerAdapter{t: et}
	pkt, err := wire.Append(nil, &wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey}}, []byte("hi"))
	must(t, err)
	p, err := wire.Parse(pkt)
	must(t, err)
	recs := []datapath.TraceRecord{
		{Sent: true, Bytes: pkt, Packet: p, Resend: qp.ResendTimeout},
		{Bytes: pkt, Packet: p},
		{Bytes: pkt, Drop: datapath.DropICRC},
	}
	want := []struct {
		dir    Direction
		resent string
	}{{Sent, "timeout"}, {Received, ""}, {Dropped, ""}}
	for i := range recs {
		a.TracePacket(&recs[i])
		if et.dir != want[i].dir || et.resent != want[i].resent || et.n != i+1 {
			t.Errorf("record %d: event %v resent %q (%d events), want %v %q", i, et.dir, et.resent, et.n, want[i].dir, want[i].resent)
		}
	}
	if n := testing.AllocsPerRun(200, func() { a.TracePacket(&recs[0]) }); n != 0 {
		t.Errorf("%v allocations a traced packet, want 0", n)
	}
}

// TestClosedQPDropsAfterTraffic sends a SEND to a QP, so that its shard remembers it (lookup's
// last QP), then closes the QP and sends another: the second must be dropped as addressed to a QPN
// nobody has, not handed to the closed QP.
func TestClosedQPDropsAfterTraffic(t *testing.T) {
	p := newPair(t, nil, RC, ConnectOptions{})
	mb, err := p.pdb.AllocMR(16, LocalWrite)
	must(t, err)
	must(t, p.qb.PostRecv(&RecvWR{SGL: []SGE{mb.SGE(0, 16)}}))
	send := &SendWR{Opcode: WRSend, Flags: Signaled | Inline, InlineData: []byte("first")}
	must(t, p.qa.PostSend(send))
	if wc := wait(t, p.cqb, 1)[0]; wc.Err() != nil || wc.Opcode != CompRecv {
		t.Fatalf("the first SEND completed at its receiver as %+v", wc)
	}
	must(t, p.qb.Close())
	before := p.b.Stats().DropUnknownQPN
	send.InlineData = []byte("second")
	must(t, p.qa.PostSend(send))
	for deadline := time.Now().Add(10 * time.Second); p.b.Stats().DropUnknownQPN == before; {
		if time.Now().After(deadline) {
			t.Fatalf("the SEND to the closed QP was not dropped as for an unknown QPN: stats %+v", p.b.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStatsCountWhatThePeerSent moves 64 KiB RDMA WRITEs (GSO runs of 4 KiB packets, read back whole
// with GRO on loopback) and SEND ping-pongs between two devices, and checks that once the traffic
// has settled each device counts in exactly the datagrams, bytes and GRO runs the other counted out.
func TestStatsCountWhatThePeerSent(t *testing.T) {
	p := newPair(t, nil, RC, ConnectOptions{MTU: MTU4096})
	src, err := p.pda.AllocMR(64<<10, LocalWrite)
	must(t, err)
	dst, err := p.pdb.AllocMR(64<<10, LocalWrite|RemoteWrite)
	must(t, err)
	for range 8 {
		must(t, p.qa.PostSend(&SendWR{Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, 64<<10)},
			RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	}
	wait(t, p.cqa, 8)
	mb, err := p.pdb.AllocMR(16, LocalWrite)
	must(t, err)
	for range 4 {
		must(t, p.qb.PostRecv(&RecvWR{SGL: []SGE{mb.SGE(0, 16)}}))
		must(t, p.qa.PostSend(&SendWR{Opcode: WRSend, Flags: Signaled | Inline, InlineData: []byte("ping")}))
		wait(t, p.cqb, 1)
		wait(t, p.cqa, 1)
	}
	settled := func() (bool, string) {
		a, b := p.a.Stats(), p.b.Stats()
		got := fmt.Sprintf("a sent %d datagrams, %d bytes, %d GSO runs; b received %d, %d, %d runs; "+
			"b sent %d, %d, %d runs; a received %d, %d, %d runs",
			a.TxPackets, a.TxBytes, a.TxGSO, b.RxPackets, b.RxBytes, b.RxGRO,
			b.TxPackets, b.TxBytes, b.TxGSO, a.RxPackets, a.RxBytes, a.RxGRO)
		return a.TxPackets == b.RxPackets && a.TxBytes == b.RxBytes && a.TxGSO == b.RxGRO &&
			b.TxPackets == a.RxPackets && b.TxBytes == a.RxBytes && b.TxGSO == a.RxGRO && a.TxGSO > 0, got
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		ok, got := settled()
		if ok {
			t.Log(got)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counts never matched: %s", got)
		}
		time.Sleep(time.Millisecond)
	}
}

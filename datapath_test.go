package goroce

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/internal/testaddr"
	"github.com/goroce/goroce/wire"
)

// The datapath seen from outside the device: what goes on the wire (GSO runs and the identification
// each packet's ICRC is sealed with, source ports), the fallback when the kernel refuses GSO, and the
// goroutine that handles a CQ's packets.

// wiretap records the datagrams a device writes, as they leave: a conn.Conn wrapper for WrapNetwork.
type wiretap struct {
	conn.Conn
	mu   *sync.Mutex
	msgs *[]conn.Message
}

func (w wiretap) WriteBatch(msgs []conn.Message) (int, error) {
	n, err := w.Conn.WriteBatch(msgs)
	w.mu.Lock()
	for _, m := range msgs[:n] {
		c := m
		c.Buf, c.Pieces = m.Flatten(nil), nil
		c.N = len(c.Buf)
		*w.msgs = append(*w.msgs, c)
	}
	w.mu.Unlock()
	return n, err
}

// TestGSORunsOnTheWire: a 64 KiB WRITE at MTU 4096 leaves as GSO runs of equal-sized packets (one
// shorter packet may end a run), and segment i of a run carries an ICRC sealed for IPv4
// identification i: what Linux gives it when it segments the run (conn.Listen), and what a receiver
// that checks the whole ICRC, such as rxe, verifies.
func TestGSORunsOnTheWire(t *testing.T) {
	mem := conn.NewMemNetwork()
	var mu sync.Mutex
	var sent []conn.Message
	tapped := conn.WrapNetwork(mem, func(c conn.Conn) conn.Conn { return wiretap{c, &mu, &sent} })
	a, b := testaddr.Pair()
	da, err := Open(Config{Addr: a, Network: rawNetwork{tapped}})
	must(t, err)
	defer da.Close()
	db, err := Open(Config{Addr: b, Network: rawNetwork{mem}})
	must(t, err)
	defer db.Close()
	p := &testPair{a: da, b: db}
	p.connect(t, RC, ConnectOptions{MTU: MTU4096})
	const size = 64 << 10
	src, _ := p.pda.AllocMR(size, LocalWrite)
	fill(src.Bytes(), 5)
	dst, _ := p.pdb.AllocMR(size, LocalWrite|RemoteWrite)
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	if wc := wait(t, p.cqa, 1)[0]; wc.Status != StatusSuccess {
		t.Fatal(wc)
	}
	observe(p.qb)
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("data differs")
	}
	mu.Lock()
	defer mu.Unlock()
	packets, runs := 0, 0
	for _, m := range sent {
		if m.SegSize == 0 || m.SegSize >= len(m.Buf) {
			packets++
			checkSeal(t, m.Buf, da, m.Addr, 0)
			continue
		}
		runs++
		var i uint16
		m.Segments(func(seg []byte) {
			if len(seg) != m.SegSize && len(seg) != len(m.Buf)-int(i)*m.SegSize {
				t.Errorf("run segment %d: %d bytes in a run of %d", i, len(seg), m.SegSize)
			}
			checkSeal(t, seg, da, m.Addr, i)
			i++
			packets++
		})
	}
	if packets != size/4096 || runs == 0 {
		t.Fatalf("%d packets in %d GSO runs, want %d packets and at least one run", packets, runs, size/4096)
	}
	if s := da.Stats(); s.TxGSO != uint64(runs) || s.TxPackets != uint64(packets) {
		t.Errorf("stats: TxGSO %d TxPackets %d, want %d and %d", s.TxGSO, s.TxPackets, runs, packets)
	}
}

// checkSeal verifies the full ICRC of pkt, sent by d's QP port to dst, for IPv4 identification id:
// the check rxe makes.
func checkSeal(t *testing.T, pkt []byte, d *Device, dst netip.AddrPort, id uint16) {
	t.Helper()
	if _, err := wire.Parse(pkt); err != nil {
		t.Fatalf("packet does not parse: %v", err)
	}
	var srcPort uint16
	for _, q := range d.sourcePorts() {
		srcPort = q // one QP, one port
	}
	ip, udp := headers(netip.AddrPortFrom(d.LocalAddr().Addr(), srcPort), dst, len(pkt))
	binary.BigEndian.PutUint16(ip[4:], id)
	if err := wire.VerifyICRC(ip, udp, pkt); err != nil {
		t.Errorf("ICRC of a packet sealed for identification %d: %v", id, err)
	}
}

// sourcePorts returns the UDP ports the device's QPs send from, by QPN.
func (d *Device) sourcePorts() map[wire.QPN]uint16 { return d.dp.SourcePorts() }

// gsoRefuser is a Conn whose GSO writes the kernel refuses, as Linux does with EIO where the route's
// device cannot checksum (net/ipv4/udp.c): it offers GSO, then refuses it once and turns it off.
type gsoRefuser struct {
	conn.Conn
	off atomic.Bool
}

func (g *gsoRefuser) Offload() conn.Offload {
	if g.off.Load() {
		return conn.Offload{GRO: g.Conn.Offload().GRO}
	}
	return g.Conn.Offload()
}

func (g *gsoRefuser) WriteBatch(msgs []conn.Message) (int, error) {
	for i, m := range msgs {
		if m.SegSize > 0 && m.SegSize < m.Len() {
			n, err := g.Conn.WriteBatch(msgs[:i])
			if err != nil {
				return n, err
			}
			g.off.Store(true)
			return i, fmt.Errorf("%w: input/output error (test)", conn.ErrGSO)
		}
	}
	return g.Conn.WriteBatch(msgs)
}

// TestGSOFallbackLosesNothing: when the kernel refuses a GSO write, the run goes out packet by packet,
// each packet sealed again for identification 0, later packets are built without GSO, and every
// byte arrives without a retransmission.
func TestGSOFallbackLosesNothing(t *testing.T) {
	mem := conn.NewMemNetwork()
	a, b := testaddr.Pair()
	da, err := Open(Config{Addr: a, Network: rawNetwork{conn.WrapNetwork(mem, func(c conn.Conn) conn.Conn { return &gsoRefuser{Conn: c} })}, ICRC: ICRCStrict})
	must(t, err)
	defer da.Close()
	db, err := Open(Config{Addr: b, Network: rawNetwork{mem}, ICRC: ICRCStrict})
	must(t, err)
	defer db.Close()
	p := &testPair{a: da, b: db}
	p.connect(t, RC, ConnectOptions{MTU: MTU4096})
	const size = 1 << 20
	src, _ := p.pda.AllocMR(size, LocalWrite)
	fill(src.Bytes(), 9)
	dst, _ := p.pdb.AllocMR(size, LocalWrite|RemoteWrite)
	must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	if wc := wait(t, p.cqa, 1)[0]; wc.Status != StatusSuccess {
		t.Fatal(wc)
	}
	observe(p.qb)
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("data differs")
	}
	// Runs built before the refusal are each resent packet by packet; the ones after are not built.
	sa, sb := da.Stats(), db.Stats()
	if sa.GSOFallback == 0 || sa.TxGSO != sa.GSOFallback || sa.QP.CompleterRetryErr != 0 || sb.DropICRC != 0 {
		t.Errorf("GSOFallback %d of TxGSO %d (want all, at least 1), retransmissions %d, ICRC drops at the receiver %d (want 0)",
			sa.GSOFallback, sa.TxGSO, sa.QP.CompleterRetryErr, sb.DropICRC)
	}
}

// TestSourcePortPerQP: QPs send from source ports chosen by QPN from a bounded pool, so that one
// QP's packets are one UDP flow and QPs spread over flows; a receiver takes packets from any port.
func TestSourcePortPerQP(t *testing.T) {
	mem := conn.NewMemNetwork()
	a, b := testaddr.Pair()
	da, err := Open(Config{Addr: a, Network: rawNetwork{mem}, SourcePorts: 4})
	must(t, err)
	defer da.Close()
	db, err := Open(Config{Addr: b, Network: rawNetwork{mem}})
	must(t, err)
	defer db.Close()
	pda, _ := da.AllocPD()
	pdb, _ := db.AllocPD()
	cqa, _ := da.CreateCQ(256)
	cqb, _ := db.CreateCQ(256)
	var qas []*QP
	for range 16 {
		qa, err := pda.CreateQP(QPInit{Type: RC, SendCQ: cqa, RecvCQ: cqa})
		must(t, err)
		qb, err := pdb.CreateQP(QPInit{Type: RC, SendCQ: cqb, RecvCQ: cqb})
		must(t, err)
		must(t, qa.Connect(qb.Endpoint(), nil))
		must(t, qb.Connect(qa.Endpoint(), nil))
		must(t, qb.PostRecv(&RecvWR{WRID: 1}))
		must(t, qa.PostSend(&SendWR{WRID: 1, Opcode: WRSend, Flags: Signaled}))
		qas = append(qas, qa)
	}
	for _, wc := range wait(t, cqa, 16) {
		if wc.Status != StatusSuccess {
			t.Fatal(wc)
		}
	}
	ports := da.sourcePorts()
	distinct := map[uint16]bool{}
	for _, q := range qas {
		port, ok := ports[q.QPN()]
		if !ok || port == 0 || port == DefaultPort {
			t.Fatalf("QP %v sends from port %d", q.QPN(), port)
		}
		distinct[port] = true
	}
	if len(distinct) < 2 || len(distinct) > 4 {
		t.Errorf("16 QPs send from %d ports, want between 2 and the pool's 4", len(distinct))
	}
}

// TestWaitersOnOneShard: goroutines waiting on CQs whose QPs share a shard all get their completions,
// whichever of them drives the shard, and a waiter that drives gets its own without a hand-off. A
// waiter must never queue behind another waiter's drive.
func TestWaitersOnOneShard(t *testing.T) {
	a, b := testaddr.Pair()
	da, err := Open(Config{Addr: a, Shards: 1})
	must(t, err)
	defer da.Close()
	db, err := Open(Config{Addr: b, Shards: 1})
	must(t, err)
	defer db.Close()
	const pairs, rounds = 4, 300
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*pairs)
	for range pairs {
		p := &testPair{a: da, b: db}
		p.connect(t, RC, ConnectOptions{})
		var posted sync.WaitGroup
		posted.Add(2)
		// b echoes, a pings; each side waits on its own CQ, all on the one shard of its device.
		echo := func(q *QP, cq *CQ, first bool) {
			defer wg.Done()
			if err := pingPong(ctx, q, cq, &SendWR{Opcode: WRSend}, &RecvWR{}, rounds, first, &posted); err != nil {
				errs <- err
			}
		}
		wg.Add(2)
		go echo(p.qa, p.cqa, true)
		go echo(p.qb, p.cqb, false)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s := da.Stats(); s.DrivenWaits == 0 || s.ParkedWaits == 0 {
		t.Errorf("driven waits %d, parked waits %d: with %d waiters on one shard, want both", s.DrivenWaits, s.ParkedWaits, pairs)
	}
}

// TestPeerVanishes: a peer that stops answering makes the requester's sends fail with the retry
// counter exceeded, after its retries and their timeouts, while the application waits on its CQ (the
// waiting goroutine drives the shard, whose timers must fire).
func TestPeerVanishes(t *testing.T) {
	for _, mode := range []string{"wait", "poll"} {
		t.Run(mode, func(t *testing.T) {
			p := newPair(t, nil, RC, ConnectOptions{Timeout: 10, RetryCnt: 2}) // 4.2 ms, 3 tries
			src, _ := p.pda.RegMR(make([]byte, 100), LocalWrite)
			dst, _ := p.pdb.RegMR(make([]byte, 100), LocalWrite)
			must(t, p.qb.PostRecv(&RecvWR{WRID: 1, SGL: []SGE{dst.SGE(0, 100)}}))
			must(t, p.qa.PostSend(&SendWR{WRID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{src.SGE(0, 100)}}))
			if wc := wait(t, p.cqa, 1)[0]; wc.Status != StatusSuccess {
				t.Fatal(wc)
			}
			p.b.Close()
			start := time.Now()
			must(t, p.qa.PostSend(&SendWR{WRID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{src.SGE(0, 100)}}))
			var wc Completion
			if mode == "wait" {
				// Three tries of 4.2 ms each: ten seconds without the completion is a hang.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				wcs := make([]Completion, 1)
				if _, err := p.cqa.Wait(ctx, wcs); err != nil {
					t.Fatalf("no completion: %v (the timers of the shard the waiter drives did not fire)", err)
				}
				wc = wcs[0]
			} else {
				wcs := make([]Completion, 1)
				for p.cqa.Poll(wcs) == 0 {
					if time.Since(start) > time.Minute {
						t.Fatal("no completion")
					}
					time.Sleep(time.Millisecond)
				}
				wc = wcs[0]
			}
			if wc.Status != StatusRetryExcErr {
				t.Fatalf("completion %+v, want retry counter exceeded", wc)
			}
			t.Logf("retry counter exceeded after %v", time.Since(start))
		})
	}
}

// TestShardsJoinOnFirstQP: a device's second receive socket joins its reuseport group, and the group
// starts steering by QPN, only when a QP is placed on the second shard; until then the first socket
// takes every datagram. Each pair of QPs must then find its packets on its own shard, whichever
// joined when.
func TestShardsJoinOnFirstQP(t *testing.T) {
	da, db := openDevices(t, Config{Shards: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(p *testPair) {
		t.Helper()
		must(t, pingPongPair(ctx, p, 0, 50))
	}
	shards := func(d *Device) uint64 { return d.dp.Stats().Shards }

	first := &testPair{a: da, b: db}
	first.connect(t, RC, ConnectOptions{})
	run(first)
	if sa, sb := shards(da), shards(db); sa != 1 || sb != 1 {
		t.Fatalf("with one QP each, %d and %d shards took datagrams, want 1", sa, sb)
	}
	second := &testPair{a: da, b: db}
	second.connect(t, RC, ConnectOptions{})
	if sa, sb := shards(da), shards(db); sa != 2 || sb != 2 {
		t.Fatalf("with two QPs each, %d and %d shards took datagrams, want 2", sa, sb)
	}
	run(first)
	run(second)
	for _, d := range []*Device{da, db} {
		if s := d.dp.Stats(); s.RxOffShard != 0 || s.SteerFailed != 0 || s.ShardJoinFailed != 0 {
			t.Errorf("%v: %d packets read off their QP's shard, steering failed %d, joins failed %d",
				d.LocalAddr(), s.RxOffShard, s.SteerFailed, s.ShardJoinFailed)
		}
	}
}

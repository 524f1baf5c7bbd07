package capture

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// counter is the Tracer after the capture's: it counts what the devices traced, independently of it.
type counter struct {
	mu      sync.Mutex
	dirs    map[goroce.Direction]int
	reasons map[string]int
	lost    int
}

func newCounter() *counter {
	return &counter{dirs: map[goroce.Direction]int{}, reasons: map[string]int{}}
}

func (c *counter) Packet(e *goroce.TraceEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirs[e.Dir]++
	if e.Dir == goroce.Dropped {
		c.reasons[e.Reason]++
	}
}

func (c *counter) Completion(time.Time, goroce.Completion) {}

// run is one captured MemNetwork run.
type run struct {
	path  string
	count *counter
	imp   goroce.ImpairStats
	recs  []Record
}

// captureMemRun runs two DCQCN devices on a MemNetwork that loses, duplicates and CE-marks packets,
// with both devices traced into one capture: SENDs, WRITEs, READs and atomics on one connection, and a
// SEND on a second QP connected to a QPN that does not exist, which the peer drops ("unknown QPN")
// until the requester gives up. It returns the capture read back.
func captureMemRun(t *testing.T, imp goroce.Impairment) *run {
	t.Helper()
	r := &run{path: filepath.Join(t.TempDir(), "mem.pcapng"), count: newCounter()}
	cw, err := Create(r.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := cw.Tracer(r.count)
	net := goroce.NewMemNetwork()
	imp.Dropped = func(b []byte, from, to netip.AddrPort) {
		tr.Lost(b, from, to)
		r.count.mu.Lock()
		r.count.lost++
		r.count.mu.Unlock()
	}
	if err := net.Impair(imp); err != nil {
		t.Fatal(err)
	}
	dcqcn := goroce.DefaultDCQCN(10e9)
	open := func(addr string) *goroce.Device {
		d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(addr), Port: goroce.DefaultPort, Network: net, Tracer: tr, DCQCN: &dcqcn})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := open("10.0.0.1"), open("10.0.0.2")
	closed := false
	defer func() {
		if !closed {
			a.Close()
			b.Close()
		}
	}()

	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	cqa, _ := a.CreateCQ(64)
	cqb, _ := b.CreateCQ(64)
	qpa, err := pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqa, RecvCQ: cqa})
	ok(t, err)
	qpb, err := pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqb, RecvCQ: cqb})
	ok(t, err)
	lost, err := pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqa, RecvCQ: cqa})
	ok(t, err)
	opts := goroce.DefaultConnectOptions()
	opts.MTU, opts.Timeout = goroce.MTU1024, 10 // 4 ms: losses recover quickly
	ok(t, qpa.Connect(qpb.Endpoint(), &opts))
	ok(t, qpb.Connect(qpa.Endpoint(), &opts))
	nowhere := qpb.Endpoint()
	nowhere.QPN = 0xABCDE
	lopts := opts
	lopts.RetryCnt = 2
	ok(t, lost.Connect(nowhere, &lopts))

	src, err := pda.AllocMR(1<<16, goroce.LocalWrite)
	ok(t, err)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i)
	}
	dst, err := pdb.AllocMR(1<<16, goroce.LocalWrite|goroce.RemoteWrite|goroce.RemoteRead|goroce.RemoteAtomic)
	ok(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wait := func(cq *goroce.CQ) goroce.Completion {
		t.Helper()
		wc := make([]goroce.Completion, 1)
		if _, err := cq.Wait(ctx, wc); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
		return wc[0]
	}
	ok(t, lost.PostSend(&goroce.SendWR{WRID: 99, Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline, InlineData: []byte("anyone there? hello?")}))
	for i := range 8 {
		ok(t, qpb.PostRecv(&goroce.RecvWR{WRID: uint64(i), SGL: []goroce.SGE{dst.SGE(0, 4096)}}))
		for _, wr := range []goroce.SendWR{
			{Opcode: goroce.WRSend, SGL: []goroce.SGE{src.SGE(0, 3000)}},
			{Opcode: goroce.WRRDMAWrite, SGL: []goroce.SGE{src.SGE(0, 16384)}, RemoteAddr: dst.Addr() + 4096, RKey: dst.RKey()},
			{Opcode: goroce.WRRDMARead, SGL: []goroce.SGE{src.SGE(32768, 5000)}, RemoteAddr: dst.Addr() + 4096, RKey: dst.RKey()},
			{Opcode: goroce.WRFetchAdd, SGL: []goroce.SGE{src.SGE(60000, 8)}, RemoteAddr: dst.Addr() + 65528, RKey: dst.RKey(), CompareAdd: 1},
		} {
			wr.Flags |= goroce.Signaled
			ok(t, qpa.PostSend(&wr))
			if wc := wait(cqa); wc.WRID == 99 {
				if wc.Status == goroce.StatusSuccess {
					t.Fatal("a SEND to a QPN that does not exist succeeded")
				}
				wc = wait(cqa) // the one posted on qpa
				if wc.Err() != nil {
					t.Fatal(wc.Err())
				}
			} else if wc.Err() != nil {
				t.Fatal(wc.Err())
			}
		}
		if wc := wait(cqb); wc.Err() != nil {
			t.Fatal(wc.Err())
		}
	}
	for lost.State() != goroce.StateErr { // the SEND to nowhere runs out of retries
		if ctx.Err() != nil {
			t.Fatal("the SEND to a QPN that does not exist never failed")
		}
		time.Sleep(time.Millisecond)
	}
	// Let the traffic settle before closing: a packet sent last (a retry to nowhere, an ACK held for
	// company, a copy the network delivers late) may still wait in a device's socket, and a closed
	// device never reads it, so the counts would miss it. Settled is every packet sent accounted for,
	// received, dropped or lost, for 50 ms on end.
	balanced := func() bool {
		st := net.Stats()
		r.count.mu.Lock()
		defer r.count.mu.Unlock()
		d := r.count.dirs
		return d[goroce.Received]+d[goroce.Dropped] == d[goroce.Sent]-int(st.Dropped)+int(st.Duplicated)
	}
	waitSteady(balanced, 50*time.Millisecond, 5*time.Second)
	closed = true
	a.Close()
	b.Close()
	if err := cw.Close(); err != nil {
		t.Fatal(err)
	}
	r.imp = net.Stats()
	data, err := os.ReadFile(r.path)
	ok(t, err)
	r.recs = readAll(t, data)
	return r
}

// waitSteady returns once cond has held for steady on end, or after limit.
func waitSteady(cond func() bool, steady, limit time.Duration) {
	var since time.Time
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if !cond() {
			since = time.Time{}
			continue
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) >= steady {
			return
		}
	}
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// countComments counts the comments in recs that start with prefix.
func countComments(recs []Record, prefix string) (n int) {
	for _, rec := range recs {
		for _, c := range rec.Comments {
			if strings.HasPrefix(c, prefix) {
				n++
			}
		}
	}
	return n
}

// Two traced devices on a lossy, duplicating, CE-marking network: the capture has every packet once
// (each duplicate once more), every ICRC verifies against the headers in the capture, and every loss,
// drop, mark and duplicate is a comment on its packet.
func TestTracerMemNetwork(t *testing.T) {
	const seed = 7
	r := captureMemRun(t, goroce.Impairment{Loss: 0.03, Duplicate: 0.02, CE: 0.05, Seed: seed})
	c, imp := r.count, r.imp
	sent, recv, drop := c.dirs[goroce.Sent], c.dirs[goroce.Received], c.dirs[goroce.Dropped]
	t.Logf("seed %d: traced %d sent, %d received, %d dropped %v; network lost %d, duplicated %d, marked %d; %d records",
		seed, sent, recv, drop, c.reasons, imp.Dropped, imp.Duplicated, imp.Marked, len(r.recs))
	if c.lost != int(imp.Dropped) || recv+drop != sent-int(imp.Dropped)+int(imp.Duplicated) {
		t.Fatalf("seed %d: the run's own counts disagree: %d lost reported of %d, %d+%d arrived of %d sent",
			seed, c.lost, imp.Dropped, recv, drop, sent)
	}
	if imp.Dropped == 0 || imp.Duplicated == 0 || imp.Marked == 0 || c.reasons["unknown QPN"] == 0 {
		t.Fatalf("seed %d: the run exercised too little", seed)
	}
	if want := sent + int(imp.Duplicated); len(r.recs) != want {
		t.Errorf("seed %d: %d records, want %d: one per packet sent, one per duplicate", seed, len(r.recs), want)
	}
	for i, rec := range r.recs {
		checkFrame(t, rec.Data)
		if rec.Dir == NoDirection {
			t.Errorf("record %d has no direction", i+1)
		}
	}
	if n := countComments(r.recs, "lost: injected loss"); n != int(imp.Dropped) {
		t.Errorf("%d records say lost, the network lost %d", n, imp.Dropped)
	}
	if n := countComments(r.recs, "dropped: unknown QPN"); n != c.reasons["unknown QPN"] {
		t.Errorf("%d records say dropped: unknown QPN, the device dropped %d", n, c.reasons["unknown QPN"])
	}
	if n := countComments(r.recs, "dropped: "); n != drop {
		t.Errorf("%d records say dropped, the devices dropped %d", n, drop)
	}
	// A duplicate is written again when it arrives: said "duplicate", or "dropped" when the copy was
	// dropped (a second copy has nothing left to join).
	inboundDrops := 0
	for _, rec := range r.recs {
		if rec.Dir == Inbound && len(rec.Comments) > 0 && strings.HasPrefix(rec.Comments[0], "dropped: ") {
			inboundDrops++
		}
	}
	if n := countComments(r.recs, "duplicate: delivered again by the network"); n+inboundDrops != int(imp.Duplicated) {
		t.Errorf("%d records say duplicate and %d dropped on arrival, the network duplicated %d", n, inboundDrops, imp.Duplicated)
	}
	// The network marks a packet before it duplicates it, so both copies arrive marked. Copies are
	// matched to what was sent by their bytes, and a retransmission has the bytes of the first
	// transmission: when the device has sent a packet again before the network's marked copy of the
	// first transmission arrives, that copy settles the retransmission and is said marked too (and
	// the retransmission's own copy, arriving after, is said duplicate). So a mark can be said once
	// more for each duplicate.
	if n := countComments(r.recs, "marked: ECN CE on the way"); n == 0 || n > int(imp.Marked+imp.Duplicated) {
		t.Errorf("%d records say marked, the network marked %d and duplicated %d", n, imp.Marked, imp.Duplicated)
	}
}

// One traced device with an untraced peer: the capture has what it sent and what it received.
func TestTracerOneSide(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.pcapng")
	cw, err := Create(path, nil)
	ok(t, err)
	count := newCounter()
	net := goroce.NewMemNetwork()
	a, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("fd00::1"), Port: goroce.DefaultPort, Network: net, Tracer: cw.Tracer(count)})
	ok(t, err)
	defer a.Close()
	b, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("fd00::2"), Port: goroce.DefaultPort, Network: net})
	ok(t, err)
	defer b.Close()
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	cqa, _ := a.CreateCQ(8)
	cqb, _ := b.CreateCQ(8)
	qpa, err := pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqa, RecvCQ: cqa})
	ok(t, err)
	qpb, err := pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqb, RecvCQ: cqb})
	ok(t, err)
	ok(t, qpa.Connect(qpb.Endpoint(), nil))
	ok(t, qpb.Connect(qpa.Endpoint(), nil))
	mr, err := pdb.AllocMR(1<<16, goroce.LocalWrite|goroce.RemoteRead)
	ok(t, err)
	land, err := pda.AllocMR(1<<16, goroce.LocalWrite)
	ok(t, err)
	ok(t, qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMARead, Flags: goroce.Signaled, SGL: []goroce.SGE{land.SGE(0, 1<<16)},
		RemoteAddr: mr.Addr(), RKey: mr.RKey()}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	if _, err := cqa.Wait(ctx, wc); err != nil || wc[0].Err() != nil {
		t.Fatal(err, wc[0].Err())
	}
	a.Close()
	ok(t, cw.Close())
	data, err := os.ReadFile(path)
	ok(t, err)
	recs := readAll(t, data)
	sent, recv := count.dirs[goroce.Sent], count.dirs[goroce.Received]
	if len(recs) != sent+recv || recv < 16 {
		t.Fatalf("%d records of %d sent and %d received", len(recs), sent, recv)
	}
	dirs := map[Direction]int{}
	for _, rec := range recs {
		checkFrame(t, rec.Data)
		dirs[rec.Dir]++
	}
	if dirs[Outbound] != sent || dirs[Inbound] != recv {
		t.Errorf("directions %v, want %d out and %d in", dirs, sent, recv)
	}
}

// The Tracer's rules, one event at a time.
func TestTracerRules(t *testing.T) {
	a, b := netip.MustParseAddrPort("10.0.0.1:49152"), netip.MustParseAddrPort("10.0.0.2:4791")
	at := time.Unix(100, 0)
	ev := func(dir goroce.Direction, tos uint8, id uint16, pkt []byte, reason string) *goroce.TraceEvent {
		at = at.Add(time.Microsecond)
		return &goroce.TraceEvent{Dir: dir, At: at, From: a, To: b, TOS: tos, IPID: id, Bytes: pkt, Reason: reason}
	}
	for _, c := range []struct {
		name string
		hold int
		run  func(tr *Tracer, p1, p2 []byte)
		want []string // each record: its direction and comments
	}{
		{"received as sent", 0, func(tr *Tracer, p1, _ []byte) {
			tr.Packet(ev(goroce.Sent, 2, 5, p1, ""))
			tr.Packet(ev(goroce.Received, 2, 5, p1, ""))
		}, []string{"outbound"}},
		{"marked and duplicated", 0, func(tr *Tracer, p1, p2 []byte) {
			tr.Packet(ev(goroce.Sent, 2, 5, p1, ""))
			tr.Packet(ev(goroce.Sent, 0x10, 0, p2, ""))
			tr.Packet(ev(goroce.Received, 3, 5, p1, ""))
			tr.Packet(ev(goroce.Received, 0x14, 0, p2, ""))
			tr.Packet(ev(goroce.Received, 3, 5, p1, ""))
		}, []string{"outbound marked: ECN CE on the way", "outbound marked: TOS 0x14 on the way (sent 0x10)",
			"inbound duplicate: delivered again by the network"}},
		{"lost, held", 0, func(tr *Tracer, p1, p2 []byte) {
			tr.Packet(ev(goroce.Sent, 2, 5, p1, ""))
			tr.Packet(ev(goroce.Sent, 0, 0, p2, ""))
			tr.Lost(p1, a, b)
		}, []string{"outbound lost: injected loss", "outbound"}},
		{"lost, written already", -1, func(tr *Tracer, p1, _ []byte) {
			tr.Packet(ev(goroce.Sent, 2, 5, p1, ""))
			tr.Lost(p1, a, b)
		}, []string{"outbound", "outbound lost: injected loss"}},
		{"lost, never traced", 0, func(tr *Tracer, p1, _ []byte) {
			tr.Lost(p1, a, b) // the identification, 5, is solved from the ICRC
		}, []string{"outbound lost: injected loss"}},
		{"dropped, sender traced", 0, func(tr *Tracer, p1, _ []byte) {
			tr.Packet(ev(goroce.Sent, 2, 5, p1, ""))
			tr.Packet(ev(goroce.Dropped, 2, 5, p1, "unknown QPN"))
		}, []string{"outbound dropped: unknown QPN"}},
		{"dropped, sender not traced", 0, func(tr *Tracer, _, p2 []byte) {
			tr.Packet(ev(goroce.Received, 0, 0, p2, ""))
			tr.Packet(ev(goroce.Dropped, 0, 0, p2, "wrong peer"))
		}, []string{"inbound", "inbound dropped: wrong peer"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf strings.Builder
			w, err := NewWriter(&buf, &Options{Hold: c.hold})
			ok(t, err)
			p1, p2 := sealed(t, a, b, 5, []byte("first packet")), sealed(t, a, b, 0, []byte("second packet"))
			c.run(w.Tracer(nil), p1, p2)
			ok(t, w.Close())
			recs := readAll(t, []byte(buf.String()))
			var got []string
			for _, r := range recs {
				got = append(got, strings.Join(append([]string{r.Dir.String()}, r.Comments...), " "))
				checkFrame(t, r.Data)
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}

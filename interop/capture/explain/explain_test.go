package explain

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/sim"
	"github.com/goroce/goroce/wire"
)

// wireTestdata holds real rxe captures.
const wireTestdata = "../../../wire/testdata"

func analyzeFile(t *testing.T, name string) ([]Packet, *Analysis) {
	t.Helper()
	pkts, err := ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkts) == 0 {
		t.Fatalf("%s: no RoCEv2 packets", name)
	}
	return pkts, Analyze(pkts)
}

// notes returns the notes of a frame, failing if it has none of kind k.
func notesOf(t *testing.T, a *Analysis, frame int, k Kind) []Note {
	t.Helper()
	e := a.Frame(frame)
	if e == nil {
		t.Fatalf("no frame %d", frame)
	}
	var ns []Note
	for _, n := range e.Notes {
		if n.Kind == k {
			ns = append(ns, n)
		}
	}
	if len(ns) == 0 {
		t.Fatalf("frame %d has no %v note: %+v", frame, k, e.Notes)
	}
	return ns
}

// wantNote checks that frame has a note of kind k containing every one of subs, inferred or not as
// said, naming the frames refs.
func wantNote(t *testing.T, a *Analysis, frame int, k Kind, inferred bool, refs []int, subs ...string) {
	t.Helper()
	for _, n := range notesOf(t, a, frame, k) {
		ok := n.Inferred == inferred
		for _, s := range subs {
			ok = ok && strings.Contains(n.Text, s)
		}
		if ok && (refs == nil || slices.Equal(n.Refs, refs)) {
			return
		}
	}
	t.Errorf("frame %d: no %v note (inferred %v, refs %v) with %q in %+v", frame, k, inferred, refs, subs,
		a.Frame(frame).Notes)
}

// TestDemoLoss explains goroce demo's lossy run (testdata/README.md): a lost ACK and a timeout, a lost
// WRITE packet and the NAK it causes, a go-back-N resend, READ responses lost and the READ asked for
// again from the missing PSN, duplicates answered from responder resources, coalesced ACKs, the MSN.
func TestDemoLoss(t *testing.T) {
	_, a := analyzeFile(t, "testdata/demo-loss20-seed3.pcapng")
	if len(a.Pairs) != 1 {
		t.Fatalf("%d pairs, want 1", len(a.Pairs))
	}
	pr := a.Pairs[0]
	if got := pr.String(); got != "RC 127.0.0.1 QP 0x0f1244 <-> 127.0.0.2 QP 0xe2478c" || pr.Inferred {
		t.Errorf("pair %q (inferred %v)", got, pr.Inferred)
	}
	if e := a.Frame(16); e.From != pr.B || e.To != pr.A || e.Role != RoleResponse {
		t.Errorf("frame 16: %v > %v %v", e.From, e.To, e.Role)
	}

	// #4, the ACK of the first SEND, is lost: #5 resends it after a timeout, #6 and #7 go on.
	wantNote(t, a, 4, KindFate, false, nil, "lost on the way (injected loss)")
	wantNote(t, a, 4, KindAck, false, []int{1, 3}, "acknowledges 3 request packets at once, PSNs 0xdbfde1..0xdbfde3", "coalescing")
	wantNote(t, a, 5, KindRetransmit, true, []int{1, 4}, "resends PSN 0xdbfde1 (first sent as #1) 5.956 ms after #1",
		"local ACK timer expired", "#4, was lost")
	wantNote(t, a, 6, KindRetransmit, true, []int{2, 5}, "going on with the resend #5 began")
	wantNote(t, a, 11, KindDuplicate, true, []int{5, 10}, "acknowledges PSN 0xdbfde3 again, for the duplicates #5..#10")

	// #13 is lost: the responder gets #14 instead and NAKs, the requester goes back to #13's PSN.
	wantNote(t, a, 16, KindNAK, false, nil, "PSN sequence error: the responder expected PSN 0xdbfde4")
	wantNote(t, a, 16, KindNAK, true, []int{14, 13}, "got PSN 0xdbfde5 (#14) instead", "#13, which carried PSN 0xdbfde4, never arrived (lost: injected loss)")
	wantNote(t, a, 17, KindRetransmit, true, []int{13, 16}, "resends PSN 0xdbfde4 (first sent as #13)", "after the NAK #16", "go-back-N")
	wantNote(t, a, 20, KindAck, false, []int{13, 15}, "3 request packets at once, PSNs 0xdbfde4..0xdbfde6")
	wantNote(t, a, 20, KindAck, false, []int{12}, "MSN 2: 1 more message completed since #12")

	// The READ: #24 (PSN 0xdbfde9) is lost, so #25 is out of order: the requester asks again from
	// 0xdbfde9, 2048 bytes into the READ, and the responder answers from its responder resources.
	wantNote(t, a, 21, KindInfo, false, nil, "READ of 5000 bytes", "5 response packets, PSNs 0xdbfde7..0xdbfdeb")
	wantNote(t, a, 22, KindInfo, false, []int{21}, "answers READ #21", "response 1 of 5")
	wantNote(t, a, 25, KindRetransmit, true, []int{24}, "waited for READ response PSN 0xdbfde9 and got 0xdbfdea")
	wantNote(t, a, 27, KindRetransmit, true, []int{21, 25}, "asks again for the rest of READ #21 from PSN 0xdbfde9, 2048 bytes in, 2952 bytes")
	wantNote(t, a, 28, KindDuplicate, true, []int{24, 27}, "sends READ response PSN 0xdbfde9 again (first sent as #24): it answers #27", "responder resources")
	wantNote(t, a, 35, KindInfo, false, []int{34}, "answers RC Fetch Add #34")

	s := pr.Stats
	want := Stats{Packets: 35, Requests: 19, Responses: 16, Messages: 4, Lost: 5, Retransmits: 11, AfterTimeout: 2,
		AfterNAK: 1, AfterReadGap: 2, InBurst: 6, ACKs: 4, NAKs: 1, MaxCoalesced: 3, Duplicates: 7, MSN: 4,
		Start: s.Start, End: s.End}
	if s != want {
		t.Errorf("stats\n got %+v\nwant %+v", s, want)
	}
	if len(pr.Story) < 4 {
		t.Errorf("story %q", pr.Story)
	}
}

// simCapture runs a simulator scenario with its packets captured, and reads them back.
func simCapture(t *testing.T, name string, edit func(*sim.Params)) []Packet {
	t.Helper()
	p, err := sim.DefaultParams(name)
	if err != nil {
		t.Fatal(err)
	}
	edit(&p)
	var buf bytes.Buffer
	w, err := capture.NewWriter(&buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Tracer = w.SimTracer(time.Time{}, nil)
	if _, err := sim.RunScenario(name, p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	pkts, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return pkts
}

// TestSimLadder explains the simulator's lossy ladder and checks every inference against the truth the
// capture's comments hold: a NAK's "got" packet arrived, comes after the lost one, and carries a later
// PSN; the lost one carries the PSN the NAK expects; every retransmission is explained.
func TestSimLadder(t *testing.T) {
	allNAKs := 0
	for _, seed := range []uint64{1, 2, 3} {
		pkts := simCapture(t, "ladder", func(p *sim.Params) { p.Seed, p.Loss = seed, 0.05 })
		a := Analyze(pkts)
		byFrame := map[int]*Packet{}
		for i := range pkts {
			byFrame[pkts[i].Frame] = &pkts[i]
		}
		psnOf := func(n int) wire.PSN { return wire.BTH(byFrame[n].Data).PSN() }
		naks, resends := 0, 0
		for i, e := range a.Packets {
			p := &pkts[i]
			b := wire.BTH(p.Data)
			if b.Opcode() == wire.RCAcknowledge && wire.AETH(p.Data[wire.BTHLen:]).Syndrome().Kind() == wire.KindNAK {
				naks++
				ns := notesOf(t, a, e.Frame, KindNAK)
				if len(ns) != 2 || len(ns[1].Refs) != 2 {
					t.Fatalf("seed %d frame %d: notes %+v", seed, e.Frame, ns)
				}
				got, lost := ns[1].Refs[0], ns[1].Refs[1]
				if lost >= got || got >= e.Frame || psnOf(lost) != b.PSN() || !psnOf(got).After(b.PSN()) ||
					len(byFrame[got].Comments) != 0 || !strings.HasPrefix(byFrame[lost].Comments[0], "lost:") {
					t.Errorf("seed %d frame %d: %q: got #%d (psn %v, %q), lost #%d (psn %v, %q)", seed, e.Frame, ns[1].Text,
						got, psnOf(got), byFrame[got].Comments, lost, psnOf(lost), byFrame[lost].Comments)
				}
			}
			if e.Role == RoleRequest && strings.Contains(strings.Join(noteTexts(e.Notes), "|"), "resends") {
				resends++
			}
		}
		st := a.Pairs[0].Stats
		allNAKs += naks
		if resends != st.Retransmits || st.NAKs != naks || st.AfterNAK+st.AfterTimeout+st.InBurst != st.Retransmits ||
			(st.Lost > 0) != (st.Retransmits > 0) {
			t.Errorf("seed %d: %d NAKs, %d resends explained, stats %+v", seed, naks, resends, st)
		}
		t.Logf("seed %d: %d packets, %s", seed, len(pkts), strings.Join(a.Pairs[0].Story, " "))
	}
	if allNAKs == 0 {
		t.Error("no NAK in any run")
	}
}

func noteTexts(ns []Note) []string {
	var s []string
	for _, n := range ns {
		s = append(s, n.Text)
	}
	return s
}

// TestSimCNP explains the CNPs of a DCQCN incast: each goes to the QP whose packets a switch marked, names
// the latest marked packet of that flow before it, and measures the sender's rate around it.
func TestSimCNP(t *testing.T) {
	pkts := simCapture(t, "dcqcn-incast", func(p *sim.Params) { p.Flows, p.Duration = 2, 200*time.Microsecond })
	a := Analyze(pkts)
	if len(a.Pairs) != 2 {
		t.Fatalf("%d pairs, want 2", len(a.Pairs))
	}
	cnps := 0
	for i, e := range a.Packets {
		if e.Role != RoleCNP {
			continue
		}
		cnps++
		if e.Pair.Inferred || e.To != e.Pair.A || !strings.HasPrefix(e.To.String(), pkts[i].Dst.Addr().String()) {
			t.Errorf("frame %d: CNP %v > %v in pair %v", e.Frame, e.From, e.To, e.Pair)
		}
		ns := notesOf(t, a, e.Frame, KindCongestion)
		if len(ns) != 3 || !strings.Contains(ns[0].Text, "CNP to "+e.To.String()) || ns[0].Inferred {
			t.Fatalf("frame %d: %+v", e.Frame, ns)
		}
		marked := a.Frame(ns[1].Refs[0])
		if marked.Pair != e.Pair || marked.Role != RoleRequest || !strings.Contains(marked.Notes[0].Text, "a switch marked it") {
			t.Errorf("frame %d: %q names #%d: %+v", e.Frame, ns[1].Text, ns[1].Refs[0], marked)
		}
		if !strings.Contains(ns[2].Text, "Gb/s over the 16 before it") {
			t.Errorf("frame %d: %q", e.Frame, ns[2].Text)
		}
	}
	if cnps == 0 || a.Pairs[0].Stats.CNPs+a.Pairs[1].Stats.CNPs != cnps || a.Pairs[0].Stats.Marked == 0 {
		t.Errorf("%d CNPs; stats %+v %+v", cnps, a.Pairs[0].Stats, a.Pairs[1].Stats)
	}
}

// TestRxe explains real rxe traffic: RNR NAKs and the waits after them, a remote access error, READs
// with several responses, atomics, a resend after an ACK the requester did not take, and the pairing of
// RC, UC and UD QPs.
func TestRxe(t *testing.T) {
	_, a := analyzeFile(t, filepath.Join(wireTestdata, "rxe/rnr_nak.pcap"))
	wantNote(t, a, 2, KindNAK, false, []int{1}, "RNR NAK (receiver not ready): no receive was posted for the SEND with PSN 0xd80cc9 (#1)", "at least 10.240 ms")
	wantNote(t, a, 3, KindRetransmit, true, []int{1, 2}, "resends PSN 0xd80cc9 (first sent as #1) 18.989 ms after the RNR NAK #2")
	wantNote(t, a, 11, KindRetransmit, true, nil, "197.0 us after the RNR NAK #10", "sooner than that")
	if s := a.Pairs[0].Stats; s.RNRNAKs != 20 || s.AfterRNR != 20 || s.Retransmits != 20 || s.ACKs != 1 {
		t.Errorf("rnr_nak: %+v", s)
	}

	_, a = analyzeFile(t, filepath.Join(wireTestdata, "rxe/nak_access.pcap"))
	wantNote(t, a, 2, KindError, false, []int{1}, "refused the request with PSN 0x12f831 (#1, RC RDMA Write Only), remote access error")

	_, a = analyzeFile(t, filepath.Join(wireTestdata, "rxe/read_multi.pcap"))
	wantNote(t, a, 1, KindInfo, false, nil, "READ of 4096 bytes: the responder answers with 4 response packets, PSNs 0x1f3cee..0x1f3cf1")
	if s := a.Pairs[0].Stats; s.Retransmits != 0 || s.Duplicates != 0 || s.MSN != 5 || s.Messages != 5 {
		t.Errorf("read_multi: %+v", s)
	}

	_, a = analyzeFile(t, filepath.Join(wireTestdata, "rxe/rc_pingpong_ipv6.pcap"))
	wantNote(t, a, 30, KindRetransmit, true, []int{25, 27}, "though #27 acknowledged it 2.619 ms before")
	if !a.Pairs[0].Stats.Bidirectional {
		t.Errorf("rc_pingpong_ipv6: both sides send, stats %+v", a.Pairs[0].Stats)
	}

	_, a = analyzeFile(t, filepath.Join(wireTestdata, "rxe/uc_pingpong.pcap"))
	if len(a.Pairs) != 1 || !a.Pairs[0].Inferred || a.Pairs[0].String() != "UC 10.77.0.12 QP 0x000016 <-> 10.77.0.11 QP 0x000016" {
		t.Errorf("uc_pingpong: %v", a.Pairs)
	}
	_, a = analyzeFile(t, filepath.Join(wireTestdata, "rping.pcap"))
	if len(a.Pairs) != 2 || a.Pairs[0].Transport != wire.TransportUD || a.Pairs[0].A.QPN != wire.QPNGSI ||
		a.Pairs[1].String() != "RC 10.77.0.12 QP 0x000014 <-> 10.77.0.11 QP 0x000014" || a.Pairs[1].Stats.Retransmits != 0 {
		t.Errorf("rping: %v", a.Pairs)
	}
}

// TestAllCaptures analyzes every capture in wire/testdata: every packet gets a pair and both endpoints,
// every RC QP's number is known, and a pair's frames are its packets.
func TestAllCaptures(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(wireTestdata, "*.pcap"))
	more, _ := filepath.Glob(filepath.Join(wireTestdata, "rxe/*.pcap"))
	files = append(append(files, more...), "testdata/demo-loss20-seed3.pcapng")
	for _, f := range files {
		pkts, a := analyzeFile(t, f)
		n := 0
		for _, pr := range a.Pairs {
			n += len(pr.Frames)
			if pr.Transport == wire.TransportRC && (!pr.A.Known || !pr.B.Known) {
				t.Errorf("%s: pair %v has an unknown QP", f, pr)
			}
			if pr.Stats.Packets != len(pr.Frames) || len(pr.Story) == 0 {
				t.Errorf("%s: pair %v: %d frames, stats %+v, story %q", f, pr, len(pr.Frames), pr.Stats, pr.Story)
			}
		}
		for _, e := range a.Packets {
			if e.Pair == nil || e.From == nil || e.To == nil {
				t.Errorf("%s: frame %d: %+v", f, e.Frame, e)
			}
		}
		if n != len(pkts) {
			t.Errorf("%s: pairs hold %d frames of %d", f, n, len(pkts))
		}
	}
}

// TestFromLink decodes one RoCEv2 packet framed every way FromLink knows.
func TestFromLink(t *testing.T) {
	pkts, err := ReadFile("testdata/demo-loss20-seed3.pcapng")
	if err != nil {
		t.Fatal(err)
	}
	eth := framed(t, pkts[0])
	ip := eth[14:]
	vlan := slices.Concat(eth[:12], []byte{0x81, 0x00, 0x00, 0x05}, eth[12:])
	sll := slices.Concat([]byte{0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00}, ip)
	sll2 := slices.Concat([]byte{0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0}, ip)
	null := slices.Concat([]byte{2, 0, 0, 0}, ip)
	for _, c := range []struct {
		link uint16
		b    []byte
	}{{linkEthernet, eth}, {linkEthernet, vlan}, {linkSLL, sll}, {linkSLL2, sll2}, {linkRaw, ip}, {linkIPv4, ip}, {linkNull, null}} {
		p, ok := FromLink(c.link, c.b)
		if !ok || p.Src != pkts[0].Src || p.Dst != pkts[0].Dst || !bytes.Equal(p.Data, pkts[0].Data) || p.IPLen != len(ip) {
			t.Errorf("link %d: %v %+v", c.link, ok, p)
		}
	}
	for _, b := range [][]byte{nil, eth[:20], eth[:14+20+4], ip[:19]} {
		if p, ok := FromLink(linkEthernet, b); ok {
			t.Errorf("%d bytes decoded: %+v", len(b), p)
		}
	}
}

// framed returns the Ethernet frame of the first packet in the demo capture.
func framed(t *testing.T, p Packet) []byte {
	var buf bytes.Buffer
	w, err := capture.NewWriter(&buf, &capture.Options{Hold: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(&capture.Packet{At: p.At, From: p.Src, To: p.Dst, Payload: p.Data}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := capture.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(rec.Data)
}

// FuzzAnalyze feeds arbitrary packets to Analyze: it never panics, and every packet gets an explanation.
func FuzzAnalyze(f *testing.F) {
	pkts, err := ReadFile("testdata/demo-loss20-seed3.pcapng")
	if err != nil {
		f.Fatal(err)
	}
	for i := 0; i+2 < len(pkts); i += 3 {
		f.Add(pkts[i].Data, pkts[i+1].Data, pkts[i+2].Data, uint8(i))
	}
	f.Fuzz(func(t *testing.T, a, b, c []byte, order uint8) {
		var in []Packet
		for i := range 12 {
			d := [][]byte{a, b, c}[(i+int(order))%3]
			src, dst := pkts[0].Src, pkts[0].Dst
			if (int(order)>>(i%8))&1 == 1 {
				src, dst = dst, src
			}
			in = append(in, Packet{Frame: i + 1, At: time.Unix(0, int64(i)*1000), Src: src, Dst: dst, Data: d,
				Comments: []string{"", "lost: x", "marked: y", "duplicate: z"}[i%4:][:i%2]})
		}
		an := Analyze(in)
		if len(an.Packets) != len(in) {
			t.Fatalf("%d explanations of %d packets", len(an.Packets), len(in))
		}
	})
}

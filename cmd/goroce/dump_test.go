package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/iblayer"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const wireTestdata = "../../wire/testdata"

// sharedCaptures are the spellings of the rxe lab's captures: beside the checkout (as CI lays it out)
// and where a developer's machine has them.
var sharedCaptures = []string{"../../../shared/rxe-lab/pcaps", "/work/shared/rxe-lab/pcaps"}

// checkGolden compares got with testdata/name, or rewrites it under -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("%s differs at line %d:\n got %s\nwant %s\n(run go test -update if the change is intended)",
					name, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%s differs in length: got %d lines, want %d", name, len(gl), len(wl))
	}
}

// TestGolden checks the dump of a few real captures against golden text: RDMA CM MADs and RC traffic
// (rping), SEND segmentation and coalesced ACKs (rc_pingpong), and the TCP out-of-band exchange.
func TestGolden(t *testing.T) {
	for _, c := range []struct {
		golden string
		opts   dumpOptions
		files  []string
	}{
		{"rping.golden", dumpOptions{}, []string{wireTestdata + "/rping.pcap"}},
		{"rc_pingpong.golden", dumpOptions{}, []string{wireTestdata + "/rc_pingpong.pcap", "testdata/rc_pingpong_oob.pcap"}},
		{"write_bw_qp.golden", dumpOptions{qpOnly: true}, []string{wireTestdata + "/write_bw.pcap"}},
	} {
		t.Run(c.golden, func(t *testing.T) {
			var out bytes.Buffer
			total, ok := dump(&out, c.opts, c.files...)
			if !ok || total.roce == 0 {
				t.Errorf("dump not OK: %+v", total)
			}
			checkGolden(t, c.golden, out.Bytes())
		})
	}
}

// TestGoldenVerbose checks the -v field tree of one packet of each kind in the golden captures.
func TestGoldenVerbose(t *testing.T) {
	var recs []rec
	seen := map[string]bool{}
	for _, f := range []string{"rping.pcap", "write_bw.pcap", "read_lat.pcap"} {
		for _, r := range readRecords(t, filepath.Join(wireTestdata, f)) {
			p := gopacket.NewPacket(r.data, layers.LayerTypeEthernet, gopacket.Default)
			b, ok := p.Layer(iblayer.LayerTypeBTH).(*iblayer.BTH)
			if ok && !seen[b.Opcode.String()] {
				seen[b.Opcode.String()] = true
				recs = append(recs, r)
			}
		}
	}
	recs = append(recs, readRecords(t, "testdata/rc_pingpong_oob.pcap")[3])
	for i := range recs { // one clock for packets from several captures
		recs[i].ci.Timestamp = time.Unix(0, int64(i)*int64(time.Millisecond))
	}
	out := dumpRecords(t, dumpOptions{verbose: true}, layers.LinkTypeEthernet, recs)
	checkGolden(t, "verbose.golden", out)
}

// TestAllCaptures dumps every capture the checkout and the lab have: every RoCEv2 packet must decode and
// verify.
func TestAllCaptures(t *testing.T) {
	dirs := []string{wireTestdata, wireTestdata + "/rxe"}
	for _, d := range sharedCaptures {
		if _, err := os.Stat(d); err == nil {
			dirs = append(dirs, d)
			break
		}
	}
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pcap*"))
		if len(files) == 0 {
			t.Logf("%s: no captures", dir)
			continue
		}
		var out bytes.Buffer
		start := time.Now()
		total, ok := dump(&out, dumpOptions{}, files...)
		t.Logf("%s: %d files in %v: %s", dir, len(files), time.Since(start), total.line())
		if !ok || total.icrcBad != 0 || total.malformed != 0 || total.truncated != 0 || total.roce == 0 {
			t.Errorf("%s: %s\n%s", dir, total.line(), lastLines(out.String(), 5))
		}
		if got := strings.Count(out.String(), " icrc ok\n"); got != total.icrcOK || total.icrcOK != total.roce {
			t.Errorf("%s: %d lines say icrc ok, counted %d of %d RoCEv2 packets", dir, got, total.icrcOK, total.roce)
		}
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// rec is a captured packet.
type rec struct {
	data []byte
	ci   gopacket.CaptureInfo
}

func readRecords(t testing.TB, file string) []rec {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, _, err := openCapture(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []rec
	for {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rec{data, ci})
	}
}

// writeCapture writes packets to a pcap file in a temporary directory and returns its path.
func writeCapture(t testing.TB, link layers.LinkType, recs []rec) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65536, link); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.WritePacket(r.ci, r.data); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// dumpRecords dumps packets written to a temporary capture, with the temporary path replaced by "TMP".
func dumpRecords(t *testing.T, o dumpOptions, link layers.LinkType, recs []rec) []byte {
	t.Helper()
	path := writeCapture(t, link, recs)
	var out bytes.Buffer
	dump(&out, o, path)
	return bytes.ReplaceAll(out.Bytes(), []byte(path), []byte("TMP.pcap"))
}

// dumpRecordsCounts is dumpRecords that also returns the totals and verdict.
func dumpRecordsCounts(t *testing.T, link layers.LinkType, recs []rec) (string, counts, bool) {
	t.Helper()
	var out bytes.Buffer
	total, ok := dump(&out, dumpOptions{}, writeCapture(t, link, recs))
	return out.String(), total, ok
}

// TestTruncatedCapture cuts every packet to a 100-byte snaplen: packets are reported as truncated and
// decoded as far as they go, never as ICRC failures, and the verdict fails.
func TestTruncatedCapture(t *testing.T) {
	const snaplen = 100
	recs := readRecords(t, wireTestdata+"/write_bw.pcap")
	long := 0
	for i := range recs {
		if len(recs[i].data) > snaplen {
			long++
			recs[i].data = recs[i].data[:snaplen]
			recs[i].ci.CaptureLength = snaplen
		}
	}
	out, total, ok := dumpRecordsCounts(t, layers.LinkTypeEthernet, recs)
	if ok || total.truncated != long || total.icrcBad != 0 || total.malformed != 0 || total.icrcOK != total.roce-long {
		t.Errorf("%s: ok=%v, want %d truncated\n%s", total.line(), ok, long, lastLines(out, 3))
	}
	for _, want := range []string{
		"RC RDMA Write First qp=0x000012 psn=0xf73ab6 va=0x562045508000 rkey=0x00000315 len=8192 payload=1024 truncated capture (100 of 1098 bytes)\n",
		"RC RDMA Write Middle qp=0x000012 psn=0xf73ab7 payload=1024 truncated capture (100 of 1082 bytes)\n",
		"FAIL: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out[:min(len(out), 2000)])
		}
	}
}

// TestCorruptICRC flips one payload byte in three packets: exactly those three fail their ICRC.
func TestCorruptICRC(t *testing.T) {
	recs := readRecords(t, wireTestdata+"/rc_pingpong.pcap")
	for _, i := range []int{0, 5, 10} {
		recs[i].data = bytes.Clone(recs[i].data)
		recs[i].data[len(recs[i].data)-20] ^= 0x01
	}
	out, total, ok := dumpRecordsCounts(t, layers.LinkTypeEthernet, recs)
	if ok || total.icrcBad != 3 || total.icrcOK != len(recs)-3 {
		t.Errorf("%s: ok=%v, want 3 icrc bad", total.line(), ok)
	}
	if n := strings.Count(out, " icrc BAD (want 0x"); n != 3 {
		t.Errorf("%d lines report a bad ICRC, want 3", n)
	}
	if !strings.Contains(out, "FAIL: 3 of 40 RoCEv2 packets not verified: 3 ICRC failures") {
		t.Errorf("verdict missing:\n%s", lastLines(out, 2))
	}
}

// TestMalformed dumps a packet wire rejects: the line carries wire's error.
func TestMalformed(t *testing.T) {
	recs := readRecords(t, wireTestdata+"/rc_pingpong.pcap")[:1]
	recs[0].data = bytes.Clone(recs[0].data)
	recs[0].data[14+20+8] = 0x1f // a reserved RC opcode
	out, total, ok := dumpRecordsCounts(t, layers.LinkTypeEthernet, recs)
	if ok || total.malformed != 1 || !strings.Contains(out, "RoCEv2 malformed: wire: unknown or reserved opcode") {
		t.Errorf("%s\n%s", total.line(), out)
	}
}

// TestLinkTypes dumps a captured packet re-framed as Linux cooked capture, and a packet built over IPv6.
func TestLinkTypes(t *testing.T) {
	r := readRecords(t, wireTestdata+"/rc_pingpong.pcap")[0]
	sll := append([]byte{0, 0, 0, 1, 0, 6, 0x52, 0x54, 0, 0x77, 0, 0x0c, 0, 0, 0x08, 0x00}, r.data[14:]...)
	r.ci.CaptureLength, r.ci.Length = len(sll), len(sll)
	out, total, ok := dumpRecordsCounts(t, layers.LinkTypeLinuxSLL, []rec{{sll, r.ci}})
	if !ok || total.icrcOK != 1 || !strings.Contains(out, "10.77.0.12:49441 > 10.77.0.11:4791 RC Send First") {
		t.Errorf("Linux SLL: %s\n%s", total.line(), out)
	}

	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
		&layers.Ethernet{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6), EthernetType: layers.EthernetTypeIPv6},
		&layers.IPv6{Version: 6, HopLimit: 1, NextHeader: layers.IPProtocolUDP, SrcIP: net.ParseIP("fe80::1"), DstIP: net.ParseIP("fe80::2")},
		&layers.UDP{SrcPort: 49152, DstPort: wire.UDPPort},
		&iblayer.BTH{BTHFields: wire.BTHFields{Opcode: wire.RCAcknowledge, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 7}},
		&iblayer.AETH{AETHFields: wire.AETHFields{Syndrome: wire.SyndromeRNR(14), MSN: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if err := iblayer.SetICRC(buf.Bytes()[14:]); err != nil {
		t.Fatal(err)
	}
	ci := gopacket.CaptureInfo{Timestamp: time.Unix(0, 0), CaptureLength: len(buf.Bytes()), Length: len(buf.Bytes())}
	out, total, ok = dumpRecordsCounts(t, layers.LinkTypeEthernet, []rec{{buf.Bytes(), ci}})
	want := "[fe80::1]:49152 > [fe80::2]:4791 RC Acknowledge qp=0x000011 psn=0x000007 RNR NAK 1.28ms msn=3 icrc ok\n"
	if !ok || !strings.Contains(out, want) {
		t.Errorf("IPv6: %s\n%s", total.line(), out)
	}
	if !strings.Contains(out, "0    1       0") { // the RNR NAK column of the summary
		t.Errorf("IPv6: summary does not count the RNR NAK:\n%s", out)
	}
}

func TestDescribeOOB(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"0000:000011:10b60a:00000000000000000000ffff0a4d000c\x00",
			`"0000:000011:10b60a:00000000000000000000ffff0a4d000c"+1 NUL (rc_pingpong lid=0x0000 qpn=0x000011 psn=0x10b60a gid=::ffff:10.77.0.12)`},
		{"done\x00", `"done"+1 NUL`},
		{"0000:0001:000012:f73ab6:000003cd:0000562c8ac9c000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:\x00",
			`"0000:0001:000012:f73ab6:000003cd:0000562c8ac9c000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:"+1 NUL (perftest lid=0x0000 out-reads=1 qpn=0x000012 psn=0xf73ab6 rkey=0x000003cd va=0x562c8ac9c000 gid=::ffff:10.77.0.12)`},
		{"\x00\x00\x10\x00", "4 bytes 0x00001000"},
		{"0000:zz:10b60a:00", `"0000:zz:10b60a:00"`},
		{strings.Repeat("\x01", 20), "20 bytes 0x01010101010101010101010101010101..."},
	} {
		if got := describeOOB([]byte(c.in)); got != c.want {
			t.Errorf("describeOOB(%q)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

// TestRun checks the subcommand table: usage and status 2 for no or an unknown subcommand, 1 for a dump
// that fails.
func TestRun(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(nil, &stderr); code != 2 || !strings.Contains(stderr.String(), "dump ") {
		t.Errorf("no subcommand: status %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"frobnicate"}, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), `unknown subcommand "frobnicate"`) || !strings.Contains(stderr.String(), "usage:") {
		t.Errorf("unknown subcommand: status %d, stderr %q", code, stderr.String())
	}
	stdout := os.Stdout
	os.Stdout, _ = os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer func() { os.Stdout = stdout }()
	if code := run([]string{"dump", filepath.Join(t.TempDir(), "missing.pcap")}, &stderr); code != 1 {
		t.Errorf("dump of a missing file: status %d", code)
	}
	if code := run([]string{"dump", wireTestdata + "/rping.pcap"}, &stderr); code != 0 {
		t.Errorf("dump of rping.pcap: status %d", code)
	}
	if code := run([]string{"dump"}, io.Discard); code != 2 {
		t.Errorf("dump without files: status %d", code)
	}
}

// BenchmarkDump measures the dump of the 1 MB rc_pingpong capture when the lab's captures are present,
// else of the golden one.
func BenchmarkDump(b *testing.B) {
	file := wireTestdata + "/rc_pingpong.pcap"
	for _, d := range sharedCaptures {
		if _, err := os.Stat(d + "/rc_pingpong.pcap"); err == nil {
			file = d + "/rc_pingpong.pcap"
			break
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := dump(io.Discard, dumpOptions{}, file); !ok {
			b.Fatal("dump failed")
		}
	}
}

package capture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// readAll reads every record of a pcapng file, copying the data.
func readAll(t testing.TB, b []byte) []Record {
	t.Helper()
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("record %d: %v", len(out)+1, err)
		}
		rec.Data = bytes.Clone(rec.Data)
		out = append(out, *rec)
	}
}

// testPackets writes three packets: one per direction, with and without comments.
func testPackets(t testing.TB, w *Writer) []Packet {
	t.Helper()
	from, to := netip.MustParseAddrPort("10.0.0.1:49152"), netip.MustParseAddrPort("10.0.0.2:4791")
	back, there := netip.MustParseAddrPort("10.0.0.2:49153"), netip.MustParseAddrPort("10.0.0.1:4791")
	at := time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC)
	ps := []Packet{
		{At: at, From: from, To: to, IPID: 1, Payload: sealed(t, from, to, 1, []byte("abc")), Dir: Outbound},
		{At: at.Add(time.Microsecond), From: back, To: there, TOS: 2, Payload: sealed(t, back, there, 0, nil), Dir: Inbound,
			Comments: []string{"dropped: bad ICRC", "second comment, odd length"}},
		{At: at.Add(time.Second), From: from, To: to, Payload: sealed(t, from, to, 0, make([]byte, 1000))},
	}
	for i := range ps {
		if err := w.WritePacket(&ps[i]); err != nil {
			t.Fatal(err)
		}
	}
	return ps
}

// The Writer's file reads back with this package's Reader (comments, directions, nanosecond stamps)
// and with gopacket's pcapgo.NgReader (what `goroce dump` used to read pcapng with).
func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, &Options{Interface: "test0"})
	if err != nil {
		t.Fatal(err)
	}
	ps := testPackets(t, w)
	if w.Packets() != len(ps) {
		t.Errorf("Packets() = %d, want %d", w.Packets(), len(ps))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(&ps[0]); err == nil {
		t.Error("a closed Writer took a packet")
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	recs := readAll(t, buf.Bytes())
	if len(recs) != len(ps) {
		t.Fatalf("read %d records, wrote %d", len(recs), len(ps))
	}
	for i, rec := range recs {
		p := &ps[i]
		if !rec.At.Equal(p.At) || rec.Dir != p.Dir || !slices.Equal(rec.Comments, p.Comments) || rec.LinkType != linkTypeEthernet ||
			rec.Length != len(rec.Data) {
			t.Errorf("record %d: at %v dir %v comments %q link %d len %d/%d; want %v %v %q", i, rec.At, rec.Dir, rec.Comments,
				rec.LinkType, len(rec.Data), rec.Length, p.At, p.Dir, p.Comments)
		}
		f := checkFrame(t, rec.Data)
		if !bytes.Equal(f.Bytes(), p.Payload) {
			t.Errorf("record %d: payload differs", i)
		}
	}

	ng, err := pcapgo.NewNgReader(bytes.NewReader(buf.Bytes()), pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	if ng.LinkType() != layers.LinkTypeEthernet {
		t.Errorf("pcapgo: link type %v", ng.LinkType())
	}
	for i := 0; ; i++ {
		data, ci, err := ng.ReadPacketData()
		if errors.Is(err, io.EOF) {
			if i != len(recs) {
				t.Errorf("pcapgo read %d packets, want %d", i, len(recs))
			}
			break
		}
		if err != nil {
			t.Fatalf("pcapgo: packet %d: %v", i, err)
		}
		if !bytes.Equal(data, recs[i].Data) || !ci.Timestamp.Equal(recs[i].At) {
			t.Errorf("pcapgo: packet %d differs (at %v)", i, ci.Timestamp)
		}
	}
}

// Hold keeps packets back until Flush; a negative Hold writes at once.
func TestHold(t *testing.T) {
	for _, c := range []struct {
		hold, wantBeforeFlush int
	}{{-1, 3}, {2, 1}, {0, 0}} {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, &Options{Hold: c.hold})
		if err != nil {
			t.Fatal(err)
		}
		testPackets(t, w)
		// The third packet is a second after the others, beyond HoldTime: the first two go out then,
		// whatever the count allows.
		want := c.wantBeforeFlush
		if c.hold >= 0 {
			want = 2
		}
		w.bw.Flush()
		if got := len(readAll(t, buf.Bytes())); got != want {
			t.Errorf("hold %d: %d records before Flush, want %d", c.hold, got, want)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := len(readAll(t, buf.Bytes())); got != 3 {
			t.Errorf("hold %d: %d records after Flush, want 3", c.hold, got)
		}
	}
}

// bigEndianFile is a pcapng file written by a big-endian host: a section header, an interface with
// microsecond stamps (no if_tsresol) and a 2-second if_tsoffset, an Enhanced Packet Block with a
// comment and the inbound flag, a Simple Packet Block, and an unknown block to skip.
func bigEndianFile() []byte {
	be := binary.BigEndian
	block := func(typ uint32, body []byte) []byte {
		n := uint32(12 + len(body))
		b := be.AppendUint32(be.AppendUint32(nil, typ), n)
		return be.AppendUint32(append(b, body...), n)
	}
	opt := func(code uint16, v []byte) []byte {
		b := be.AppendUint16(be.AppendUint16(nil, code), uint16(len(v)))
		return append(append(b, v...), make([]byte, pad4(len(v))-len(v))...)
	}
	var f []byte
	shb := be.AppendUint32(nil, byteOrderMagic)
	shb = be.AppendUint64(be.AppendUint32(shb, 1<<16), ^uint64(0))
	f = append(f, block(blockSHB, shb)...)
	idb := be.AppendUint32(be.AppendUint32(nil, 1<<16), 65535) // Ethernet, reserved, snaplen
	idb = append(idb, opt(14, be.AppendUint64(nil, 2))...)
	idb = append(idb, 0, 0, 0, 0)
	f = append(f, block(blockIDB, idb)...)
	f = append(f, block(0x0BAD, []byte{1, 2, 3, 4})...)
	epb := be.AppendUint32(nil, 0)
	epb = be.AppendUint32(be.AppendUint32(epb, 0), 1500000) // 1.5 s in microseconds
	epb = be.AppendUint32(be.AppendUint32(epb, 3), 60)
	epb = append(epb, 0xAA, 0xBB, 0xCC, 0)
	epb = append(epb, opt(optComment, []byte("hi"))...)
	epb = append(epb, opt(optEPBFlags, be.AppendUint32(nil, flagsInbound))...)
	epb = append(epb, 0, 0, 0, 0)
	f = append(f, block(blockEPB, epb)...)
	spb := be.AppendUint32(nil, 2)
	spb = append(spb, 0xDD, 0xEE, 0, 0)
	return append(f, block(blockSPB, spb)...)
}

func TestReaderBigEndian(t *testing.T) {
	recs := readAll(t, bigEndianFile())
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	e := recs[0]
	if !bytes.Equal(e.Data, []byte{0xAA, 0xBB, 0xCC}) || e.Length != 60 || e.Dir != Inbound || !slices.Equal(e.Comments, []string{"hi"}) ||
		!e.At.Equal(time.Unix(3, 500000000)) {
		t.Errorf("EPB: %+v", e)
	}
	if s := recs[1]; !bytes.Equal(s.Data, []byte{0xDD, 0xEE}) || s.Length != 2 {
		t.Errorf("SPB: %+v", s)
	}
}

// Every truncation of a valid file is an error or a clean end, never a panic.
func TestReaderTruncated(t *testing.T) {
	f := bigEndianFile()
	for n := range len(f) {
		r, err := NewReader(bytes.NewReader(f[:n]))
		if err != nil {
			continue
		}
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
	}
	if _, err := NewReader(bytes.NewReader([]byte("\xd4\xc3\xb2\xa1 a classic pcap"))); !errors.Is(err, ErrNotPcapng) {
		t.Errorf("pcap: %v", err)
	}
}

// FuzzReader: arbitrary files never panic the Reader.
func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, nil)
	if err != nil {
		f.Fatal(err)
	}
	testPackets(f, w)
	w.Close()
	f.Add(buf.Bytes())
	f.Add(bigEndianFile())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		for range 1000 {
			rec, err := r.Next()
			if err != nil {
				return
			}
			if rec.Length < len(rec.Data) {
				t.Fatalf("length %d below %d captured", rec.Length, len(rec.Data))
			}
		}
	})
}

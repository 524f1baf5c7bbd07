package mad

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/goroce/goroce/wire"
)

// captureMADs returns the payloads of the UD SEND_ONLY packets to QP1 in wire/testdata/rping.pcap: the
// RDMA CM exchange of a real rping between two rxe peers (REQ, REP, RTU, then DREQ, DREP at the end).
func captureMADs(t testing.TB) [][]byte {
	t.Helper()
	d, err := os.ReadFile("../testdata/rping.pcap")
	if err != nil {
		t.Fatal(err)
	}
	const ethLen, pcapHdr, recHdr = 14, 24, 16
	var out [][]byte
	for off := pcapHdr; off+recHdr <= len(d); {
		incl := int(binary.LittleEndian.Uint32(d[off+8:]))
		frame := d[off+recHdr : off+recHdr+incl]
		off += recHdr + incl
		if len(frame) < ethLen || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		f, err := wire.ParseIP(frame[ethLen:])
		if err != nil || f.Opcode() != wire.UDSendOnly || f.BTH().DestQP() != wire.QPNGSI {
			continue
		}
		out = append(out, f.Payload())
	}
	if len(out) != 5 {
		t.Fatalf("found %d MADs in rping.pcap, want 5", len(out))
	}
	return out
}

func TestCaptureMADs(t *testing.T) {
	mads := captureMADs(t)
	want := []string{
		"CM ConnectRequest comm=0x864cc85e qpn=0x000014 psn=0xf65fee service=0x0000000001061c06 mtu=1024",
		"CM ConnectReply comm=0x38d031d7 remote-comm=0x864cc85e qpn=0x000014 psn=0x42f96e",
		"CM ReadyToUse comm=0x864cc85e remote-comm=0x38d031d7",
		"CM DisconnectRequest comm=0x864cc85e remote-comm=0x38d031d7 remote-qpn=0x000014",
		"CM DisconnectReply comm=0x38d031d7 remote-comm=0x864cc85e",
	}
	attrs := []AttributeID{AttrConnectRequest, AttrConnectReply, AttrReadyToUse, AttrDisconnectRequest,
		AttrDisconnectReply}
	for i, b := range mads {
		m, err := Parse(b)
		if err != nil {
			t.Fatalf("MAD %d: %v", i, err)
		}
		if got := m.String(); got != want[i] {
			t.Errorf("MAD %d:\n got %s\nwant %s", i, got, want[i])
		}
		h := m.Header().Fields()
		wantHdr := HeaderFields{BaseVersion: 1, MgmtClass: ClassCM, ClassVersion: 2, Method: MethodSend,
			TransactionID: 0x000000025ec84c86, AttributeID: attrs[i]}
		if h != wantHdr {
			t.Errorf("MAD %d header %+v, want %+v", i, h, wantHdr)
		}
		// The header re-encodes to the captured bytes.
		var enc [HeaderLen]byte
		Header(enc[:]).Encode(&h)
		if string(enc[:]) != string(b[:HeaderLen]) {
			t.Errorf("MAD %d header re-encodes to %x, want %x", i, enc, b[:HeaderLen])
		}
	}

	req := MAD(mads[0]).REQ()
	if req == nil || MAD(mads[0]).REP() != nil {
		t.Fatal("REQ accessor mismatch")
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"LocalCAGUID", req.LocalCAGUID(), uint64(0x505400fffe77000c)},
		{"ResponderResources", req.ResponderResources(), uint8(1)},
		{"InitiatorDepth", req.InitiatorDepth(), uint8(1)},
		{"TransportServiceType", req.TransportServiceType(), TransportRC},
		{"RetryCount", req.RetryCount(), uint8(7)},
		{"RNRRetryCount", req.RNRRetryCount(), uint8(7)},
		{"PKey", req.PKey(), wire.DefaultPKey},
		{"PathMTU", req.PathMTU(), wire.MTU1024},
		{"LocalGID", req.LocalGID(), netip.MustParseAddr("::ffff:10.77.0.12")},
		{"RemoteGID", req.RemoteGID(), netip.MustParseAddr("::ffff:10.77.0.11")},
		// The CMA header: version 0, IPv4, then the source port and addresses.
		{"PrivateData[1]", req.PrivateData()[1], uint8(0x40)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("REQ %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	rep := MAD(mads[1]).REP()
	if rep.ResponderResources() != 1 || rep.InitiatorDepth() != 1 || rep.RNRRetryCount() != 7 {
		t.Errorf("REP resources %d depth %d rnr %d", rep.ResponderResources(), rep.InitiatorDepth(),
			rep.RNRRetryCount())
	}
}

// TestTruncated checks that every prefix of a MAD fails with ErrTruncated, and that ParseHeader accepts
// exactly the prefixes that hold the common header.
func TestTruncated(t *testing.T) {
	b := captureMADs(t)[0]
	for n := range Len {
		if _, err := Parse(b[:n]); !errors.Is(err, ErrTruncated) {
			t.Errorf("Parse of %d bytes: %v, want ErrTruncated", n, err)
		}
		_, err := ParseHeader(b[:n])
		if n < HeaderLen && !errors.Is(err, ErrTruncated) {
			t.Errorf("ParseHeader of %d bytes: %v, want ErrTruncated", n, err)
		}
		if n >= HeaderLen && err != nil {
			t.Errorf("ParseHeader of %d bytes: %v", n, err)
		}
	}
	if _, err := Parse(append(b[:Len:Len], 0, 0, 0, 0)); err != nil {
		t.Errorf("a MAD with trailing bytes: %v", err)
	}
}

func TestBadVersion(t *testing.T) {
	b := append([]byte(nil), captureMADs(t)[0]...)
	b[0] = 2
	if _, err := Parse(b); !errors.Is(err, ErrBadVersion) {
		t.Errorf("Parse of base version 2: %v, want ErrBadVersion", err)
	}
}

func TestStrings(t *testing.T) {
	var b [Len]byte
	h := Header(b[:])
	h.Encode(&HeaderFields{BaseVersion: 1, MgmtClass: ClassCM, ClassVersion: 2, Method: MethodSend,
		AttributeID: AttrConnectReject})
	rej := REJ(b[HeaderLen:])
	binary.BigEndian.PutUint32(rej[0:], 0x11223344)
	binary.BigEndian.PutUint32(rej[4:], 0x55667788)
	binary.BigEndian.PutUint16(rej[rejReason:], uint16(RejConsumerReject))
	rej[rejInfoLen] = 4 << 1
	m, err := Parse(b[:])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.String(), "CM ConnectReject comm=0x11223344 remote-comm=0x55667788 reason=consumer-reject(28) rejected=REQ"; got != want {
		t.Errorf("REJ: got %q, want %q", got, want)
	}
	if n := len(m.REJ().ARI()); n != 4 {
		t.Errorf("ARI length %d, want 4", n)
	}

	h.Encode(&HeaderFields{BaseVersion: 1, MgmtClass: ClassSubnAdm, ClassVersion: 2, Method: MethodGetResp,
		Status: 0x000c, TransactionID: 7, AttributeID: 0x0035})
	if got, want := m.String(), "SubnAdm Attribute(0x0035) GetResp status=0x000c tid=0x7"; got != want {
		t.Errorf("SA: got %q, want %q", got, want)
	}
	for _, c := range []struct{ got, want string }{
		{Class(0x0a).String(), "Vendor(0x0a)"},
		{Class(0x25).String(), "Application(0x25)"},
		{Class(0xff).String(), "Class(0xff)"},
		{Method(0x7f).String(), "Method(0x7f)"},
		{RejectReason(99).String(), "reason(99)"},
		{ClassPerfMgmt.AttributeName(AttrClassPortInfo), "ClassPortInfo"},
		{ClassCM.AttributeName(AttrAlternatePathResp), "APR"},
		{ClassSubnAdm.AttributeName(AttrConnectRequest), "Attribute(0x0010)"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseAllocs(t *testing.T) {
	b := captureMADs(t)[0]
	n := testing.AllocsPerRun(100, func() {
		m, err := Parse(b)
		if err != nil || m.REQ().LocalQPN() == 0 {
			t.Fatal("parse failed")
		}
	})
	if n != 0 {
		t.Errorf("Parse allocates %v times", n)
	}
}

// FuzzParse feeds arbitrary bytes to Parse and every accessor: nothing may panic, and a MAD that parses
// is exactly Len bytes with the header ParseHeader sees.
func FuzzParse(f *testing.F) {
	for _, b := range captureMADs(f) {
		f.Add(b)
	}
	f.Add([]byte{1, 7, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, herr := ParseHeader(b)
		if herr == nil {
			_ = h.Fields()
			_ = h.AttributeName()
		}
		m, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrBadVersion) {
				t.Fatalf("unmatchable error %v", err)
			}
			return
		}
		if len(m) != Len || herr != nil {
			t.Fatalf("parsed MAD of %d bytes, header error %v", len(m), herr)
		}
		_ = m.String()
		if r := m.REQ(); r != nil {
			_, _, _ = r.LocalGID(), r.RemoteGID(), r.PrivateData()
		}
		if r := m.REP(); r != nil {
			_, _ = r.LocalCAGUID(), r.PrivateData()
		}
		if r := m.REJ(); r != nil {
			_ = r.ARI()
		}
		_, _, _ = m.RTU(), m.DREP(), m.DREQ()
		_, _, _ = m.MRA(), m.SIDRReq(), m.SIDRRep()
	})
}

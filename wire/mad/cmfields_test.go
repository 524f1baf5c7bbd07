package mad

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/goroce/goroce/wire"
)

// decodeCM returns the Fields of the CM message m carries, as a Message that AppendCM rebuilds, or nil
// for the attributes without one (LAP, APR).
func decodeCM(m MAD) Message {
	switch m.Header().AttributeID() {
	case AttrConnectRequest:
		f := m.REQ().Fields()
		return &f
	case AttrMRA:
		f := m.MRA().Fields()
		return &f
	case AttrConnectReject:
		f := m.REJ().Fields()
		return &f
	case AttrConnectReply:
		f := m.REP().Fields()
		return &f
	case AttrReadyToUse:
		f := RTUFields(m.RTU().Fields())
		return &f
	case AttrDisconnectRequest:
		f := m.DREQ().Fields()
		return &f
	case AttrDisconnectReply:
		f := DREPFields(m.DREP().Fields())
		return &f
	case AttrSIDRRequest:
		f := m.SIDRReq().Fields()
		return &f
	case AttrSIDRReply:
		f := m.SIDRRep().Fields()
		return &f
	}
	return nil
}

// TestCaptureReencode decodes the five CM MADs of rping.pcap (REQ, REP, RTU, DREQ, DREP between two rxe
// peers) into their Fields and builds them again: every byte comes back, reserved bits included.
func TestCaptureReencode(t *testing.T) {
	for i, b := range captureMADs(t) {
		m, err := ParseCM(b)
		if err != nil {
			t.Fatalf("MAD %d: %v", i, err)
		}
		out, err := AppendCM(nil, m.Header().TransactionID(), decodeCM(m))
		if err != nil {
			t.Fatalf("MAD %d: %v", i, err)
		}
		if !bytes.Equal(out, b[:Len]) {
			t.Errorf("MAD %d (%v) re-encodes to\n%x\nwant\n%x", i, m, out, b[:Len])
		}
	}
}

// TestCaptureREQFields checks the fields of rping's REQ that the CM engine relies on, with the values
// Linux's rdma_cm gives them (drivers/infiniband/core/cma.c: CMA_CM_RESPONSE_TIMEOUT 20,
// CMA_MAX_CM_RETRIES 15; cm.c cm_format_req: permissive LIDs off-subnet, cm_ack_timeout(15, 18) = 19).
func TestCaptureREQFields(t *testing.T) {
	mads := captureMADs(t)
	req := MAD(mads[0]).REQ().Fields()
	want := REQFields{
		LocalCommID: 0x864cc85e, ServiceID: ServiceID(PortSpaceTCP, 7174), LocalCAGUID: 0x505400fffe77000c,
		LocalQPN: 0x14, ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 20,
		TransportServiceType: TransportRC, StartingPSN: 0xf65fee, LocalCMResponseTimeout: 20, RetryCount: 7,
		PKey: wire.DefaultPKey, PathMTU: wire.MTU1024, RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: netip.MustParseAddr("::ffff:10.77.0.12"),
			RemoteGID: netip.MustParseAddr("::ffff:10.77.0.11"), FlowLabel: 785645, HopLimit: 64,
			LocalACKTimeout: 19},
		Alternate:   Path{LocalGID: netip.IPv6Unspecified(), RemoteGID: netip.IPv6Unspecified()},
		PrivateData: req.PrivateData,
	}
	if !reflect.DeepEqual(req, want) {
		t.Errorf("REQ\n got %+v\nwant %+v", req, want)
	}
	h, err := ParseCMAHeader(req.PrivateData)
	if err != nil {
		t.Fatal(err)
	}
	wantHdr := CMAHeaderFields{SrcPort: 58937, SrcAddr: netip.MustParseAddr("10.77.0.12"),
		DstAddr: netip.MustParseAddr("10.77.0.11")}
	if h.Version() != 0 || h.IPVersion() != 4 || h.Fields() != wantHdr {
		t.Errorf("CMA header v%d ip%d %+v, want v0 ip4 %+v", h.Version(), h.IPVersion(), h.Fields(), wantHdr)
	}
	// The header rebuilds byte for byte, and the rest of rping's private data is zero.
	if got := wantHdr.Append(nil, nil); !bytes.Equal(got, req.PrivateData[:CMAHeaderLen]) {
		t.Errorf("CMA header re-encodes to %x, want %x", got, req.PrivateData[:CMAHeaderLen])
	}
	if !bytes.Equal(req.PrivateData[CMAHeaderLen:], make([]byte, REQPrivateDataLen-CMAHeaderLen)) {
		t.Errorf("private data after the CMA header: %x", req.PrivateData[CMAHeaderLen:])
	}

	rep := MAD(mads[1]).REP().Fields()
	if rep.TargetACKDelay != 15 || rep.LocalQPN != 0x14 || rep.StartingPSN != 0x42f96e ||
		rep.RemoteCommID != req.LocalCommID || rep.LocalCAGUID != 0x505400fffe77000b {
		t.Errorf("REP %+v", rep)
	}
	dreq := MAD(mads[3]).DREQ().Fields()
	if dreq.RemoteQPN != rep.LocalQPN || dreq.RemoteCommID != rep.LocalCommID {
		t.Errorf("DREQ %+v", dreq)
	}
}

// randomMessages returns one message of every kind with every field random and within its width, the
// byte fields at their full length (which is what Fields returns).
func randomMessages(r *rand.Rand) []Message {
	u8 := func(width uint) uint8 { return uint8(r.UintN(1 << width)) }
	u24 := func() uint32 { return r.Uint32() & wire.PSNMask }
	bs := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	addr := func() netip.Addr { return netip.AddrFrom16([16]byte(bs(16))) }
	path := func() Path {
		return Path{LocalLID: uint16(r.Uint32()), RemoteLID: uint16(r.Uint32()), LocalGID: addr(), RemoteGID: addr(),
			FlowLabel: r.Uint32() >> 12, PacketRate: u8(6), TrafficClass: u8(8), HopLimit: u8(8), SL: u8(4),
			SubnetLocal: r.IntN(2) == 1, LocalACKTimeout: u8(5)}
	}
	return []Message{
		&REQFields{LocalCommID: r.Uint32(), ServiceID: r.Uint64(), LocalCAGUID: r.Uint64(),
			LocalQKey: wire.QKey(r.Uint32()), LocalQPN: wire.QPN(u24()), ResponderResources: u8(8),
			LocalEECN: u24(), InitiatorDepth: u8(8), RemoteEECN: u24(), RemoteCMResponseTimeout: u8(5),
			TransportServiceType: TransportType(u8(2)), EndToEndFlowControl: r.IntN(2) == 1,
			StartingPSN: wire.PSN(u24()), LocalCMResponseTimeout: u8(5), RetryCount: u8(3),
			PKey: wire.PKey(r.Uint32()), PathMTU: wire.MTU(u8(4)), RDCExists: r.IntN(2) == 1,
			RNRRetryCount: u8(3), MaxCMRetries: u8(4), SRQ: r.IntN(2) == 1, ExtendedTransportType: u8(3),
			Primary: path(), Alternate: path(), SAPSupported: r.IntN(2) == 1, PrivateData: bs(REQPrivateDataLen)},
		&MRAFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), MessageMRAed: MessageType(u8(2)),
			ServiceTimeout: u8(5), PrivateData: bs(MRAPrivateDataLen)},
		&REJFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), MessageRejected: MessageType(u8(2)),
			Reason: RejectReason(r.Uint32()), ARI: bs(r.IntN(REJARILen + 1)), PrivateData: bs(REJPrivateDataLen)},
		&REPFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), LocalQKey: wire.QKey(r.Uint32()),
			LocalQPN: wire.QPN(u24()), LocalEECN: u24(), StartingPSN: wire.PSN(u24()), ResponderResources: u8(8),
			InitiatorDepth: u8(8), TargetACKDelay: u8(5), FailoverAccepted: u8(2), EndToEndFlowControl: r.IntN(2) == 1,
			RNRRetryCount: u8(3), SRQ: r.IntN(2) == 1, LocalCAGUID: r.Uint64(), PrivateData: bs(REPPrivateDataLen)},
		&RTUFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), PrivateData: bs(RTUPrivateDataLen)},
		&DREQFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), RemoteQPN: wire.QPN(u24()),
			PrivateData: bs(DREQPrivateDataLen)},
		&DREPFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), PrivateData: bs(DREPPrivateDataLen)},
		&SIDRReqFields{RequestID: r.Uint32(), PKey: wire.PKey(r.Uint32()), ServiceID: r.Uint64(),
			PrivateData: bs(SIDRReqPrivateDataLen)},
		&SIDRRepFields{RequestID: r.Uint32(), Status: SIDRStatus(u8(8)), QPN: wire.QPN(u24()), ServiceID: r.Uint64(),
			QKey: wire.QKey(r.Uint32()), AdditionalInfo: bs(r.IntN(SIDRRepInfoLen + 1)),
			PrivateData: bs(SIDRRepPrivateDataLen)},
	}
}

// TestRoundTrip builds every message with random fields, parses it back and decodes the same fields.
func TestRoundTrip(t *testing.T) {
	seed := uint64(rand.Uint32())
	r := rand.New(rand.NewPCG(seed, 1))
	for range 200 {
		for _, msg := range randomMessages(r) {
			tid := r.Uint64()
			b, err := AppendCM([]byte{0xAA}, tid, msg)
			if err != nil {
				t.Fatalf("seed %d: %T: %v", seed, msg, err)
			}
			if len(b) != 1+Len || b[0] != 0xAA {
				t.Fatalf("seed %d: %T: Append wrote %d bytes over a prefix", seed, msg, len(b))
			}
			m, err := ParseCM(b[1:])
			if err != nil {
				t.Fatalf("seed %d: %T: %v", seed, msg, err)
			}
			h := m.Header()
			if h.TransactionID() != tid || h.AttributeID() != msg.Attribute() || h.ClassVersion() != CMClassVersion ||
				h.Method() != MethodSend {
				t.Fatalf("seed %d: %T: header %+v", seed, msg, h.Fields())
			}
			if got := decodeCM(m); !reflect.DeepEqual(got, msg) {
				t.Fatalf("seed %d: round trip of %T\n got %+v\nwant %+v", seed, msg, got, msg)
			}
		}
	}
}

// TestShortPrivateData checks that private data shorter than its field is padded with zeros, whatever
// the buffer held before.
func TestShortPrivateData(t *testing.T) {
	b := bytes.Repeat([]byte{0xFF}, Len)
	m := MAD(b)
	REQ(m.Data()).Encode(&REQFields{PrivateData: []byte{1, 2, 3}})
	want := append([]byte{1, 2, 3}, make([]byte, REQPrivateDataLen-3)...)
	if !bytes.Equal(REQ(m.Data()).PrivateData(), want) {
		t.Errorf("private data %x", REQ(m.Data()).PrivateData())
	}
	// Every byte of the message was rewritten: a zero REQFields encodes to zeros, and :: for the GIDs.
	if !bytes.Equal(m.Data()[:reqPrivateData], make([]byte, reqPrivateData)) {
		t.Errorf("reserved bytes not cleared: %x", m.Data()[:reqPrivateData])
	}
}

// TestFieldsCut checks that numeric fields wider than their place are cut to it and do not spill into
// their neighbours.
func TestFieldsCut(t *testing.T) {
	b, err := AppendCM(nil, 1, &REQFields{LocalQPN: 0xFF123456, ResponderResources: 9, StartingPSN: 0x7F654321,
		LocalCMResponseTimeout: 0xFF, RetryCount: 2, PathMTU: 0x13, RNRRetryCount: 0x0E, MaxCMRetries: 0x1F})
	if err != nil {
		t.Fatal(err)
	}
	r := MAD(b).REQ()
	if r.LocalQPN() != 0x123456 || r.ResponderResources() != 9 || r.StartingPSN() != 0x654321 ||
		r.LocalCMResponseTimeout() != 0x1F || r.RetryCount() != 2 || r.PathMTU() != 3 || r.RNRRetryCount() != 6 ||
		r.MaxCMRetries() != 0xF || r.SRQ() {
		t.Errorf("cut fields: %+v", r.Fields())
	}
}

func TestFieldTooLong(t *testing.T) {
	for _, m := range []Message{
		&REQFields{PrivateData: make([]byte, REQPrivateDataLen+1)},
		&MRAFields{PrivateData: make([]byte, MRAPrivateDataLen+1)},
		&REJFields{ARI: make([]byte, REJARILen+1)},
		&REJFields{PrivateData: make([]byte, REJPrivateDataLen+1)},
		&REPFields{PrivateData: make([]byte, REPPrivateDataLen+1)},
		&RTUFields{PrivateData: make([]byte, RTUPrivateDataLen+1)},
		&DREQFields{PrivateData: make([]byte, DREQPrivateDataLen+1)},
		&DREPFields{PrivateData: make([]byte, DREPPrivateDataLen+1)},
		&SIDRReqFields{PrivateData: make([]byte, SIDRReqPrivateDataLen+1)},
		&SIDRRepFields{AdditionalInfo: make([]byte, SIDRRepInfoLen+1)},
		&SIDRRepFields{PrivateData: make([]byte, SIDRRepPrivateDataLen+1)},
	} {
		dst := []byte{1, 2}
		got, err := AppendCM(dst, 0, m)
		if !errors.Is(err, ErrFieldTooLong) || len(got) != 2 {
			t.Errorf("%T: %v, %d bytes", m, err, len(got))
		}
	}
}

func TestParseCMErrors(t *testing.T) {
	good, _ := AppendCM(nil, 7, &RTUFields{LocalCommID: 1, RemoteCommID: 2})
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", good[:Len-1], ErrTruncated},
		{"base version", mod(func(b []byte) { b[hdrBaseVersion] = 2 }), ErrBadVersion},
		{"class", mod(func(b []byte) { b[hdrMgmtClass] = byte(ClassSubnAdm) }), ErrNotCM},
		{"method", mod(func(b []byte) { b[hdrMethod] = byte(MethodGet) }), ErrNotCM},
		{"class version", mod(func(b []byte) { b[hdrClassVersion] = 1 }), ErrCMClassVersion},
		{"attribute low", mod(func(b []byte) { b[hdrAttrID+1] = 0x0F }), ErrUnknownAttribute},
		{"attribute high", mod(func(b []byte) { b[hdrAttrID+1] = 0x1B }), ErrUnknownAttribute},
		{"ClassPortInfo", mod(func(b []byte) { b[hdrAttrID+1] = 0x01 }), ErrUnknownAttribute},
	} {
		if _, err := ParseCM(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := ParseCM(good); err != nil {
		t.Errorf("good RTU: %v", err)
	}
}

func TestServiceID(t *testing.T) {
	for _, c := range []struct {
		ps   PortSpace
		port uint16
		sid  uint64
	}{
		{PortSpaceTCP, 7174, 0x0000000001061c06}, // rping's default
		{PortSpaceUDP, 7174, 0x0000000001111c06}, // udaddy's
		{PortSpaceIB, 0xFFFF, 0x00000000013FFFFF},
		{PortSpaceIPoIB, 1, 0x0000000000020001},
	} {
		if got := ServiceID(c.ps, c.port); got != c.sid {
			t.Errorf("ServiceID(%v, %d) = %#x, want %#x", c.ps, c.port, got, c.sid)
		}
		ps, port, ok := ParseServiceID(c.sid)
		if !ok || ps != c.ps || port != c.port {
			t.Errorf("ParseServiceID(%#x) = %v %d %v", c.sid, ps, port, ok)
		}
	}
	if _, _, ok := ParseServiceID(0x0200000000000001); ok {
		t.Error("an IB-assigned service ID parsed as rdma_cm's")
	}
	if PortSpaceTCP.String() != "TCP" || PortSpace(7).String() != "PortSpace(7)" {
		t.Error("PortSpace names")
	}
}

func TestCMAHeader(t *testing.T) {
	for _, f := range []CMAHeaderFields{
		{SrcPort: 1, SrcAddr: netip.MustParseAddr("192.0.2.1"), DstAddr: netip.MustParseAddr("192.0.2.2")},
		{SrcPort: 65535, SrcAddr: netip.MustParseAddr("2001:db8::1"), DstAddr: netip.MustParseAddr("fe80::2")},
	} {
		p := f.Append(nil, []byte("app"))
		if len(p) != CMAHeaderLen+3 || string(p[CMAHeaderLen:]) != "app" {
			t.Fatalf("Append: %x", p)
		}
		h, err := ParseCMAHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		if h.Fields() != f {
			t.Errorf("round trip %+v, want %+v", h.Fields(), f)
		}
	}
	// IPv4-mapped addresses are written as rdma_cm writes IPv4 ones: zeros, then the four bytes.
	h := CMAHeader(make([]byte, CMAHeaderLen))
	h.Encode(&CMAHeaderFields{SrcAddr: netip.MustParseAddr("::ffff:10.0.0.1"), DstAddr: netip.MustParseAddr("10.0.0.2")})
	if h.IPVersion() != 4 || h.SrcAddr() != netip.MustParseAddr("10.0.0.1") || h[cmaSrc+10] != 0 {
		t.Errorf("mapped source: %x", []byte(h))
	}
	for _, p := range [][]byte{
		nil,
		make([]byte, CMAHeaderLen-1),
		append([]byte{1, 0x40}, make([]byte, CMAHeaderLen)...), // version 1
		append([]byte{0, 0x50}, make([]byte, CMAHeaderLen)...), // IP version 5
	} {
		if _, err := ParseCMAHeader(p); !errors.Is(err, ErrCMAHeader) {
			t.Errorf("ParseCMAHeader(%x): %v", p, err)
		}
	}
}

func TestEnumStrings(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{TransportUC.String(), "UC"}, {TransportType(9).String(), "TransportType(9)"},
		{MsgREP.String(), "REP"}, {MessageType(3).String(), "reserved"},
		{SIDRReject.String(), "reject"}, {SIDRStatus(40).String(), "status(40)"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestAppendAllocs(t *testing.T) {
	f := &REQFields{LocalCommID: 1, PrivateData: make([]byte, 40)}
	buf := make([]byte, 0, Len)
	n := testing.AllocsPerRun(100, func() {
		if _, err := AppendCM(buf[:0], 1, f); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("AppendCM into a buffer with room allocates %v times", n)
	}
}

// FuzzCM feeds arbitrary bytes to ParseCM; a MAD it accepts decodes into Fields that encode and decode
// to the same Fields again, and no view's accessor panics.
func FuzzCM(f *testing.F) {
	for _, b := range captureMADs(f) {
		f.Add(b)
	}
	for _, m := range randomMessages(rand.New(rand.NewPCG(1, 2))) {
		b, _ := AppendCM(nil, 3, m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseCM(b)
		if err != nil {
			for _, e := range []error{ErrTruncated, ErrBadVersion, ErrNotCM, ErrCMClassVersion, ErrUnknownAttribute} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("unmatchable error %v", err)
		}
		_ = m.String()
		msg := decodeCM(m)
		if msg == nil {
			return
		}
		if r := m.REQ(); r != nil {
			if h, err := ParseCMAHeader(r.PrivateData()); err == nil {
				_ = h.Fields()
			}
		}
		out, err := AppendCM(nil, m.Header().TransactionID(), msg)
		if err != nil {
			t.Fatalf("re-encoding %v: %v", m, err)
		}
		m2, err := ParseCM(out)
		if err != nil {
			t.Fatal(err)
		}
		if again := decodeCM(m2); !reflect.DeepEqual(again, msg) {
			t.Fatalf("decode(encode(decode(x))) differs:\n got %+v\nwant %+v", again, msg)
		}
	})
}

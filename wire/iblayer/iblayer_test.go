package iblayer

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// ipOf returns the IP packet inside an Ethernet or Linux SLL frame, or nil.
func ipOf(r record) []byte {
	switch r.link {
	case layers.LinkTypeEthernet:
		if len(r.data) >= 14 {
			return r.data[14:]
		}
	case layers.LinkTypeLinuxSLL:
		if len(r.data) >= 16 {
			return r.data[16:]
		}
	}
	return nil
}

// TestCaptures decodes every UDP/4791 packet of every capture through gopacket and cross-checks the layers
// against wire.ParseIP: opcode, QPN, PSN, every extension header wire sees, payload and ICRC.
func TestCaptures(t *testing.T) {
	var roce, mads int
	seen := map[wire.Opcode]bool{}
	for _, r := range readCaptures(t) {
		pkt := gopacket.NewPacket(r.data, r.link, gopacket.DecodeOptions{NoCopy: true, SkipDecodeRecovery: true})
		udp, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if !ok || udp.DstPort != wire.UDPPort {
			continue
		}
		roce++
		if el := pkt.ErrorLayer(); el != nil {
			t.Errorf("%s: decode error %v", r.name, el.Error())
			continue
		}
		want, err := wire.ParseIP(ipOf(r))
		if err != nil {
			t.Errorf("%s: wire.ParseIP: %v", r.name, err)
			continue
		}
		b, ok := pkt.Layer(LayerTypeBTH).(*BTH)
		if !ok {
			t.Errorf("%s: no BTH layer; layers %v", r.name, pkt.Layers())
			continue
		}
		seen[b.Opcode] = true
		if b.Opcode != want.Opcode() || b.DestQP != want.BTH().DestQP() || b.PSN != want.BTH().PSN() ||
			b.BTHFields != want.BTH().Fields() {
			t.Errorf("%s: BTH %+v, wire says %+v", r.name, b.BTHFields, want.BTH().Fields())
		}
		if b.Truncated || !bytes.Equal(b.Packet.Bytes(), want.Bytes()) || b.ICRC != want.ICRC() {
			t.Errorf("%s: BTH packet or ICRC differs from wire's", r.name)
		}
		checkExtLayers(t, r.name, pkt, want)
		if err := VerifyICRC(pkt); err != nil {
			t.Errorf("%s: VerifyICRC: %v", r.name, err)
		}
		if c, err := ComputeICRC(pkt); err != nil || c != b.ICRC {
			t.Errorf("%s: ComputeICRC = %#x, %v; packet carries %#x", r.name, c, err, b.ICRC)
		}
		if m, ok := pkt.Layer(LayerTypeMAD).(*MAD); ok {
			mads++
			if m.MgmtClass != mad.ClassCM || !bytes.Equal(m.Contents, want.Payload()) {
				t.Errorf("%s: MAD layer %+v", r.name, m.HeaderFields)
			}
		} else if want.PayloadLen() > 0 {
			pl, ok := pkt.Layer(gopacket.LayerTypePayload).(*gopacket.Payload)
			if !ok || !bytes.Equal(pl.Payload(), want.Payload()) {
				t.Errorf("%s: payload layer differs from wire's payload", r.name)
			}
		}
	}
	if roce == 0 || mads == 0 {
		t.Fatalf("%d RoCEv2 packets, %d MADs", roce, mads)
	}
	t.Logf("%d RoCEv2 packets (%d MADs), opcodes %v", roce, mads, seen)
}

// checkExtLayers checks that pkt has one layer per extension header of want, in wire order, with the
// fields wire decodes.
func checkExtLayers(t *testing.T, name string, pkt gopacket.Packet, want wire.Frame) {
	t.Helper()
	f := want.Fields()
	var got []gopacket.LayerType
	after := false
	for _, l := range pkt.Layers() {
		if l.LayerType() == LayerTypeBTH {
			after = true
			continue
		}
		if after && l.LayerType() != gopacket.LayerTypePayload && l.LayerType() != LayerTypeMAD {
			got = append(got, l.LayerType())
		}
		switch l := l.(type) {
		case *RETH:
			if l.RETHFields != f.RETH {
				t.Errorf("%s: RETH %+v, want %+v", name, l.RETHFields, f.RETH)
			}
		case *AETH:
			if l.AETHFields != f.AETH {
				t.Errorf("%s: AETH %+v, want %+v", name, l.AETHFields, f.AETH)
			}
		case *DETH:
			if l.DETHFields != f.DETH {
				t.Errorf("%s: DETH %+v, want %+v", name, l.DETHFields, f.DETH)
			}
		case *AtomicETH:
			if l.AtomicETHFields != f.AtomicETH {
				t.Errorf("%s: AtomicETH %+v, want %+v", name, l.AtomicETHFields, f.AtomicETH)
			}
		case *AtomicAckETH:
			if l.OrigData != f.AtomicAck {
				t.Errorf("%s: AtomicAckETH %#x, want %#x", name, l.OrigData, f.AtomicAck)
			}
		case *ImmDt:
			if l.Imm != f.Imm {
				t.Errorf("%s: ImmDt %#x, want %#x", name, l.Imm, f.Imm)
			}
		case *IETH:
			if l.RKey != f.IETH {
				t.Errorf("%s: IETH %v, want %v", name, l.RKey, f.IETH)
			}
		}
	}
	var wantTypes []gopacket.LayerType
	for h := wire.Header(0); int(h) < len(extLayerType); h++ {
		if want.Has(h) {
			wantTypes = append(wantTypes, *extLayerType[h])
		}
	}
	if len(got) != len(wantTypes) {
		t.Errorf("%s: extension layers %v, want %v", name, got, wantTypes)
		return
	}
	for i := range got {
		if got[i] != wantTypes[i] {
			t.Errorf("%s: extension layers %v, want %v", name, got, wantTypes)
		}
	}
}

// TestRoundTrip decodes every RoCEv2 frame of the golden captures and serializes its layers again: the
// bytes must be the captured ones.
func TestRoundTrip(t *testing.T) {
	n := 0
	for _, r := range readCaptures(t) {
		pkt := gopacket.NewPacket(r.data, r.link, gopacket.Default)
		if _, ok := pkt.Layer(LayerTypeBTH).(*BTH); !ok {
			continue
		}
		var ls []gopacket.SerializableLayer
		for _, l := range pkt.Layers() {
			sl, ok := l.(gopacket.SerializableLayer)
			if !ok {
				t.Fatalf("%s: layer %v is not serializable", r.name, l.LayerType())
			}
			ls = append(ls, sl)
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, ls...); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		// Ethernet padding after the IP packet is not a layer's; compare up to the IP length.
		if got := buf.Bytes(); !bytes.Equal(got, r.data[:len(got)]) {
			t.Errorf("%s: re-serialized\n got %x\nwant %x", r.name, got, r.data)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no RoCEv2 packets")
	}
}

// TestBuild serializes RoCEv2 packets from fields, with FixLengths and SetICRC, over IPv4 and IPv6; wire
// must accept them and read the fields back.
func TestBuild(t *testing.T) {
	payload := []byte("hello, rdma") // 11 bytes: one pad byte
	for _, v6 := range []bool{false, true} {
		eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
			EthernetType: layers.EthernetTypeIPv4}
		var ip gopacket.NetworkLayer
		if v6 {
			eth.EthernetType = layers.EthernetTypeIPv6
			ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
				SrcIP: net.ParseIP("fe80::1"), DstIP: net.ParseIP("fe80::2")}
		} else {
			ip = &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
				SrcIP: net.IPv4(10, 0, 0, 1), DstIP: net.IPv4(10, 0, 0, 2)}
		}
		udp := &layers.UDP{SrcPort: 49152, DstPort: wire.UDPPort}
		bth := &BTH{BTHFields: wire.BTHFields{Opcode: wire.RCWriteOnlyImm, PKey: wire.DefaultPKey, DestQP: 0x11,
			AckReq: true, PSN: 0xfffffe}}
		reth := &RETH{RETHFields: wire.RETHFields{VA: 0x7f0000001000, RKey: 0x1234, DMALen: uint32(len(payload))}}
		imm := &ImmDt{Imm: 0xdeadbeef}
		buf := gopacket.NewSerializeBuffer()
		opts := gopacket.SerializeOptions{FixLengths: true} // RoCEv2 leaves the UDP checksum 0
		if err := gopacket.SerializeLayers(buf, opts, eth, ip.(gopacket.SerializableLayer), udp, bth, reth, imm,
			gopacket.Payload(payload)); err != nil {
			t.Fatal(err)
		}
		if err := SetICRC(buf.Bytes()[14:]); err != nil {
			t.Fatal(err)
		}
		f, err := wire.ParseIP(buf.Bytes()[14:])
		if err != nil {
			t.Fatalf("v6=%v: wire rejects the built packet: %v", v6, err)
		}
		got := f.Fields()
		if got.BTH.PadCnt != 1 || got.BTH.PSN != 0xfffffe || got.RETH != reth.RETHFields || got.Imm != 0xdeadbeef ||
			!bytes.Equal(f.Payload(), payload) {
			t.Errorf("v6=%v: built %+v", v6, got)
		}
		pkt := gopacket.NewPacket(buf.Bytes(), layers.LayerTypeEthernet, gopacket.Default)
		if err := VerifyICRC(pkt); err != nil {
			t.Errorf("v6=%v: VerifyICRC: %v", v6, err)
		}
	}
}

// udpFrame wraps a transport packet in Ethernet, IPv4 and UDP headers with consistent lengths.
func udpFrame(t testing.TB, tp []byte) []byte {
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
		&layers.Ethernet{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6), EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IPv4(10, 0, 0, 1), DstIP: net.IPv4(10, 0, 0, 2)},
		&layers.UDP{SrcPort: 49152, DstPort: wire.UDPPort}, gopacket.Payload(tp))
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestMalformed checks that packets wire rejects decode to a DecodeFailure carrying wire's error.
func TestMalformed(t *testing.T) {
	ack := (&wire.BTHFields{Opcode: wire.RCAcknowledge, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 5}).Append(nil)
	ack = append(ack, 0x1f, 0, 0, 1, 0, 0, 0, 0) // AETH and ICRC
	for _, c := range []struct {
		name string
		tp   []byte
		want error
	}{
		{"short", ack[:10], wire.ErrTruncated},
		{"headers", ack[:12], wire.ErrTruncated},
		{"opcode", append([]byte{0x1f}, ack[1:]...), wire.ErrBadOpcode},
		{"unaligned", append(ack[:len(ack):len(ack)], 0), wire.ErrBadLength},
		{"payload", append(ack[:len(ack):len(ack)], 0, 0, 0, 0), wire.ErrBadLength},
	} {
		pkt := gopacket.NewPacket(udpFrame(t, c.tp), layers.LayerTypeEthernet, gopacket.DecodeOptions{SkipDecodeRecovery: true})
		el := pkt.ErrorLayer()
		if el == nil || !errors.Is(el.Error(), c.want) {
			t.Errorf("%s: error layer %v, want %v", c.name, el, c.want)
		}
	}
	pkt := gopacket.NewPacket(udpFrame(t, ack), layers.LayerTypeEthernet, gopacket.Default)
	if err := VerifyICRC(pkt); !errors.Is(err, wire.ErrICRC) {
		t.Errorf("zero ICRC: VerifyICRC = %v, want ErrICRC", err)
	}
}

// TestTruncatedCapture cuts captured frames short, as a small snaplen does: the BTH and the extension
// headers wholly present still decode, and the ICRC reports ErrTruncated rather than a mismatch.
func TestTruncatedCapture(t *testing.T) {
	const ethIPUDP = 14 + 20 + 8
	for _, r := range readFile(t, "../testdata/write_bw.pcap")[:12] {
		full := gopacket.NewPacket(r.data, layers.LayerTypeEthernet, gopacket.Default)
		want, ok := full.Layer(LayerTypeBTH).(*BTH)
		if !ok {
			continue
		}
		for cut := ethIPUDP + wire.BTHLen; cut < len(r.data) && cut < ethIPUDP+64; cut++ {
			pkt := gopacket.NewPacket(r.data[:cut], layers.LayerTypeEthernet, gopacket.DecodeOptions{SkipDecodeRecovery: true})
			b, ok := pkt.Layer(LayerTypeBTH).(*BTH)
			if !ok || !b.Truncated || b.BTHFields != want.BTHFields {
				t.Fatalf("%s cut to %d: BTH %+v (layers %v)", r.name, cut, b, pkt.Layers())
			}
			if el := pkt.ErrorLayer(); el != nil {
				t.Errorf("%s cut to %d: error %v", r.name, cut, el.Error())
			}
			off, hasRETH := want.Opcode.Info().Offset(wire.HdrRETH)
			_, gotRETH := pkt.Layer(LayerTypeRETH).(*RETH)
			if hasRETH && gotRETH != (cut >= ethIPUDP+off+wire.RETHLen) {
				t.Errorf("%s cut to %d: RETH layer present %v", r.name, cut, gotRETH)
			}
			if err := VerifyICRC(pkt); !errors.Is(err, wire.ErrTruncated) {
				t.Errorf("%s cut to %d: VerifyICRC = %v, want ErrTruncated", r.name, cut, err)
			}
		}
	}
}

// FuzzDecode decodes arbitrary transport packets and arbitrary Ethernet frames. A transport packet decodes
// with gopacket's panic recovery off, and every decode error must be one of wire's or mad's. A frame
// decodes with recovery on, because some of gopacket's own layers panic on garbage (the seed corpus has a
// Cisco Discovery Protocol frame that does); no recovered panic may come from goroce's code.
func FuzzDecode(f *testing.F) {
	seen := map[wire.Opcode]bool{}
	for _, r := range readFile(f, "../testdata/rping.pcap") {
		p := gopacket.NewPacket(r.data, r.link, gopacket.Default)
		if b, ok := p.Layer(LayerTypeBTH).(*BTH); ok && !seen[b.Opcode] {
			seen[b.Opcode] = true
			f.Add(b.Packet.Bytes(), false)
			f.Add(r.data, true)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, frame bool) {
		if frame {
			pkt := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
			_, _ = ComputeICRC(pkt)
			if df, ok := pkt.ErrorLayer().(*gopacket.DecodeFailure); ok && panickedIn(df.Dump(), "goroce/wire") {
				t.Fatalf("panic in goroce: %v\n%s", df.Error(), df.Dump())
			}
			return
		}
		pkt := gopacket.NewPacket(b, LayerTypeBTH, gopacket.DecodeOptions{SkipDecodeRecovery: true})
		_ = pkt.String()
		_, _ = ComputeICRC(pkt)
		if el := pkt.ErrorLayer(); el != nil {
			err := el.Error()
			if !errors.Is(err, wire.ErrTruncated) && !errors.Is(err, wire.ErrBadOpcode) &&
				!errors.Is(err, wire.ErrBadVersion) && !errors.Is(err, wire.ErrBadPad) &&
				!errors.Is(err, wire.ErrBadLength) && !errors.Is(err, wire.ErrPayloadTooLarge) &&
				!errors.Is(err, mad.ErrTruncated) && !errors.Is(err, mad.ErrBadVersion) {
				t.Fatalf("unmatchable error %v", err)
			}
		}
	})
}

// panickedIn reports whether the function that panicked, in a stack trace gopacket recovered, is in a
// package whose path contains pkg.
func panickedIn(stack, pkg string) bool {
	_, after, ok := strings.Cut(stack, "\npanic(")
	if !ok {
		return false
	}
	lines := strings.Split(after, "\n")
	return len(lines) > 2 && strings.Contains(lines[2], pkg) // lines: panic's file, the panicking function
}

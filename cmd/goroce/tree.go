package main

import (
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/goroce/goroce/interop/capture/explain"
	"github.com/goroce/goroce/wire/iblayer"
	"github.com/goroce/goroce/wire/mad"
)

// treeIndent lines the field tree up under the packet line's addresses.
const treeIndent = "                  "

// tree writes the -v field tree of pkt: one line per header with every field, then the payload's first
// bytes and the ICRC check.
func tree(l *line, pkt gopacket.Packet, icrc string) {
	node := func(format string, args ...any) {
		l.WriteString(treeIndent)
		fmt.Fprintf(l, format, args...)
		l.WriteByte('\n')
	}
	for _, x := range pkt.Layers() {
		switch x := x.(type) {
		case *layers.Ethernet:
			node("Ethernet %v > %v type=%v", x.SrcMAC, x.DstMAC, x.EthernetType)
		case *layers.LinuxSLL:
			node("LinuxSLL pkttype=%v addr=%v proto=%v", x.PacketType, x.Addr, x.EthernetType)
		case *layers.Dot1Q:
			node("802.1Q vlan=%d prio=%d type=%v", x.VLANIdentifier, x.Priority, x.Type)
		case *layers.IPv4:
			node("IPv4 %v > %v ihl=%d tos=%#02x len=%d id=%#04x flags=%v frag=%d ttl=%d proto=%v csum=%#04x",
				x.SrcIP, x.DstIP, x.IHL, x.TOS, x.Length, x.Id, x.Flags, x.FragOffset, x.TTL, x.Protocol, x.Checksum)
		case *layers.IPv6:
			node("IPv6 %v > %v tc=%#02x flow=%#05x len=%d next=%v hop=%d", x.SrcIP, x.DstIP, x.TrafficClass,
				x.FlowLabel, x.Length, x.NextHeader, x.HopLimit)
		case *layers.UDP:
			node("UDP %d > %d len=%d csum=%#04x", x.SrcPort, x.DstPort, x.Length, x.Checksum)
		case *layers.TCP:
			node("TCP %d > %d seq=%d ack=%d flags=%s win=%d csum=%#04x hlen=%d", x.SrcPort, x.DstPort, x.Seq,
				x.Ack, tcpFlags(x), x.Window, x.Checksum, x.DataOffset*4)
		case *iblayer.BTH:
			f := x.BTHFields
			node("BTH opcode=%#02x (%v) se=%d migreq=%d pad=%d tver=%d pkey=%#04x fecn=%d becn=%d resv6=%#x qp=%v ackreq=%d resv7=%#x psn=%v",
				uint8(f.Opcode), explain.OpcodeName(f.Opcode), b2i(f.SolicitedEvent), b2i(f.MigReq), f.PadCnt, f.TVer, uint16(f.PKey),
				b2i(f.FECN), b2i(f.BECN), f.Resv6, f.DestQP, b2i(f.AckReq), f.Resv7, f.PSN)
		case *iblayer.DETH:
			node("DETH qkey=%#08x resv8=%#x src-qp=%v", uint32(x.QKey), x.Resv8, x.SrcQP)
		case *iblayer.FETH:
			node("FETH bits=%#08x placement-type=%d selectivity=%d", x.Bits, x.PlacementType(), x.SelectivityLevel())
		case *iblayer.RETH:
			node("RETH va=%#016x rkey=%v dmalen=%d", x.VA, x.RKey, x.DMALen)
		case *iblayer.AtomicETH:
			node("AtomicETH va=%#016x rkey=%v swap-add=%#016x compare=%#016x", x.VA, x.RKey, x.SwapAdd, x.Compare)
		case *iblayer.AETH:
			node("AETH syndrome=%#02x (%v) msn=%d", uint8(x.Syndrome), x.Syndrome, x.MSN)
		case *iblayer.AtomicAckETH:
			node("AtomicAckETH orig=%#016x", x.OrigData)
		case *iblayer.ImmDt:
			node("ImmDt imm=%#08x", x.Imm)
		case *iblayer.IETH:
			node("IETH rkey=%v", x.RKey)
		case *iblayer.CNP:
			node("CNP reserved=%x", x.Reserved)
		case *iblayer.MAD:
			madTree(node, x.MAD)
		case *gopacket.Payload:
			node("Payload %d bytes: %s", len(*x), hexPrefix(*x, 32))
		case *gopacket.DecodeFailure:
			node("error: %v", x.Error())
		default:
			node("%v %d bytes", x.LayerType(), len(x.LayerContents()))
		}
	}
	if icrc != "" {
		node("%s", icrc)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hexPrefix shows the first n bytes of b in hex, in groups of 4.
func hexPrefix(b []byte, n int) string {
	var s []byte
	for i, c := range b[:min(len(b), n)] {
		if i > 0 && i%4 == 0 {
			s = append(s, ' ')
		}
		s = fmt.Appendf(s, "%02x", c)
	}
	if len(b) > n {
		s = append(s, "..."...)
	}
	return string(s)
}

// madTree writes the MAD header and the fields of the CM messages.
func madTree(node func(string, ...any), m mad.MAD) {
	h := m.Header()
	node("MAD base=%d class=%v (%#02x) classver=%d method=%v (%#02x) status=%#04x classspec=%#04x tid=%#016x attr=%s (%v) attrmod=%#08x",
		h.BaseVersion(), h.MgmtClass(), uint8(h.MgmtClass()), h.ClassVersion(), h.Method(), uint8(h.Method()),
		h.Status(), h.ClassSpecific(), h.TransactionID(), h.AttributeName(), h.AttributeID(), h.AttributeModifier())
	switch {
	case m.REQ() != nil:
		r := m.REQ()
		node("CM REQ local-comm=%#08x service=%#016x ca-guid=%#016x qpn=%v resp-res=%d init-depth=%d transport=%d psn=%v retry=%d pkey=%#04x mtu=%v rnr-retry=%d",
			r.LocalCommID(), r.ServiceID(), r.LocalCAGUID(), r.LocalQPN(), r.ResponderResources(),
			r.InitiatorDepth(), r.TransportServiceType(), r.StartingPSN(), r.RetryCount(), uint16(r.PKey()),
			r.PathMTU(), r.RNRRetryCount())
		node("CM REQ local-gid=%v remote-gid=%v private=%s", r.LocalGID(), r.RemoteGID(), hexPrefix(r.PrivateData(), 36))
	case m.REP() != nil:
		r := m.REP()
		node("CM REP local-comm=%#08x remote-comm=%#08x qpn=%v psn=%v resp-res=%d init-depth=%d rnr-retry=%d ca-guid=%#016x",
			r.LocalCommID(), r.RemoteCommID(), r.LocalQPN(), r.StartingPSN(), r.ResponderResources(),
			r.InitiatorDepth(), r.RNRRetryCount(), r.LocalCAGUID())
	case m.REJ() != nil:
		r := m.REJ()
		node("CM REJ local-comm=%#08x remote-comm=%#08x rejected=%d reason=%v ari=%x", r.LocalCommID(),
			r.RemoteCommID(), r.MessageRejected(), r.Reason(), r.ARI())
	case m.DREQ() != nil:
		r := m.DREQ()
		node("CM DREQ local-comm=%#08x remote-comm=%#08x remote-qpn=%v", r.LocalCommID(), r.RemoteCommID(), r.RemoteQPN())
	case m.RTU() != nil, m.DREP() != nil:
		r := mad.Comm(m.Data())
		node("CM %s local-comm=%#08x remote-comm=%#08x", h.AttributeName(), r.LocalCommID(), r.RemoteCommID())
	}
}

package main

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/goroce/goroce/interop/capture/explain"
	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/iblayer"
	"github.com/goroce/goroce/wire/mad"
)

// oobPort is the TCP port ibv_rc_pingpong and perftest exchange their QP numbers and PSNs on.
// rdma-core libibverbs/examples/rc_pingpong.c; perftest DEF_PORT.
const oobPort = 18515

// line collects the words of one output line.
type line struct{ strings.Builder }

func (l *line) word(s string) {
	if l.Len() > 0 {
		l.WriteByte(' ')
	}
	l.WriteString(s)
}

func (l *line) wordf(format string, args ...any) { l.word(fmt.Sprintf(format, args...)) }

// packet decodes one captured packet, updates the counts and flows, and prints its line (and with -v its
// field tree).
func (d *dumper) packet(n int, ci gopacket.CaptureInfo, data []byte, dec gopacket.Decoder) {
	c := d.cur
	c.counts.packets++
	if c.counts.packets == 1 {
		c.start = ci.Timestamp
	}
	pkt := gopacket.NewPacket(data, dec, gopacket.DecodeOptions{NoCopy: true})
	var l line
	l.WriteString(fmt.Sprintf("%5d %10.6f", n, ci.Timestamp.Sub(c.start).Seconds()))
	cut := ""
	if ci.CaptureLength < ci.Length {
		cut = fmt.Sprintf("truncated capture (%d of %d bytes)", ci.CaptureLength, ci.Length)
	}
	src, dst := addrs(pkt)
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
	var icrc string
	switch {
	case udp != nil && udp.DstPort == wire.UDPPort:
		l.word(netip.AddrPortFrom(src, uint16(udp.SrcPort)).String() + " > " +
			netip.AddrPortFrom(dst, uint16(udp.DstPort)).String())
		icrc = d.roce(&l, pkt, src, dst, udp, cut)
	case tcp != nil:
		c.counts.tcp++
		l.word(netip.AddrPortFrom(src, uint16(tcp.SrcPort)).String() + " > " +
			netip.AddrPortFrom(dst, uint16(tcp.DstPort)).String())
		d.tcpLine(&l, tcp, src, dst)
		if cut != "" {
			l.word(cut)
		}
	default:
		c.counts.other++
		l.word("other: " + describeOther(pkt, src, dst))
		if cut != "" {
			l.word(cut)
		}
	}
	if d.note != "" {
		l.word("[" + d.note + "]")
	}
	if d.holding() {
		h := &heldPacket{n: n, at: ci.Timestamp.Sub(c.start), line: l.String()}
		if d.opts.verbose || d.opts.keep {
			var t line
			tree(&t, pkt, icrc)
			h.tree = t.String()
		}
		if udp != nil && udp.DstPort == wire.UDPPort {
			h.roce = &explain.Packet{Frame: n, At: ci.Timestamp, Src: netip.AddrPortFrom(src, uint16(udp.SrcPort)),
				Dst: netip.AddrPortFrom(dst, uint16(udp.DstPort)), Data: udp.Payload, Comments: d.comments}
			switch ip := pkt.NetworkLayer().(type) {
			case *layers.IPv4:
				h.roce.ECN, h.roce.IPLen = ip.TOS&3, int(ip.Length)
			case *layers.IPv6:
				h.roce.ECN, h.roce.IPLen = ip.TrafficClass&3, 40+int(ip.Length)
			}
		}
		d.held = append(d.held, h)
		return
	}
	if d.opts.qpOnly {
		return
	}
	l.WriteByte('\n')
	if d.opts.verbose {
		tree(&l, pkt, icrc)
	}
	fmt.Fprint(d.w, l.String())
}

// addrs returns the IP source and destination of pkt, or invalid addresses.
func addrs(pkt gopacket.Packet) (src, dst netip.Addr) {
	switch n := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		return ipAddr(n.SrcIP), ipAddr(n.DstIP)
	case *layers.IPv6:
		return ipAddr(n.SrcIP), ipAddr(n.DstIP)
	}
	return
}

func ipAddr(ip net.IP) netip.Addr {
	if v4 := ip.To4(); v4 != nil && len(ip) == net.IPv4len {
		ip = v4
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

// roce describes a packet to UDP port 4791 and returns the text of its ICRC check for the field tree.
func (d *dumper) roce(l *line, pkt gopacket.Packet, src, dst netip.Addr, udp *layers.UDP, cut string) string {
	c := &d.cur.counts
	c.roce++
	b, ok := pkt.Layer(iblayer.LayerTypeBTH).(*iblayer.BTH)
	if !ok {
		if el := pkt.ErrorLayer(); el != nil && cut == "" {
			c.malformed++
			l.word("RoCEv2 malformed: " + el.Error().Error())
			return ""
		}
		c.truncated++
		if cut == "" {
			cut = "truncated"
		}
		l.word("RoCEv2 " + cut + ", BTH not captured")
		return ""
	}
	info := b.Opcode.Info()
	l.word(explain.OpcodeName(b.Opcode))
	l.word("qp=" + b.DestQP.String())
	l.word("psn=" + b.PSN.String())
	flags(l, b)

	var syn wire.Syndrome
	hasAETH := false
	payload := -1
	var payloadBytes []byte
	var madLayer *iblayer.MAD
	for _, x := range pkt.Layers() {
		switch x := x.(type) {
		case *iblayer.DETH:
			l.wordf("qkey=%#08x src-qp=%v", uint32(x.QKey), x.SrcQP)
		case *iblayer.FETH:
			l.wordf("flush-type=%d level=%d", x.PlacementType(), x.SelectivityLevel())
		case *iblayer.RETH:
			l.wordf("va=%#x rkey=%v len=%d", x.VA, x.RKey, x.DMALen)
		case *iblayer.AtomicETH:
			l.wordf("va=%#x rkey=%v", x.VA, x.RKey)
			if b.Opcode == wire.RCCompareSwap {
				l.wordf("compare=%#x swap=%#x", x.Compare, x.SwapAdd)
			} else {
				l.wordf("add=%#x", x.SwapAdd)
			}
		case *iblayer.AETH:
			syn, hasAETH = x.Syndrome, true
			l.wordf("%v msn=%d", x.Syndrome, x.MSN)
		case *iblayer.AtomicAckETH:
			l.wordf("orig=%#x", x.OrigData)
		case *iblayer.ImmDt:
			l.wordf("imm=%#08x", x.Imm)
		case *iblayer.IETH:
			l.wordf("inv-rkey=%v", x.RKey)
		case *gopacket.Payload:
			payload, payloadBytes = len(*x), *x
		case *iblayer.MAD:
			madLayer = x
			payload = len(x.Contents)
		}
	}
	if !b.Truncated {
		if payload < 0 {
			payload = 0
		}
		if info.Payload {
			l.wordf("payload=%d", payload)
		}
	} else if full := int(udp.Length) - wire.UDPHeaderLen - int(info.HeaderLen) - int(b.PadCnt) - wire.ICRCLen; info.Valid() && info.Payload && full >= 0 {
		payload = full // the lengths in the IP and UDP headers say what the capture left out
		l.wordf("payload=%d", payload)
	}
	if madLayer != nil {
		l.word("MAD " + madLayer.MAD.String())
	} else if b.Truncated && b.DestQP == wire.QPNGSI && info.Transport == wire.TransportUD {
		if h, err := mad.ParseHeader(payloadBytes); err == nil {
			l.word("MAD " + h.MgmtClass().String() + " " + h.AttributeName() + " (cut short)")
		}
	}

	f := d.cur.flows.get(flowKey{src: src, dst: dst, qpn: b.DestQP, role: roleOf(b.Opcode)})
	if f.observe(b.BTHFields, max(payload, 0), syn, hasAETH) {
		if f.key.role == roleRequest {
			l.word("retransmit")
		} else {
			l.word("duplicate")
		}
	}

	if b.Truncated {
		c.truncated++
		f.truncated++
		if cut == "" {
			cut = "truncated"
		}
		l.word(cut)
		return "ICRC not captured"
	}
	if el := pkt.ErrorLayer(); el != nil { // after a BTH only the MAD can fail
		c.malformed++
		l.word("MAD malformed: " + el.Error().Error())
	}
	want, err := iblayer.ComputeICRC(pkt)
	switch {
	case err != nil:
		c.malformed++
		l.word("icrc unchecked: " + err.Error())
		return "ICRC unchecked: " + err.Error()
	case want == b.ICRC:
		c.icrcOK++
		l.word("icrc ok")
		return fmt.Sprintf("ICRC %#08x ok", b.ICRC)
	default:
		c.icrcBad++
		f.icrcBad++
		s := fmt.Sprintf("icrc BAD (want %#08x, got %#08x)", want, b.ICRC)
		l.word(s)
		return "ICRC " + s[5:]
	}
}

// flags writes the BTH bits worth a word: those that are set, and the fields that differ from what every
// RoCE peer sends.
func flags(l *line, b *iblayer.BTH) {
	if b.AckReq {
		l.word("ack-req")
	}
	if b.SolicitedEvent {
		l.word("se")
	}
	if b.FECN {
		l.word("fecn")
	}
	if b.BECN {
		l.word("becn")
	}
	if b.PKey != wire.DefaultPKey {
		l.wordf("pkey=%#04x", uint16(b.PKey))
	}
	if b.TVer != wire.TransportVersion {
		l.wordf("tver=%d", b.TVer)
	}
}

// tcpKey names one direction of a TCP connection.
type tcpKey struct{ src, dst netip.AddrPort }

// tcpLine describes a TCP segment the way tcpdump does, with sequence numbers relative to the first one
// seen in each direction, and the out-of-band messages of ibv_rc_pingpong and perftest in words.
func (d *dumper) tcpLine(l *line, t *layers.TCP, src, dst netip.Addr) {
	k := tcpKey{netip.AddrPortFrom(src, uint16(t.SrcPort)), netip.AddrPortFrom(dst, uint16(t.DstPort))}
	isn, ok := d.cur.tcp[k]
	if !ok {
		isn = t.Seq
		d.cur.tcp[k] = isn
	}
	l.word("TCP " + tcpFlags(t))
	seq := t.Seq - isn
	if n := len(t.Payload); n > 0 {
		l.wordf("seq=%d:%d", seq, seq+uint32(n))
	} else {
		l.wordf("seq=%d", seq)
	}
	if t.ACK {
		ack := t.Ack
		if risn, ok := d.cur.tcp[tcpKey{k.dst, k.src}]; ok {
			ack -= risn
		}
		l.wordf("ack=%d", ack)
	}
	l.wordf("len=%d", len(t.Payload))
	if len(t.Payload) > 0 && (t.SrcPort == oobPort || t.DstPort == oobPort) {
		l.word("OOB " + describeOOB(t.Payload))
	}
}

func tcpFlags(t *layers.TCP) string {
	var b strings.Builder
	b.WriteByte('[')
	for _, f := range []struct {
		set bool
		c   byte
	}{{t.SYN, 'S'}, {t.FIN, 'F'}, {t.PSH, 'P'}, {t.RST, 'R'}, {t.URG, 'U'}, {t.ECE, 'E'}, {t.CWR, 'W'}, {t.ACK, '.'}} {
		if f.set {
			b.WriteByte(f.c)
		}
	}
	if b.Len() == 1 {
		b.WriteString("none")
	}
	b.WriteByte(']')
	return b.String()
}

// describeOOB shows an out-of-band message: its text when it is printable (trailing NULs dropped), decoded
// into LID, QPN, PSN and GID when it is an ibv_rc_pingpong or perftest connection message, or else its
// first bytes in hex.
func describeOOB(p []byte) string {
	t := bytes.TrimRight(p, "\x00")
	if len(t) == 0 || !printable(t) {
		s := fmt.Sprintf("%d bytes 0x%x", len(p), p[:min(len(p), 16)])
		if len(p) > 16 {
			s += "..."
		}
		return s
	}
	s := strconv.Quote(string(t))
	if len(t) < len(p) {
		s += fmt.Sprintf("+%d NUL", len(p)-len(t))
	}
	if m := decodeConnMsg(string(t)); m != "" {
		s += " (" + m + ")"
	}
	return s
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// decodeConnMsg decodes the connection messages of ibv_rc_pingpong, "%04x:%06x:%06x:%s" (LID, QPN, PSN,
// GID as 32 hex digits), and of perftest, "%04x:%04x:%06x:%06x:%08x:%016llx:" (LID, out_reads, QPN, PSN,
// rkey, vaddr) followed by 16 GID bytes as "%02x:" and the SRQ number. It returns "" for anything else.
// The formats are rdma-core's libibverbs/examples/rc_pingpong.c (pp_client_exch_dest) and perftest's
// KEY_PRINT_FMT_GID (src/perftest_communication.c and .h).
func decodeConnMsg(s string) string {
	f := strings.Split(s, ":")
	hexOK := func(i, n int) (uint64, bool) {
		if i >= len(f) || len(f[i]) != n {
			return 0, false
		}
		v, err := strconv.ParseUint(f[i], 16, 64)
		return v, err == nil
	}
	if len(f) == 4 {
		lid, ok1 := hexOK(0, 4)
		qpn, ok2 := hexOK(1, 6)
		psn, ok3 := hexOK(2, 6)
		gid, err := hex.DecodeString(f[3])
		if ok1 && ok2 && ok3 && err == nil && len(gid) == 16 {
			return fmt.Sprintf("rc_pingpong lid=%#04x qpn=%v psn=%v gid=%v", lid, wire.QPN(qpn), wire.PSN(psn),
				netip.AddrFrom16([16]byte(gid)))
		}
		return ""
	}
	if len(f) < 7 {
		return ""
	}
	lid, ok1 := hexOK(0, 4)
	reads, ok2 := hexOK(1, 4)
	qpn, ok3 := hexOK(2, 6)
	psn, ok4 := hexOK(3, 6)
	rkey, ok5 := hexOK(4, 8)
	va, ok6 := hexOK(5, 16)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return ""
	}
	s = fmt.Sprintf("perftest lid=%#04x out-reads=%d qpn=%v psn=%v rkey=%v va=%#x", lid, reads, wire.QPN(qpn),
		wire.PSN(psn), wire.RKey(rkey), va)
	if len(f) >= 6+16+1 {
		var gid [16]byte
		for i := range gid {
			v, ok := hexOK(6+i, 2)
			if !ok {
				return s
			}
			gid[i] = byte(v)
		}
		s += " gid=" + netip.AddrFrom16(gid).String()
	}
	return s
}

// describeOther names a packet that is neither RoCEv2 nor TCP: ARP in words, anything else by its layers.
func describeOther(pkt gopacket.Packet, src, dst netip.Addr) string {
	if a, ok := pkt.Layer(layers.LayerTypeARP).(*layers.ARP); ok {
		tip, _ := netip.AddrFromSlice(a.DstProtAddress)
		sip, _ := netip.AddrFromSlice(a.SourceProtAddress)
		if a.Operation == layers.ARPRequest {
			return fmt.Sprintf("ARP who-has %v tell %v", tip, sip)
		}
		return fmt.Sprintf("ARP reply %v is-at %v", sip, net.HardwareAddr(a.SourceHwAddress))
	}
	var names []string
	for _, x := range pkt.Layers() {
		names = append(names, x.LayerType().String())
	}
	s := strings.Join(names, "/")
	if src.IsValid() {
		s = fmt.Sprintf("%v > %v %s", src, dst, s)
	}
	if u, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
		s += fmt.Sprintf(" ports %d > %d", u.SrcPort, u.DstPort)
	}
	if el := pkt.ErrorLayer(); el != nil {
		s += " (" + el.Error().Error() + ")"
	}
	return fmt.Sprintf("%s, %d bytes", s, len(pkt.Data()))
}

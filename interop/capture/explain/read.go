package explain

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/google/gopacket/pcapgo"

	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/wire"
)

// Packet is one RoCEv2 packet of a capture, as Analyze takes it: the UDP payload and what the IP and UDP
// headers around it said.
type Packet struct {
	Frame    int            // its number in the capture, from 1, as dump and Wireshark count
	At       time.Time      // capture time
	Src, Dst netip.AddrPort // UDP source and destination
	ECN      uint8          // the IP header's ECN bits as captured: 3 is CE (congestion experienced)
	IPLen    int            // the IP packet's length, headers included, for rates
	Data     []byte         // the UDP payload: BTH through ICRC, as far as it was captured
	Comments []string       // pcapng packet comments, e.g. "lost: injected loss"
}

// Link types of the link layers FromLink decodes: LINKTYPE_ values of pcap and pcapng.
const (
	linkNull     = 0   // BSD loopback: a 4-byte address family in host order
	linkEthernet = 1   // Ethernet II, optionally 802.1Q tagged
	linkRaw      = 101 // raw IPv4 or IPv6
	linkLoop     = 108 // OpenBSD loopback: a 4-byte address family in network order
	linkSLL      = 113 // Linux cooked capture v1
	linkIPv4     = 228
	linkIPv6     = 229
	linkSLL2     = 276 // Linux cooked capture v2
)

// EtherTypes FromLink follows.
const (
	etherIPv4  = 0x0800
	etherIPv6  = 0x86DD
	etherVLAN  = 0x8100
	etherQinQ  = 0x88A8
	ipProtoUDP = 17
)

// FromLink decodes a captured frame of the given link type (a LINKTYPE_ value: Ethernet, Linux cooked,
// raw IP, loopback) down to UDP and reports whether it is a RoCEv2 packet, UDP to port 4791. The Packet
// refers to data; it does not copy it.
func FromLink(linkType uint16, data []byte) (Packet, bool) {
	ip, ok := ipOf(linkType, data)
	if !ok || len(ip) < 1 {
		return Packet{}, false
	}
	var p Packet
	var src, dst netip.Addr
	var udp []byte
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < 20 {
			return Packet{}, false
		}
		ihl := int(ip[0]&0x0F) * 4
		if ihl < 20 || len(ip) < ihl+8 || ip[9] != ipProtoUDP || binary.BigEndian.Uint16(ip[6:8])&0x1FFF != 0 {
			return Packet{}, false
		}
		p.ECN = ip[1] & 3
		p.IPLen = int(binary.BigEndian.Uint16(ip[2:4]))
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		udp = ip[ihl:]
	case 6:
		if len(ip) < 48 || ip[6] != ipProtoUDP {
			return Packet{}, false
		}
		p.ECN = (ip[1] >> 4) & 3
		p.IPLen = 40 + int(binary.BigEndian.Uint16(ip[4:6]))
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		udp = ip[40:]
	default:
		return Packet{}, false
	}
	dport := binary.BigEndian.Uint16(udp[2:4])
	if dport != wire.UDPPort {
		return Packet{}, false
	}
	p.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(udp[0:2]))
	p.Dst = netip.AddrPortFrom(dst, dport)
	p.Data = udp[wire.UDPHeaderLen:]
	if n := int(binary.BigEndian.Uint16(udp[4:6])) - wire.UDPHeaderLen; n >= 0 && n < len(p.Data) {
		p.Data = p.Data[:n] // an Ethernet trailer pads short frames
	}
	return p, true
}

// ipOf returns the IP packet a frame of the link type carries.
func ipOf(linkType uint16, b []byte) ([]byte, bool) {
	switch linkType {
	case linkEthernet:
		if len(b) < 14 {
			return nil, false
		}
		et, off := binary.BigEndian.Uint16(b[12:14]), 14
		for (et == etherVLAN || et == etherQinQ) && len(b) >= off+4 {
			et, off = binary.BigEndian.Uint16(b[off+2:off+4]), off+4
		}
		return b[off:], et == etherIPv4 || et == etherIPv6
	case linkSLL:
		if len(b) < 16 {
			return nil, false
		}
		et := binary.BigEndian.Uint16(b[14:16])
		return b[16:], et == etherIPv4 || et == etherIPv6
	case linkSLL2:
		if len(b) < 20 {
			return nil, false
		}
		et := binary.BigEndian.Uint16(b[0:2])
		return b[20:], et == etherIPv4 || et == etherIPv6
	case linkNull, linkLoop:
		if len(b) < 4 {
			return nil, false
		}
		return b[4:], true
	case linkRaw, linkIPv4, linkIPv6:
		return b, true
	}
	return nil, false
}

// ErrFormat is returned for a file that is neither pcap nor pcapng.
var ErrFormat = errors.New("explain: not a pcap or pcapng file")

// ReadFile reads the RoCEv2 packets of a pcap or pcapng file, numbered by their frame in the file, with
// their pcapng comments. Other packets are skipped but counted in the frame numbers.
func ReadFile(name string) ([]Packet, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f)
}

// Read reads the RoCEv2 packets of a pcap or pcapng stream; see ReadFile.
func Read(r io.Reader) ([]Packet, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic, err := br.Peek(4)
	if err != nil {
		return nil, ErrFormat
	}
	var pkts []Packet
	keep := func(frame int, at time.Time, link uint16, data []byte, comments []string) {
		if p, ok := FromLink(link, data); ok {
			p.Frame, p.At, p.Comments = frame, at, comments
			p.Data = bytes.Clone(p.Data)
			pkts = append(pkts, p)
		}
	}
	if string(magic) == "\x0a\x0d\x0d\x0a" {
		ng, err := capture.NewReader(br)
		if err != nil {
			return nil, err
		}
		for n := 1; ; n++ {
			rec, err := ng.Next()
			if err == io.EOF {
				return pkts, nil
			}
			if err != nil {
				return pkts, fmt.Errorf("packet %d: %w", n, err)
			}
			keep(n, rec.At, rec.LinkType, rec.Data, rec.Comments)
		}
	}
	pr, err := pcapgo.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	link := uint16(pr.LinkType())
	for n := 1; ; n++ {
		data, ci, err := pr.ReadPacketData()
		if err == io.EOF {
			return pkts, nil
		}
		if err != nil {
			return pkts, fmt.Errorf("packet %d: %w", n, err)
		}
		keep(n, ci.Timestamp, link, data, nil)
	}
}

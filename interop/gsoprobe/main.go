//go:build linux

// Command gsoprobe checks, on a real kernel path, which IPv4 identification and DF flag the datagrams
// of a UDP GSO send carry. It is a test tool for interop/gso_test.go, not a user command.
//
// goroce sends runs of equal-sized RoCEv2 packets with UDP GSO (UDP_SEGMENT = segment size) from an
// unconnected UDP socket with IP_MTU_DISCOVER = IP_PMTUDISC_DO. The RoCEv2 ICRC covers the IPv4
// identification and flags, so goroce must know the identification each segment will carry. The facts
// this tool checks, by looking at the datagrams where a receiver sees them:
//
//   - segment i of one GSO send call carries identification i (0, 1, 2, ... again from 0 at every
//     call) and DF, because the kernel segments in software and numbers the segments from the
//     super-packet's identification, which is 0 on an unconnected socket with DF;
//   - a plain datagram from the same socket carries identification 0 and DF;
//   - each segment arrives as a datagram of its own (nothing on the way coalesces or renumbers them);
//   - with -rocev2, a RoCEv2 receiver (rxe) accepts each segment's ICRC computed for identification i.
//
// Modes:
//
//	gsoprobe send -from IP:PORT -to IP:PORT [-seg 1200] [-n 8] [-calls 3] [-rocev2 [-icrc-id seq|zero]]
//	gsoprobe capture -port PORT -count K [-iface IFACE] [-gso-off IFACE] [-timeout 30s] [-ready FILE]
//	gsoprobe features -iface IFACE
//
// send writes calls GSO messages of n segments of seg bytes each, then one plain datagram of seg bytes.
// Every datagram's payload carries a marker: "GSOPROBE", the call (0xFFFF for the plain datagram), the
// segment index and n, big-endian 16-bit each. With -rocev2 each datagram is instead a RoCEv2 UD SEND
// to QP 1 (the GSI QP every RoCE device has) holding a 256-byte MAD that the MAD layer drops silently
// (a response nobody asked for), with the marker in the MAD's data, and an ICRC computed as if segment
// i carried identification i (-icrc-id seq, the prediction) or 0 (-icrc-id zero, a negative control).
//
// capture reads with an AF_PACKET socket (cooked, IPv4 only) and prints one line per received IPv4 UDP
// datagram to port: identification, DF, IPv4 total length, the marker, how many markers the datagram
// holds (more than one would mean coalesced segments) and, for port 4791, whether its ICRC matches its
// headers as received. It ends after count datagrams (exit 0) or at the timeout (exit 3). -gso-off
// turns tx-udp-segmentation off on an interface through SIOCETHTOOL (ETHTOOL_SFEATURES) for the
// capture's duration: on lo that makes the kernel segment before the capture point, as it does for a
// device without UDP segmentation offload.
//
// features prints an interface's offload features as ethtool -k does, read through SIOCETHTOOL (guests
// have no ethtool).
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "send":
		err = send(os.Args[2:])
	case "capture":
		err = capture(os.Args[2:])
	case "features":
		err = features(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gsoprobe:", err)
		var ec exitCode
		if errors.As(err, &ec) {
			os.Exit(int(ec))
		}
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: gsoprobe send|capture|features [flags] (see the package documentation)")
	os.Exit(2)
}

// exitCode is an error that asks for a particular exit status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// Payload marker.
var magic = []byte("GSOPROBE")

const (
	markerLen = 8 + 2 + 2 + 2
	plainCall = 0xFFFF // the call number of the plain datagram
)

func putMarker(b []byte, call, seg, n int) {
	copy(b, magic)
	binary.BigEndian.PutUint16(b[8:], uint16(call))
	binary.BigEndian.PutUint16(b[10:], uint16(seg))
	binary.BigEndian.PutUint16(b[12:], uint16(n))
}

// RoCEv2 layout of -rocev2 datagrams: BTH, DETH, a 256-byte MAD, ICRC. IBTA vol. 1, 9.2 and 9.3.
const (
	rocePort      = 4791
	bthLen        = 12
	dethLen       = 8
	madLen        = 256
	madHdrLen     = 24
	icrcLen       = 4
	roceSeg       = bthLen + dethLen + madLen + icrcLen // 280
	udSendOnly    = 0x64                                // UD SEND Only
	gsiQKey       = 0x80010000
	defaultPKey   = 0xFFFF
	ipv4HdrLen    = 20
	udpHdrLen     = 8
	ipv4DF        = 0x4000
	ipv4MF        = 0x2000
	ipv4OffMask   = 0x1FFF
	ipProtoUDP    = 17
	madPerfMgmt   = 0x04 // management class PerfMgmt
	madGetResp    = 0x81 // method GetResp: a response, routed by TID, dropped when no agent sent the request
	madBaseVer    = 1
	madClassVer   = 1
	roceSrcQP     = 0x000011
	roceDestQPGSI = 1
)

// send is the send mode.
func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	from := fs.String("from", "0.0.0.0:0", "local `IP:PORT` to bind (-rocev2 needs the IP)")
	to := fs.String("to", "", "destination `IP:PORT`")
	seg := fs.Int("seg", 0, "segment size in bytes (default 1200; 280 with -rocev2)")
	n := fs.Int("n", 8, "segments per GSO call")
	calls := fs.Int("calls", 3, "GSO calls")
	rocev2 := fs.Bool("rocev2", false, "send RoCEv2 UD SENDs of a MAD to QP 1 with a predicted ICRC")
	icrcID := fs.String("icrc-id", "seq", "identification the ICRC assumes: seq (segment index) or zero")
	gap := fs.Duration("gap", 20*time.Millisecond, "pause between calls")
	fs.Parse(args)

	dst, err := netip.ParseAddrPort(*to)
	if err != nil || !dst.Addr().Is4() {
		return fmt.Errorf("-to %q: want IPv4:PORT", *to)
	}
	src, err := netip.ParseAddrPort(*from)
	if err != nil || !src.Addr().Is4() {
		return fmt.Errorf("-from %q: want IPv4:PORT", *from)
	}
	if *seg == 0 {
		*seg = 1200
		if *rocev2 {
			*seg = roceSeg
		}
	}
	switch {
	case *rocev2 && *seg != roceSeg:
		return fmt.Errorf("-rocev2 sends %d-byte datagrams (BTH, DETH, 256-byte MAD, ICRC), not %d", roceSeg, *seg)
	case *rocev2 && src.Addr().IsUnspecified():
		return errors.New("-rocev2 needs -from with the source IP: the ICRC covers it")
	case *icrcID != "seq" && *icrcID != "zero":
		return fmt.Errorf("-icrc-id %q: want seq or zero", *icrcID)
	case *seg < markerLen || *n < 1 || *n*(*seg) > 65507:
		return fmt.Errorf("bad -seg %d / -n %d", *seg, *n)
	}

	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// DF on every datagram, and the kernel's fixed identification 0 on an unconnected socket.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
		return fmt.Errorf("IP_MTU_DISCOVER: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(src.Port()), Addr: src.Addr().As4()}); err != nil {
		return fmt.Errorf("bind %v: %w", src, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return err
	}
	src = netip.AddrPortFrom(src.Addr(), uint16(sa.(*unix.SockaddrInet4).Port))
	to4 := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	fmt.Printf("send: from %v to %v, unconnected, IP_PMTUDISC_DO, %d calls of %d segments of %d bytes, then 1 plain datagram\n",
		src, dst, *calls, *n, *seg)

	// datagram builds the payload of segment s of call c.
	datagram := func(b []byte, c, s int) {
		for i := range b {
			b[i] = byte(c*31 + s*7 + i)
		}
		if !*rocev2 {
			putMarker(b, c, s, *n)
			return
		}
		id := uint16(s)
		if *icrcID == "zero" || c == plainCall {
			id = 0
		}
		psn := uint32(c&0xFF)<<8 | uint32(s)
		buildRoCE(b, c, s, *n, psn)
		ip := ipv4Header(src.Addr(), dst.Addr(), id, len(b))
		udp := udpHeader(src.Port(), dst.Port(), len(b))
		binary.LittleEndian.PutUint32(b[len(b)-icrcLen:], icrc(ip, udp, b[:len(b)-icrcLen]))
	}

	oob := udpSegmentCmsg(uint16(*seg))
	buf := make([]byte, *n**seg)
	for c := 0; c < *calls; c++ {
		for s := 0; s < *n; s++ {
			datagram(buf[s**seg:(s+1)**seg], c, s)
		}
		w, err := unix.SendmsgN(fd, buf, oob, to4, 0)
		if err != nil {
			return fmt.Errorf("GSO call %d: sendmsg: %w", c, err)
		}
		fmt.Printf("send: call %d: one sendmsg of %d bytes with UDP_SEGMENT %d\n", c, w, *seg)
		time.Sleep(*gap)
	}
	plain := make([]byte, *seg)
	datagram(plain, plainCall, 0)
	if err := unix.Sendto(fd, plain, 0, to4); err != nil {
		return fmt.Errorf("plain datagram: %w", err)
	}
	fmt.Printf("send: plain datagram of %d bytes\n", len(plain))
	return nil
}

// udpSegmentCmsg returns the control message that makes one sendmsg a GSO send of size-byte segments.
func udpSegmentCmsg(size uint16) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], size)
	return b
}

// buildRoCE fills b (roceSeg bytes) with a UD SEND Only to QP 1 carrying a MAD, all but the ICRC.
func buildRoCE(b []byte, call, seg, n int, psn uint32) {
	clear(b)
	bth := b[:bthLen]
	bth[0] = udSendOnly
	bth[1] = 0 // SE 0, MigReq 0, PadCnt 0, TVer 0
	binary.BigEndian.PutUint16(bth[2:], defaultPKey)
	binary.BigEndian.PutUint32(bth[4:], roceDestQPGSI) // byte 4 reserved
	binary.BigEndian.PutUint32(bth[8:], psn&0xFFFFFF)  // AckReq 0
	deth := b[bthLen : bthLen+dethLen]
	binary.BigEndian.PutUint32(deth[0:], gsiQKey)
	binary.BigEndian.PutUint32(deth[4:], roceSrcQP)
	mad := b[bthLen+dethLen : bthLen+dethLen+madLen]
	mad[0], mad[1], mad[2], mad[3] = madBaseVer, madPerfMgmt, madClassVer, madGetResp
	// The TID's high half names the agent a response is for; no agent has 0xFFFFFFFF.
	binary.BigEndian.PutUint64(mad[8:], 0xFFFFFFFF_00000000|uint64(call)<<16|uint64(seg))
	putMarker(mad[madHdrLen:], call, seg, n)
}

// ipv4Header returns the IPv4 header Linux builds for a datagram of payload bytes from an unconnected
// socket with DF, with identification id. TOS, TTL and checksum are left 0: the ICRC masks them.
func ipv4Header(src, dst netip.Addr, id uint16, payload int) []byte {
	h := make([]byte, ipv4HdrLen)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(ipv4HdrLen+udpHdrLen+payload))
	binary.BigEndian.PutUint16(h[4:], id)
	binary.BigEndian.PutUint16(h[6:], ipv4DF)
	h[9] = ipProtoUDP
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return h
}

func udpHeader(sport, dport uint16, payload int) []byte {
	h := make([]byte, udpHdrLen)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(udpHdrLen+payload))
	return h
}

// icrc returns the RoCEv2 ICRC (IBTA Annex A17) of pkt (BTH up to the ICRC) sent with the IPv4 header ip
// and UDP header udp: CRC-32 over 8 bytes of 0xFF, the IPv4 header with TOS, TTL and checksum set to
// all ones, the UDP header with its checksum set to all ones, the BTH with byte 4 set to all ones, and
// the rest of pkt. It goes on the wire little-endian. Linux rxe computes the same (rxe_icrc.c).
func icrc(ip, udp, pkt []byte) uint32 {
	var h []byte
	h = append(h, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	h = append(h, ip...)
	h[8+1], h[8+8], h[8+10], h[8+11] = 0xFF, 0xFF, 0xFF, 0xFF
	h = append(h, udp...)
	h[len(h)-2], h[len(h)-1] = 0xFF, 0xFF
	h = append(h, pkt[:bthLen]...)
	h[len(h)-bthLen+4] = 0xFF
	crc := crc32.Update(0, crc32.IEEETable, h)
	return crc32.Update(crc, crc32.IEEETable, pkt[bthLen:])
}

// capture is the capture mode.
func capture(args []string) error {
	fs := flag.NewFlagSet("capture", flag.ExitOnError)
	port := fs.Int("port", 0, "UDP destination port to report")
	count := fs.Int("count", 0, "datagrams to wait for")
	iface := fs.String("iface", "", "interface to capture on (default: all)")
	gsoOff := fs.String("gso-off", "", "interface on which to turn tx-udp-segmentation off while capturing")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	ready := fs.String("ready", "", "file to create once the capture socket is bound")
	outgoing := fs.Bool("outgoing", false, "report outgoing datagrams too (on lo each is seen both ways)")
	fs.Parse(args)
	if *port <= 0 || *count <= 0 {
		return errors.New("capture needs -port and -count")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	if *gsoOff != "" {
		restore, err := setFeatures(*gsoOff, map[string]bool{"tx-udp-segmentation": false})
		if err != nil {
			return err
		}
		defer restore()
	}

	// ETH_P_ALL, not ETH_P_IP: the kernel shows outgoing packets only to ETH_P_ALL sockets
	// (net/core/dev.c, dev_queue_xmit_nit). Cooked (SOCK_DGRAM): each packet starts at its IP header.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return fmt.Errorf("AF_PACKET socket: %w", err)
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	ifindex := 0
	if *iface != "" {
		ifi, err := net.InterfaceByName(*iface)
		if err != nil {
			return err
		}
		ifindex = ifi.Index
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		return fmt.Errorf("bind AF_PACKET: %w", err)
	}
	if *ready != "" {
		if err := os.WriteFile(*ready, nil, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("capture: on %s for UDP port %d, %d datagrams\n", orAll(*iface), *port, *count)

	buf := make([]byte, 1<<16)
	seen := 0
	for seen < *count {
		if ctx.Err() != nil {
			fmt.Printf("capture: stopped (%v) after %d of %d datagrams\n", context.Cause(ctx), seen, *count)
			return exitCode(3)
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Protocol != htons(unix.ETH_P_IP) || ll.Pkttype == unix.PACKET_OUTGOING && !*outgoing {
			continue
		}
		line, ok := describe(buf[:n], *port)
		if !ok {
			continue
		}
		name := fmt.Sprint(ll.Ifindex)
		if ifi, err := net.InterfaceByIndex(ll.Ifindex); err == nil {
			name = ifi.Name
		}
		fmt.Printf("pkt dev=%s dir=%s %s\n", name, pktType(ll.Pkttype), line)
		seen++
	}
	fmt.Printf("capture: done, %d datagrams\n", seen)
	return nil
}

func orAll(s string) string {
	if s == "" {
		return "all interfaces"
	}
	return s
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func pktType(t uint8) string {
	switch t {
	case unix.PACKET_HOST:
		return "in"
	case unix.PACKET_OUTGOING:
		return "out"
	case unix.PACKET_BROADCAST:
		return "bcast"
	case unix.PACKET_MULTICAST:
		return "mcast"
	}
	return fmt.Sprint(t)
}

// describe returns the report line of an IPv4 packet p if it is a UDP datagram to port (or the first
// fragment of one).
func describe(p []byte, port int) (string, bool) {
	if len(p) < ipv4HdrLen || p[0]>>4 != 4 || p[9] != ipProtoUDP {
		return "", false
	}
	ihl := int(p[0]&0x0F) * 4
	if ihl < ipv4HdrLen || len(p) < ihl+udpHdrLen {
		return "", false
	}
	frag := binary.BigEndian.Uint16(p[6:])
	if frag&ipv4OffMask != 0 {
		return "", false // a later fragment: no UDP header to match; DF means there should be none
	}
	udp := p[ihl : ihl+udpHdrLen]
	if int(binary.BigEndian.Uint16(udp[2:])) != port {
		return "", false
	}
	payload := p[ihl+udpHdrLen:]
	var b strings.Builder
	fmt.Fprintf(&b, "id=%d df=%d mf=%d len=%d sport=%d udplen=%d", binary.BigEndian.Uint16(p[4:]),
		b2i(frag&ipv4DF != 0), b2i(frag&ipv4MF != 0), binary.BigEndian.Uint16(p[2:]),
		binary.BigEndian.Uint16(udp[0:]), binary.BigEndian.Uint16(udp[4:]))
	if i := bytes.Index(payload, magic); i >= 0 && len(payload) >= i+markerLen {
		m := payload[i:]
		call := binary.BigEndian.Uint16(m[8:])
		if call == plainCall {
			b.WriteString(" call=plain")
		} else {
			fmt.Fprintf(&b, " call=%d", call)
		}
		fmt.Fprintf(&b, " seg=%d of=%d", binary.BigEndian.Uint16(m[10:]), binary.BigEndian.Uint16(m[12:]))
	} else {
		b.WriteString(" call=none")
	}
	fmt.Fprintf(&b, " markers=%d", bytes.Count(payload, magic))
	if port == rocePort && len(payload) >= bthLen+icrcLen {
		n := len(payload) - icrcLen
		ok := icrc(p[:ihl], udp, payload[:n]) == binary.LittleEndian.Uint32(payload[n:])
		fmt.Fprintf(&b, " icrc=%s", map[bool]string{true: "ok", false: "bad"}[ok])
	}
	return b.String(), true
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// features is the features mode.
func features(args []string) error {
	fs := flag.NewFlagSet("features", flag.ExitOnError)
	iface := fs.String("iface", "", "interface")
	fs.Parse(args)
	if *iface == "" {
		return errors.New("features needs -iface")
	}
	ft, err := getFeatures(*iface)
	if err != nil {
		return err
	}
	for i, name := range ft.names {
		if name == "" {
			continue
		}
		fixed := ""
		if !ft.bit(ft.available, i) || ft.bit(ft.neverChanged, i) {
			fixed = " [fixed]"
		}
		req := ""
		if fixed == "" && ft.bit(ft.requested, i) != ft.bit(ft.active, i) {
			req = " [requested " + onOff(ft.bit(ft.requested, i)) + "]"
		}
		fmt.Printf("%s: %s%s%s\n", name, onOff(ft.bit(ft.active, i)), fixed, req)
	}
	return nil
}

func onOff(v bool) string {
	if v {
		return "on"
	}
	return "off"
}

// The ethtool ioctl interface (include/uapi/linux/ethtool.h), through SIOCETHTOOL.
const ethSSFeatures = 4 // ETH_SS_FEATURES: the string set of the netdev feature names

// featureSet is an interface's netdev features: names[i] is feature bit i, the masks are 32 bits a word.
type featureSet struct {
	names                                      []string
	available, requested, active, neverChanged []uint32
}

func (f *featureSet) bit(m []uint32, i int) bool { return m[i/32]>>(i%32)&1 != 0 }

// ethtool issues SIOCETHTOOL on iface with data, an ethtool command structure, and returns the
// ioctl's result.
func ethtool(iface string, data []byte) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// struct ifreq: the name, then a union (here ifr_data, a pointer) padded to 24 bytes.
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	copy(ifr.name[:unix.IFNAMSIZ-1], iface)
	ifr.data = unsafe.Pointer(&data[0])
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(data)
	if errno != 0 {
		return 0, fmt.Errorf("SIOCETHTOOL %#x on %s: %w", binary.NativeEndian.Uint32(data), iface, errno)
	}
	return int(r), nil
}

// getFeatures reads iface's feature names (ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS) and states
// (ETHTOOL_GFEATURES).
func getFeatures(iface string) (*featureSet, error) {
	ne := binary.NativeEndian
	// struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }
	info := make([]byte, 16+4)
	ne.PutUint32(info[0:], unix.ETHTOOL_GSSET_INFO)
	ne.PutUint64(info[8:], 1<<ethSSFeatures)
	if _, err := ethtool(iface, info); err != nil {
		return nil, err
	}
	if ne.Uint64(info[8:])&(1<<ethSSFeatures) == 0 {
		return nil, fmt.Errorf("%s: no feature strings", iface)
	}
	count := int(ne.Uint32(info[16:]))
	// struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[len * ETH_GSTRING_LEN]; }
	const gstringLen = 32
	strs := make([]byte, 12+count*gstringLen)
	ne.PutUint32(strs[0:], unix.ETHTOOL_GSTRINGS)
	ne.PutUint32(strs[4:], ethSSFeatures)
	ne.PutUint32(strs[8:], uint32(count))
	if _, err := ethtool(iface, strs); err != nil {
		return nil, err
	}
	f := &featureSet{names: make([]string, count)}
	for i := range count {
		s := strs[12+i*gstringLen : 12+(i+1)*gstringLen]
		if j := bytes.IndexByte(s, 0); j >= 0 {
			s = s[:j]
		}
		f.names[i] = string(s)
	}
	// struct ethtool_gfeatures { u32 cmd; u32 size; struct { u32 available, requested, active,
	// never_changed; } features[size]; }
	blocks := (count + 31) / 32
	gf := make([]byte, 8+blocks*16)
	ne.PutUint32(gf[0:], unix.ETHTOOL_GFEATURES)
	ne.PutUint32(gf[4:], uint32(blocks))
	if _, err := ethtool(iface, gf); err != nil {
		return nil, err
	}
	for b := range blocks {
		w := gf[8+b*16:]
		f.available = append(f.available, ne.Uint32(w[0:]))
		f.requested = append(f.requested, ne.Uint32(w[4:]))
		f.active = append(f.active, ne.Uint32(w[8:]))
		f.neverChanged = append(f.neverChanged, ne.Uint32(w[12:]))
	}
	return f, nil
}

// setFeatures requests the named features on or off on iface (ETHTOOL_SFEATURES), prints what became
// of them and returns a function that requests their former states again.
func setFeatures(iface string, want map[string]bool) (restore func(), err error) {
	ft, err := getFeatures(iface)
	if err != nil {
		return nil, err
	}
	idx := map[string]int{}
	for i, n := range ft.names {
		idx[n] = i
	}
	request := func(states map[string]bool) error {
		// struct ethtool_sfeatures { u32 cmd; u32 size; struct { u32 valid, requested; } features[size]; }
		ne := binary.NativeEndian
		blocks := len(ft.active)
		sf := make([]byte, 8+blocks*8)
		ne.PutUint32(sf[0:], unix.ETHTOOL_SFEATURES)
		ne.PutUint32(sf[4:], uint32(blocks))
		for name, on := range states {
			i, ok := idx[name]
			if !ok {
				return fmt.Errorf("%s has no feature %q", iface, name)
			}
			w := sf[8+i/32*8:]
			ne.PutUint32(w[0:], ne.Uint32(w[0:])|1<<(i%32))
			if on {
				ne.PutUint32(w[4:], ne.Uint32(w[4:])|1<<(i%32))
			}
		}
		r, err := ethtool(iface, sf)
		if err != nil {
			return err
		}
		if r&unix.ETHTOOL_F_UNSUPPORTED != 0 {
			return fmt.Errorf("%s: some of %v cannot be changed", iface, states)
		}
		return nil
	}
	old := map[string]bool{}
	for name := range want {
		i, ok := idx[name]
		if !ok {
			return nil, fmt.Errorf("%s has no feature %q", iface, name)
		}
		old[name] = ft.bit(ft.requested, i)
	}
	if err := request(want); err != nil {
		return nil, err
	}
	now, err := getFeatures(iface)
	if err != nil {
		return nil, err
	}
	for name := range want {
		fmt.Printf("features: %s %s: %s -> %s\n", iface, name, onOff(old[name]), onOff(now.bit(now.active, idx[name])))
	}
	return func() {
		if err := request(old); err != nil {
			fmt.Fprintln(os.Stderr, "gsoprobe: restoring features:", err)
			return
		}
		fmt.Printf("features: %s restored %v\n", iface, old)
	}, nil
}

//go:build linux

package netdev

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Egress returns the device a datagram to dst leaves through, as the kernel's routing decides it
// for the calling thread's network namespace: local addresses route through lo. An IPv4-mapped
// IPv6 address is looked up as the IPv4 address it maps; an IPv6 zone, by name or number, fixes
// the outgoing interface as it does for a socket. No privilege is needed.
//
// The errors wrap ErrNoRoute when the kernel has no usable route, ErrInvalidAddr for an address
// that cannot be looked up, and otherwise the failing call's errno.
func Egress(dst netip.Addr) (Device, error) {
	index, err := routeOIF(dst)
	if err != nil {
		return Device{}, fmt.Errorf("netdev: egress device for %v: %w", dst, err)
	}
	d, err := byIndex(index)
	if err != nil {
		return Device{}, fmt.Errorf("netdev: egress device for %v: %w", dst, err)
	}
	return d, nil
}

// byIndex describes the device with the given interface index.
func byIndex(index int) (Device, error) {
	name, parent, err := link(index)
	if err != nil {
		return Device{}, err
	}
	uso, err := udpSegmentation(name)
	if err != nil {
		return Device{}, err
	}
	d := Device{Index: index, Name: name, Hardware: parent || sysfsParent(name, index), USO: uso}
	if ifi, err := net.InterfaceByIndex(index); err == nil {
		d.MTU = ifi.MTU
	}
	return d, nil
}

// routeOIF asks the kernel, with RTM_GETROUTE, which interface a datagram to dst goes out of.
func routeOIF(dst netip.Addr) (int, error) {
	if !dst.IsValid() {
		return 0, ErrInvalidAddr
	}
	zone := dst.Zone()
	dst = dst.Unmap().WithZone("")
	family, bits := uint8(unix.AF_INET), uint8(32)
	if dst.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
	body := make([]byte, unix.SizeofRtMsg)
	body[0], body[1] = family, bits
	body = appendAttr(body, unix.RTA_DST, dst.AsSlice())
	if zone != "" {
		oif, err := zoneIndex(zone)
		if err != nil {
			return 0, err
		}
		body = appendAttr(body, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(oif)))
	}
	reply, err := rtnetlink(unix.RTM_GETROUTE, body, unix.RTM_NEWROUTE)
	if err != nil {
		// The kernel's answers for: no route (ENETUNREACH), an unreachable route (EHOSTUNREACH),
		// a prohibit route (EACCES), a blackhole route (EINVAL).
		if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) ||
			errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINVAL) {
			return 0, fmt.Errorf("%w: %w", ErrNoRoute, err)
		}
		return 0, err
	}
	return parseRoute(reply)
}

// parseRoute returns the output interface of an RTM_NEWROUTE reply (after its nlmsghdr).
func parseRoute(b []byte) (int, error) {
	if len(b) < unix.SizeofRtMsg {
		return 0, errors.New("short route reply")
	}
	switch typ := b[7]; typ {
	case unix.RTN_UNREACHABLE, unix.RTN_PROHIBIT, unix.RTN_BLACKHOLE, unix.RTN_THROW:
		return 0, fmt.Errorf("%w: route of type %d", ErrNoRoute, typ)
	}
	attrs, err := parseAttrs(b[unix.SizeofRtMsg:])
	if err != nil {
		return 0, fmt.Errorf("route reply: %w", err)
	}
	oif, ok := attrs[unix.RTA_OIF]
	if !ok {
		return 0, fmt.Errorf("%w: route has no output interface", ErrNoRoute)
	}
	if len(oif) != 4 {
		return 0, errors.New("route reply: malformed output interface")
	}
	index := binary.NativeEndian.Uint32(oif)
	if index == 0 || index > 1<<31-1 {
		return 0, fmt.Errorf("route reply: output interface index %d", index)
	}
	return int(index), nil
}

// zoneIndex returns the interface index an IPv6 zone names: an interface name or a number.
func zoneIndex(zone string) (int, error) {
	if n, err := strconv.ParseUint(zone, 10, 31); err == nil && n > 0 {
		return int(n), nil
	}
	ifi, err := net.InterfaceByName(zone)
	if err != nil {
		return 0, fmt.Errorf("%w: zone %q: %w", ErrInvalidAddr, zone, err)
	}
	return ifi.Index, nil
}

// link asks the kernel, with RTM_GETLINK, for the name of the interface with the given index and
// whether it has a parent (bus) device. Kernels before 5.15 never report a parent.
func link(index int) (name string, parent bool, err error) {
	// struct ifinfomsg: family, pad, type (u16), index (s32), flags (u32), change (u32).
	body := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	reply, err := rtnetlink(unix.RTM_GETLINK, body, unix.RTM_NEWLINK)
	if err != nil {
		return "", false, fmt.Errorf("interface %d: %w", index, err)
	}
	return parseLink(reply, index)
}

// parseLink reads an RTM_NEWLINK reply (after its nlmsghdr) for the interface with the given index.
func parseLink(b []byte, index int) (name string, parent bool, err error) {
	if len(b) < unix.SizeofIfInfomsg {
		return "", false, fmt.Errorf("interface %d: short link reply", index)
	}
	if got := int32(binary.NativeEndian.Uint32(b[4:])); int(got) != index {
		return "", false, fmt.Errorf("interface %d: link reply describes interface %d", index, got)
	}
	attrs, err := parseAttrs(b[unix.SizeofIfInfomsg:])
	if err != nil {
		return "", false, fmt.Errorf("interface %d: link reply: %w", index, err)
	}
	name = string(bytes.TrimRight(attrs[unix.IFLA_IFNAME], "\x00"))
	if name == "" {
		return "", false, fmt.Errorf("interface %d: link reply has no name", index)
	}
	_, parent = attrs[unix.IFLA_PARENT_DEV_NAME]
	return name, parent, nil
}

// sysfsParent reports whether /sys/class/net/NAME/device exists, for kernels too old to report
// IFLA_PARENT_DEV_NAME. It believes sysfs only when sysfs shows the interface under the same
// index, since a sysfs mounted from another network namespace shows that namespace's devices.
func sysfsParent(name string, index int) bool {
	if name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return false
	}
	dir := "/sys/class/net/" + name
	b, err := os.ReadFile(dir + "/ifindex")
	if err != nil {
		return false
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || n != index {
		return false
	}
	_, err = os.Stat(dir + "/device")
	return err == nil
}

// rtnetlink sends one request of type typ with the given body on a new NETLINK_ROUTE socket and
// returns the body of the kernel's reply of type want. A kernel error reply becomes its errno.
func rtnetlink(typ uint16, body []byte, want uint16) ([]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	const seq = 1 // the socket is ours alone and carries one request
	// struct nlmsghdr: len (u32), type (u16), flags (u16), seq (u32), pid (u32).
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		n, _, flags, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return nil, errors.New("netlink reply truncated")
		}
		reply, found, err := findReply(buf[:n], seq, want)
		if found {
			return reply, err
		}
	}
}

// findReply looks through one datagram of netlink messages for the answer to request seq: a
// message of type want, whose body it returns, or an error message. found is false when the
// datagram holds neither.
func findReply(b []byte, seq uint32, want uint16) (reply []byte, found bool, err error) {
	for len(b) > 0 {
		if len(b) < unix.SizeofNlMsghdr {
			return nil, true, errors.New("netlink: truncated message header")
		}
		n := binary.NativeEndian.Uint32(b[0:])
		if n < unix.SizeofNlMsghdr || uint64(n) > uint64(len(b)) {
			return nil, true, fmt.Errorf("netlink: message length %d in %d bytes", n, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		body := b[unix.SizeofNlMsghdr:n]
		if binary.NativeEndian.Uint32(b[8:]) == seq {
			switch typ {
			case want:
				return body, true, nil
			case unix.NLMSG_ERROR:
				if len(body) < 4 {
					return nil, true, errors.New("netlink: truncated error message")
				}
				if code := int32(binary.NativeEndian.Uint32(body)); code < 0 {
					return nil, true, unix.Errno(-code)
				}
				return nil, true, errors.New("netlink: acknowledgement without a reply")
			case unix.NLMSG_DONE:
				return nil, true, errors.New("netlink: no reply")
			}
		}
		b = b[min(align4(int(n)), len(b)):]
	}
	return nil, false, nil
}

// parseAttrs splits a run of netlink attributes (struct rtattr: len u16, type u16, payload,
// padding to 4 bytes) into a map by type, without the nested and byte-order flags. A type that
// occurs twice keeps its last payload.
func parseAttrs(b []byte) (map[uint16][]byte, error) {
	attrs := make(map[uint16][]byte)
	for len(b) > 0 {
		if len(b) < unix.SizeofRtAttr {
			return nil, errors.New("truncated attribute header")
		}
		n := int(binary.NativeEndian.Uint16(b[0:]))
		if n < unix.SizeofRtAttr || n > len(b) {
			return nil, fmt.Errorf("attribute length %d in %d bytes", n, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		attrs[typ] = b[unix.SizeofRtAttr:n]
		b = b[min(align4(n), len(b)):]
	}
	return attrs, nil
}

// appendAttr appends a netlink attribute of type typ with payload v, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, v []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.SizeofRtAttr+len(v)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	return append(b, make([]byte, align4(len(v))-len(v))...)
}

func align4(n int) int { return (n + 3) &^ 3 }

// Package netdev finds the network device a datagram to a destination leaves through, and whether
// that device cuts UDP GSO super-packets into segments itself.
//
// goroce sends runs of equal-sized RoCEv2 packets as one UDP GSO write (UDP_SEGMENT). The RoCEv2
// ICRC covers the IPv4 identification, so goroce must know the identification every segment will
// carry before it seals the segment's ICRC. That depends on who does the cutting:
//
//   - The kernel, in software. When the device a super-packet is handed to lacks the feature
//     NETIF_F_GSO_UDP_L4 ("tx-udp-segmentation"), validate_xmit_skb in net/core/dev.c sees that
//     the packet needs GSO and calls skb_gso_segment, which reaches inet_gso_segment in
//     net/ipv4/af_inet.c; that gives segment i the super-packet's identification plus i. A
//     super-packet from an unconnected IP_PMTUDISC_DO socket carries identification 0, so segment
//     i carries i, which goroce predicts. Virtual devices that do have the feature (lo, veth,
//     tun/tap...) hand the super-packet on whole, and where it is delivered locally the receive
//     path segments it in software the same way (udp_rcv_segment in include/net/udp.h, through
//     __skb_gso_segment); goroce has read identifications 0, 1, 2... on lo (see internal/conn).
//   - The NIC, in hardware, when the device is backed by real hardware and has the feature active.
//     The NIC then writes the identifications itself, and goroce cannot know them.
//
// So goroce asks Egress for the device toward each destination and uses GSO toward it only when
// Device.SegmentsInSoftware holds, unless told otherwise.
//
// The device's link MTU also bounds a queue pair's path MTU, as rxe derives its port's active MTU
// from its netdev's: Device.MTU toward a peer, LocalMTU for the address a device is bound to.
//
// Limitation: Egress reports the device the route names, and nothing beneath it. A virtual device
// with the feature active can pass a super-packet whole to a device of its own (a VLAN or macvlan
// to its lower device, a bridge or bond to its ports, a veth to its peer's namespace, which may
// forward it to a physical NIC), and that device's features decide. Such stacks are reported as
// segmenting in software.
package netdev

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// ErrNoRoute is wrapped by the error Egress returns when the kernel has no usable route to the
// destination: none at all, or one of type unreachable, prohibit, blackhole or throw. The kernel's
// errno, when it gave one, is wrapped beside it.
var ErrNoRoute = errors.New("no route to destination")

// ErrInvalidAddr is wrapped by the error Egress returns for the zero netip.Addr or an IPv6 zone
// that names no interface.
var ErrInvalidAddr = errors.New("invalid destination address")

// Device is a network device in the caller's network namespace, as far as UDP GSO cares.
type Device struct {
	// Index is the interface index.
	Index int
	// Name is the interface name, such as "lo" or "eth0".
	Name string
	// Hardware is true when the device is backed by a bus device (a PCI function, a virtio
	// device, a USB interface...): the kernel records a parent device for it, shown as the
	// symbolic link /sys/class/net/NAME/device and the rtnetlink attribute IFLA_PARENT_DEV_NAME.
	// Virtual devices (lo, veth, bridge, bond, tun/tap, vxlan, dummy, macvlan...) have none.
	Hardware bool
	// USO is true when "tx-udp-segmentation" (NETIF_F_GSO_UDP_L4) is among the device's active
	// features, as ethtool's ETHTOOL_GFEATURES reports them: the kernel then hands it UDP GSO
	// super-packets whole instead of segmenting them first.
	USO bool
	// MTU is the device's link MTU, the largest IP packet it sends; 0 if unknown.
	MTU int
}

// SegmentsInSoftware reports whether the kernel, not a NIC, cuts a UDP GSO super-packet sent
// through d into segments, so that segment i of one send carries the super-packet's IPv4
// identification plus i (see the package comment). It is false only for a hardware device with
// tx-udp-segmentation active: such a NIC segments the super-packet itself and writes identifications
// of its own choosing.
func (d Device) SegmentsInSoftware() bool {
	return !(d.Hardware && d.USO)
}

// LocalMTU returns the link MTU of the interface that holds the local address a: what rxe derives its
// port's active MTU from. An unspecified address has no interface; it, and an address no interface
// holds, give an error.
func LocalMTU(a netip.Addr) (int, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, fmt.Errorf("netdev: interfaces: %w", err)
	}
	a = a.Unmap().WithZone("")
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, ia := range addrs {
			if p, ok := ia.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == a {
					return ifi.MTU, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("netdev: no interface holds %v: %w", a, ErrInvalidAddr)
}

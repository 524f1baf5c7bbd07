package mad

import (
	"errors"
	"net/netip"
	"strconv"
)

// The RDMA CM's conventions on top of the IB CM: how librdmacm (and the kernel's rdma_cm,
// drivers/infiniband/core/cma.c) names a service by an IP port, and the header it puts first in the
// private data of a REQ and a SIDR_REQ so that the passive side learns the IP addresses and ports.
// IBTA Vol 1 Annex A11 (RDMA IP CM Service).

// PortSpace is an rdma_cm port space: which IP protocol's ports a service ID stands for. Linux
// include/uapi/rdma/rdma_user_cm.h (enum rdma_ucm_port_space), "IBTA Annex A11, service ID bytes 4 & 5".
type PortSpace uint16

// Port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: RC connections (rping, perftest -R, NVMe-oF)
	PortSpaceUDP   PortSpace = 0x0111 // RDMA_PS_UDP: UD services resolved with SIDR (udaddy)
	PortSpaceIB    PortSpace = 0x013F // RDMA_PS_IB: RC or UD, chosen by the QP type
)

func (p PortSpace) String() string {
	switch p {
	case PortSpaceIPoIB:
		return "IPoIB"
	case PortSpaceTCP:
		return "TCP"
	case PortSpaceUDP:
		return "UDP"
	case PortSpaceIB:
		return "IB"
	}
	return "PortSpace(" + strconv.Itoa(int(p)) + ")"
}

// ServiceID returns the service ID rdma_cm uses for port in port space ps: (ps << 16) + port, as
// rdma_get_service_id in Linux drivers/infiniband/core/cma.c computes it. rping's default (TCP port
// 7174) is 0x0000000001061c06.
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// serviceIDIPMask covers the bytes of an rdma_cm service ID above the port space: zero (Linux
// RDMA_IB_IP_PS_MASK keeps the port space with them).
const serviceIDIPMask = 0xFFFFFFFF_00000000

// ParseServiceID splits an rdma_cm service ID into its port space and port; ok is false when sid is
// not of that form (its top four bytes are not zero), as IB services named by other conventions are
// not.
func ParseServiceID(sid uint64) (ps PortSpace, port uint16, ok bool) {
	if sid&serviceIDIPMask != 0 {
		return 0, 0, false
	}
	return PortSpace(sid >> 16), uint16(sid), true
}

// CMAHeaderLen is the size of rdma_cm's header in private data. Linux drivers/infiniband/core/cma.c
// (struct cma_hdr).
const CMAHeaderLen = 36

// CMAVersion is the only CMA header version (CMA_VERSION).
const CMAVersion = 0

// Errors of ParseCMAHeader. They match with errors.Is.
var (
	ErrCMAHeader = errors.New("mad: malformed rdma_cm header in private data")
)

// CMAHeader is a view of rdma_cm's header at the start of a REQ's or SIDR_REQ's private data
// (struct cma_hdr in Linux drivers/infiniband/core/cma.c; IBTA Vol 1 Annex A11):
//
//	0 CMAVersion(8) IPVersion(4) reserved(4) SrcPort(16)
//	4 SrcAddr (16)  20 DstAddr (16)
//
// An IPv4 address sits in the last four bytes of its 16 with zeros before it (union cma_ip_addr), not
// IPv4-mapped. SrcPort is the active side's port; the destination port is the service ID's. The
// application's private data follows, at CMAHeaderLen.
type CMAHeader []byte

const (
	cmaVersion = 0
	cmaIPVer   = 1
	cmaPort    = 2
	cmaSrc     = 4
	cmaDst     = 20
)

// ParseCMAHeader checks that p, a REQ's or SIDR_REQ's private data, starts with a CMA header of version
// 0 for IPv4 or IPv6, and returns a view of it.
func ParseCMAHeader(p []byte) (CMAHeader, error) {
	if len(p) < CMAHeaderLen || p[cmaVersion] != CMAVersion {
		return nil, ErrCMAHeader
	}
	if v := p[cmaIPVer] >> 4; v != 4 && v != 6 {
		return nil, ErrCMAHeader
	}
	return CMAHeader(p[:CMAHeaderLen:CMAHeaderLen]), nil
}

// Version returns the CMA header version; 0 is the only one.
func (h CMAHeader) Version() uint8 { return h[cmaVersion] }

// IPVersion returns the IP version of the addresses: 4 or 6.
func (h CMAHeader) IPVersion() uint8 { return h[cmaIPVer] >> 4 }

// SrcPort returns the active side's port.
func (h CMAHeader) SrcPort() uint16 { return be16(h, cmaPort) }

func (h CMAHeader) addr(off int) netip.Addr {
	if h.IPVersion() == 4 {
		return netip.AddrFrom4([4]byte(h[off+12 : off+16]))
	}
	return gid(h, off)
}

// SrcAddr returns the active side's IP address.
func (h CMAHeader) SrcAddr() netip.Addr { return h.addr(cmaSrc) }

// DstAddr returns the IP address the active side connects to.
func (h CMAHeader) DstAddr() netip.Addr { return h.addr(cmaDst) }

// CMAHeaderFields holds the fields of a CMA header. The IP version is the source address's: 4 for an
// IPv4 (or IPv4-mapped) address, 6 otherwise.
type CMAHeaderFields struct {
	SrcPort uint16
	SrcAddr netip.Addr
	DstAddr netip.Addr
}

// Fields decodes the header.
func (h CMAHeader) Fields() CMAHeaderFields {
	return CMAHeaderFields{SrcPort: h.SrcPort(), SrcAddr: h.SrcAddr(), DstAddr: h.DstAddr()}
}

func putIP(b []byte, v4 bool, a netip.Addr) {
	clear(b[:16])
	if v4 {
		a4 := a.Unmap().As4()
		copy(b[12:16], a4[:])
		return
	}
	a16 := a.As16()
	copy(b, a16[:])
}

// Encode writes f into h, version 0.
func (h CMAHeader) Encode(f *CMAHeaderFields) {
	v4 := f.SrcAddr.Unmap().Is4()
	h[cmaVersion] = CMAVersion
	h[cmaIPVer] = 6 << 4
	if v4 {
		h[cmaIPVer] = 4 << 4
	}
	put16(h, cmaPort, f.SrcPort)
	putIP(h[cmaSrc:], v4, f.SrcAddr)
	putIP(h[cmaDst:], v4, f.DstAddr)
}

// Append appends the header and then the application's private data p: the private data of a REQ or a
// SIDR_REQ as rdma_connect builds it (cma_connect_ib, cma_resolve_ib_udp).
func (f *CMAHeaderFields) Append(dst []byte, p []byte) []byte {
	l := len(dst)
	dst = append(dst, make([]byte, CMAHeaderLen)...)
	CMAHeader(dst[l:]).Encode(f)
	return append(dst, p...)
}

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/wire"
)

// perftest's out-of-band exchange over TCP ("Data ex. method : Ethernet"), as perftest 6.06 does it.
// Every step is lock-step and fixed-size: the client writes its message and then reads the server's,
// the server reads first and then writes. Nothing is framed, so both sides must agree on the sequence
// exactly; perftestSchedule holds it per test, as observed on the wire between two rxe guests.

// perftestVersion is the version goroce announces: the one the Debian bookworm perftest (4.5+0.17)
// reports and whose exchange the rxe-lab captures show.
const perftestVersion = "6.06"

// perftestVersionLen is the size of perftest's version field (MAX_VERSION).
const perftestVersionLen = 16

// perftestKeyLen is the size of a key message with a GID (KEY_MSG_SIZE_GID): 107 characters of
// "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:" and a NUL.
const perftestKeyLen = 108

// perftestDone ends the exchange; each side writes it and closes without reading the other's.
const perftestDone = "done\x00"

// perftestCacheLine is the cache-line size goroce reports in the system-data step.
const perftestCacheLine = 64

// perftestDest is one QP's key message: perftest's struct pingpong_dest as it travels.
type perftestDest struct {
	lid      uint16
	outReads int
	qpn      wire.QPN
	psn      wire.PSN
	rkey     wire.RKey
	vaddr    uint64
	gid      goroce.GID
	srqn     uint32
}

// encode formats d as KEY_PRINT_FMT_GID, NUL-padded to perftestKeyLen.
func (d perftestDest) encode() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.lid, d.outReads, uint32(d.qpn), uint32(d.psn), uint32(d.rkey), d.vaddr)
	for _, g := range d.gid {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", d.srqn)
	out := make([]byte, perftestKeyLen)
	copy(out, b.String())
	return out
}

// parsePerftestDest reads a key message field by field, as perftest does with strtol on each
// colon-separated token.
func parsePerftestDest(b []byte) (perftestDest, error) {
	var d perftestDest
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(s, ":")
	if len(f) < 23 {
		return d, fmt.Errorf("bad key message %q", s)
	}
	var errs []error
	num := func(s string, bits int) uint64 {
		v, err := strconv.ParseUint(s, 16, bits)
		errs = append(errs, err)
		return v
	}
	d.lid = uint16(num(f[0], 16))
	d.outReads = int(num(f[1], 16))
	d.qpn = wire.QPN(num(f[2], 24))
	d.psn = wire.PSN(num(f[3], 24))
	d.rkey = wire.RKey(num(f[4], 32))
	d.vaddr = num(f[5], 64)
	for i := range d.gid {
		d.gid[i] = byte(num(f[6+i], 8))
	}
	d.srqn = uint32(num(f[22], 32))
	if err := errors.Join(errs...); err != nil {
		return d, fmt.Errorf("bad key message %q: %v", s, err)
	}
	return d, nil
}

// perftestConn is the TCP connection of the exchange and the side this process plays.
type perftestConn struct {
	c      net.Conn
	client bool
}

// xchg sends mine and receives the peer's message of the same size, in the order of this side.
func (p *perftestConn) xchg(mine []byte) ([]byte, error) {
	theirs := make([]byte, len(mine))
	if p.client {
		if _, err := p.c.Write(mine); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(p.c, theirs); err != nil {
			return nil, err
		}
		return theirs, nil
	}
	if _, err := io.ReadFull(p.c, theirs); err != nil {
		return nil, err
	}
	if _, err := p.c.Write(mine); err != nil {
		return nil, err
	}
	return theirs, nil
}

// perftestVersionAtLeast compares dotted versions numerically, as strverscmp does for these.
func perftestVersionAtLeast(v, min string) bool {
	a, b := strings.Split(v, "."), strings.Split(min, ".")
	for i := 0; i < max(len(a), len(b)); i++ {
		var x, y int
		if i < len(a) {
			x, _ = strconv.Atoi(a[i])
		}
		if i < len(b) {
			y, _ = strconv.Atoi(b[i])
		}
		if x != y {
			return x > y
		}
	}
	return true
}

// perftestHello is what the steps before the key exchange settle.
type perftestHello struct {
	remoteVersion string
	pageSize      int // the larger of both sides' cycle buffers (page sizes)
	cacheLine     int
	mtu           wire.MTU // the smaller of both sides' MTUs
}

// hello runs exchange_versions, check_sys_data and check_mtu.
func (p *perftestConn) hello(pageSize int, mtu wire.MTU) (perftestHello, error) {
	var h perftestHello
	v := make([]byte, perftestVersionLen)
	copy(v, perftestVersion)
	rv, err := p.xchg(v)
	if err != nil {
		return h, fmt.Errorf("exchanging versions: %w", err)
	}
	h.remoteVersion = string(bytes.TrimRight(rv, "\x00"))
	if i := strings.IndexByte(h.remoteVersion, 0); i >= 0 {
		h.remoteVersion = h.remoteVersion[:i]
	}
	h.pageSize, h.cacheLine, h.mtu = pageSize, perftestCacheLine, mtu
	if perftestVersionAtLeast(h.remoteVersion, "5.32") {
		for _, f := range []*int{&h.pageSize, &h.cacheLine} {
			b, err := p.xchg(binary.BigEndian.AppendUint32(nil, uint32(*f)))
			if err != nil {
				return h, fmt.Errorf("exchanging system data: %w", err)
			}
			*f = max(*f, int(binary.BigEndian.Uint32(b)))
		}
	}
	if perftestVersionAtLeast(h.remoteVersion, "5.1") {
		n := 4 // sizeof(int) before 5.31
		if perftestVersionAtLeast(h.remoteVersion, "5.31") {
			n = 2
		}
		m := make([]byte, n)
		copy(m, strconv.Itoa(int(mtu)))
		b, err := p.xchg(m)
		if err != nil {
			return h, fmt.Errorf("exchanging MTU: %w", err)
		}
		s := string(b)
		if i := strings.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		if r, err := strconv.Atoi(s); err == nil && wire.MTU(r).Valid() && wire.MTU(r) < mtu {
			h.mtu = wire.MTU(r)
		}
	}
	return h, nil
}

// handshake exchanges key messages: the first one carries the QPs' addresses, the later ones are
// barriers.
func (p *perftestConn) handshake(mine perftestDest) (perftestDest, error) {
	b, err := p.xchg(mine.encode())
	if err != nil {
		return perftestDest{}, fmt.Errorf("exchanging keys: %w", err)
	}
	return parsePerftestDest(b)
}

// perftestBWReport is bw_report_data as xchg_bw_reports sends it: size and iterations as 64-bit
// big-endian integers (remote version 5.33 and later), bandwidths in MB/s (2^20 bytes) and the message
// rate in Mpps as big-endian doubles.
type perftestBWReport struct {
	size, iters   uint64
	bwPeak, bwAvg float64
	msgRate       float64
}

// xchgReports exchanges bandwidth reports field by field.
func (p *perftestConn) xchgReports(mine perftestBWReport, remoteVersion string) (perftestBWReport, error) {
	var r perftestBWReport
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	iters := u64(mine.iters)
	if !perftestVersionAtLeast(remoteVersion, "5.33") {
		iters = binary.BigEndian.AppendUint32(nil, uint32(mine.iters))
	}
	fields := []struct {
		mine []byte
		set  func([]byte)
	}{
		{u64(mine.size), func(b []byte) { r.size = binary.BigEndian.Uint64(b) }},
		{iters, func(b []byte) {
			if len(b) == 4 {
				r.iters = uint64(binary.BigEndian.Uint32(b))
			} else {
				r.iters = binary.BigEndian.Uint64(b)
			}
		}},
		{u64(math.Float64bits(mine.bwPeak)), func(b []byte) { r.bwPeak = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
		{u64(math.Float64bits(mine.bwAvg)), func(b []byte) { r.bwAvg = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
		{u64(math.Float64bits(mine.msgRate)), func(b []byte) { r.msgRate = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
	}
	for _, f := range fields {
		b, err := p.xchg(f.mine)
		if err != nil {
			return r, fmt.Errorf("exchanging reports: %w", err)
		}
		f.set(b)
	}
	return r, nil
}

// closeConn is ctx_close_connection without its handshake: write "done" and close; perftest never
// reads the peer's.
func (p *perftestConn) closeConn() error {
	_, err := p.c.Write([]byte(perftestDone))
	p.c.Close()
	return err
}

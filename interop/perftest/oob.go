package perftest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/goroce/goroce"
)

// perftest's out-of-band exchange over TCP ("Data ex. method : Ethernet"), as perftest 6.06 does it
// in perftest_communication.c. Every step is lock-step and fixed-size: the client writes its message
// and then reads the server's, the server reads first and then writes. Nothing is framed, so both
// sides must agree on the sequence exactly; Test holds it per program, as observed on the wire
// between two rxe guests.

// Version is the perftest version goroce announces: the one the Debian bookworm perftest
// (4.5+0.17) reports and whose exchange the rxe-lab captures show.
const Version = "6.06"

// versionLen is the size of perftest's version field (MAX_VERSION).
const versionLen = 16

// KeyLen is the size of a key message with a GID (KEY_MSG_SIZE_GID): 107 characters of
// "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:" and a NUL.
const KeyLen = 108

// doneMsg ends the exchange; each side writes it and closes without reading the other's.
const doneMsg = "done\x00"

// cacheLine is the cache-line size goroce reports in the system-data step.
const cacheLine = 64

// ErrBadKey is the error of a key message that does not parse; the error ParseDest returns quotes
// the message after it.
var ErrBadKey = errors.New("bad key message")

// Dest is one QP's key message: perftest's struct pingpong_dest as ethernet_write_keys sends it, the
// text KEY_PRINT_FMT_GID ("%04x:%04x:%06x:%06x:%08x:%016llx:" for LID, out_reads, QPN, PSN, rkey and
// vaddr, the 16 GID bytes as "%02x:", the SRQ number as "%08x:"), NUL-padded to KeyLen bytes.
// perftest_communication.c.
type Dest struct {
	LID uint16
	// OutReads is the READs and atomics this side accepts outstanding; the sides use the smaller.
	OutReads int
	QPN      goroce.QPN
	PSN      goroce.PSN
	RKey     goroce.RKey // the region the peer may WRITE, READ and run atomics on
	VAddr    uint64      // the address there the peer's operations target
	GID      goroce.GID  // zero when the peer runs without -x; goroce then uses the TCP peer's address
	SRQN     uint32
}

// Append appends d's key message, KeyLen bytes, to b.
func (d Dest) Append(b []byte) []byte {
	start := len(b)
	b = fmt.Appendf(b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, uint32(d.QPN), uint32(d.PSN), uint32(d.RKey), d.VAddr)
	for _, g := range d.GID {
		b = fmt.Appendf(b, "%02x:", g)
	}
	b = fmt.Appendf(b, "%08x:", d.SRQN)
	for len(b) < start+KeyLen {
		b = append(b, 0)
	}
	return b[:start+KeyLen]
}

// Marshal returns d's key message, KeyLen bytes.
func (d Dest) Marshal() []byte { return d.Append(make([]byte, 0, KeyLen)) }

// ParseDest reads a key message field by field, as ethernet_read_keys does with strtol on each
// colon-separated token. Anything else is an error that matches ErrBadKey.
func ParseDest(b []byte) (Dest, error) {
	var d Dest
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(s, ":")
	if len(f) < 23 {
		return d, fmt.Errorf("%w %q", ErrBadKey, s)
	}
	var errs []error
	num := func(s string, bits int) uint64 {
		v, err := strconv.ParseUint(s, 16, bits)
		errs = append(errs, err)
		return v
	}
	d.LID = uint16(num(f[0], 16))
	d.OutReads = int(num(f[1], 16))
	d.QPN = goroce.QPN(num(f[2], 24))
	d.PSN = goroce.PSN(num(f[3], 24))
	d.RKey = goroce.RKey(num(f[4], 32))
	d.VAddr = num(f[5], 64)
	for i := range d.GID {
		d.GID[i] = byte(num(f[6+i], 8))
	}
	d.SRQN = uint32(num(f[22], 32))
	if err := errors.Join(errs...); err != nil {
		return d, fmt.Errorf("%w %q: %w", ErrBadKey, s, err)
	}
	return d, nil
}

// Endpoint returns what d says about the peer's QP, for QP.Connect: its GID, QPN and first PSN on the
// RoCEv2 port (goroce.DefaultPort), with the MTU unknown.
func (d Dest) Endpoint() goroce.Endpoint {
	return goroce.Endpoint{GID: d.GID, QPN: d.QPN, PSN: d.PSN}
}

// Conn is one side of perftest's Ethernet exchange on a TCP connection: ctx_xchg_data_ethernet's
// lock-step, fixed-size messages, the client writing first. Its methods are the steps in the order
// perftest takes them: Hello, then Handshake as often as the test does, ExchangeReports for bandwidth
// tests, and Close.
type Conn struct {
	rw     io.ReadWriter
	client bool
}

// NewConn returns the exchange on rw, as the client (which writes first) or the server.
func NewConn(rw io.ReadWriter, client bool) *Conn { return &Conn{rw: rw, client: client} }

// xchg sends mine and receives the peer's message of the same size, in the order of this side.
func (c *Conn) xchg(mine []byte) ([]byte, error) {
	theirs := make([]byte, len(mine))
	if c.client {
		if _, err := c.rw.Write(mine); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c.rw, theirs); err != nil {
			return nil, err
		}
		return theirs, nil
	}
	if _, err := io.ReadFull(c.rw, theirs); err != nil {
		return nil, err
	}
	if _, err := c.rw.Write(mine); err != nil {
		return nil, err
	}
	return theirs, nil
}

// versionAtLeast compares dotted versions numerically, as strverscmp does for these.
func versionAtLeast(v, min string) bool {
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

// Hello is what the steps before the key exchange settle.
type Hello struct {
	// RemoteVersion is the version the peer announced; it decides which later steps exist and their
	// sizes.
	RemoteVersion string
	// PageSize is the larger of both sides' cycle buffers (page sizes), CacheLine the larger cache line
	// (check_sys_data, perftest 5.32 and later).
	PageSize, CacheLine int
	// MTU is the smaller of both sides' MTUs (check_mtu, perftest 5.1 and later).
	MTU goroce.MTU
}

// Hello runs exchange_versions, check_sys_data and check_mtu, announcing Version, pageSize and mtu.
func (c *Conn) Hello(pageSize int, mtu goroce.MTU) (Hello, error) {
	var h Hello
	v := make([]byte, versionLen)
	copy(v, Version)
	rv, err := c.xchg(v)
	if err != nil {
		return h, fmt.Errorf("exchanging versions: %w", err)
	}
	h.RemoteVersion = string(bytes.TrimRight(rv, "\x00"))
	if i := strings.IndexByte(h.RemoteVersion, 0); i >= 0 {
		h.RemoteVersion = h.RemoteVersion[:i]
	}
	h.PageSize, h.CacheLine, h.MTU = pageSize, cacheLine, mtu
	if versionAtLeast(h.RemoteVersion, "5.32") {
		for _, f := range []*int{&h.PageSize, &h.CacheLine} {
			b, err := c.xchg(binary.BigEndian.AppendUint32(nil, uint32(*f)))
			if err != nil {
				return h, fmt.Errorf("exchanging system data: %w", err)
			}
			*f = max(*f, int(binary.BigEndian.Uint32(b)))
		}
	}
	if versionAtLeast(h.RemoteVersion, "5.1") {
		n := 4 // sizeof(int) before 5.31
		if versionAtLeast(h.RemoteVersion, "5.31") {
			n = 2
		}
		m := make([]byte, n)
		copy(m, strconv.Itoa(int(mtu)))
		b, err := c.xchg(m)
		if err != nil {
			return h, fmt.Errorf("exchanging MTU: %w", err)
		}
		s := string(b)
		if i := strings.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		if r, err := strconv.Atoi(s); err == nil && goroce.MTU(r).Valid() && goroce.MTU(r) < mtu {
			h.MTU = goroce.MTU(r)
		}
	}
	return h, nil
}

// Handshake exchanges key messages (ctx_hand_shake): the first one carries the QPs' addresses, the
// later ones are barriers that carry the same message again.
func (c *Conn) Handshake(mine Dest) (Dest, error) {
	b, err := c.xchg(mine.Marshal())
	if err != nil {
		return Dest{}, fmt.Errorf("exchanging keys: %w", err)
	}
	return ParseDest(b)
}

// BWReport is one line of a bandwidth test's results, and bw_report_data as xchg_bw_reports sends it:
// size and iterations as 64-bit big-endian integers (the iterations 32-bit to peers before 5.33),
// bandwidths in MB/s (2^20 bytes) and the message rate in Mpps as big-endian doubles.
type BWReport struct {
	Size, Iters   uint64
	BWPeak, BWAvg float64 // MB/s
	MsgRate       float64 // Mpps
}

// ExchangeReports exchanges bandwidth reports field by field (xchg_bw_reports); remoteVersion is
// Hello's.
func (c *Conn) ExchangeReports(mine BWReport, remoteVersion string) (BWReport, error) {
	var r BWReport
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	iters := u64(mine.Iters)
	if !versionAtLeast(remoteVersion, "5.33") {
		iters = binary.BigEndian.AppendUint32(nil, uint32(mine.Iters))
	}
	fields := []struct {
		mine []byte
		set  func([]byte)
	}{
		{u64(mine.Size), func(b []byte) { r.Size = binary.BigEndian.Uint64(b) }},
		{iters, func(b []byte) {
			if len(b) == 4 {
				r.Iters = uint64(binary.BigEndian.Uint32(b))
			} else {
				r.Iters = binary.BigEndian.Uint64(b)
			}
		}},
		{u64(math.Float64bits(mine.BWPeak)), func(b []byte) { r.BWPeak = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
		{u64(math.Float64bits(mine.BWAvg)), func(b []byte) { r.BWAvg = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
		{u64(math.Float64bits(mine.MsgRate)), func(b []byte) { r.MsgRate = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
	}
	for _, f := range fields {
		b, err := c.xchg(f.mine)
		if err != nil {
			return r, fmt.Errorf("exchanging reports: %w", err)
		}
		f.set(b)
	}
	return r, nil
}

// Close is ctx_close_connection without its handshake: it writes "done" and closes the connection
// if it is an io.Closer; perftest never reads the peer's.
func (c *Conn) Close() error {
	_, err := c.rw.Write([]byte(doneMsg))
	if cl, ok := c.rw.(io.Closer); ok {
		cl.Close()
	}
	if err != nil {
		return fmt.Errorf("couldn't write done: %w", err)
	}
	return nil
}

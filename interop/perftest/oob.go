package perftest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce"
)

// perftest's out-of-band exchange over TCP ("Data ex. method : Ethernet"), as perftest 6.06 does it
// in perftest_communication.c. Every step is lock-step and fixed-size: the client writes its message
// and then reads the server's, the server reads first and then writes. Nothing is framed, so both
// sides must agree on the sequence exactly; run.go holds it per program and mode, as observed on the
// wire between two rxe guests.
//
// perftest itself trusts the sequence: a peer one step ahead or behind makes it parse a key message
// as a report and print the garbage. Conn instead checks every message it reads against the kind
// the step expects, byte by byte as they arrive, so that a peer at another step is caught at once
// rather than leaving both sides waiting for bytes the other will never send.

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

// pollInterval is how often a read that waits for the peer runs the run's checks (Conn.check).
const pollInterval = 100 * time.Millisecond

// partialLimit bounds the wait for the rest of a message once its first byte arrived (Conn.read).
const partialLimit = 5 * time.Second

// helloTimeout bounds the wait for the peer's version. A perftest server answers a second after
// the connection (it sleeps first); one that never does runs --dont_xchg_versions and waits for a
// key message this side will not send.
const helloTimeout = 20 * time.Second

// ErrBadKey is the error of a key message that does not parse; the error ParseDest returns quotes
// the message after it.
var ErrBadKey = errors.New("bad key message")

// ErrMismatch is the error of a run whose peer runs other settings than this side: a step of the
// exchange got another step's message, or the figures the peer reports are not of the same run.
// perftest's flags that decide the exchange (-q, -b, -a, -D, -s, -n, the test) must be the same on
// both sides.
var ErrMismatch = errors.New("the peer's settings differ from this side's")

// MismatchError is what a run found when the peer turned out to run other settings: the step this
// side was at, and what the peer did instead. It matches ErrMismatch, and unwraps to what failed when
// the traffic told (a *CompletionError).
type MismatchError struct {
	// Step is what this side was doing, for example "synchronizing after the traffic".
	Step string
	// Reason says what differs, with the flags that may cause it.
	Reason string
	// Err, if set, is the failure that showed it.
	Err error
}

// Error returns perftest's message for a failed exchange (or the failed work request), then what
// differs.
func (e *MismatchError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%v: %s", e.Err, e.Reason)
	}
	return fmt.Sprintf("failed to exchange data between server and clients: %s: %s", e.Step, e.Reason)
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Unwrap returns Err.
func (e *MismatchError) Unwrap() error { return e.Err }

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
	RKey     goroce.RKey // the region the peer may access, with the rights the test grants
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

// isHex reports whether c is a hexadecimal digit.
func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// keyPrefix reports whether b can begin a key message: its first field (the LID, "%04x") is four
// hex digits and a colon, and the rest is hex digits, colons and the NUL padding. It rejects every
// other message of the exchange from its first bytes: a version ("6.06"), the binary system data and
// reports, the MTU ("5\0") and "done".
func keyPrefix(b []byte) bool {
	for i, c := range b {
		switch {
		case i < 4 && !isHex(c), i == 4 && c != ':':
			return false
		case c == 0:
			if bytes.IndexFunc(b[i:], func(r rune) bool { return r != 0 }) >= 0 {
				return false
			}
			return true
		case !isHex(c) && c != ':':
			return false
		}
	}
	return true
}

// looksLikeText reports whether b, read where a report's binary field belongs, is key-message text
// instead: no size, count or bandwidth a report carries encodes to hex digits and colons only.
func looksLikeText(b []byte) bool {
	for _, c := range b {
		if !isHex(c) && c != ':' {
			return false
		}
	}
	return true
}

// describe says what a message the peer sent where it did not belong looks like.
func describe(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("done")):
		return `its last message ("done"): it has finished`
	case len(b) >= 5 && keyPrefix(b[:5]):
		return "a key message"
	case len(b) > 0 && b[0] >= '0' && b[0] <= '9' && bytes.IndexByte(b, '.') > 0:
		return fmt.Sprintf("a version (%q): it exchanges versions where this side does not (--dont_xchg_versions differs)", bytes.TrimRight(b, "\x00"))
	}
	return fmt.Sprintf("%d bytes of binary data (% x), which no key message starts with", len(b), b[:min(len(b), 8)])
}

// deadliner is a connection whose reads can time out (net.Conn).
type deadliner interface {
	SetReadDeadline(t time.Time) error
}

// Conn is one side of perftest's Ethernet exchange on a TCP connection: ctx_xchg_data_ethernet's
// lock-step, fixed-size messages, the client writing first. Its methods are the steps in the order
// perftest takes them: Hello, then Handshake as often as the test does, ExchangeReports for bandwidth
// tests, and Close.
//
// Each step checks what it reads: a step that gets another step's message fails with a
// *MismatchError.
type Conn struct {
	rw     io.ReadWriter
	client bool
	// ahead holds bytes read from the peer before a step asked for them (Conn.poll).
	ahead []byte
	// eof is set once the peer closed the connection.
	eof bool
	// check, if set, runs every pollInterval while a read waits for the peer, on a connection whose
	// reads can time out; its error ends the wait.
	check func() error
	// cm is set for rdma_cm's exchange (-R): every Read is one message, key messages are binary
	// (DestBinaryLen bytes), and Close writes no "done".
	cm bool
}

// keyMsg returns d's key message for this exchange.
func (c *Conn) keyMsg(d Dest) []byte {
	if c.cm {
		return d.AppendBinary(nil)
	}
	return d.Marshal()
}

// keyValid is the check of a key message's prefix as it arrives (none for binary ones).
func (c *Conn) keyValid() func([]byte) bool {
	if c.cm {
		return nil
	}
	return keyPrefix
}

// parseKey reads a key message of this exchange.
func (c *Conn) parseKey(b []byte) (Dest, error) {
	if c.cm {
		return ParseDestBinary(b)
	}
	return ParseDest(b)
}

// NewConn returns the exchange on rw, as the client (which writes first) or the server.
func NewConn(rw io.ReadWriter, client bool) *Conn { return &Conn{rw: rw, client: client} }

// read reads the peer's next message of n bytes for step. valid, if set, is asked about every prefix
// of the message as it arrives; a prefix it refuses ends the step with a *MismatchError at once.
// limit, if not zero, bounds the wait for the message's first byte: set where the peer has nothing
// to do before it answers. Once the first byte is in, the rest must follow within partialLimit: the
// peer writes each message whole, so a part that stays alone was a shorter message, and the peer now
// waits for an answer this side will not send.
func (c *Conn) read(n int, step string, valid func([]byte) bool, limit time.Duration) ([]byte, error) {
	buf := make([]byte, n)
	got := copy(buf, c.ahead)
	c.ahead = c.ahead[got:]
	refused := func() error {
		return &MismatchError{Step: step, Reason: "instead of this step's message, the peer sent " + describe(buf[:got])}
	}
	if valid != nil && !valid(buf[:got]) {
		return nil, refused()
	}
	dl, timed := c.rw.(deadliner)
	if timed {
		defer dl.SetReadDeadline(time.Time{})
	}
	start, first := time.Now(), time.Time{}
	if got > 0 {
		first = start
	}
	for got < n {
		if c.eof {
			return nil, c.closedErr(step, buf[:got])
		}
		if timed {
			dl.SetReadDeadline(time.Now().Add(pollInterval))
		}
		k, err := c.rw.Read(buf[got:])
		if k > 0 && got == 0 {
			first = time.Now()
		}
		got += k
		if c.cm && k > 0 && got < n {
			return nil, &MismatchError{Step: step, Reason: fmt.Sprintf("the peer sent a message of %d bytes (%s) where this step takes %d", got, describe(buf[:got]), n)}
		}
		if valid != nil && !valid(buf[:got]) {
			return nil, refused()
		}
		switch {
		case err == nil:
		case timed && errors.Is(err, os.ErrDeadlineExceeded):
			if c.check != nil {
				if err := c.check(); err != nil {
					return nil, err
				}
			}
			switch {
			case got > 0 && time.Since(first) > partialLimit:
				return nil, &MismatchError{Step: step, Reason: fmt.Sprintf("the peer sent a message of %d bytes (%s) where this step takes %d, and waits",
					got, describe(buf[:got]), n)}
			case got == 0 && limit > 0 && time.Since(start) > limit:
				return nil, &MismatchError{Step: step, Reason: fmt.Sprintf("the peer sent nothing for %v: it waits at another step", limit)}
			}
		case errors.Is(err, io.EOF):
			c.eof = true
		default:
			return nil, fmt.Errorf("%s: %w", step, err)
		}
	}
	return buf, nil
}

// closedErr is the error of a step whose peer closed the connection before sending all of its
// message.
func (c *Conn) closedErr(step string, got []byte) error {
	if len(got) > 0 && bytes.HasPrefix([]byte(doneMsg), got[:min(len(got), len(doneMsg))]) {
		return &MismatchError{Step: step, Reason: `the peer sent its last message ("done") and closed the connection: it has finished`}
	}
	return fmt.Errorf("%s: the peer closed the connection (after %d bytes of the message): %w", step, len(got), io.ErrUnexpectedEOF)
}

// poll reads what the peer has written and no step asked for yet, without waiting, and reports
// whether there is any, and whether the peer has closed the connection. A side in its traffic uses it
// to notice a peer that has moved on to the next step (or ended) while this side still waits for it.
func (c *Conn) poll() (wrote, closed bool) {
	dl, ok := c.rw.(deadliner)
	if ok && !c.eof {
		dl.SetReadDeadline(time.Now().Add(time.Millisecond))
		var b [512]byte
		k, err := c.rw.Read(b[:])
		dl.SetReadDeadline(time.Time{})
		c.ahead = append(c.ahead, b[:k]...)
		if errors.Is(err, io.EOF) {
			c.eof = true
		}
	}
	return len(c.ahead) > 0, c.eof
}

// xchg sends mine and receives the peer's message of the same size, in the order of this side.
func (c *Conn) xchg(mine []byte, step string, valid func([]byte) bool, limit time.Duration) ([]byte, error) {
	return c.xchgThen(mine, step, valid, limit, nil)
}

// xchgThen is xchg, with a server's look at the run after it has read the client's message and
// before it answers: the client waits for the answer, so it has done nothing since it wrote.
func (c *Conn) xchgThen(mine []byte, step string, valid func([]byte) bool, limit time.Duration, read func() error) ([]byte, error) {
	if c.client {
		if _, err := c.rw.Write(mine); err != nil {
			return nil, fmt.Errorf("%s: %w", step, err)
		}
		return c.read(len(mine), step, valid, limit)
	}
	theirs, err := c.read(len(mine), step, valid, limit)
	if err != nil {
		return nil, err
	}
	if read != nil {
		if err := read(); err != nil {
			return nil, err
		}
	}
	if _, err := c.rw.Write(mine); err != nil {
		return nil, fmt.Errorf("%s: %w", step, err)
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

// versionPrefix reports whether b can begin perftest's version field: digits and dots, then NULs.
func versionPrefix(b []byte) bool {
	for i, c := range b {
		switch {
		case c == 0:
			return i > 0 && bytes.IndexFunc(b[i:], func(r rune) bool { return r != 0 }) < 0
		case c != '.' && (c < '0' || c > '9'):
			return false
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
// A peer that runs --dont_xchg_versions sends a key message instead of its version, or, as a
// server, nothing; either ends Hello with a *MismatchError.
func (c *Conn) Hello(pageSize int, mtu goroce.MTU) (Hello, error) {
	var h Hello
	v := make([]byte, versionLen)
	copy(v, Version)
	rv, err := c.xchg(v, "exchanging versions", versionPrefix, helloTimeout)
	if err != nil {
		var m *MismatchError
		if errors.As(err, &m) {
			m.Reason += "; does it run --dont_xchg_versions where this side does not?"
		}
		return h, err
	}
	h.RemoteVersion = string(bytes.TrimRight(rv, "\x00"))
	h.PageSize, h.CacheLine, h.MTU = pageSize, cacheLine, mtu
	if versionAtLeast(h.RemoteVersion, "5.32") {
		for _, f := range []*int{&h.PageSize, &h.CacheLine} {
			b, err := c.xchg(binary.BigEndian.AppendUint32(nil, uint32(*f)), "exchanging system data", nil, 0)
			if err != nil {
				return h, err
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
		b, err := c.xchg(m, "exchanging MTU", nil, 0)
		if err != nil {
			return h, err
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

// Handshake exchanges key messages (ctx_hand_shake): the first ones carry the QPs' addresses, the
// later ones are barriers that carry a message again. A message that is not a key message fails
// with a *MismatchError.
func (c *Conn) Handshake(mine Dest) (Dest, error) { return c.handshake(mine, "exchanging keys") }

func (c *Conn) handshake(mine Dest, step string) (Dest, error) {
	b, err := c.xchg(c.keyMsg(mine), step, c.keyValid(), 0)
	if err != nil {
		return Dest{}, err
	}
	d, err := c.parseKey(b)
	if err != nil {
		return Dest{}, &MismatchError{Step: step, Reason: fmt.Sprintf("the peer's message is no key message: %v", err)}
	}
	return d, nil
}

// BWReport is one line of a bandwidth test's results, and bw_report_data as xchg_bw_reports sends it:
// size and iterations as 64-bit big-endian integers (the iterations 32-bit to peers before 5.33),
// bandwidths in the unit of the report (MB/s of 2^20 bytes, or Gbit/s with --report_gbits) and the
// message rate in Mpps as big-endian doubles.
type BWReport struct {
	Size, Iters   uint64
	BWPeak, BWAvg float64 // MB/s, or Gbit/s with Options.ReportGbits
	MsgRate       float64 // Mpps
}

// ExchangeReports exchanges bandwidth reports field by field (xchg_bw_reports); remoteVersion is
// Hello's. A field that holds key-message text fails with a *MismatchError: the peer is at a
// handshake.
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
	const step = "exchanging reports"
	for _, f := range fields {
		n := len(f.mine)
		b, err := c.xchg(f.mine, step, func(b []byte) bool { return len(b) < n || !looksLikeText(b) }, 0)
		if err != nil {
			var m *MismatchError
			if errors.As(err, &m) && m.Err == nil {
				m.Reason += " (it is at a handshake)"
			}
			return r, err
		}
		f.set(b)
	}
	return r, nil
}

// Close is ctx_close_connection without its handshake: it writes "done" and closes the connection
// if it is an io.Closer; perftest never reads the peer's.
func (c *Conn) Close() error {
	if c.cm {
		// rdma_cm's ctx_close_connection ends with its barrier; the run disconnects the exchange's
		// connection after the test QPs', as perftest leaves it to its exit.
		return nil
	}
	_, err := c.rw.Write([]byte(doneMsg))
	if cl, ok := c.rw.(io.Closer); ok {
		cl.Close()
	}
	if err != nil {
		return fmt.Errorf("couldn't write done: %w", err)
	}
	return nil
}

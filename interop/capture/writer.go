package capture

import (
	"bufio"
	"errors"
	"io"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/goroce/goroce/wire"
)

// Direction is which way a packet crossed the interface a record stands for: pcapng's epb_flags
// direction bits.
type Direction uint8

// Directions.
const (
	NoDirection Direction = iota // not recorded
	Inbound                      // received
	Outbound                     // sent
)

func (d Direction) String() string {
	switch d {
	case Inbound:
		return "inbound"
	case Outbound:
		return "outbound"
	}
	return "unknown"
}

// flags returns d's epb_flags bits.
func (d Direction) flags() uint32 {
	switch d {
	case Inbound:
		return flagsInbound
	case Outbound:
		return flagsOutbound
	}
	return 0
}

// Options configure a Writer; the zero value (or nil) is the default.
type Options struct {
	// Interface is the name of the capture's one Ethernet interface (pcapng if_name): "goroce"
	// unless set.
	Interface string
	// Hold is how many packets the Writer keeps before writing them, so that what befalls a packet
	// after it was sent (lost on the way, dropped on arrival, marked CE) still joins its record as a
	// comment: DefaultHold unless set; negative writes every packet at once. Records are also written
	// once they are HoldTime older than the newest, and by Flush and Close.
	Hold int
}

// DefaultHold is the number of packets a Writer keeps back unless Options.Hold says otherwise: more
// than a device sends in one batch, so a loss injected on the write that follows still finds its
// packet.
const DefaultHold = 1024

// HoldTime bounds how long, in the packets' own clock, a Writer keeps a packet back: a program that
// goes quiet still sees its packets written by then, at the latest on the next packet after it.
const HoldTime = 100 * time.Millisecond

// maxTracked bounds the packets a Writer remembers having written, to tell a device's received packet
// from one a traced device sent: a few times the packets in flight on a fast run.
const maxTracked = 1 << 14

// maxComment bounds a comment's bytes: pcapng options are at most 65535 bytes long.
const maxComment = 4096

// Packet is a RoCEv2 packet to write: its UDP payload and what the IP and UDP headers around it held.
type Packet struct {
	At       time.Time
	From, To netip.AddrPort // UDP addresses; IPv4 (or IPv4-mapped) both ways makes an IPv4 packet
	TOS      uint8          // the IPv4 TOS or IPv6 traffic class
	IPID     uint16         // the IPv4 identification
	Payload  []byte         // the UDP payload: BTH through ICRC
	Dir      Direction      // epb_flags: received or sent, if known
	Comments []string       // each an opt_comment, e.g. "dropped: bad ICRC"
}

// Writer writes packets to a pcapng file, framed as they were on the wire: Ethernet with synthetic
// MACs, IPv4 or IPv6, UDP with its checksum, and the RoCEv2 transport packet unchanged, so that
// Wireshark decodes them and `goroce dump` verifies their ICRCs. The file has one section and one
// Ethernet interface; timestamps are in nanoseconds.
//
// The Writer keeps the last Options.Hold packets before writing them (see the adapters, Tracer and
// SimTracer, for why). Close writes them and ends the file; a Writer that is not closed loses them.
//
// A Writer is safe for concurrent use. Its methods write to the underlying io.Writer through a 64 KiB
// buffer while they hold the Writer's lock, so a slow file slows the callers, a device's goroutines
// among them.
type Writer struct {
	mu     sync.Mutex // guards every field below
	bw     *bufio.Writer
	closer io.Closer // the file Create opened
	err    error     // the first write error; every later call returns it
	hold   int
	count  int // packets taken, held or written

	held  []*record // oldest first
	free  []*record
	block []byte // scratch for one block

	tracked map[key]sent
	order   []trackedKey // a ring by seq: which key to forget when maxTracked are remembered
	seq     uint64

	idr wire.IDRecovery // the IPv4 identification of a packet known only by its bytes
}

// record is a packet the Writer holds: its frame and what the record will say about it.
type record struct {
	at       time.Time
	frame    []byte
	dir      Direction
	comments []string
	gen      uint64 // bumped on reuse, so a stale reference to it is told apart
	written  bool
}

// key identifies a packet by its addresses and a hash of its bytes (or, in the simulator, its ID).
type key struct {
	from, to netip.AddrPort
	sum      uint64
}

// sent is a packet the Writer wrote (or holds) as it was sent, and the copies of it not yet accounted
// for: received, dropped on arrival or lost.
type sent struct {
	rec  *record
	gen  uint64
	open int
	tos  uint8
	seq  uint64 // the latest trackedKey of the packet
}

type trackedKey struct {
	k   key
	seq uint64
}

// NewWriter starts a pcapng file on w: a section header and the interface description. o may be nil.
func NewWriter(w io.Writer, o *Options) (*Writer, error) {
	if o == nil {
		o = &Options{}
	}
	name := o.Interface
	if name == "" {
		name = "goroce"
	}
	cw := &Writer{bw: bufio.NewWriterSize(w, 64<<10), hold: o.Hold, tracked: make(map[key]sent)}
	if cw.hold == 0 {
		cw.hold = DefaultHold
	}
	cw.hold = max(cw.hold, 0)
	cw.idr.RequireDF = true
	cw.block = appendIDB(appendSHB(cw.block[:0]), name)
	if _, err := cw.bw.Write(cw.block); err != nil {
		return nil, err
	}
	return cw, nil
}

// Create creates the named file and starts a pcapng file in it; Close closes the file.
func Create(name string, o *Options) (*Writer, error) {
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(f, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	w.closer = f
	return w, nil
}

// WritePacket writes p framed as it was on the wire. p's bytes are copied.
func (w *Writer) WritePacket(p *Packet) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.newRecord(p.At, p.Dir)
	r.frame = appendFrame(r.frame, p.From, p.To, p.TOS, p.IPID, p.Payload)
	r.comments = appendComments(r.comments, p.Comments...)
	w.push(r)
	return w.err
}

// WriteIP writes an IPv4 or IPv6 packet as it is, behind an Ethernet header with the synthetic MACs of
// its addresses: for packets whose IP and UDP headers exist already, such as the simulator's.
func (w *Writer) WriteIP(at time.Time, ip []byte, dir Direction, comments ...string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.newRecord(at, dir)
	r.frame = appendEthernet(r.frame, ip)
	r.comments = appendComments(r.comments, comments...)
	w.push(r)
	return w.err
}

// Packets returns the number of packets the Writer has taken: written, or held to be written.
func (w *Writer) Packets() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count
}

// Flush writes the packets held back and flushes the buffer to the underlying writer. A comment for a
// packet already written becomes a record of its own.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.release(len(w.held))
	if w.err == nil {
		w.err = w.bw.Flush()
	}
	return w.err
}

// Close flushes the Writer and closes the file Create opened. It does not close an io.Writer given
// to NewWriter. Packets given to a closed Writer are dropped; closing it again does nothing.
func (w *Writer) Close() error {
	w.mu.Lock()
	closed := w.err == errClosed
	w.mu.Unlock()
	if closed {
		return nil
	}
	err := w.Flush()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closer != nil {
		if cerr := w.closer.Close(); err == nil {
			err = cerr
		}
		w.closer = nil
	}
	if err == nil {
		w.err = errClosed
	}
	return err
}

var errClosed = errors.New("capture: writer closed")

// newRecord returns an empty record, reused when one is free. w.mu is held.
func (w *Writer) newRecord(at time.Time, dir Direction) *record {
	var r *record
	if n := len(w.free); n > 0 {
		r = w.free[n-1]
		w.free = w.free[:n-1]
		r.gen++
		r.frame, r.comments, r.written = r.frame[:0], r.comments[:0], false
	} else {
		r = &record{}
	}
	r.at, r.dir = at, dir
	return r
}

// push takes r: holds it, and writes the records that are now too many or too old. w.mu is held.
func (w *Writer) push(r *record) {
	w.count++
	w.held = append(w.held, r)
	n := max(len(w.held)-w.hold, 0)
	for n < len(w.held) && r.at.Sub(w.held[n].at) > HoldTime {
		n++
	}
	w.release(n)
}

// release writes the n oldest held records. w.mu is held.
func (w *Writer) release(n int) {
	for _, r := range w.held[:n] {
		if w.err == nil {
			w.block = appendEPB(w.block[:0], r.at, r.frame, r.dir, r.comments)
			_, w.err = w.bw.Write(w.block)
		}
		r.written = true
		if len(w.free) < 64 {
			w.free = append(w.free, r)
		}
	}
	k := copy(w.held, w.held[n:])
	clear(w.held[k:])
	w.held = w.held[:k]
}

// track remembers that r holds a packet as it was sent, under k. w.mu is held.
func (w *Writer) track(k key, r *record, tos uint8) {
	w.seq++
	i := int((w.seq - 1) % maxTracked)
	if i == len(w.order) {
		w.order = append(w.order, trackedKey{})
	}
	slot := &w.order[i]
	if slot.seq != 0 { // the packet tracked maxTracked packets ago, unless tracked again since
		if s, ok := w.tracked[slot.k]; ok && s.seq == slot.seq {
			delete(w.tracked, slot.k)
		}
	}
	*slot = trackedKey{k, w.seq}
	s := w.tracked[k]
	s.rec, s.gen, s.tos, s.seq = r, r.gen, tos, w.seq
	s.open++
	w.tracked[k] = s
}

// seen reports whether the Writer remembers a packet under k. w.mu is held.
func (w *Writer) seen(k key) bool {
	_, ok := w.tracked[k]
	return ok
}

// lookup returns the entry of the packet tracked under k, if any. w.mu is held.
func (w *Writer) lookup(k key) *sent {
	if s, ok := w.tracked[k]; ok {
		return &s
	}
	return nil
}

// settle accounts for one copy of the packet tracked under k (received, dropped or lost) and returns
// its entry, or nil if no copy of it is open. w.mu is held.
func (w *Writer) settle(k key) *sent {
	s, ok := w.tracked[k]
	if !ok || s.open == 0 {
		return nil
	}
	s.open--
	w.tracked[k] = s
	return &s
}

// held returns the record of s if the Writer still holds it unwritten. w.mu is held.
func (s *sent) held() *record {
	if s == nil || s.rec == nil || s.rec.gen != s.gen || s.rec.written {
		return nil
	}
	return s.rec
}

// annotate adds comment to the record of s if the Writer still holds it, and reports whether it did.
// w.mu is held.
func (w *Writer) annotate(s *sent, comment string) bool {
	r := s.held()
	if r == nil {
		return false
	}
	r.comments = appendComments(r.comments, comment)
	return true
}

// appendComments appends the non-empty comments, each cut to maxComment bytes.
func appendComments(dst []string, comments ...string) []string {
	for _, c := range comments {
		if len(c) > maxComment {
			c = c[:maxComment]
		}
		if c != "" {
			dst = append(dst, c)
		}
	}
	return dst
}

package capture

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"time"
)

// Reader reads a pcapng file, with the per-packet options gopacket's pcapgo.NgReader skips: comments
// and the direction flag. It reads any pcapng file (both byte orders, several sections, several
// interfaces of any link type, Enhanced, Simple and obsolete Packet Blocks, if_tsresol and
// if_tsoffset) and skips the blocks it does not know. It never panics on a malformed file.
type Reader struct {
	r      *bufio.Reader
	order  binary.ByteOrder // the current section's
	ifaces []iface
	first  *iface // the file's first interface, for LinkType
	block  []byte
	err    error // sticky
}

// iface is what the Reader keeps of an Interface Description Block.
type iface struct {
	linkType uint16
	snapLen  uint32
	tsResol  uint8 // if_tsresol: 10^-n seconds, or 2^-n with the high bit set
	tsOffset int64 // if_tsoffset, seconds
}

// Record is one packet read from a pcapng file.
type Record struct {
	At        time.Time
	Data      []byte // the captured bytes; valid until the next call of Next
	Length    int    // the packet's length on the wire, at least len(Data)
	Interface int    // the index of its interface in the section
	LinkType  uint16 // its interface's LINKTYPE_ value (1 for Ethernet)
	Dir       Direction
	Comments  []string
}

// Errors a Reader returns for a file it cannot read.
var (
	ErrNotPcapng = errors.New("capture: not a pcapng file")
	ErrMalformed = errors.New("capture: malformed pcapng file")
)

// maxBlockLen bounds the blocks the Reader takes, so that a corrupt length cannot make it allocate
// without limit.
const maxBlockLen = 64 << 20

// NewReader reads the section header and the blocks up to the first interface description.
func NewReader(r io.Reader) (*Reader, error) {
	cr := &Reader{r: bufio.NewReaderSize(r, 64<<10)}
	magic, err := cr.r.Peek(4)
	if err != nil || binary.LittleEndian.Uint32(magic) != blockSHB {
		return nil, ErrNotPcapng
	}
	for cr.first == nil {
		typ, body, err := cr.readBlock()
		if err == io.EOF {
			return nil, fmt.Errorf("%w: no interface description", ErrMalformed)
		}
		if err != nil {
			return nil, err
		}
		if err := cr.control(typ, body); err != nil {
			return nil, err
		}
		if typ == blockEPB || typ == blockSPB || typ == blockPB {
			return nil, fmt.Errorf("%w: packet before any interface description", ErrMalformed)
		}
	}
	return cr, nil
}

// LinkType returns the link type of the file's first interface.
func (r *Reader) LinkType() uint16 { return r.first.linkType }

// Next returns the next packet, or io.EOF after the last.
func (r *Reader) Next() (*Record, error) {
	for r.err == nil {
		typ, body, err := r.readBlock()
		if err != nil {
			r.err = err
			break
		}
		if err := r.control(typ, body); err != nil {
			r.err = err
			break
		}
		switch typ {
		case blockEPB, blockPB, blockSPB:
			rec, err := r.packet(typ, body)
			if err != nil {
				r.err = err
				break
			}
			return rec, nil
		}
	}
	return nil, r.err
}

// readBlock reads one block and returns its type and body. A section header sets the byte order.
func (r *Reader) readBlock() (uint32, []byte, error) {
	var hdr [12]byte
	if _, err := io.ReadFull(r.r, hdr[:8]); err != nil {
		if err == io.EOF {
			return 0, nil, io.EOF
		}
		return 0, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if binary.LittleEndian.Uint32(hdr[:]) == blockSHB {
		if _, err := io.ReadFull(r.r, hdr[8:12]); err != nil {
			return 0, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		switch {
		case binary.LittleEndian.Uint32(hdr[8:]) == byteOrderMagic:
			r.order = binary.LittleEndian
		case binary.BigEndian.Uint32(hdr[8:]) == byteOrderMagic:
			r.order = binary.BigEndian
		default:
			return 0, nil, fmt.Errorf("%w: bad byte-order magic", ErrMalformed)
		}
	} else if r.order == nil {
		return 0, nil, ErrNotPcapng
	}
	typ := r.order.Uint32(hdr[:])
	n := int(r.order.Uint32(hdr[4:]))
	if n < blockHeaderLen+blockTrailerLen || n%4 != 0 || n > maxBlockLen || (typ == blockSHB && n < 28) {
		return 0, nil, fmt.Errorf("%w: block length %d", ErrMalformed, n)
	}
	if cap(r.block) < n {
		r.block = make([]byte, n)
	}
	b := r.block[:n]
	copy(b, hdr[:8])
	read := 8
	if typ == blockSHB {
		copy(b[8:], hdr[8:12])
		read = 12
	}
	if _, err := io.ReadFull(r.r, b[read:]); err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if r.order.Uint32(b[n-4:]) != uint32(n) {
		return 0, nil, fmt.Errorf("%w: block lengths differ", ErrMalformed)
	}
	return typ, b[blockHeaderLen : n-blockTrailerLen], nil
}

// control handles a section header or an interface description.
func (r *Reader) control(typ uint32, body []byte) error {
	switch typ {
	case blockSHB:
		if r.order.Uint16(body[4:]) != 1 {
			return fmt.Errorf("%w: version %d.%d", ErrMalformed, r.order.Uint16(body[4:]), r.order.Uint16(body[6:]))
		}
		r.ifaces = r.ifaces[:0]
	case blockIDB:
		if len(body) < 8 {
			return fmt.Errorf("%w: short interface description", ErrMalformed)
		}
		f := iface{linkType: r.order.Uint16(body), snapLen: r.order.Uint32(body[4:]), tsResol: 6}
		err := r.options(body[8:], func(code uint16, v []byte) {
			switch {
			case code == optIfTSResol && len(v) == 1:
				f.tsResol = v[0]
			case code == 14 && len(v) == 8: // if_tsoffset
				f.tsOffset = int64(r.order.Uint64(v))
			}
		})
		if err != nil {
			return err
		}
		r.ifaces = append(r.ifaces, f)
		if r.first == nil {
			r.first = &f
		}
	}
	return nil
}

// packet decodes an Enhanced, Simple or obsolete Packet Block.
func (r *Reader) packet(typ uint32, body []byte) (*Record, error) {
	rec := &Record{}
	var ts uint64
	var data, opts []byte
	switch typ {
	case blockEPB, blockPB:
		if len(body) < epbFixedLen {
			return nil, fmt.Errorf("%w: short packet block", ErrMalformed)
		}
		if typ == blockEPB {
			rec.Interface = int(r.order.Uint32(body))
		} else {
			rec.Interface = int(r.order.Uint16(body))
		}
		ts = uint64(r.order.Uint32(body[4:]))<<32 | uint64(r.order.Uint32(body[8:]))
		capLen := int(r.order.Uint32(body[12:]))
		rec.Length = int(r.order.Uint32(body[16:]))
		if capLen < 0 || capLen > len(body)-epbFixedLen {
			return nil, fmt.Errorf("%w: captured length %d", ErrMalformed, capLen)
		}
		data = body[epbFixedLen : epbFixedLen+capLen]
		opts = body[min(epbFixedLen+pad4(capLen), len(body)):]
	case blockSPB:
		if len(body) < 4 {
			return nil, fmt.Errorf("%w: short simple packet block", ErrMalformed)
		}
		rec.Length = int(r.order.Uint32(body))
		data = body[4:]
		if rec.Length < len(data) {
			data = data[:rec.Length]
		}
	}
	if rec.Interface >= len(r.ifaces) {
		return nil, fmt.Errorf("%w: packet on undescribed interface %d", ErrMalformed, rec.Interface)
	}
	f := &r.ifaces[rec.Interface]
	if typ == blockSPB && f.snapLen != 0 && len(data) > int(f.snapLen) {
		data = data[:f.snapLen]
	}
	rec.Data, rec.LinkType = data, f.linkType
	rec.Length = max(rec.Length, len(data))
	if typ != blockSPB {
		rec.At = f.time(ts)
	}
	err := r.options(opts, func(code uint16, v []byte) {
		switch {
		case code == optComment:
			rec.Comments = append(rec.Comments, string(v))
		case code == optEPBFlags && len(v) == 4:
			switch r.order.Uint32(v) & flagsDirMask {
			case flagsInbound:
				rec.Dir = Inbound
			case flagsOutbound:
				rec.Dir = Outbound
			}
		}
	})
	return rec, err
}

// time converts a timestamp in the interface's units to a time.
func (f *iface) time(ts uint64) time.Time {
	var perSec uint64
	if f.tsResol&0x80 != 0 {
		e := f.tsResol & 0x7F
		if e >= 64 {
			return time.Unix(f.tsOffset, 0).UTC()
		}
		perSec = 1 << e
	} else {
		perSec = 1
		for range min(f.tsResol, 19) { // 10^19 is the largest power of ten in 64 bits
			perSec *= 10
		}
	}
	sec, frac := ts/perSec, ts%perSec
	hi, lo := bits.Mul64(frac, 1e9)
	ns, _ := bits.Div64(hi, lo, perSec) // frac < perSec, so the quotient fits
	return time.Unix(f.tsOffset+int64(sec), int64(ns)).UTC()
}

// options walks an option list, calling fn for each option until opt_endofopt or the end.
func (r *Reader) options(b []byte, fn func(code uint16, v []byte)) error {
	for len(b) >= 4 {
		code, n := r.order.Uint16(b), int(r.order.Uint16(b[2:]))
		if code == optEndOfOpt {
			return nil
		}
		if 4+n > len(b) {
			return fmt.Errorf("%w: option %d overruns its block", ErrMalformed, code)
		}
		fn(code, b[4:4+n])
		b = b[min(4+pad4(n), len(b)):]
	}
	return nil
}

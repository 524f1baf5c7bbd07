package capture

import (
	"encoding/binary"
	"time"
)

// The pcapng blocks this package writes and reads, all little-endian when written. Block layout, IETF
// draft-ietf-opsawg-pcapng (PCAP Next Generation Dump File Format) section 3.1:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|                          Block Type                           |
//	+---------------------------------------------------------------+
//	|                      Block Total Length                       |
//	+---------------------------------------------------------------+
//	/                          Block Body                           /
//	/              variable length, padded to 32 bits               /
//	+---------------------------------------------------------------+
//	|                      Block Total Length                       |
//	+---------------------------------------------------------------+
//
// Options (section 3.5) are a code and a length, 16 bits each, then the value padded to 32 bits; the
// list ends with opt_endofopt (code 0, length 0).
//
// gopacket's pcapgo.NgWriter writes no per-packet options (no opt_comment, no epb_flags), and its
// NgReader skips them, which is why this package has its own few lines of each.

// Block types. draft-ietf-opsawg-pcapng sections 4.1 to 4.3 and Appendix A (Packet Block, obsolete).
const (
	blockSHB = 0x0A0D0D0A // Section Header Block
	blockIDB = 0x00000001 // Interface Description Block
	blockPB  = 0x00000002 // Packet Block (obsolete, still read)
	blockSPB = 0x00000003 // Simple Packet Block
	blockEPB = 0x00000006 // Enhanced Packet Block
)

// byteOrderMagic is the SHB's byte-order magic, written in the section's byte order. Section 4.1.
const byteOrderMagic = 0x1A2B3C4D

// Option codes. Section 3.5 (opt_endofopt, opt_comment), 4.1 (shb_userappl), 4.2 (if_name,
// if_tsresol) and 4.3 (epb_flags).
const (
	optEndOfOpt   = 0
	optComment    = 1
	optSHBUserApp = 4
	optIfName     = 2
	optIfTSResol  = 9
	optEPBFlags   = 2
)

// linkTypeEthernet is LINKTYPE_ETHERNET, the link type of every interface this package writes.
// tcpdump.org link-layer header types.
const linkTypeEthernet = 1

// snapLen is the interface's snapshot length: tcpdump's default. Nothing this package writes is cut.
const snapLen = 262144

// tsResolNano is an if_tsresol of 10^-9 s: timestamps in nanoseconds. Section 4.2.
const tsResolNano = 9

// epb_flags direction bits (bits 0-1): 01 inbound, 10 outbound. Section 4.3.1.
const (
	flagsInbound  = 0x1
	flagsOutbound = 0x2
	flagsDirMask  = 0x3
)

// blockHeaderLen and blockTrailerLen frame every block: type and length, then the length again.
const (
	blockHeaderLen  = 8
	blockTrailerLen = 4
	epbFixedLen     = 20 // interface ID, timestamp (2 x 32 bits), captured and original lengths
)

// pad4 rounds n up to a multiple of 4.
func pad4(n int) int { return (n + 3) &^ 3 }

// appendOption appends one option with its value padded to 32 bits.
func appendOption(b []byte, code uint16, v []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(v)))
	b = append(b, v...)
	return append(b, make([]byte, pad4(len(v))-len(v))...)
}

// appendEndOfOpt ends an option list.
func appendEndOfOpt(b []byte) []byte { return append(b, 0, 0, 0, 0) }

// beginBlock appends a block header with a length to be filled in by endBlock, and returns where the
// block starts.
func beginBlock(b []byte, typ uint32) ([]byte, int) {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, typ)
	return binary.LittleEndian.AppendUint32(b, 0), start
}

// endBlock pads the block that starts at start to 32 bits, appends its trailing length and fills in
// the leading one.
func endBlock(b []byte, start int) []byte {
	b = append(b, make([]byte, pad4(len(b)-start)-(len(b)-start))...)
	n := uint32(len(b) - start + blockTrailerLen)
	binary.LittleEndian.PutUint32(b[start+4:], n)
	return binary.LittleEndian.AppendUint32(b, n)
}

// appendSHB appends a Section Header Block: version 1.0, section length unknown (-1), naming goroce as
// the application that wrote it.
func appendSHB(b []byte) []byte {
	b, start := beginBlock(b, blockSHB)
	b = binary.LittleEndian.AppendUint32(b, byteOrderMagic)
	b = binary.LittleEndian.AppendUint16(b, 1) // major version
	b = binary.LittleEndian.AppendUint16(b, 0) // minor version
	b = binary.LittleEndian.AppendUint64(b, ^uint64(0))
	b = appendOption(b, optSHBUserApp, []byte("goroce"))
	b = appendEndOfOpt(b)
	return endBlock(b, start)
}

// appendIDB appends an Interface Description Block for an Ethernet interface named name, with
// nanosecond timestamps.
func appendIDB(b []byte, name string) []byte {
	b, start := beginBlock(b, blockIDB)
	b = binary.LittleEndian.AppendUint16(b, linkTypeEthernet)
	b = binary.LittleEndian.AppendUint16(b, 0) // reserved
	b = binary.LittleEndian.AppendUint32(b, snapLen)
	if name != "" {
		b = appendOption(b, optIfName, []byte(name))
	}
	b = appendOption(b, optIfTSResol, []byte{tsResolNano})
	b = appendEndOfOpt(b)
	return endBlock(b, start)
}

// appendEPB appends an Enhanced Packet Block for interface 0: the frame, whole, stamped at at in
// nanoseconds, with its direction in epb_flags (unless unknown) and one opt_comment per comment.
func appendEPB(b []byte, at time.Time, frame []byte, dir Direction, comments []string) []byte {
	b, start := beginBlock(b, blockEPB)
	ts := uint64(at.UnixNano())
	b = binary.LittleEndian.AppendUint32(b, 0) // interface ID
	b = binary.LittleEndian.AppendUint32(b, uint32(ts>>32))
	b = binary.LittleEndian.AppendUint32(b, uint32(ts))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(frame)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(frame)))
	b = append(b, frame...)
	b = append(b, make([]byte, pad4(len(frame))-len(frame))...)
	for _, c := range comments {
		b = appendOption(b, optComment, []byte(c))
	}
	if f := dir.flags(); f != 0 {
		b = appendOption(b, optEPBFlags, binary.LittleEndian.AppendUint32(nil, f))
	}
	if len(comments) > 0 || dir.flags() != 0 {
		b = appendEndOfOpt(b)
	}
	return endBlock(b, start)
}

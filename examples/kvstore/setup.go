package kvstore

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/goroce/goroce"
)

// The setup exchange, big-endian:
//
//	client → server  hello: magic "GRKV" (4), the client QP's Endpoint (goroce.EndpointLen)
//	server → client  table: the server QP's Endpoint (goroce.EndpointLen), table address (8),
//	                 rkey (4), slots (4), MaxKey (2), MaxValue (4), probes (4), byte order (1)
//
// The server connects its queue pair before it sends table and the client connects on receiving it;
// only the client ever starts an exchange on the queue pairs, so no packet reaches a queue pair before
// its Connect. The connection then stays open, silent: the server keeps the client's queue pair until
// it closes.
const (
	magic    = "GRKV"
	helloLen = len(magic) + goroce.EndpointLen
	tableLen = goroce.EndpointLen + 8 + 4 + 4 + 2 + 4 + 4 + 1
)

// tableInfo is what a client learns of the table.
type tableInfo struct {
	peer  goroce.Endpoint
	addr  uint64
	rkey  goroce.RKey
	order binary.ByteOrder // the server's: that of the version words
	layout
}

func writeHello(w io.Writer, ep goroce.Endpoint) error {
	b, _ := ep.AppendBinary([]byte(magic))
	_, err := w.Write(b)
	return err
}

func readHello(r io.Reader) (goroce.Endpoint, error) {
	var b [helloLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return goroce.Endpoint{}, err
	}
	if string(b[:len(magic)]) != magic {
		return goroce.Endpoint{}, fmt.Errorf("%w: not a kvstore client", ErrProtocol)
	}
	var ep goroce.Endpoint
	if err := ep.UnmarshalBinary(b[len(magic):]); err != nil {
		return goroce.Endpoint{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return ep, nil
}

func writeTable(w io.Writer, ep goroce.Endpoint, table *goroce.MR, l layout) error {
	b, _ := ep.AppendBinary(make([]byte, 0, tableLen))
	b = binary.BigEndian.AppendUint64(b, table.Addr())
	b = binary.BigEndian.AppendUint32(b, uint32(table.RKey()))
	b = binary.BigEndian.AppendUint32(b, uint32(l.Slots))
	b = binary.BigEndian.AppendUint16(b, uint16(l.MaxKey))
	b = binary.BigEndian.AppendUint32(b, uint32(l.MaxValue))
	b = binary.BigEndian.AppendUint32(b, uint32(l.Probes))
	b = append(b, nativeOrder())
	_, err := w.Write(b)
	return err
}

func readTable(r io.Reader) (tableInfo, error) {
	var b [tableLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return tableInfo{}, err
	}
	var t tableInfo
	if err := t.peer.UnmarshalBinary(b[:goroce.EndpointLen]); err != nil {
		return tableInfo{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	p := b[goroce.EndpointLen:]
	t.addr = binary.BigEndian.Uint64(p[0:])
	t.rkey = goroce.RKey(binary.BigEndian.Uint32(p[8:]))
	t.Slots = int(binary.BigEndian.Uint32(p[12:]))
	t.MaxKey = int(binary.BigEndian.Uint16(p[16:]))
	t.MaxValue = int(binary.BigEndian.Uint32(p[18:]))
	t.Probes = int(binary.BigEndian.Uint32(p[22:]))
	switch p[26] {
	case orderLittle:
		t.order = binary.LittleEndian
	case orderBig:
		t.order = binary.BigEndian
	default:
		return tableInfo{}, fmt.Errorf("%w: byte order %d", ErrProtocol, p[26])
	}
	if err := t.layout.validate(); err != nil {
		return tableInfo{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return t, nil
}

// Limits of a layout.
const (
	maxSlots    = 1 << 24
	maxKeyLen   = 1<<16 - 1
	maxValueLen = 1 << 20
)

func (l layout) validate() error {
	switch {
	case l.Slots < 1 || l.Slots > maxSlots:
		return fmt.Errorf("slots %d out of range (1..%d)", l.Slots, maxSlots)
	case l.MaxKey < 1 || l.MaxKey > maxKeyLen:
		return fmt.Errorf("key length %d out of range (1..%d)", l.MaxKey, maxKeyLen)
	case l.MaxValue < 0 || l.MaxValue > maxValueLen:
		return fmt.Errorf("value length %d out of range (0..%d)", l.MaxValue, maxValueLen)
	case l.Probes < 1 || l.Probes > l.Slots:
		return fmt.Errorf("probes %d out of range (1..slots)", l.Probes)
	}
	return nil
}

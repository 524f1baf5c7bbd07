// Package kvstore is a one-sided key-value store on goroce, of the kind people build on RDMA (Pilaf,
// FaRM): the server registers a table and serves only connection setup; clients read and write the
// table themselves with RDMA READ, WRITE and atomics, and no request ever runs on the server's CPU.
//
// A server opens a goroce Device, NewServer registers the table, and Serve (or ServeConn) hands each
// client, over a TCP connection (or any net.Conn), a connected queue pair and the table's address and
// rkey. NewClient is the other end; Client.Get and Client.Put then go straight to the table.
//
// # Table
//
// The table is Config.Slots fixed-size slots in one registered region. A key's FNV-1a hash picks its
// home slot; a key lives in the first slot of its probe sequence (the home slot and the
// Config.Probes-1 after it, wrapping around) that holds it or is empty. There is no delete, so a slot
// once taken keeps its key and an empty slot ends every probe sequence through it. A slot is
//
//	offset        size      field
//	0             8         version: the seqlock word, in the server's byte order
//	8             8         checksum: CRC-64 (ECMA) of version, key length, value length, key, value
//	16            2         key length, little-endian; 0 in a slot never written
//	18            2         zero
//	20            4         value length, little-endian
//	24            MaxKey    key
//	24+MaxKey     MaxValue  value
//
// padded to a multiple of 8 bytes, so that every version word is 8-byte aligned, as atomics require.
//
// # The seqlock
//
// The version word makes each slot a sequence lock: writers take it, readers never do. An even
// version means the slot is stable, an odd one that a writer holds it; 0 is a slot never written.
//
// A writer (Put) reads the slot as a reader does and sees version v, even. It then runs a
// compare-and-swap of v to v+1 on the version word. If the swap fails, another writer came first, and
// it reads again; if it succeeds, the writer holds the slot, and knows that the slot still holds what
// it read, since any write since would have changed v. It then posts, in one PostSend, an RDMA WRITE of
// the checksum, lengths, key and value and a fetch-and-add of 1 that moves the version to v+2 and
// releases the slot. RC runs a queue pair's requests in order, so the WRITE has landed when the version
// turns even. The release is an atomic rather than a WRITE of v+2 because goroce, like a NIC, makes
// atomics atomic only with respect to other atomics: every change of the word goes through one.
//
// A reader (Get) posts an RDMA READ of the whole slot and, behind it on the same queue pair, a READ of
// the version word alone. It keeps the copy only if the version in the copy (v1) equals the one read
// after it (v2) and is even: the version only grows, so no writer took the slot between the two
// reads. Otherwise a writer was at work, and it reads again.
//
// The version alone would be enough if a READ copied the slot's bytes in order, version first. RDMA
// does not promise that (a NIC moves a READ's bytes in any order, and goroce copies one packet at a
// time), so a copy may hold a version read late with bytes read early, during the write that ended
// just before. The checksum catches that: it covers the version the writer released, so bytes that do
// not belong to that version fail it (but for a chance of 2^-64), and the reader reads again.
//
// # Failures
//
// A client that dies holding a slot leaves it locked: readers and writers of that slot retry until
// their context ends. Real systems give locks a lease; this example does not. A client whose queue pair
// fails (the server went away, a retry counter ran out) fails every later call with the error that
// ended it.
//
// # Byte order
//
// The server's NIC runs atomics on the version word as a number in its own byte order, and a client's
// NIC returns an atomic's original value in the client's. The server tells each client its order, and
// clients decode the version words they READ with it. The other fields are little-endian.
package kvstore

import (
	"encoding/binary"
	"errors"
	"hash/crc64"
	"hash/fnv"
)

// Errors of the store.
var (
	ErrNotFound      = errors.New("kvstore: key not found")
	ErrTableFull     = errors.New("kvstore: no free slot in the key's probe sequence")
	ErrKeyLength     = errors.New("kvstore: key empty or longer than the table allows")
	ErrValueTooLarge = errors.New("kvstore: value longer than the table allows")
	ErrClosed        = errors.New("kvstore: closed")
	ErrProtocol      = errors.New("kvstore: malformed setup message")
)

// Offsets of a slot's fields.
const (
	offVersion  = 0
	offChecksum = 8
	offKeyLen   = 16
	offValueLen = 20
	offKey      = 24
)

// wordSize is the length of the version word and the alignment atomics need. IBTA Vol 1 chapter 9
// (transport layer, atomic operations).
const wordSize = 8

// Defaults of Config.
const (
	DefaultSlots    = 1024
	DefaultMaxKey   = 32
	DefaultMaxValue = 224
	DefaultProbes   = 8
)

// layout is the table's geometry, which the server sends every client.
type layout struct {
	Slots    int
	MaxKey   int
	MaxValue int
	Probes   int
}

// slotSize returns the length of a slot: the header, key and value, padded to the word size.
func (l layout) slotSize() int {
	return (offKey + l.MaxKey + l.MaxValue + wordSize - 1) / wordSize * wordSize
}

// probe returns the table index of the i-th slot of the probe sequence of a key with hash h.
func (l layout) probe(h uint64, i int) int {
	return int((h + uint64(i)) % uint64(l.Slots))
}

// hashKey returns the hash that picks a key's home slot: FNV-1a, the same in every client.
func hashKey(key []byte) uint64 {
	h := fnv.New64a()
	h.Write(key)
	return h.Sum64()
}

var crcTable = crc64.MakeTable(crc64.ECMA)

// checksum returns the checksum a slot with these contents carries.
func checksum(version uint64, key, value []byte) uint64 {
	var hdr [14]byte
	binary.LittleEndian.PutUint64(hdr[0:], version)
	binary.LittleEndian.PutUint16(hdr[8:], uint16(len(key)))
	binary.LittleEndian.PutUint32(hdr[10:], uint32(len(value)))
	c := crc64.Update(0, crcTable, hdr[:])
	c = crc64.Update(c, crcTable, key)
	return crc64.Update(c, crcTable, value)
}

// byteOrder codes in the setup message.
const (
	orderLittle = 1
	orderBig    = 2
)

// nativeOrder returns the code of this host's byte order.
func nativeOrder() byte {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	if b[0] == 1 {
		return orderLittle
	}
	return orderBig
}

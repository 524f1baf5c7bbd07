package wire

import "errors"

// Error categories. Every error Parse, Append and the ICRC functions return matches exactly one of these
// with errors.Is; the message names the precise problem. The errors are preallocated, so rejecting a
// packet never allocates.
var (
	ErrTruncated       = errors.New("wire: truncated packet")
	ErrBadOpcode       = errors.New("wire: unknown or reserved opcode")
	ErrBadVersion      = errors.New("wire: unsupported transport header version")
	ErrBadPad          = errors.New("wire: bad pad count")
	ErrBadLength       = errors.New("wire: length disagrees with the header chain")
	ErrPayloadTooLarge = errors.New("wire: payload larger than the largest MTU")
	ErrICRC            = errors.New("wire: ICRC mismatch")
	ErrIPHeader        = errors.New("wire: bad IP or UDP header")
)

// detailError is a precise message that matches one category.
type detailError struct {
	kind error
	msg  string
}

func (e *detailError) Error() string { return e.msg }
func (e *detailError) Unwrap() error { return e.kind }

func detail(kind error, msg string) error { return &detailError{kind: kind, msg: msg} }

var (
	errShortBTH        = detail(ErrTruncated, "wire: truncated packet: shorter than a BTH and an ICRC")
	errShortHeaders    = detail(ErrTruncated, "wire: truncated packet: shorter than the headers its opcode requires")
	errUnaligned       = detail(ErrBadLength, "wire: packet length is not a multiple of 4 bytes")
	errUnexpectedPay   = detail(ErrBadLength, "wire: payload present on an opcode that carries none")
	errAtomicWriteLen  = detail(ErrBadLength, "wire: ATOMIC_WRITE payload is not 8 bytes")
	errPadNoPayload    = detail(ErrBadPad, "wire: nonzero pad count on an opcode that carries no payload")
	errPadExceeds      = detail(ErrBadPad, "wire: pad count larger than the bytes after the headers")
	errPayloadTooLarge = detail(ErrPayloadTooLarge, "wire: payload larger than 4096 bytes")
	errBuildPayload    = detail(ErrBadLength, "wire: cannot append a payload to an opcode that carries none")
)

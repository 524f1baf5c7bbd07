// Package wire is goroce's RoCEv2 codec: the InfiniBand transport headers that RoCEv2 carries in UDP to
// port 4791, their one opcode table, PSN arithmetic, and the invariant CRC (ICRC).
//
// It imports only the standard library and never allocates on the packet path: headers are byte-slice
// views (BTH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH, FETH) with getters, setters, a
// Fields struct and Encode/Append; Parse validates a whole transport packet once, after which the
// accessors trust it; Append builds one; ComputeICRC, SetICRC and VerifyICRC handle the ICRC over the
// IPv4 or IPv6 header it covers; ParseIP does all of it for a packet seen with its IP header.
//
// The layout of a RoCEv2 packet:
//
//	IPv4 or IPv6 | UDP (dport 4791) | BTH | extension headers | payload | pad | ICRC
//
// Which extension headers follow the BTH, and whether a payload may, depends only on the opcode: see
// OpInfo. Section references are to the InfiniBand Architecture Specification Volume 1 (IBTA Vol 1,
// Release 1.2.1, chapter 9 for the transport layer) and its Annex A17 (RoCEv2).
//
// Errors are matchable with errors.Is against the category sentinels (ErrTruncated, ErrBadOpcode,
// ErrBadVersion, ErrBadPad, ErrBadLength, ErrPayloadTooLarge, ErrICRC, ErrIPHeader); each message says
// precisely what was wrong.
package wire

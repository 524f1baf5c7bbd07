// Package mad decodes and builds InfiniBand management datagrams (MADs): the 256-byte messages that
// RoCEv2 carries as UD SEND_ONLY packets to QP1, the general services interface (GSI). The RDMA connection
// manager (CM) that rping and every rdma_cm application use speaks in MADs: ConnectRequest, ConnectReply,
// ReadyToUse, DisconnectRequest and their kin.
//
// Like wire, the package imports only the standard library (and wire's domain types), never allocates
// when parsing, and never panics on peer input. Parse validates a MAD once (its length and base
// version), ParseCM also that it is a CM message of chapter 12; every CM field lies inside the 256
// bytes, so after them the accessors trust the bytes.
//
// Every CM message has a view (REQ, REP, MRA, REJ, Comm for RTU and DREP, DREQ, SIDRReq, SIDRRep) with
// an accessor per field, a Fields struct with Fields and Encode, and an Append that builds the whole MAD
// (AppendCM). cma.go holds rdma_cm's conventions: service IDs made of a port space and a port, and the
// CMA header that starts a REQ's private data.
//
// Section references are to the InfiniBand Architecture Specification Volume 1, Release 1.2.1:
// chapter 13.4 for the MAD common header, chapter 12 for the communication manager. CM field offsets
// follow Linux include/rdma/ibta_vol1_c12.h.
package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Len is the size of every MAD: a 24-byte common header and 232 bytes of class-specific data.
// IBTA Vol 1 13.4.2 (MAD formats).
const Len = 256

// HeaderLen is the size of the MAD common header. IBTA Vol 1 13.4.2 (MAD common header).
const HeaderLen = 24

// DataLen is the size of the data after the common header.
const DataLen = Len - HeaderLen

// BaseVersion is the only MAD base version InfiniBand defines. IBTA Vol 1 13.4.2 (BaseVersion).
const BaseVersion = 1

// Error categories. Every error Parse and ParseHeader return matches one of them with errors.Is.
var (
	ErrTruncated   = errors.New("mad: truncated MAD")
	ErrBadVersion  = errors.New("mad: unsupported MAD base version")
	errShortHeader = &detailError{ErrTruncated, "mad: truncated MAD: shorter than the 24-byte common header"}
	errShortMAD    = &detailError{ErrTruncated, "mad: truncated MAD: shorter than 256 bytes"}
)

// detailError is a precise message that matches one category.
type detailError struct {
	kind error
	msg  string
}

func (e *detailError) Error() string { return e.msg }
func (e *detailError) Unwrap() error { return e.kind }

// Header is a view of the MAD common header. IBTA Vol 1 13.4.2 (MAD common header).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  BaseVersion  |   MgmtClass   | ClassVersion  |R|   Method    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|            Status             |         ClassSpecific         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                      TransactionID (64)                       |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          AttributeID          |           Reserved            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       AttributeModifier                       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// R is the response bit, kept here as the top bit of Method. Accessors do not check the length: use them
// on a slice of at least HeaderLen bytes, such as one ParseHeader returned.
type Header []byte

const (
	hdrBaseVersion  = 0
	hdrMgmtClass    = 1
	hdrClassVersion = 2
	hdrMethod       = 3
	hdrStatus       = 4
	hdrClassSpec    = 6
	hdrTID          = 8
	hdrAttrID       = 16
	hdrAttrMod      = 20
)

// ParseHeader checks that b starts with a whole MAD common header and returns a view of it. It is for
// MADs a capture cut short; Parse is the check for a whole one.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return nil, errShortHeader
	}
	return Header(b[:HeaderLen:HeaderLen]), nil
}

// BaseVersion returns the MAD format version; BaseVersion (1) is the only one defined.
func (h Header) BaseVersion() uint8 { return h[hdrBaseVersion] }

// MgmtClass returns the management class: which manager the MAD is for (CM, SubnAdm, ...).
func (h Header) MgmtClass() Class { return Class(h[hdrMgmtClass]) }

// ClassVersion returns the version of the management class's protocol; the CM's is 2.
func (h Header) ClassVersion() uint8 { return h[hdrClassVersion] }

// Method returns the method, response bit included: Get, Set, Send, GetResp, ...
func (h Header) Method() Method { return Method(h[hdrMethod]) }

// Status returns the status field; nonzero only in responses that report a problem.
// IBTA Vol 1 13.4.7 (status field).
func (h Header) Status() uint16 { return binary.BigEndian.Uint16(h[hdrStatus:]) }

// ClassSpecific returns the class-specific field (hop pointer and count for directed-route SMPs).
func (h Header) ClassSpecific() uint16 { return binary.BigEndian.Uint16(h[hdrClassSpec:]) }

// TransactionID returns the transaction ID the requester chose; a response echoes it.
func (h Header) TransactionID() uint64 { return binary.BigEndian.Uint64(h[hdrTID:]) }

// AttributeID returns the attribute ID: which message of the class this is (ConnectRequest, ...).
func (h Header) AttributeID() AttributeID { return AttributeID(binary.BigEndian.Uint16(h[hdrAttrID:])) }

// AttributeModifier returns the attribute modifier, whose meaning depends on the attribute.
func (h Header) AttributeModifier() uint32 { return binary.BigEndian.Uint32(h[hdrAttrMod:]) }

// AttributeName returns the name of the header's attribute in its class, or its number in hex.
func (h Header) AttributeName() string { return h.MgmtClass().AttributeName(h.AttributeID()) }

// HeaderFields holds every field of a MAD common header.
type HeaderFields struct {
	BaseVersion       uint8
	MgmtClass         Class
	ClassVersion      uint8
	Method            Method
	Status            uint16
	ClassSpecific     uint16
	TransactionID     uint64
	AttributeID       AttributeID
	AttributeModifier uint32
}

// Fields decodes the whole header.
func (h Header) Fields() HeaderFields {
	return HeaderFields{
		BaseVersion:       h.BaseVersion(),
		MgmtClass:         h.MgmtClass(),
		ClassVersion:      h.ClassVersion(),
		Method:            h.Method(),
		Status:            h.Status(),
		ClassSpecific:     h.ClassSpecific(),
		TransactionID:     h.TransactionID(),
		AttributeID:       h.AttributeID(),
		AttributeModifier: h.AttributeModifier(),
	}
}

// Encode writes all of f into h; the reserved field is zeroed.
func (h Header) Encode(f *HeaderFields) {
	h[hdrBaseVersion] = f.BaseVersion
	h[hdrMgmtClass] = byte(f.MgmtClass)
	h[hdrClassVersion] = f.ClassVersion
	h[hdrMethod] = byte(f.Method)
	binary.BigEndian.PutUint16(h[hdrStatus:], f.Status)
	binary.BigEndian.PutUint16(h[hdrClassSpec:], f.ClassSpecific)
	binary.BigEndian.PutUint64(h[hdrTID:], f.TransactionID)
	binary.BigEndian.PutUint16(h[hdrAttrID:], uint16(f.AttributeID))
	binary.BigEndian.PutUint16(h[hdrAttrID+2:], 0)
	binary.BigEndian.PutUint32(h[hdrAttrMod:], f.AttributeModifier)
}

// MAD is a validated 256-byte management datagram. Only Parse makes one; its accessors trust the
// length. It refers to the bytes it was parsed from.
type MAD []byte

// Parse validates a whole MAD: at least Len bytes (a UD payload of more is cut to Len), base version 1.
// It never allocates and never panics.
func Parse(b []byte) (MAD, error) {
	if len(b) < HeaderLen {
		return nil, errShortHeader
	}
	if b[hdrBaseVersion] != BaseVersion {
		return nil, ErrBadVersion
	}
	if len(b) < Len {
		return nil, errShortMAD
	}
	return MAD(b[:Len:Len]), nil
}

// Header returns the common header.
func (m MAD) Header() Header { return Header(m[:HeaderLen:HeaderLen]) }

// Data returns the 232 bytes after the common header: the class-specific message.
func (m MAD) Data() []byte { return m[HeaderLen:Len:Len] }

// IsCM reports whether the MAD is a communication manager message.
func (m MAD) IsCM() bool { return m.Header().MgmtClass() == ClassCM }

// String summarizes the MAD in one line: the class, the attribute, and for CM messages their key fields,
// e.g. "CM ConnectRequest comm=0x864cc85e qpn=0x000014 psn=0xf65fee service=0x0000000001061c06 mtu=1024".
func (m MAD) String() string {
	h := m.Header()
	s := h.MgmtClass().String() + " " + h.AttributeName()
	if !(h.MgmtClass() == ClassCM && h.Method() == MethodSend) {
		s += " " + h.Method().String()
	}
	if h.Status() != 0 {
		s += fmt.Sprintf(" status=%#04x", h.Status())
	}
	if h.MgmtClass() == ClassCM {
		if c := m.cmSummary(); c != "" {
			s += " " + c
		}
	} else {
		s += fmt.Sprintf(" tid=%#x", h.TransactionID())
	}
	return s
}

// Class is a management class: the manager a MAD is addressed to. IBTA Vol 1 13.4.4 (management classes);
// values as in Linux include/rdma/ib_mad.h.
type Class uint8

// Management classes.
const (
	ClassSubnLIDRouted  Class = 0x01 // subnet management, LID routed
	ClassSubnAdm        Class = 0x03 // subnet administration (the SA)
	ClassPerfMgmt       Class = 0x04 // performance management
	ClassBaseboardMgmt  Class = 0x05 // baseboard management
	ClassDevMgmt        Class = 0x06 // device management
	ClassCM             Class = 0x07 // communication management
	ClassSNMP           Class = 0x08 // SNMP tunneling
	ClassDevAdm         Class = 0x10 // device administration
	ClassBootMgmt       Class = 0x11 // boot management
	ClassBIS            Class = 0x12 // BIS
	ClassCongMgmt       Class = 0x21 // congestion management
	ClassSubnDirected   Class = 0x81 // subnet management, directed route
	classVendor1Start   Class = 0x09
	classVendor1End     Class = 0x0F
	classVendor2Start   Class = 0x30
	classVendor2End     Class = 0x4F
	classApplicationEnd Class = 0x2F // 0x22..0x2F are application specific
)

var classNames = map[Class]string{
	ClassSubnLIDRouted: "SubnMgmt",
	ClassSubnAdm:       "SubnAdm",
	ClassPerfMgmt:      "PerfMgmt",
	ClassBaseboardMgmt: "BaseboardMgmt",
	ClassDevMgmt:       "DevMgmt",
	ClassCM:            "CM",
	ClassSNMP:          "SNMP",
	ClassDevAdm:        "DevAdm",
	ClassBootMgmt:      "BootMgmt",
	ClassBIS:           "BIS",
	ClassCongMgmt:      "CongMgmt",
	ClassSubnDirected:  "SubnMgmtDR",
}

func (c Class) String() string {
	if n, ok := classNames[c]; ok {
		return n
	}
	switch {
	case c >= classVendor1Start && c <= classVendor1End, c >= classVendor2Start && c <= classVendor2End:
		return fmt.Sprintf("Vendor(%#02x)", uint8(c))
	case c > ClassCongMgmt && c <= classApplicationEnd:
		return fmt.Sprintf("Application(%#02x)", uint8(c))
	}
	return fmt.Sprintf("Class(%#02x)", uint8(c))
}

// Method is a MAD method; the top bit marks a response. IBTA Vol 1 13.4.5 (methods); Linux ib_mad.h.
type Method uint8

// MethodResponse is the bit a response method sets.
const MethodResponse Method = 0x80

// Methods.
const (
	MethodGet           Method = 0x01
	MethodSet           Method = 0x02
	MethodSend          Method = 0x03 // the only method the CM uses
	MethodTrap          Method = 0x05
	MethodReport        Method = 0x06
	MethodTrapRepress   Method = 0x07
	MethodGetTable      Method = 0x12 // SA
	MethodGetTraceTable Method = 0x13 // SA
	MethodGetMulti      Method = 0x14 // SA
	MethodDelete        Method = 0x15 // SA
	MethodGetResp       Method = MethodGet | MethodResponse
	MethodReportResp    Method = MethodReport | MethodResponse
	MethodGetTableResp  Method = MethodGetTable | MethodResponse
	MethodGetMultiResp  Method = MethodGetMulti | MethodResponse
	MethodDeleteResp    Method = MethodDelete | MethodResponse
)

var methodNames = map[Method]string{
	MethodGet:           "Get",
	MethodSet:           "Set",
	MethodSend:          "Send",
	MethodTrap:          "Trap",
	MethodReport:        "Report",
	MethodTrapRepress:   "TrapRepress",
	MethodGetTable:      "GetTable",
	MethodGetTraceTable: "GetTraceTable",
	MethodGetMulti:      "GetMulti",
	MethodDelete:        "Delete",
	MethodGetResp:       "GetResp",
	MethodReportResp:    "ReportResp",
	MethodGetTableResp:  "GetTableResp",
	MethodGetMultiResp:  "GetMultiResp",
	MethodDeleteResp:    "DeleteResp",
}

// IsResponse reports whether the method's response bit is set.
func (m Method) IsResponse() bool { return m&MethodResponse != 0 }

func (m Method) String() string {
	if n, ok := methodNames[m]; ok {
		return n
	}
	return fmt.Sprintf("Method(%#02x)", uint8(m))
}

// AttributeID names the message a MAD carries within its class. The CM's attributes are the CM message
// types. IBTA Vol 1 12.6 (CM messages), 13.4.8 (common attributes).
type AttributeID uint16

// Attributes every class shares. IBTA Vol 1 13.4.8.
const (
	AttrClassPortInfo AttributeID = 0x0001
	AttrNotice        AttributeID = 0x0002
	AttrInformInfo    AttributeID = 0x0003
)

// CM attributes: the communication manager's message types. IBTA Vol 1 12.6 (Table 103); Wireshark
// packet-infiniband.c CM_Attributes.
const (
	AttrConnectRequest    AttributeID = 0x0010 // REQ
	AttrMRA               AttributeID = 0x0011 // message receipt acknowledgement
	AttrConnectReject     AttributeID = 0x0012 // REJ
	AttrConnectReply      AttributeID = 0x0013 // REP
	AttrReadyToUse        AttributeID = 0x0014 // RTU
	AttrDisconnectRequest AttributeID = 0x0015 // DREQ
	AttrDisconnectReply   AttributeID = 0x0016 // DREP
	AttrSIDRRequest       AttributeID = 0x0017 // SIDR_REQ: service ID resolution for UD
	AttrSIDRReply         AttributeID = 0x0018 // SIDR_REP
	AttrLoadAlternatePath AttributeID = 0x0019 // LAP
	AttrAlternatePathResp AttributeID = 0x001A // APR
)

var commonAttrNames = map[AttributeID]string{
	AttrClassPortInfo: "ClassPortInfo",
	AttrNotice:        "Notice",
	AttrInformInfo:    "InformInfo",
}

var cmAttrNames = map[AttributeID]string{
	AttrConnectRequest:    "ConnectRequest",
	AttrMRA:               "MRA",
	AttrConnectReject:     "ConnectReject",
	AttrConnectReply:      "ConnectReply",
	AttrReadyToUse:        "ReadyToUse",
	AttrDisconnectRequest: "DisconnectRequest",
	AttrDisconnectReply:   "DisconnectReply",
	AttrSIDRRequest:       "SIDR_REQ",
	AttrSIDRReply:         "SIDR_REP",
	AttrLoadAlternatePath: "LAP",
	AttrAlternatePathResp: "APR",
}

func (a AttributeID) String() string { return fmt.Sprintf("%#04x", uint16(a)) }

// AttributeName returns the name attribute a has in class c: "ConnectRequest" for the CM's 0x0010,
// "ClassPortInfo" for 0x0001 in every class, or a's number in hex.
func (c Class) AttributeName(a AttributeID) string {
	if n, ok := commonAttrNames[a]; ok {
		return n
	}
	if c == ClassCM {
		if n, ok := cmAttrNames[a]; ok {
			return n
		}
	}
	return "Attribute(" + a.String() + ")"
}

package wire

import (
	"fmt"
	"strconv"
	"time"
)

// Syndrome is the AETH syndrome byte: whether the packet acknowledges (ACK), asks the requester to wait
// (RNR NAK) or reports an error (NAK), with a 5-bit value whose meaning depends on the kind.
// IBTA Vol 1 9.7.5 (AETH syndrome).
//
//	  7   6 5   4 3 2 1 0
//	+---+-----+-----------+
//	| 0 |kind | value     |   kind: 00 ACK, 01 RNR NAK, 10 reserved, 11 NAK
//	+---+-----+-----------+
type Syndrome uint8

// SyndromeKind is bits 6..5 of a syndrome.
type SyndromeKind uint8

// Syndrome kinds. IBTA Vol 1 9.7.5.
const (
	KindACK      SyndromeKind = 0
	KindRNRNAK   SyndromeKind = 1
	KindReserved SyndromeKind = 2
	KindNAK      SyndromeKind = 3
)

func (k SyndromeKind) String() string {
	switch k {
	case KindACK:
		return "ACK"
	case KindRNRNAK:
		return "RNR NAK"
	case KindNAK:
		return "NAK"
	}
	return "reserved"
}

// NAKCode is the value of a NAK syndrome. IBTA Vol 1 9.7.5.
type NAKCode uint8

// NAK codes. IBTA Vol 1 9.7.5 (AETH syndrome); rxe maps 1..3 to IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR
// and IBV_WC_REM_OP_ERR.
const (
	NAKPSNSequenceError       NAKCode = 0
	NAKInvalidRequest         NAKCode = 1
	NAKRemoteAccessError      NAKCode = 2
	NAKRemoteOperationalError NAKCode = 3
	NAKInvalidRDRequest       NAKCode = 4
)

var nakNames = [...]string{
	NAKPSNSequenceError:       "psn-sequence-error",
	NAKInvalidRequest:         "invalid-request",
	NAKRemoteAccessError:      "remote-access-error",
	NAKRemoteOperationalError: "remote-operational-error",
	NAKInvalidRDRequest:       "invalid-rd-request",
}

func (c NAKCode) String() string {
	if int(c) < len(nakNames) {
		return nakNames[c]
	}
	return "reserved-" + strconv.Itoa(int(c))
}

const (
	syndromeKindShift = 5
	syndromeKindMask  = 0x3
	syndromeValueMask = 0x1F
)

// CreditInvalid is the ACK credit code that advertises no credit count. rxe always sends it, and
// goroce does too: end-to-end credits are not used on RoCE. IBTA Vol 1 9.7.7.
const CreditInvalid = 0x1F

// SyndromeACK returns an ACK syndrome with the given 5-bit credit code.
func SyndromeACK(credit uint8) Syndrome { return Syndrome(credit & syndromeValueMask) }

// SyndromeRNR returns an RNR NAK syndrome with the given 5-bit timer code (see RNRTimer).
func SyndromeRNR(timer uint8) Syndrome {
	return Syndrome(KindRNRNAK<<syndromeKindShift) | Syndrome(timer&syndromeValueMask)
}

// SyndromeNAK returns a NAK syndrome with the given code.
func SyndromeNAK(c NAKCode) Syndrome {
	return Syndrome(KindNAK<<syndromeKindShift) | Syndrome(c&syndromeValueMask)
}

// Kind returns the syndrome's kind.
func (s Syndrome) Kind() SyndromeKind { return SyndromeKind(s>>syndromeKindShift) & syndromeKindMask }

// Value returns the low 5 bits: a credit code, an RNR timer code or a NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & syndromeValueMask }

// IsACK reports whether s is a positive acknowledgement.
func (s Syndrome) IsACK() bool { return s.Kind() == KindACK }

// Credits returns the number of receive credits an ACK advertises, and false for CreditInvalid or a
// syndrome that is not an ACK.
func (s Syndrome) Credits() (int, bool) {
	if s.Kind() != KindACK || s.Value() == CreditInvalid {
		return 0, false
	}
	return int(creditTable[s.Value()]), true
}

// NAKCode returns the code of a NAK; it is meaningful only when Kind is KindNAK.
func (s Syndrome) NAKCode() NAKCode { return NAKCode(s.Value()) }

// RNRTimer returns how long a requester waits after an RNR NAK with this syndrome; it is meaningful only
// when Kind is KindRNRNAK.
func (s Syndrome) RNRTimer() time.Duration { return RNRTimer(s.Value()) }

// Reserved reports whether s uses a reserved kind, sets the reserved top bit, or is a NAK with a reserved
// code.
func (s Syndrome) Reserved() bool {
	return s&0x80 != 0 || s.Kind() == KindReserved || (s.Kind() == KindNAK && s.NAKCode() > NAKInvalidRDRequest)
}

// String says what the syndrome means in words: "ACK", "ACK credits=64", "RNR NAK 0.64ms",
// "NAK psn-sequence-error".
func (s Syndrome) String() string {
	if s&0x80 != 0 || s.Kind() == KindReserved {
		return fmt.Sprintf("reserved syndrome %#02x", uint8(s))
	}
	switch s.Kind() {
	case KindACK:
		if n, ok := s.Credits(); ok {
			return "ACK credits=" + strconv.Itoa(n)
		}
		return "ACK"
	case KindRNRNAK:
		return "RNR NAK " + formatMillis(s.RNRTimer())
	default:
		return "NAK " + s.NAKCode().String()
	}
}

func formatMillis(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64) + "ms"
}

// creditTable maps ACK credit codes to credit counts. IBTA Vol 1 9.7.7 (credits).
var creditTable = [32]uint16{
	0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 0,
}

// rnrTimerMicros maps RNR NAK timer codes to microseconds. IBTA Vol 1 9.7.5 (RNR timer
// field encodings). rxe's table (rxe_comp.c rnrnak_usec) has 61410 for code 25, a typo for the spec's
// 61440; goroce uses the spec's value.
var rnrTimerMicros = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760,
	327680, 491520,
}

// RNRTimer returns the wait that a 5-bit RNR timer code (min_rnr_timer, or the value of an RNR NAK)
// stands for. Code 0 is the longest, 655.36 ms.
func RNRTimer(code uint8) time.Duration {
	return time.Duration(rnrTimerMicros[code&syndromeValueMask]) * time.Microsecond
}

package wire

import (
	"testing"
	"time"
)

func TestSyndrome(t *testing.T) {
	for _, tc := range []struct {
		s    Syndrome
		kind SyndromeKind
		str  string
	}{
		{0x1F, KindACK, "ACK"}, // rxe's ACKs: credit count invalid
		{SyndromeACK(12), KindACK, "ACK credits=64"},
		{SyndromeACK(0), KindACK, "ACK credits=0"},
		{SyndromeRNR(12), KindRNRNAK, "RNR NAK 0.64ms"}, // ibv_rc_pingpong's min_rnr_timer
		{SyndromeRNR(0), KindRNRNAK, "RNR NAK 655.36ms"},
		{SyndromeRNR(25), KindRNRNAK, "RNR NAK 61.44ms"}, // the spec's value, not rxe's 61.41
		{0x60, KindNAK, "NAK psn-sequence-error"},
		{0x61, KindNAK, "NAK invalid-request"},
		{0x62, KindNAK, "NAK remote-access-error"},
		{0x63, KindNAK, "NAK remote-operational-error"},
		{0x64, KindNAK, "NAK invalid-rd-request"},
		{0x65, KindNAK, "NAK reserved-5"},
		{0x40, KindReserved, "reserved syndrome 0x40"},
		{0x9F, KindACK, "reserved syndrome 0x9f"},
	} {
		if tc.s.Kind() != tc.kind || tc.s.String() != tc.str {
			t.Errorf("%#02x: kind %v %q, want %v %q", uint8(tc.s), tc.s.Kind(), tc.s.String(), tc.kind, tc.str)
		}
	}
	if !Syndrome(0x65).Reserved() || Syndrome(0x64).Reserved() || !Syndrome(0x9F).Reserved() || Syndrome(0x1F).Reserved() {
		t.Error("Reserved")
	}
	if SyndromeNAK(NAKRemoteAccessError) != 0x62 || SyndromeRNR(12) != 0x2C {
		t.Error("constructors")
	}
	if _, ok := Syndrome(0x1F).Credits(); ok {
		t.Error("invalid credit code reported credits")
	}
	if RNRTimer(1) != 10*time.Microsecond || RNRTimer(31) != 491520*time.Microsecond || RNRTimer(0) != 655360*time.Microsecond {
		t.Error("RNR timer table ends")
	}
	for c := uint8(2); c < 32; c++ { // strictly increasing after code 1
		if RNRTimer(c) <= RNRTimer(c-1) {
			t.Errorf("RNR timer %d not above %d", c, c-1)
		}
	}
}

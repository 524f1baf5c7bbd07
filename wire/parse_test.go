package wire

import (
	"errors"
	"testing"
)

func mustAppend(t testing.TB, f Fields, payload []byte) []byte {
	t.Helper()
	b, err := Append(nil, &f, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseRejects(t *testing.T) {
	send := mustAppend(t, Fields{BTH: BTHFields{Opcode: RCSendOnly, PKey: DefaultPKey}}, []byte("abcde")) // pad 3
	ack := mustAppend(t, Fields{BTH: BTHFields{Opcode: RCAcknowledge}, AETH: AETHFields{Syndrome: 0x1F}}, nil)
	write := mustAppend(t, Fields{BTH: BTHFields{Opcode: RCWriteOnly}}, make([]byte, 8))
	big := mustAppend(t, Fields{BTH: BTHFields{Opcode: RCSendMiddle}}, make([]byte, MaxPayload))
	aw := mustAppend(t, Fields{BTH: BTHFields{Opcode: RCAtomicWrite}}, make([]byte, 8))

	mod := func(b []byte, f func([]byte) []byte) []byte { return f(append([]byte(nil), b...)) }
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"shorter than BTH+ICRC", send[:15], ErrTruncated},
		{"reserved opcode 0x15", mod(send, func(b []byte) []byte { b[0] = 0x15; return b }), ErrBadOpcode},
		{"RD opcode", mod(send, func(b []byte) []byte { b[0] = 0x44; return b }), ErrBadOpcode},
		{"manufacturer opcode", mod(send, func(b []byte) []byte { b[0] = 0xE0; return b }), ErrBadOpcode},
		{"TVer 1", mod(send, func(b []byte) []byte { b[1] |= 1; return b }), ErrBadVersion},
		{"WRITE_ONLY without its RETH", mod(write, func(b []byte) []byte {
			return append(b[:BTHLen], 0, 0, 0, 0, 0, 0, 0, 0)
		}), ErrTruncated},
		{"length not a multiple of 4", append(send[:len(send):len(send)], 0), ErrBadLength},
		{"payload on an ACK", append(ack[:len(ack):len(ack)], 0, 0, 0, 0), ErrBadLength},
		{"pad on an ACK", mod(ack, func(b []byte) []byte { BTH(b).SetPadCnt(2); return b }), ErrBadPad},
		{"pad larger than the rest", mod(write, func(b []byte) []byte {
			BTH(b).SetPadCnt(3)
			return append(b[:BTHLen+RETHLen], 0, 0, 0, 0)
		}), ErrBadPad},
		{"payload over 4096", append(big[:len(big):len(big)], 0, 0, 0, 0), ErrPayloadTooLarge},
		{"ATOMIC_WRITE of 12 bytes", append(aw[:len(aw):len(aw)], 0, 0, 0, 0), ErrBadLength},
	} {
		_, err := Parse(tc.b)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, ok := range [][]byte{send, ack, write, big, aw} {
		if _, err := Parse(ok); err != nil {
			t.Errorf("valid packet rejected: %v", err)
		}
	}
	// Every prefix shorter than the headers the opcode needs is ErrTruncated.
	for _, b := range [][]byte{send, ack, write, aw} {
		hl := int(b[0]) // placeholder so the loop reads naturally below
		_ = hl
		need := int(Opcode(b[0]).Info().HeaderLen) + ICRCLen
		for n := 0; n < need; n++ {
			if _, err := Parse(b[:n]); !errors.Is(err, ErrTruncated) {
				t.Errorf("%v cut to %d: %v", Opcode(b[0]), n, err)
			}
		}
	}
}

func TestAppendRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       Fields
		payload []byte
		want    error
	}{
		{"reserved opcode", Fields{BTH: BTHFields{Opcode: 0x15}}, nil, ErrBadOpcode},
		{"payload on a READ request", Fields{BTH: BTHFields{Opcode: RCReadRequest}}, []byte{1}, ErrBadLength},
		{"payload over 4096", Fields{BTH: BTHFields{Opcode: RCSendOnly}}, make([]byte, MaxPayload+1), ErrPayloadTooLarge},
		{"ATOMIC_WRITE of 4 bytes", Fields{BTH: BTHFields{Opcode: RCAtomicWrite}}, make([]byte, 4), ErrBadLength},
	} {
		out, err := Append([]byte{9}, &tc.f, tc.payload)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
		if len(out) != 1 {
			t.Errorf("%s: Append grew dst on error", tc.name)
		}
	}
}

func TestParseIPRejects(t *testing.T) {
	frames := goldenFrames(t)
	v4 := frames[0].ip
	mod := func(f func([]byte)) []byte { b := append([]byte(nil), v4...); f(b); return b }
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"IP version 5", mod(func(b []byte) { b[0] = 0x55 }), ErrIPHeader},
		{"IHL 4", mod(func(b []byte) { b[0] = 0x44 }), ErrIPHeader},
		{"TCP", mod(func(b []byte) { b[9] = 6 }), ErrIPHeader},
		{"fragment", mod(func(b []byte) { b[6] |= 0x20 }), ErrIPHeader},
		{"UDP length off by 4", mod(func(b []byte) { b[25] -= 4 }), ErrIPHeader},
		{"not port 4791", mod(func(b []byte) { b[23]++ }), ErrIPHeader},
		{"payload byte flipped", mod(func(b []byte) { b[len(b)-5] ^= 0x10 }), ErrICRC},
		{"ICRC flipped", mod(func(b []byte) { b[len(b)-1] ^= 1 }), ErrICRC},
	} {
		if _, err := ParseIP(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	// Link-layer padding after the IP length is ignored.
	padded := append(append([]byte(nil), v4...), 0, 0, 0, 0, 0, 0)
	if _, err := ParseIP(padded); err != nil {
		t.Errorf("padded frame: %v", err)
	}
}

func TestICRCRejectsBadIPHeaders(t *testing.T) {
	pkt := make([]byte, 16)
	udp := make([]byte, 8)
	for _, ip := range [][]byte{nil, make([]byte, 20), append([]byte{0x45}, make([]byte, 18)...), append([]byte{0x60}, make([]byte, 30)...)} {
		if _, err := ComputeICRC(ip, udp, pkt); !errors.Is(err, ErrIPHeader) {
			t.Errorf("ip %x: %v", ip, err)
		}
	}
	if _, err := ComputeICRC(append([]byte{0x45}, make([]byte, 19)...), udp[:7], pkt); !errors.Is(err, ErrIPHeader) {
		t.Errorf("short UDP header: %v", err)
	}
	if err := SetICRC(append([]byte{0x45}, make([]byte, 19)...), udp, pkt[:15]); !errors.Is(err, ErrTruncated) {
		t.Errorf("short packet: %v", err)
	}
}

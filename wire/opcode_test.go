package wire

import "testing"

// TestOpcodeTableWalk walks all 256 opcodes: exactly the RC, UC, UD and CNP codes are defined, and each
// defined entry is self-consistent.
func TestOpcodeTableWalk(t *testing.T) {
	defined := map[Opcode]bool{CNP: true, UDSendOnly: true, UDSendOnlyImm: true, RCFlush: true, RCAtomicWrite: true}
	for c := Opcode(0x00); c <= 0x14; c++ {
		defined[c] = true
	}
	defined[0x16], defined[0x17] = true, true
	for c := Opcode(0x20); c <= 0x2B; c++ {
		defined[c] = true
	}
	count := 0
	for code := 0; code < 256; code++ {
		o := Opcode(code)
		i := o.Info()
		if i.Valid() != defined[o] || o.Valid() != defined[o] {
			t.Errorf("%#02x: valid=%v, want %v", code, i.Valid(), defined[o])
			continue
		}
		if !i.Valid() {
			if s := o.String(); s[:7] != "Opcode(" {
				t.Errorf("%#02x: reserved opcode prints as %q", code, s)
			}
			continue
		}
		count++
		if i.Transport != o.Transport() {
			t.Errorf("%v: transport %v, want %v", o, i.Transport, o.Transport())
		}
		// Offsets follow wire order without gaps and add up to HeaderLen.
		off := BTHLen
		for h := Header(0); h < numHeaders; h++ {
			got, ok := i.Offset(h)
			if ok != i.Headers.Has(h) {
				t.Errorf("%v: Offset(%v) present=%v, Headers says %v", o, h, ok, i.Headers.Has(h))
			}
			if ok {
				if got != off {
					t.Errorf("%v: %v at %d, want %d", o, h, got, off)
				}
				off += h.Len()
			}
		}
		if int(i.HeaderLen) != off {
			t.Errorf("%v: HeaderLen %d, want %d", o, i.HeaderLen, off)
		}
		if i.Imm != i.Headers.Has(HdrImmDt) || i.Invalidate != i.Headers.Has(HdrIETH) {
			t.Errorf("%v: Imm/Invalidate flags disagree with headers", o)
		}
		// Only RC requests are acknowledged.
		if (i.Ack != AckNone) != (i.Transport == TransportRC && !i.Response) {
			t.Errorf("%v: ack policy %v", o, i.Ack)
		}
		// RETH exactly on first/only RDMA WRITEs, READ requests, FLUSH and ATOMIC_WRITE.
		wantRETH := (i.Op == OpWrite && i.Pos.StartsMessage()) || i.Op == OpReadRequest || i.Op == OpFlush || i.Op == OpAtomicWrite
		if i.Headers.Has(HdrRETH) != wantRETH {
			t.Errorf("%v: RETH present=%v", o, i.Headers.Has(HdrRETH))
		}
		// AETH on every response but READ_RESPONSE_MIDDLE.
		wantAETH := i.Response && !(i.Op == OpReadResponse && i.Pos == PosMiddle)
		if i.Headers.Has(HdrAETH) != wantAETH {
			t.Errorf("%v: AETH present=%v", o, i.Headers.Has(HdrAETH))
		}
		if i.Transport == TransportUD && !i.Headers.Has(HdrDETH) {
			t.Errorf("%v: UD without DETH", o)
		}
	}
	if count != len(defined) {
		t.Errorf("%d defined opcodes, want %d", count, len(defined))
	}
}

func TestOpcodeNamesAndLayouts(t *testing.T) {
	for _, tc := range []struct {
		op        Opcode
		name      string
		headerLen int
		pos       Position
		payload   bool
	}{
		{RCSendFirst, "RC SEND_FIRST", 12, PosFirst, true},
		{RCWriteOnlyImm, "RC RDMA_WRITE_ONLY_WITH_IMMEDIATE", 12 + 16 + 4, PosOnly, true},
		{RCReadRequest, "RC RDMA_READ_REQUEST", 28, PosOnly, false},
		{RCReadResponseMiddle, "RC RDMA_READ_RESPONSE_MIDDLE", 12, PosMiddle, true},
		{RCAtomicAcknowledge, "RC ATOMIC_ACKNOWLEDGE", 12 + 4 + 8, PosOnly, false},
		{RCFetchAdd, "RC FETCH_ADD", 12 + 28, PosOnly, false},
		{RCSendOnlyInvalidate, "RC SEND_ONLY_WITH_INVALIDATE", 16, PosOnly, true},
		{RCFlush, "RC FLUSH", 12 + 4 + 16, PosOnly, false},
		{UCWriteLastImm, "UC RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, PosLast, true},
		{UDSendOnlyImm, "UD SEND_ONLY_WITH_IMMEDIATE", 12 + 8 + 4, PosOnly, true},
		{CNP, "CNP", 28, PosOnly, false}, // as Wireshark names it, not "CNP CNP"
	} {
		i := tc.op.Info()
		if tc.op.String() != tc.name || int(i.HeaderLen) != tc.headerLen || i.Pos != tc.pos || i.Payload != tc.payload {
			t.Errorf("%#02x: got %q len %d pos %v payload %v; want %q %d %v %v", uint8(tc.op), tc.op.String(),
				i.HeaderLen, i.Pos, i.Payload, tc.name, tc.headerLen, tc.pos, tc.payload)
		}
	}
	// FETH comes before RETH in a FLUSH (rxe_opcode.c), ImmDt after RETH in WRITE_ONLY_WITH_IMMEDIATE.
	if off, _ := RCFlush.Info().Offset(HdrFETH); off != 12 {
		t.Errorf("FLUSH FETH at %d", off)
	}
	if off, _ := RCWriteOnlyImm.Info().Offset(HdrImmDt); off != 28 {
		t.Errorf("WRITE_ONLY_WITH_IMMEDIATE ImmDt at %d", off)
	}
}

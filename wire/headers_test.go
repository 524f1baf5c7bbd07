package wire

import (
	"bytes"
	"testing"
)

func TestBTHRoundTrip(t *testing.T) {
	f := BTHFields{Opcode: RCWriteFirst, SolicitedEvent: true, MigReq: true, PadCnt: 3, TVer: 0, PKey: 0x8001,
		FECN: true, BECN: false, Resv6: 0x15, DestQP: 0xABCDEF, AckReq: true, Resv7: 0x55, PSN: 0x123456}
	b := f.Append(nil)
	if len(b) != BTHLen {
		t.Fatalf("len %d", len(b))
	}
	if got := BTH(b).Fields(); got != f {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, f)
	}
	want := []byte{0x06, 0xF0, 0x80, 0x01, 0x95, 0xAB, 0xCD, 0xEF, 0xD5, 0x12, 0x34, 0x56}
	if !bytes.Equal(b, want) {
		t.Fatalf("bytes %x, want %x", b, want)
	}
	// Setters change only their field.
	h := BTH(b)
	h.SetDestQP(0x000001)
	h.SetPSN(0xFFFFFF)
	h.SetPadCnt(1)
	h.SetAckReq(false)
	h.SetBECN(true)
	h.SetSolicitedEvent(false)
	f.DestQP, f.PSN, f.PadCnt, f.AckReq, f.BECN, f.SolicitedEvent = 1, 0xFFFFFF, 1, false, true, false
	if got := h.Fields(); got != f {
		t.Fatalf("after setters:\n got %+v\nwant %+v", got, f)
	}
	// Out-of-range values are truncated to their field, never spill into neighbours.
	h.SetDestQP(0xFF000002)
	h.SetPSN(0xFF000003)
	if h.DestQP() != 2 || h.PSN() != 3 || !h.BECN() || h.AckReq() {
		t.Fatalf("24-bit setters spilled: %+v", h.Fields())
	}
}

func TestExtensionHeaderRoundTrips(t *testing.T) {
	reth := RETHFields{VA: 0x0123456789ABCDEF, RKey: 0xDEADBEEF, DMALen: 0x80000000}
	if got := RETH(reth.Append(nil)).Fields(); got != reth {
		t.Errorf("RETH: %+v", got)
	}
	aeth := AETHFields{Syndrome: SyndromeNAK(NAKRemoteAccessError), MSN: 0xFEDCBA}
	if got := AETH(aeth.Append(nil)).Fields(); got != aeth {
		t.Errorf("AETH: %+v", got)
	}
	at := AtomicETHFields{VA: 0x1000, RKey: 7, SwapAdd: 0x1122334455667788, Compare: 0x99AABBCCDDEEFF00}
	ab := at.Append(nil)
	if len(ab) != AtomicETHLen {
		t.Fatalf("AtomicETH len %d", len(ab))
	}
	if got := AtomicETH(ab).Fields(); got != at {
		t.Errorf("AtomicETH: %+v", got)
	}
	deth := DETHFields{QKey: GSIQKey, Resv8: 0x5A, SrcQP: 1}
	if got := DETH(deth.Append(nil)).Fields(); got != deth {
		t.Errorf("DETH: %+v", got)
	}
	var four [4]byte
	ImmDt(four[:]).SetImm(0xCAFEF00D)
	if ImmDt(four[:]).Imm() != 0xCAFEF00D || four != [4]byte{0xCA, 0xFE, 0xF0, 0x0D} {
		t.Errorf("ImmDt: %x", four)
	}
	IETH(four[:]).SetRKey(0x01020304)
	if IETH(four[:]).RKey() != 0x01020304 {
		t.Errorf("IETH: %x", four)
	}
	FETH(four[:]).SetBits(FlushMR<<4 | FlushPersistent)
	if FETH(four[:]).PlacementType() != FlushPersistent || FETH(four[:]).SelectivityLevel() != FlushMR {
		t.Errorf("FETH: %x", four)
	}
	var eight [8]byte
	AtomicAckETH(eight[:]).SetOrigData(42)
	if AtomicAckETH(eight[:]).OrigData() != 42 {
		t.Errorf("AtomicAckETH: %x", eight)
	}
}

// TestAppendEveryOpcode builds a packet of every defined opcode, parses it back and compares fields.
func TestAppendEveryOpcode(t *testing.T) {
	payload := []byte("hello, rdma") // 11 bytes: pad 1
	for code := 0; code < 256; code++ {
		o := Opcode(code)
		if !o.Valid() {
			if _, err := Append(nil, &Fields{BTH: BTHFields{Opcode: o}}, nil); err != ErrBadOpcode {
				t.Errorf("%#02x: Append of a reserved opcode: %v", code, err)
			}
			continue
		}
		i := o.Info()
		f := Fields{
			BTH:       BTHFields{Opcode: o, PKey: DefaultPKey, DestQP: 0x11, PSN: 0xFFFFFE, AckReq: true},
			DETH:      DETHFields{QKey: 0x11111111, SrcQP: 0x22},
			FETH:      FlushGlobal,
			RETH:      RETHFields{VA: 0x7F0000001000, RKey: 0x1234, DMALen: 11},
			AtomicETH: AtomicETHFields{VA: 0x2000, RKey: 0x99, SwapAdd: 5, Compare: 6},
			AETH:      AETHFields{Syndrome: SyndromeACK(CreditInvalid), MSN: 3},
			AtomicAck: 77,
			Imm:       0xABCD,
			IETH:      0x4321,
		}
		var pl []byte
		switch {
		case i.Op == OpAtomicWrite:
			pl = payload[:8]
		case i.Payload:
			pl = payload
		}
		b, err := Append(make([]byte, 0, 128), &f, pl)
		if err != nil {
			t.Errorf("%v: %v", o, err)
			continue
		}
		p, err := Parse(b)
		if err != nil {
			t.Errorf("%v: Parse: %v", o, err)
			continue
		}
		if !bytes.Equal(p.Payload(), pl) {
			t.Errorf("%v: payload %q", o, p.Payload())
		}
		got := p.Fields()
		want := f
		want.BTH.PadCnt = uint8(PadLen(len(pl)))
		if !i.Headers.Has(HdrDETH) {
			want.DETH = DETHFields{}
		}
		if !i.Headers.Has(HdrFETH) {
			want.FETH = 0
		}
		if !i.Headers.Has(HdrRETH) {
			want.RETH = RETHFields{}
		}
		if !i.Headers.Has(HdrAtomicETH) {
			want.AtomicETH = AtomicETHFields{}
		}
		if !i.Headers.Has(HdrAETH) {
			want.AETH = AETHFields{}
		}
		if !i.Headers.Has(HdrAtomicAck) {
			want.AtomicAck = 0
		}
		if !i.Headers.Has(HdrImmDt) {
			want.Imm = 0
		}
		if !i.Headers.Has(HdrIETH) {
			want.IETH = 0
		}
		if got != want {
			t.Errorf("%v: fields\n got %+v\nwant %+v", o, got, want)
		}
		if p.Len() != f.Len(len(pl)) || p.Len()%4 != 0 {
			t.Errorf("%v: length %d, Fields.Len %d", o, p.Len(), f.Len(len(pl)))
		}
	}
}

package wire

import (
	"bytes"
	"testing"
)

// addGoldenSeeds seeds a fuzz target with one captured packet of each opcode: every header shape, few
// and small enough inputs that the fuzzer does not spend its time minimizing long ones.
func addGoldenSeeds(f *testing.F, transportOnly bool) {
	seen := map[Opcode]bool{}
	for _, c := range goldenFrames(f) {
		fr, err := ParseIP(c.ip)
		if err != nil {
			f.Fatal(err)
		}
		if seen[fr.Opcode()] {
			continue
		}
		seen[fr.Opcode()] = true
		if !transportOnly {
			f.Add(c.ip)
			continue
		}
		f.Add(fr.Bytes())
	}
}

// checkRebuild asserts that a parsed packet re-encodes from its fields to the same bytes. Pad bytes are
// not fields (Append writes zeros) and the ICRC needs the IP header, so both are left out here.
func checkRebuild(t *testing.T, p Packet) []byte {
	fields := p.Fields()
	out, err := Append(nil, &fields, p.Payload())
	if err != nil {
		t.Fatalf("parsed packet does not rebuild: %v", err)
	}
	if len(out) != p.Len() {
		t.Fatalf("rebuilt length %d, parsed %d", len(out), p.Len())
	}
	n := int(p.Info().HeaderLen) + p.PayloadLen()
	if !bytes.Equal(out[:n], p.Bytes()[:n]) {
		t.Fatalf("rebuilt headers or payload differ:\n got %x\nwant %x", out[:n], p.Bytes()[:n])
	}
	return out
}

// FuzzParse: Parse never panics, and whatever it accepts re-encodes to the same bytes.
func FuzzParse(f *testing.F) {
	addGoldenSeeds(f, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			return
		}
		checkRebuild(t, p)
	})
}

// FuzzParseIP: ParseIP never panics, and whatever it accepts (ICRC included) re-encodes, ICRC and all,
// to the same bytes once its pad bytes are zero.
func FuzzParseIP(f *testing.F) {
	addGoldenSeeds(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseIP(b)
		if err != nil {
			return
		}
		out := checkRebuild(t, fr.Packet)
		if err := SetICRC(fr.IP, fr.UDP, out); err != nil {
			t.Fatal(err)
		}
		want := bytes.Clone(fr.Bytes())
		pad := fr.BTH().PadCnt()
		clear(want[len(want)-ICRCLen-pad : len(want)-ICRCLen])
		// Zeroing nonzero pad bytes changes the ICRC, so compare the ICRC only when the pad was zero.
		if bytes.Equal(want, fr.Bytes()) && !bytes.Equal(out, want) {
			t.Fatalf("rebuilt frame differs:\n got %x\nwant %x", out, want)
		}
	})
}

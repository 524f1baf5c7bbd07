package wire

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

var idTrials = flag.Int("icrcid.trials", 0, "random-corruption trials for TestIDRecoveryRandomCorruption (0: the default)")
var idAllFlips = flag.Bool("icrcid.allflips", false, "TestIDRecoverySingleBitFlips: flip every bit of every captured IPv4 packet, not a sample")

// idPacket is an IPv4 RoCEv2 packet split into private copies of its headers and transport packet.
type idPacket struct {
	name         string
	ip, udp, pkt []byte
}

func (p idPacket) id() uint16 { return binary.BigEndian.Uint16(p.ip[ipv4IDOff:]) }
func (p idPacket) df() bool   { return p.ip[ipv4FlagsOff]&ipv4DFBit != 0 }

// template returns a copy of the IPv4 header with the identification and DF flag set as given and the
// fields the ICRC masks scrambled, as a receiver that does not know them would build it.
func (p idPacket) template(id uint16, df bool) []byte {
	t := append([]byte(nil), p.ip...)
	binary.BigEndian.PutUint16(t[ipv4IDOff:], id)
	setBit(&t[ipv4FlagsOff], ipv4DFBit, df)
	t[1], t[8], t[10], t[11] = 0xA5, 1, 0x5A, 0xC3 // TOS, TTL, checksum: masked
	return t
}

func ipv4Packets(t testing.TB) []idPacket {
	t.Helper()
	var out []idPacket
	for _, c := range goldenFrames(t) {
		if c.ip[0]>>4 != 4 {
			continue
		}
		ihl := int(c.ip[0]&0xF) * 4
		b := append([]byte(nil), c.ip...)
		out = append(out, idPacket{
			name: fmt.Sprintf("%s#%d", c.file, c.n),
			ip:   b[:ihl:ihl], udp: b[ihl : ihl+UDPHeaderLen : ihl+UDPHeaderLen], pkt: b[ihl+UDPHeaderLen:],
		})
	}
	return out
}

// TestIDRecoveryCaptures recovers the identification and DF flag of every IPv4 RoCEv2 packet of the rxe
// captures from a template that has them wrong.
func TestIDRecoveryCaptures(t *testing.T) {
	pkts := ipv4Packets(t)
	var r IDRecovery
	ids := map[uint16]bool{}
	dfSet, fast := 0, 0
	for i, p := range pkts {
		if err := VerifyICRC(p.ip, p.udp, p.pkt); err != nil {
			t.Fatalf("%s: capture does not verify: %v", p.name, err)
		}
		ids[p.id()] = true
		if p.df() {
			dfSet++
		}
		if p.id() == 0 && p.df() {
			fast++
		}
		for _, tc := range []struct {
			what string
			id   uint16
			df   bool
		}{
			{"ID 0, DF as sent", 0, p.df()},
			{"ID 0, DF clear", 0, false},
			{"ID 0, DF set", 0, true},
			{"wrong ID, DF flipped", p.id() ^ uint16(0x9E37*(i+1)), !p.df()},
			{"as sent", p.id(), p.df()},
		} {
			id, df, err := r.VerifyIPv4(p.template(tc.id, tc.df), p.udp, p.pkt)
			if err != nil || id != p.id() || df != p.df() {
				t.Errorf("%s, template %s: got ID %#04x DF %v err %v, want ID %#04x DF %v",
					p.name, tc.what, id, df, err, p.id(), p.df())
			}
		}
	}
	t.Logf("%d IPv4 packets: ID and DF recovered from 5 templates each; %d distinct IDs, DF set on %d, ID 0 with DF on %d",
		len(pkts), len(ids), dfSet, fast)
	if len(ids) < len(pkts)/2 {
		t.Errorf("only %d distinct IDs in %d packets: the captures should exercise recovery", len(ids), len(pkts))
	}
}

// idOracle maps the ICRC contribution of every (identification, DF) pair, found by computing the ICRC of
// all 2^17 headers, to the pair: an exhaustive answer to the question VerifyIPv4 solves by algebra. It
// depends only on the header length and the transport packet length.
type idOracle map[uint32]uint32 // contribution -> id | df<<16

func newIDOracle(t testing.TB, p idPacket) idOracle {
	t.Helper()
	icrc := func(id uint16, df bool) uint32 {
		c, err := ComputeICRC(p.template(id, df), p.udp, p.pkt[:len(p.pkt)-ICRCLen])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	base := icrc(0, false)
	// The ICRC is affine, so the contributions of the 17 bits generate the rest; a Gray-code walk
	// visits all 2^17 sums, and a sample of them is checked against a direct computation.
	var basis [17]uint32
	for b := range 16 {
		basis[b] = icrc(1<<b, false) ^ base
	}
	basis[16] = icrc(0, true) ^ base
	o := make(idOracle, 1<<17)
	var k uint32
	for g := uint32(0); g < 1<<17; g++ {
		if g > 0 {
			k ^= basis[bitIndex(int(g&-g))]
		}
		code := g ^ g>>1
		if old, dup := o[k]; dup {
			t.Fatalf("contributions of %#x and %#x collide", old, code)
		}
		o[k] = code
		if g%4099 == 0 && icrc(uint16(code), code>>16 != 0)^base != k {
			t.Fatalf("ICRC is not affine in the identification at %#x", code)
		}
	}
	return o
}

// expect returns the identification and DF that make the ICRC of pkt match, given tmpl, a header with
// ID 0 and DF clear, and whether there are any.
func (o idOracle) expect(t testing.TB, tmpl, udp, pkt []byte) (id uint16, df, ok bool) {
	n := len(pkt) - ICRCLen
	c, err := ComputeICRC(tmpl, udp, pkt[:n])
	if err != nil {
		t.Fatal(err)
	}
	v, ok := o[c^binary.LittleEndian.Uint32(pkt[n:])]
	return uint16(v), v>>16 != 0, ok
}

// flippable lists the bit positions of ip‖udp‖pkt that a corruption may hit: all but the fields the ICRC
// masks and the identification and DF bits VerifyIPv4 solves for, and, unless withVersion, the IPv4
// version and IHL byte (a flip there changes the header's shape, which VerifyIPv4 rejects before any
// ICRC arithmetic).
func flippable(p idPacket, withVersion bool) []int {
	var pos []int
	for byteOff := range len(p.ip) + UDPHeaderLen + len(p.pkt) {
		for bit := range 8 {
			switch {
			case byteOff == 0 && !withVersion:
			case byteOff == 1, byteOff == 8, byteOff == 10, byteOff == 11: // TOS, TTL, IP checksum
			case byteOff == ipv4IDOff, byteOff == ipv4IDOff+1:
			case byteOff == ipv4FlagsOff && 1<<bit == ipv4DFBit:
			case byteOff == len(p.ip)+6, byteOff == len(p.ip)+7: // UDP checksum
			case byteOff == len(p.ip)+UDPHeaderLen+bthECN: // FECN, BECN, Resv6
			default:
				pos = append(pos, byteOff*8+bit)
			}
		}
	}
	return pos
}

// flip toggles bit pos of ip‖udp‖pkt.
func flip(ip, udp, pkt []byte, pos int) {
	off, mask := pos/8, byte(1)<<(pos%8)
	switch {
	case off < len(ip):
		ip[off] ^= mask
	case off < len(ip)+len(udp):
		udp[off-len(ip)] ^= mask
	default:
		pkt[off-len(ip)-len(udp)] ^= mask
	}
}

// idVerdict runs r on a packet and checks its answer against the oracle's (wantID, wantDF, ok). It
// returns whether r accepted the packet, or what went wrong.
func idVerdict(r *IDRecovery, wantID uint16, wantDF, ok bool, tmpl, udp, pkt []byte) (accepted bool, bad string) {
	if r.RequireDF && !wantDF {
		ok = false
	}
	id, df, err := r.VerifyIPv4(tmpl, udp, pkt)
	switch {
	case !ok && errors.Is(err, ErrICRC):
		return false, ""
	case ok && err == nil && id == wantID && df == wantDF:
		return true, ""
	}
	return false, fmt.Sprintf("RequireDF %v: got ID %#04x DF %v err %v; oracle: match %v ID %#04x DF %v",
		r.RequireDF, id, df, err, ok, wantID, wantDF)
}

// TestIDRecoverySingleBitFlips flips, one at a time, every bit outside the masked fields and the
// identification and DF of a sample of captured packets (one per capture file and length; all packets
// with -icrcid.allflips) and checks VerifyIPv4 against the exhaustive oracle: a flip must be rejected
// unless some identification and DF make the corrupted packet's ICRC valid, and then VerifyIPv4 must
// return exactly those. Flips that get through are reported with their position. With RequireDF none
// may get through: the first single-bit error that matches an identification with DF unchanged lies
// 26765 bytes after the flags byte, beyond any RoCE packet.
func TestIDRecoverySingleBitFlips(t *testing.T) {
	pkts := ipv4Packets(t)
	sample := pkts
	if !*idAllFlips {
		sample = nil
		seen := map[string]bool{}
		for _, p := range pkts {
			file, _, _ := strings.Cut(p.name, "#")
			key := fmt.Sprintf("%s/%d", file, len(p.pkt))
			if !seen[key] {
				seen[key] = true
				sample = append(sample, p)
			}
		}
	}
	oracles := map[[2]int]idOracle{}
	r, rDF := &IDRecovery{}, &IDRecovery{RequireDF: true}
	flips, shapeErr, slipped, slippedDF := 0, 0, 0, 0
	where := map[string]int{}
	for _, p := range sample {
		shape := [2]int{len(p.ip), len(p.pkt)}
		o := oracles[shape]
		if o == nil {
			o = newIDOracle(t, p)
			oracles[shape] = o
		}
		tmpl := p.template(0, true)
		udp := append([]byte(nil), p.udp...)
		pkt := append([]byte(nil), p.pkt...)
		for _, pos := range flippable(p, true) {
			flip(tmpl, udp, pkt, pos)
			if pos/8 == 0 {
				for _, r := range []*IDRecovery{r, rDF} {
					if _, _, err := r.VerifyIPv4(tmpl, udp, pkt); !errors.Is(err, ErrIPHeader) {
						t.Errorf("%s: flip of byte 0 bit %d: got %v, want ErrIPHeader", p.name, pos%8, err)
					}
				}
				shapeErr++
				flip(tmpl, udp, pkt, pos)
				continue
			}
			flips++
			wantID, wantDF, ok := o.expect(t, withIDDF(tmpl, 0, false), udp, pkt)
			acc, bad := idVerdict(r, wantID, wantDF, ok, tmpl, udp, pkt)
			accDF, badDF := idVerdict(rDF, wantID, wantDF, ok, tmpl, udp, pkt)
			for _, b := range []string{bad, badDF} {
				if b != "" {
					t.Errorf("%s: flip of byte %d bit %d: %s", p.name, pos/8, pos%8, b)
				}
			}
			if acc {
				slipped++
				where[fmt.Sprintf("transport offset %d bit %d (%d bytes after the IPv4 flags byte), "+
					"matching with DF %v", pos/8-len(p.ip)-UDPHeaderLen, pos%8, pos/8-ipv4FlagsOff-1, wantDF)]++
				t.Logf("%s: flip of byte %d bit %d is undetectable: it equals ID %#04x DF %v (sent: ID %#04x DF %v)",
					p.name, pos/8, pos%8, wantID, wantDF, p.id(), p.df())
			}
			if accDF {
				slippedDF++
				t.Errorf("%s: with RequireDF, flip of byte %d bit %d is accepted as ID %#04x", p.name, pos/8, pos%8, wantID)
			}
			flip(tmpl, udp, pkt, pos)
		}
	}
	t.Logf("%d packets (%d lengths), %d single-bit flips: %d undetectable (a valid ICRC for another ID and DF), "+
		"%d with RequireDF; %d version/IHL flips rejected with ErrIPHeader",
		len(sample), len(oracles), flips, slipped, slippedDF, shapeErr)
	for w, n := range where {
		t.Logf("undetectable: %s: %d packets", w, n)
	}
}

// TestIDRecoveryRandomCorruption flips 2 to 32 distinct random bits (outside the masked fields and the
// identification and DF) of captured packets, checks every verdict against the exhaustive oracle and
// measures how many corruptions get through. Theory: 2^17 of the 2^32 ICRC differences are explained by
// some identification and DF pair, so about 2^-15 of random corruptions are accepted; 2^-16 with
// RequireDF. -icrcid.trials sets the number of trials (2^20 by default, 2^17 with -short or -race).
func TestIDRecoveryRandomCorruption(t *testing.T) {
	trials := 1 << 20
	if testing.Short() || raceEnabled() {
		trials = 1 << 17
	}
	if *idTrials > 0 {
		trials = *idTrials
	}
	// Short packets of three shapes keep the trials cheap; the rate does not depend on the length.
	var sample []idPacket
	shapes := map[int]bool{}
	for _, p := range ipv4Packets(t) {
		if len(p.pkt) <= 64 && !shapes[len(p.pkt)] && len(shapes) < 3 {
			shapes[len(p.pkt)] = true
			sample = append(sample, p)
		}
	}
	type target struct {
		o              idOracle
		tmpl, udp, pkt []byte
		pos            []int
	}
	var ts []target
	for _, p := range sample {
		ts = append(ts, target{newIDOracle(t, p), p.template(0, true), append([]byte(nil), p.udp...),
			append([]byte(nil), p.pkt...), flippable(p, false)})
	}

	r, rDF := &IDRecovery{}, &IDRecovery{RequireDF: true}
	accepted, acceptedDF, acceptedRequireDF := 0, 0, 0
	const seedBase = 0x1CC1D
	var picked []int
	pcg := rand.NewPCG(0, 0)
	rng := rand.New(pcg)
	for i := range trials {
		seed := seedBase + uint64(i)
		pcg.Seed(seed, 0)
		tg := &ts[rng.IntN(len(ts))]
		picked = picked[:0]
		for k := 2 + rng.IntN(31); len(picked) < k; {
			pos := tg.pos[rng.IntN(len(tg.pos))]
			if !slices.Contains(picked, pos) { // distinct bits: every trial is a real corruption
				picked = append(picked, pos)
				flip(tg.tmpl, tg.udp, tg.pkt, pos)
			}
		}
		tg.tmpl[ipv4FlagsOff] &^= ipv4DFBit // the oracle's base: ID 0, DF clear
		wantID, wantDF, ok := tg.o.expect(t, tg.tmpl, tg.udp, tg.pkt)
		tg.tmpl[ipv4FlagsOff] |= ipv4DFBit
		acc, bad := idVerdict(r, wantID, wantDF, ok, tg.tmpl, tg.udp, tg.pkt)
		accDF, badDF := idVerdict(rDF, wantID, wantDF, ok, tg.tmpl, tg.udp, tg.pkt)
		if bad != "" || badDF != "" {
			t.Fatalf("seed %#x: %s %s", seed, bad, badDF)
		}
		if acc {
			if err := VerifyICRC(withIDDF(tg.tmpl, wantID, wantDF), tg.udp, tg.pkt); err != nil {
				t.Fatalf("seed %#x: accepted ID %#04x DF %v, but the full check fails: %v", seed, wantID, wantDF, err)
			}
			accepted++
			if wantDF {
				acceptedDF++
			}
		}
		if accDF {
			acceptedRequireDF++
		}
		for _, pos := range picked {
			flip(tg.tmpl, tg.udp, tg.pkt, pos)
		}
	}
	for _, c := range []struct {
		what     string
		accepted int
		log2     int
	}{{"DF set or clear", accepted, -15}, {"RequireDF", acceptedRequireDF, -16}} {
		lambda := float64(trials) * math.Pow(2, float64(c.log2))
		rate := float64(c.accepted) / float64(trials)
		t.Logf("%s: %d trials, %d accepted, rate %.3g = 2^%.2f; expected %.1f (2^%d)",
			c.what, trials, c.accepted, rate, math.Log2(rate), lambda, c.log2)
		if d := math.Abs(float64(c.accepted) - lambda); d > 5*math.Sqrt(lambda)+1 {
			t.Errorf("%s: %d accepted, expected %.1f ± %.1f: the false-accept rate disagrees with 2^%d",
				c.what, c.accepted, lambda, 5*math.Sqrt(lambda)+1, c.log2)
		}
	}
	if acceptedDF != acceptedRequireDF {
		t.Errorf("%d accepted with DF set, %d with RequireDF: they should be the same packets", acceptedDF, acceptedRequireDF)
	}
}

// raceEnabled reports whether the test binary was built with -race, which makes the corruption trials
// about ten times slower.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func withIDDF(ip []byte, id uint16, df bool) []byte {
	h := append([]byte(nil), ip...)
	binary.BigEndian.PutUint16(h[ipv4IDOff:], id)
	setBit(&h[ipv4FlagsOff], ipv4DFBit, df)
	return h
}

// TestIDRecoveryGoroceFastPath checks that packets goroce builds (identification 0, DF set) verify on the
// fast path: no per-length solver is ever built.
func TestIDRecoveryGoroceFastPath(t *testing.T) {
	var r IDRecovery
	for _, n := range []int{0, 1, 3, 64, 1024, 4096} {
		for _, op := range []Opcode{RCSendOnly, RCWriteMiddle, UDSendOnly, RCAcknowledge} {
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			f := Fields{BTH: BTHFields{Opcode: op, PKey: DefaultPKey, DestQP: 0x123, PSN: 77}}
			if !op.Info().Payload {
				payload = nil
			}
			pkt, err := Append(nil, &f, payload)
			if err != nil {
				t.Fatalf("%v/%d: %v", op, n, err)
			}
			ip, udp := ipv4Headers(len(pkt), 0, true)
			if err := SetICRC(ip, udp, pkt); err != nil {
				t.Fatal(err)
			}
			id, df, err := r.VerifyIPv4(ip, udp, pkt)
			if err != nil || id != 0 || !df {
				t.Errorf("%v/%d: got ID %#04x DF %v err %v, want 0 true nil", op, n, id, df, err)
			}
		}
	}
	for i, s := range r.cache {
		if s.t != 0 {
			t.Errorf("cache slot %d holds a solver for T=%d: the fast path built one", i, s.t)
		}
	}
}

// ipv4Headers returns IPv4 and UDP headers for a transport packet of n bytes between two fixed hosts.
func ipv4Headers(n int, id uint16, df bool) (ip, udp []byte) {
	total := ipv4MinHeaderLen + UDPHeaderLen + n
	ip = []byte{0x45, 0, byte(total >> 8), byte(total), byte(id >> 8), byte(id), 0, 0, 64, protoUDP, 0, 0,
		10, 77, 0, 1, 10, 77, 0, 11}
	setBit(&ip[ipv4FlagsOff], ipv4DFBit, df)
	ul := UDPHeaderLen + n
	udp = []byte{0xC1, 0x21, UDPPort >> 8, UDPPort & 0xFF, byte(ul >> 8), byte(ul), 0, 0}
	return ip, udp
}

// TestIDRecoveryAlgebra checks the precomputed matrices against their definitions.
func TestIDRecoveryAlgebra(t *testing.T) {
	tab := idTablesOnce()
	rng := rand.New(rand.NewPCG(1, 2))

	// Z^-(2^i) undoes 2^i zero bytes.
	for i := range 12 {
		v := rng.Uint32()
		w := tab.zinvPow[i].apply(v)
		for range 1 << i {
			w = zeroByte(w)
		}
		if w != v {
			t.Errorf("Z^(2^%d) · Z^-(2^%d) · %#x = %#x", i, i, v, w)
		}
	}
	// Higher powers compose: Z^-(2^(i+1)) = (Z^-(2^i))^2.
	for i := 1; i < idPowers; i++ {
		v := rng.Uint32()
		if a, b := tab.zinvPow[i].apply(v), tab.zinvPow[i-1].apply(tab.zinvPow[i-1].apply(v)); a != b {
			t.Errorf("Z^-(2^%d) is not the square of Z^-(2^%d)", i, i-1)
		}
	}
	// The solve map sends the identification basis to unit vectors and DF outside their span.
	for i, b := range tab.basis {
		if got := tab.solve.apply(b); got != 1<<i {
			t.Errorf("Q^-1 · raw(ID bit %d) = %#x", i, got)
		}
	}
	if tab.dfCoord>>16 == 0 {
		t.Errorf("DF lies in the span of the identification bits: %#x", tab.dfCoord)
	}
	// The per-length solver built from one column by multiplying by x equals Q^-1 · Z^-T.
	var r IDRecovery
	for range 200 {
		n := 33 + rng.IntN(ipv4MaxLen-33)
		m := r.solver(tab, n)
		for range 4 {
			v := rng.Uint32()
			if got, want := m.apply(v), tab.solve.apply(tab.zinv(n, v)); got != want {
				t.Fatalf("T=%d: solver · %#x = %#x, want %#x", n, v, got, want)
			}
		}
	}
	// Inverse of random invertible matrices.
	for range 100 {
		var m gf2Mat
		for j := range m {
			m[j] = rng.Uint32()
		}
		inv, ok := m.inverse()
		if !ok {
			continue
		}
		p := m.times(&inv)
		for j := range p {
			if p[j] != 1<<j {
				t.Fatalf("m · m^-1 column %d = %#x", j, p[j])
			}
		}
	}
	// The linearity claim itself: the ICRC of identification id differs from that of 0 by
	// Z^T · raw(id), T the bytes covered after the flags byte.
	ip, udp := ipv4Headers(100, 0, true)
	pkt := make([]byte, 100-ICRCLen)
	for i := range pkt {
		pkt[i] = byte(rng.Uint32())
	}
	c0, _ := ComputeICRC(ip, udp, pkt)
	for range 50 {
		id := uint16(rng.Uint32())
		binary.BigEndian.PutUint16(ip[ipv4IDOff:], id)
		c, _ := ComputeICRC(ip, udp, pkt)
		w := rawCRC(0, byte(id>>8), byte(id), 0)
		for range len(ip) - ipv4FlagsOff - 1 + len(udp) + len(pkt) {
			w = zeroByte(w)
		}
		if c^c0 != w {
			t.Fatalf("ID %#04x: ICRC difference %#x, Z^T · raw(ID) = %#x", id, c^c0, w)
		}
	}
}

// TestIDRecoveryCacheChurn cycles through more lengths than the cache holds, in an order that defeats
// least-recently-used replacement, and checks every answer.
func TestIDRecoveryCacheChurn(t *testing.T) {
	var r IDRecovery
	for round := range 5 {
		for k := range 3 * idCacheSize {
			n := 16 + 4*k
			pkt := make([]byte, n)
			pkt[0] = byte(RCSendOnly)
			want := uint16(round*1000 + k)
			ip, udp := ipv4Headers(n, want, k%2 == 0)
			if err := SetICRC(ip, udp, pkt); err != nil {
				t.Fatal(err)
			}
			binary.BigEndian.PutUint16(ip[ipv4IDOff:], 0)
			id, df, err := r.VerifyIPv4(ip, udp, pkt)
			if err != nil || id != want || df != (k%2 == 0) {
				t.Errorf("round %d length %d: got ID %d DF %v err %v, want %d %v", round, n, id, df, err, want, k%2 == 0)
			}
		}
	}
}

// TestIDRecoveryErrors checks the argument checks.
func TestIDRecoveryErrors(t *testing.T) {
	var r IDRecovery
	ip, udp := ipv4Headers(16, 0, true)
	pkt := make([]byte, 16)
	for _, tc := range []struct {
		name         string
		ip, udp, pkt []byte
		want         error
	}{
		{"short packet", ip, udp, pkt[:BTHLen+ICRCLen-1], ErrTruncated},
		{"short IP header", ip[:19], udp, pkt, ErrIPHeader},
		{"IPv6", append([]byte{0x65}, ip[1:]...), udp, pkt, ErrIPHeader},
		{"IHL disagrees", append([]byte{0x46}, ip[1:]...), udp, pkt, ErrIPHeader},
		{"short UDP header", ip, udp[:7], pkt, ErrIPHeader},
		{"too long for IPv4", ip, udp, make([]byte, ipv4MaxLen), ErrIPHeader},
		{"bad ICRC", ip, udp, pkt, ErrICRC},
	} {
		if _, _, err := r.VerifyIPv4(tc.ip, tc.udp, tc.pkt); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestIDRecoveryZeroAllocs checks the fast path, the recovery path and a cache miss never allocate.
func TestIDRecoveryZeroAllocs(t *testing.T) {
	var r IDRecovery
	ip, udp, pkt := recoveryPacket(t, 1024, 0x1234)
	tmpl := withIDDF(ip, 0, true)
	lengths := make([][3][]byte, idCacheSize+1)
	for i := range lengths {
		a, b, c := recoveryPacket(t, 4*i, uint16(i+1))
		lengths[i] = [3][]byte{withIDDF(a, 0, true), b, c}
	}
	k := 0
	for name, fn := range map[string]func(){
		"fast":    func() { _, _, _ = r.VerifyIPv4(ip, udp, pkt) },
		"recover": func() { _, _, _ = r.VerifyIPv4(tmpl, udp, pkt) },
		"miss": func() {
			l := &lengths[k%len(lengths)]
			k++
			_, _, _ = r.VerifyIPv4(l[0], l[1], l[2])
		},
		"reject": func() { _, _, _ = r.VerifyIPv4(tmpl, udp, pkt[:len(pkt)-4]) },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s: %v allocs per run", name, n)
		}
	}
}

// recoveryPacket returns an RC WRITE MIDDLE packet with an n-byte payload and the headers it was sent
// in, identification id and DF set.
func recoveryPacket(t testing.TB, n int, id uint16) (ip, udp, pkt []byte) {
	f := Fields{BTH: BTHFields{Opcode: RCWriteMiddle, PKey: DefaultPKey, DestQP: 0x11, PSN: 100}}
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i)
	}
	pkt, err := Append(nil, &f, payload)
	if err != nil {
		t.Fatal(err)
	}
	ip, udp = ipv4Headers(len(pkt), id, true)
	if err := SetICRC(ip, udp, pkt); err != nil {
		t.Fatal(err)
	}
	return ip, udp, pkt
}

func BenchmarkIDRecovery(b *testing.B) {
	for _, n := range []int{0, 1024, 4096} {
		ip, udp, pkt := recoveryPacket(b, n, 0x1234)
		var lengths [idCacheSize + 1][3][]byte
		for i := range lengths {
			size := n + 4*i
			if size > 4096 {
				size = n - 4*i
			}
			a, u, p := recoveryPacket(b, size, 0x1234)
			lengths[i] = [3][]byte{withIDDF(a, 0, true), u, p}
		}
		for _, tc := range []struct {
			name string
			ip   []byte
		}{{"fast", ip}, {"recover", withIDDF(ip, 0, true)}, {"recoverDFclear", withIDDF(ip, 0x9999, false)}} {
			b.Run(fmt.Sprintf("%s/%d", tc.name, n), func(b *testing.B) {
				var r IDRecovery
				b.ReportAllocs()
				b.SetBytes(int64(len(pkt)))
				for b.Loop() {
					if id, _, err := r.VerifyIPv4(tc.ip, udp, pkt); err != nil || id != 0x1234 {
						b.Fatal(id, err)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("miss/%d", n), func(b *testing.B) {
			var r IDRecovery
			b.ReportAllocs()
			k := 0
			for b.Loop() {
				l := &lengths[k%len(lengths)]
				k++
				if _, _, err := r.VerifyIPv4(l[0], l[1], l[2]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("solverBuild", func(b *testing.B) {
		tab := idTablesOnce()
		b.ReportAllocs()
		var sink uint32
		for b.Loop() {
			m := tab.solver(1077)
			sink ^= m[3][5]
		}
		_ = sink
	})
}

// FuzzIDRecovery feeds arbitrary headers and packets to VerifyIPv4: it must never panic, and whatever it
// accepts must verify with a full ICRC check over the header it reports.
func FuzzIDRecovery(f *testing.F) {
	for i, p := range ipv4Packets(f) {
		if i%16 == 0 {
			f.Add(append(append(append([]byte(nil), p.ip...), p.udp...), p.pkt...))
		}
	}
	var r IDRecovery
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < ipv4MinHeaderLen {
			return
		}
		ihl := min(int(b[0]&0xF)*4, len(b))
		ip := b[:max(ihl, ipv4MinHeaderLen)]
		rest := b[len(ip):]
		udp := rest[:min(UDPHeaderLen, len(rest))]
		pkt := rest[len(udp):]
		id, df, err := r.VerifyIPv4(ip, udp, pkt)
		if err != nil {
			return
		}
		if err := VerifyICRC(withIDDF(ip, id, df), udp, pkt); err != nil {
			t.Fatalf("accepted with ID %#04x DF %v, but the full check fails: %v", id, df, err)
		}
	})
}

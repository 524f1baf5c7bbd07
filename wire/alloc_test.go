package wire

import "testing"

// TestZeroAllocs asserts that parsing, building and the ICRC never allocate.
func TestZeroAllocs(t *testing.T) {
	frames := goldenFrames(t)
	c := frames[len(frames)/2]
	f, err := ParseIP(c.ip)
	if err != nil {
		t.Fatal(err)
	}
	fields := f.Fields()
	payload := f.Payload()
	buf := make([]byte, 0, 8192)
	bad := append([]byte{0x15}, c.ip[1:]...)
	for name, fn := range map[string]func(){
		"Parse":       func() { _, _ = Parse(f.Bytes()) },
		"Parse error": func() { _, _ = Parse(bad) },
		"ParseIP":     func() { _, _ = ParseIP(c.ip) },
		"Fields":      func() { _ = f.Fields() },
		"Append":      func() { _, _ = Append(buf[:0], &fields, payload) },
		"ComputeICRC": func() { _, _ = ComputeICRC(f.IP, f.UDP, f.Bytes()) },
		"VerifyICRC":  func() { _ = f.VerifyICRC(f.IP, f.UDP) },
		"Syndrome":    func() { _ = f.BTH().PSN() },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s: %v allocs per run", name, n)
		}
	}
}

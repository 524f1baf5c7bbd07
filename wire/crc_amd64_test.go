//go:build amd64 && !purego

package wire

import "testing"

// foldVariants lists the ways updateIEEE and the ICRC can compute here: each body of foldCRC this CPU
// runs, and hash/crc32 alone. use switches to one and returns what switches back.
func foldVariants() []foldVariant {
	var vs []foldVariant
	set := func(have, w bool) func() {
		h0, w0 := haveFold, wide
		haveFold, wide = have, w
		return func() { haveFold, wide = h0, w0 }
	}
	if fold512 {
		vs = append(vs, foldVariant{"avx512", func() func() { return set(true, true) }})
	}
	if fold256 {
		vs = append(vs, foldVariant{"avx2", func() func() { return set(true, false) }})
	}
	return append(vs, foldVariant{"hash-crc32", func() func() { return set(false, wide) }})
}

// TestICRCMethod: ICRCMethod names the computation each variant switches to.
func TestICRCMethod(t *testing.T) {
	want := map[string]string{"avx512": "AVX-512 fold", "avx2": "AVX2 fold", "hash-crc32": "hash/crc32"}
	for _, v := range foldVariants() {
		restore := v.use()
		got := ICRCMethod()
		restore()
		if got != want[v.name] {
			t.Errorf("%s: ICRCMethod() = %q, want %q", v.name, got, want[v.name])
		}
	}
}

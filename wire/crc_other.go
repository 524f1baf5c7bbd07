//go:build !amd64 || purego

package wire

const (
	haveFold4 = false
	fold4Min  = 0
)

func fold4(uint32, []byte, *[16]byte) { panic("wire: fold4 without AVX-512") }

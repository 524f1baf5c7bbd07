//go:build !amd64 || purego

package wire

const haveFold = false

func foldCRC(head, p []byte) uint32 { panic("wire: foldCRC without a vector carry-less multiply") }

// ICRCMethod names how this process computes the ICRC's CRC-32: here always "hash/crc32" (the
// carry-less folds of crc_amd64.s need amd64 with AVX-512, or AVX2 and VPCLMULQDQ).
func ICRCMethod() string { return "hash/crc32" }

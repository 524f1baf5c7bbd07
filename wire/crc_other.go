//go:build !amd64 || purego

package wire

const haveFold = false

func foldCRC(head, p []byte) uint32 { panic("wire: foldCRC without a vector carry-less multiply") }

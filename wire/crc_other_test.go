//go:build !amd64 || purego

package wire

func foldVariants() []foldVariant {
	return []foldVariant{{"hash-crc32", func() func() { return func() {} }}}
}

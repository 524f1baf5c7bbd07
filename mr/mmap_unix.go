//go:build unix

package mr

import "golang.org/x/sys/unix"

// mmap returns zeroed, page-aligned, private anonymous memory of at least n bytes.
func mmap(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
}

// munmap releases memory from mmap. It cannot fail for a mapping mmap returned, which is the only use.
func munmap(b []byte) { _ = unix.Munmap(b) }

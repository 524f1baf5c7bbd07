//go:build !unix

package mr

import "errors"

func mmap(n int) ([]byte, error) { return nil, errors.New("mr: Alloc needs mmap") }

func munmap(b []byte) {}

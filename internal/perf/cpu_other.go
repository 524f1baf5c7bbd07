//go:build !linux

package perf

import "time"

// processCPU returns -1: the CPU figures are measured on Linux only.
func processCPU() time.Duration { return -1 }

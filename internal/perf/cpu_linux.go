package perf

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPU returns the CPU time this process has used so far, user and system, all its threads:
// CLOCK_PROCESS_CPUTIME_ID, which the scheduler accounts to the nanosecond (getrusage's figures move
// by whole ticks on many kernels). It returns -1 if the clock cannot be read.
func processCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return -1
	}
	return time.Duration(ts.Nano())
}

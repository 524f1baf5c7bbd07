//go:build !race

package mr

// raceGuard serializes a region's accesses under the race detector only (see race.go).
type raceGuard struct{}

func (*raceGuard) lock()       {}
func (*raceGuard) unlock()     {}
func (*raceGuard) read([]byte) {}

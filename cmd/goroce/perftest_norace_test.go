//go:build !race

package main

// perftestRace says the race detector is on; see perftest_race_test.go.
const perftestRace = false

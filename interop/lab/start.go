package lab

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// shared is the lab the tests of one process share: guests are booted once, on first use, and
// stopped by Shutdown.
var shared struct {
	mu     sync.Mutex
	lab    *Lab
	guests map[int]*Guest
	failed error
}

// Usable reports why the lab cannot run here, or nil: it needs root and the host tools.
func Usable() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespaces, taps)")
	}
	if miss := MissingTools(); len(miss) > 0 {
		return fmt.Errorf("missing host tools %v: apt-get install qemu-system-x86 debootstrap cpio iproute2", miss)
	}
	return nil
}

// Start returns the shared lab with the given guests booted (default: guest 1). Where the lab cannot
// run it skips the test, or fails it when the environment variable CI is set, so that CI never passes
// without running the interop tests.
func Start(t testing.TB, ids ...int) (*Lab, []*Guest) {
	t.Helper()
	if err := Usable(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("interop lab: %v (CI is set, so this is a failure)", err)
		}
		t.Skipf("interop lab: %v", err)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.failed != nil {
		t.Fatalf("interop lab: %v", shared.failed)
	}
	if shared.lab == nil {
		shared.lab = New()
		shared.lab.Log = os.Stderr
		shared.guests = map[int]*Guest{}
	}
	if len(ids) == 0 {
		ids = []int{1}
	}
	var gs []*Guest
	for _, n := range ids {
		g, ok := shared.guests[n]
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			booted, err := shared.lab.Up(ctx, n)
			cancel()
			if err != nil {
				shared.failed = err
				t.Fatalf("interop lab: %v", err)
			}
			g = booted[0]
			shared.guests[n] = g
		}
		gs = append(gs, g)
	}
	return shared.lab, gs
}

// Shutdown stops the guests Start booted and deletes the namespace, unless GOROCE_INTEROP_KEEP is set
// (to look at a failure with labctl). Call it from TestMain after m.Run.
func Shutdown() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.lab == nil || os.Getenv("GOROCE_INTEROP_KEEP") != "" {
		return
	}
	_ = shared.lab.Down(context.Background())
	shared.lab, shared.guests = nil, nil
}

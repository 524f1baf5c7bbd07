//go:build linux

package lab

import (
	"context"
	"fmt"
	"net"
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
		if ok && !Responsive(g) {
			// An earlier test left this guest unreachable: boot it again, so that one wedged guest
			// fails one test rather than every test after it.
			t.Logf("interop lab: vm%d does not answer; console:\n%s", n, g.ConsoleTail(40))
			Reboot(t, g)
		}
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
	t.Cleanup(func() {
		if t.Failed() {
			for _, g := range gs {
				t.Logf("vm%d console (last 40 lines):\n%s", g.N, g.ConsoleTail(40))
			}
		}
	})
	return shared.lab, gs
}

// Responsive reports whether guest g's command channel answers within a few seconds.
func Responsive(g *Guest) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := g.Exec(ctx, "true")
	return err == nil
}

// Reboot stops guest g and boots it again; g stays valid. The guest comes back as built: whatever a
// test had set up in it is gone.
func Reboot(t testing.TB, g *Guest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := g.lab.Down(ctx, g.N); err != nil {
		t.Fatalf("interop lab: stopping vm%d: %v", g.N, err)
	}
	if _, err := g.lab.Up(ctx, g.N); err != nil {
		t.Fatalf("interop lab: rebooting vm%d: %v", g.N, err)
	}
}

// ConsoleTail returns the last lines of the guest's serial console log: kernel warnings land there.
func (g *Guest) ConsoleTail(lines int) string { return tail(g.lab.Console(g.N), lines) }

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

// DumpTasks asks guest g's kernel, through qemu's monitor and magic SysRq, to print every blocked
// task and the state of every CPU to its console (read it with ConsoleTail). It works when the guest's
// network does not: that is what it is for.
func DumpTasks(g *Guest) error {
	c, err := net.DialTimeout("unix", g.lab.monitor(g.N), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	// SysRq 8 raises the console log level, so that the dumps' KERN_INFO lines reach the console;
	// w lists blocked tasks, l the CPUs' backtraces, m memory.
	for _, key := range []string{"8", "w", "l", "m"} {
		if _, err := fmt.Fprintf(c, "sendkey alt-sysrq-%s\n", key); err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let the guest print
	return nil
}

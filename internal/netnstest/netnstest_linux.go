//go:build linux

// Package netnstest gives a test a network namespace of its own: a goroutine locked to a thread that
// entered a new namespace runs the test's functions and commands there, and a socket opened there stays
// in the namespace whatever thread uses it later. Nothing outside the namespace is touched.
package netnstest

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NS is a network namespace of the test's own.
type NS struct{ req chan func() }

// Do runs f inside the namespace and returns when it has.
func (n NS) Do(f func()) {
	done := make(chan struct{})
	n.req <- func() { f(); close(done) }
	<-done
}

// Run runs the command argv inside the namespace and fails tb if it fails.
func (n NS) Run(tb testing.TB, argv ...string) {
	tb.Helper()
	var out []byte
	var err error
	n.Do(func() { out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput() })
	if err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
}

// New creates a namespace, brings its lo up and runs cmds in it (each a command and its arguments).
// It skips tb where a namespace cannot be made (not root, no iproute2) and fails it when a command
// fails.
func New(tb testing.TB, cmds ...[]string) NS {
	tb.Helper()
	n, err := create(tb, cmds)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// NewOrSkip is New, except that a command that fails skips tb: for setups that need what a kernel may
// lack (veth, a qdisc).
func NewOrSkip(tb testing.TB, cmds ...[]string) NS {
	tb.Helper()
	n, err := create(tb, cmds)
	if err != nil {
		tb.Skip("cannot set up the network namespace:", err)
	}
	return n
}

func create(tb testing.TB, cmds [][]string) (NS, error) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2's ip")
	}
	n := NS{req: make(chan func())}
	stop := make(chan struct{})
	tb.Cleanup(func() { close(stop) })
	type result struct {
		err  error
		skip string
	}
	setup := make(chan result)
	go func() {
		// The namespace belongs to this OS thread only; the thread is never given back to the
		// runtime, so it dies with the goroutine instead of carrying the namespace elsewhere.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			setup <- result{skip: "unshare(CLONE_NEWNET): " + err.Error()}
			return
		}
		for _, argv := range append([][]string{{"ip", "link", "set", "lo", "up"}}, cmds...) {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				setup <- result{err: errors.New(strings.Join(argv, " ") + ": " + err.Error() + ": " + string(out))}
				return
			}
		}
		setup <- result{}
		for {
			select {
			case f := <-n.req:
				f()
			case <-stop:
				return
			}
		}
	}()
	r := <-setup
	if r.skip != "" {
		tb.Skip(r.skip)
	}
	return n, r.err
}

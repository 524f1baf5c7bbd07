//go:build linux

package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests drive the lab with a stand-in for qemu: this test binary, run again with fakeQEMUEnv set.
// Its value says how each accelerator behaves, for example "kvm=msr tcg=ok":
//
//	ok    the probe guest panics as a kernel without a root file system does; a guest boots: a
//	      daemonized child writes the pid file, serves the command channel on the guest's address
//	      (added to the namespace's lo) and prints GOROCE-GUEST-READY on the console
//	msr   qemu's failure under a nested hypervisor without the MSRs it needs: the error, then exit
//	      status 1, leaving a pid file that names a live process which is not qemu (the test binary)
//	hang  the firmware runs, the kernel never prints (KVM under PVM): the probe and the guest hang
//	late  the probe runs; a guest's qemu exits during its boot
const (
	fakeQEMUEnv  = "GOROCE_LAB_FAKE_QEMU"
	fakeChildEnv = "GOROCE_LAB_FAKE_QEMU_CHILD"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeQEMUEnv); mode != "" {
		os.Exit(fakeQEMU(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// qemuArgs is what the stand-in reads of qemu's command line.
type qemuArgs struct {
	accel     Accel
	pidFile   string
	serial    string // the console file of a guest; "" for the probe (serial on stdio)
	daemonize bool
	guest     int
}

func parseQEMUArgs(args []string) qemuArgs {
	var q qemuArgs
	for i := 0; i < len(args); i++ {
		next := ""
		if i+1 < len(args) {
			next = args[i+1]
		}
		switch args[i] {
		case "-accel":
			q.accel = Accel(strings.SplitN(next, ",", 2)[0])
		case "-pidfile":
			q.pidFile = next
		case "-serial":
			q.serial = strings.TrimPrefix(next, "file:")
		case "-daemonize":
			q.daemonize = true
		case "-append":
			for _, f := range strings.Fields(next) {
				if v, ok := strings.CutPrefix(f, "goroce_id="); ok {
					q.guest, _ = strconv.Atoi(v)
				}
			}
		}
	}
	return q
}

// behaviour returns what mode says accel does.
func behaviour(mode string, accel Accel) string {
	for _, f := range strings.Fields(mode) {
		if v, ok := strings.CutPrefix(f, string(accel)+"="); ok {
			return v
		}
	}
	return "ok"
}

func fakeQEMU(mode string, args []string) int {
	q := parseQEMUArgs(args)
	if os.Getenv(fakeChildEnv) != "" {
		return fakeGuest(behaviour(mode, q.accel), q)
	}
	switch behaviour(mode, q.accel) {
	case "msr":
		if q.pidFile != "" {
			_ = os.WriteFile(q.pidFile, []byte(strconv.Itoa(os.Getppid())+"\n"), 0o644)
		}
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69")
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.")
		return 1
	case "hang":
		if !q.daemonize {
			fmt.Println("Probing EDD (edd=off to disable)... ok")
			time.Sleep(time.Hour)
			return 0
		}
	case "ok", "late":
		if !q.daemonize {
			fmt.Println("[    2.72] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)")
			return 0
		}
	}
	// A guest: like qemu -daemonize, start the guest in the background and return once it runs.
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c := exec.Command(self, args...)
	c.Env = append(os.Environ(), fakeChildEnv+"=1")
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(q.pidFile); err == nil {
			return 0
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "fake qemu: the guest did not write its pid file")
	return 1
}

// fakeGuest is the daemonized stand-in guest.
func fakeGuest(b string, q qemuArgs) int {
	if err := os.WriteFile(q.pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return 1
	}
	switch b {
	case "hang":
		_ = os.WriteFile(q.serial, []byte("Probing EDD (edd=off to disable)... ok\n"), 0o644)
		time.Sleep(time.Hour)
		return 0
	case "late":
		time.Sleep(time.Second)
		return 1
	}
	ip := GuestIP(q.guest).String()
	if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
		_ = os.WriteFile(q.serial, out, 0o644)
		return 1
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(GuestCmdPort)))
	if err != nil {
		_ = os.WriteFile(q.serial, []byte(err.Error()), 0o644)
		return 1
	}
	_ = os.WriteFile(q.serial, []byte("GOROCE-GUEST-READY\n"), 0o644)
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
				_, _ = c.Write(append(statusMark, "0\n"...))
			}
		}()
	}
}

// testLab returns a lab in a directory of its own, with a kernel file for the probe, a KVM device
// that opens and the stand-in qemu in the given mode.
func testLab(t *testing.T, mode string) *Lab {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kvm := filepath.Join(dir, "kvm")
	for _, f := range []string{kvm, filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.gz")} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(fakeQEMUEnv, mode)
	return &Lab{Dir: dir, MemMiB: 64, MTU: 1500, BootTimeout: 20 * time.Second, QEMU: self,
		KVMDevice: kvm, ProbeTimeout: 20 * time.Second, AptGet: "apt-get", AptLockTimeout: time.Minute,
		Log: testWriter{t}}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestAccelChoice(t *testing.T) {
	for _, tc := range []struct {
		name, mode, env string
		noDevice        bool
		probeTimeout    time.Duration
		want            Accel
		forced          bool
		reason          string
	}{
		{name: "kvm works", mode: "kvm=ok", want: KVM, reason: "booted its kernel under KVM"},
		{name: "kvm aborts at start", mode: "kvm=msr", want: TCG, reason: "failed to set MSR 0x10a"},
		{name: "kvm hangs", mode: "kvm=hang", probeTimeout: 2 * time.Second, want: TCG, reason: "did not run to its end in 2s (console: Probing EDD"},
		{name: "no kvm device", mode: "kvm=ok", noDevice: true, want: TCG, reason: "no "},
		{name: "auto by name", mode: "kvm=msr", env: "auto", want: TCG, reason: "failed to set MSR"},
		{name: "forced kvm", mode: "kvm=msr", env: "kvm", want: KVM, forced: true, reason: "forced by GOROCE_INTEROP_ACCEL=kvm"},
		{name: "forced tcg", mode: "kvm=ok", env: "TCG", want: TCG, forced: true, reason: "forced by GOROCE_INTEROP_ACCEL=tcg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := testLab(t, tc.mode)
			l.AccelMode = tc.env
			if tc.noDevice {
				l.KVMDevice = filepath.Join(l.Dir, "no-such-kvm")
			}
			if tc.probeTimeout != 0 {
				l.ProbeTimeout = tc.probeTimeout
			}
			c, err := l.Accel(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if c.Accel != tc.want || c.Forced != tc.forced || !strings.Contains(c.Reason, tc.reason) {
				t.Errorf("got %+v, want %s (forced %v) with a reason that says %q", c, tc.want, tc.forced, tc.reason)
			}
			if again, _ := l.Accel(context.Background()); again != c {
				t.Errorf("second call chose %+v, first %+v: the choice is made once", again, c)
			}
		})
	}
}

func TestAccelChoiceErrors(t *testing.T) {
	l := testLab(t, "kvm=ok")
	l.AccelMode = "hvf"
	if _, err := l.Accel(context.Background()); err == nil || !strings.Contains(err.Error(), `GOROCE_INTEROP_ACCEL="hvf": want kvm, tcg or auto`) {
		t.Errorf("unknown accelerator: got %v", err)
	}
	l = testLab(t, "kvm=ok")
	if err := os.Remove(filepath.Join(l.Dir, "vmlinuz")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accel(context.Background()); err == nil || !strings.Contains(err.Error(), "build the image first") {
		t.Errorf("no kernel to probe with: got %v", err)
	}
}

// netLab returns a test lab in a network namespace of its own, which the test deletes at its end. It
// skips the test where namespaces cannot be made (not root, no ip).
func netLab(t *testing.T, mode string) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, taps)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	l := testLab(t, mode)
	l.netns = fmt.Sprintf("goroce-labtest-%d", os.Getpid())
	if err := os.MkdirAll(l.run(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := l.NamespaceUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("down: %v", err)
		}
		if l.nsExists() {
			t.Errorf("namespace %s still exists after Down", l.netns)
		}
	})
	return l
}

// assertNoState checks that guest n left nothing behind: no qemu, pid file, monitor socket or tap.
func assertNoState(t *testing.T, l *Lab, n int) {
	t.Helper()
	if pid, ok := l.running(n); ok {
		t.Errorf("vm%d still running as pid %d", n, pid)
	}
	for _, f := range []string{l.pidFile(n), l.monitor(n)} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (%v)", f, err)
		}
	}
	if out, err := ip(context.Background(), "-n", l.netns, "link", "show", tapName(n)); err == nil {
		t.Errorf("tap left behind: %s", out)
	}
	if st := l.Status(); len(st) != 0 {
		t.Errorf("status shows %q", st)
	}
}

// TestFailedStartLeavesNoState is the sequence: KVM forced on a host where qemu aborts under
// it; the start fails with qemu's words and leaves nothing, and a retry under TCG starts cleanly
// rather than finding the guest "already running".
func TestFailedStartLeavesNoState(t *testing.T) {
	l := netLab(t, "kvm=msr tcg=ok")
	l.AccelMode = "kvm"
	ctx := context.Background()
	_, err := l.boot(ctx, 1)
	if err == nil || !strings.Contains(err.Error(), "failed to set MSR 0x10a") || !strings.Contains(err.Error(), "under kvm") {
		t.Fatalf("start under a broken KVM: got %v, want qemu's error", err)
	}
	assertNoState(t, l, 1)

	l.AccelMode, l.accel = "tcg", nil
	gs, err := l.boot(ctx, 1)
	if err != nil {
		t.Fatalf("start under TCG after the failure: %v", err)
	}
	if out, err := gs[0].Exec(ctx, "true"); err != nil {
		t.Fatalf("exec in the guest: %v %s", err, out)
	}
	st := l.Status()
	if len(st) != 1 || !strings.Contains(st[0], "running under tcg") {
		t.Errorf("status %q, want vm1 running under tcg", st)
	}
	if err := l.Down(ctx, 1); err != nil {
		t.Fatal(err)
	}
	assertNoState(t, l, 1)
}

// TestAutoFallsBackToTCG: with no accelerator forced, a host whose KVM aborts (caught by the probe)
// or fails only once a real guest boots (caught at the boot) gets its guest under TCG, and says why.
func TestAutoFallsBackToTCG(t *testing.T) {
	for _, tc := range []struct{ mode, reason string }{
		{"kvm=msr", "failed to set MSR 0x10a"},
		{"kvm=late", "a guest failed under KVM (vm1 under kvm qemu exited during boot"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			l := netLab(t, tc.mode)
			ctx := context.Background()
			if _, err := l.boot(ctx, 1); err != nil {
				t.Fatal(err)
			}
			c, _ := l.Accel(ctx)
			if c.Accel != TCG || !strings.Contains(c.Reason, tc.reason) {
				t.Errorf("accelerator %+v, want tcg because %q", c, tc.reason)
			}
			if st := l.Status(); len(st) != 1 || !strings.Contains(st[0], "running under tcg") {
				t.Errorf("status %q, want vm1 running under tcg", st)
			}
		})
	}
}

// TestStalePIDFile: a pid file naming a live process that is not this guest's qemu (a reused pid, or
// the survivor of a failed start) does not make the lab believe the guest runs.
func TestStalePIDFile(t *testing.T) {
	l := netLab(t, "kvm=ok")
	if err := os.WriteFile(l.pidFile(1), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid, ok := l.running(1); ok {
		t.Fatalf("the test process (pid %d) taken for vm1's qemu", pid)
	}
	gs, err := l.boot(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	pid, ok := l.running(1)
	if !ok || pid == os.Getpid() {
		t.Fatalf("vm1 not started afresh: running %v pid %d", ok, pid)
	}
	if _, err := gs[0].Exec(context.Background(), "true"); err != nil {
		t.Fatal(err)
	}
}

// fakeAptGet writes a stand-in apt-get that reports the lists lock as held on its first `held` runs
// and then succeeds (exit 0) or fails with another error (`then` = "fail"), counting its runs.
func fakeAptGet(t *testing.T, held int, then string) (path, count string) {
	dir := t.TempDir()
	path, count = filepath.Join(dir, "apt-get"), filepath.Join(dir, "count")
	script := fmt.Sprintf(`#!/bin/sh
n=$(cat %[1]s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s
if [ $n -le %[2]d ]; then
  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2
  echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
  exit 100
fi
[ %[3]q = fail ] && { echo "E: Unable to locate package qemu-system-x86" >&2; exit 100; }
exit 0
`, count, held, then)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, count
}

func runs(t *testing.T, count string) int {
	b, _ := os.ReadFile(count)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func TestAptWaitsForLock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		held       int
		then       string
		timeout    time.Duration
		wantRuns   int
		wantErrHas string
	}{
		{name: "released after three tries", held: 3, then: "ok", timeout: time.Minute, wantRuns: 4},
		{name: "held past the deadline", held: 1000, then: "ok", timeout: 300 * time.Millisecond, wantErrHas: "Could not get lock"},
		{name: "another error fails at once", held: 0, then: "fail", timeout: time.Minute, wantRuns: 1, wantErrHas: "Unable to locate package"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := testLab(t, "")
			var count string
			l.AptGet, count = fakeAptGet(t, tc.held, tc.then)
			l.aptRetry, l.AptLockTimeout = 10*time.Millisecond, tc.timeout
			err := l.apt(ctx, "update")
			if tc.wantErrHas == "" && err != nil || tc.wantErrHas != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErrHas)) {
				t.Errorf("apt: %v, want an error with %q", err, tc.wantErrHas)
			}
			if n := runs(t, count); tc.wantRuns != 0 && n != tc.wantRuns || tc.wantRuns == 0 && n < 2 {
				t.Errorf("apt-get ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

//go:build linux

package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Accel is the qemu accelerator the lab runs its guests under.
type Accel string

// The accelerators. KVM runs the guest on the host's CPU and is much faster where it works; TCG,
// qemu's binary translator, works everywhere.
const (
	KVM Accel = "kvm"
	TCG Accel = "tcg"
)

// AccelEnv is the environment variable that chooses the accelerator: "kvm" or "tcg" force one, and
// "auto" (or unset) uses KVM when a probe guest runs under it and TCG otherwise.
const AccelEnv = "GOROCE_INTEROP_ACCEL"

// qemuArgs returns the accelerator's qemu arguments. "-cpu host" is KVM's own CPU model; under TCG,
// "max" enables every feature qemu can emulate, among them the instructions the guest's crc32 modules use.
func (a Accel) qemuArgs() []string {
	if a == KVM {
		return []string{"-accel", "kvm", "-cpu", "host"}
	}
	return []string{"-accel", "tcg,thread=multi", "-cpu", "max"}
}

// AccelChoice is the accelerator the lab boots guests with, and why.
type AccelChoice struct {
	Accel Accel
	// Forced is set when AccelEnv named the accelerator: then a guest that fails under it is an
	// error, not a reason to fall back.
	Forced bool
	// Reason says why, in words: the probe's outcome, qemu's error, or the environment variable.
	Reason string
}

func (c AccelChoice) String() string { return fmt.Sprintf("%s: %s", c.Accel, c.Reason) }

// probePanic is what the probe guest's kernel prints last: with no root file system it panics, and
// with panic=-1 and -no-reboot qemu then exits with status 0.
const probePanic = "Kernel panic"

// accelMode returns the accelerator AccelEnv (through Lab.AccelMode) asks for: KVM, TCG, or "" for
// automatic.
func (l *Lab) accelMode() (Accel, error) {
	switch m := strings.ToLower(strings.TrimSpace(l.AccelMode)); m {
	case "", "auto":
		return "", nil
	case string(KVM), string(TCG):
		return Accel(m), nil
	default:
		return "", fmt.Errorf("%s=%q: want kvm, tcg or auto", AccelEnv, l.AccelMode)
	}
}

// Accel returns the accelerator the lab boots guests with and why, deciding on first use: forced by
// AccelEnv, TCG when the KVM device cannot be opened, otherwise KVM if and only if a probe guest runs
// to its end under KVM within ProbeTimeout. The probe guest is the lab's own kernel with no root file
// system: it goes through the firmware, the switch to long mode and the whole kernel start, then
// panics, and qemu exits. /dev/kvm can open and still be unusable, in more than one way: under some
// nested hypervisors qemu aborts at the vCPU's first reset ("failed to set MSR 0x10a"); under others
// (PVM, which runs only guests built for it) the firmware runs and the kernel then hangs with nothing
// on its console. The image must be built. The decision is kept for the Lab's lifetime; a guest that
// still fails under an automatically chosen KVM moves it to TCG.
func (l *Lab) Accel(ctx context.Context) (AccelChoice, error) {
	l.accelMu.Lock()
	defer l.accelMu.Unlock()
	if l.accel != nil {
		return *l.accel, nil
	}
	c, err := l.chooseAccel(ctx)
	if err != nil {
		return AccelChoice{}, err
	}
	l.accel = &c
	l.logf("accelerator %s", c)
	return c, nil
}

// fallBackToTCG records that a guest failed under an automatically chosen KVM.
func (l *Lab) fallBackToTCG(why string) AccelChoice {
	l.accelMu.Lock()
	defer l.accelMu.Unlock()
	c := AccelChoice{Accel: TCG, Reason: "a guest failed under KVM (" + why + ")"}
	l.accel = &c
	l.logf("accelerator %s", c)
	return c
}

func (l *Lab) chooseAccel(ctx context.Context) (AccelChoice, error) {
	forced, err := l.accelMode()
	if err != nil {
		return AccelChoice{}, err
	}
	if forced != "" {
		return AccelChoice{Accel: forced, Forced: true, Reason: fmt.Sprintf("forced by %s=%s", AccelEnv, forced)}, nil
	}
	if _, err := os.Stat(filepath.Join(l.Dir, "vmlinuz")); err != nil {
		return AccelChoice{}, fmt.Errorf("choosing the accelerator needs the guest kernel (build the image first): %w", err)
	}
	f, err := os.OpenFile(l.KVMDevice, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return AccelChoice{Accel: TCG, Reason: "no " + l.KVMDevice}, nil
		}
		return AccelChoice{Accel: TCG, Reason: err.Error()}, nil
	}
	f.Close()
	took, err := l.probeKVM(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return AccelChoice{}, ctx.Err()
		}
		return AccelChoice{Accel: TCG, Reason: l.KVMDevice + " opens but KVM is unusable: " + err.Error()}, nil
	}
	return AccelChoice{Accel: KVM, Reason: fmt.Sprintf("the probe guest booted its kernel under KVM in %.1fs", took.Seconds())}, nil
}

// probeKVM boots the probe guest under KVM and reports how long it took, or why it did not run.
func (l *Lab) probeKVM(ctx context.Context) (time.Duration, error) {
	kernel := filepath.Join(l.Dir, "vmlinuz")
	pctx, cancel := context.WithTimeout(ctx, l.ProbeTimeout)
	defer cancel()
	args := append(KVM.qemuArgs(), "-m", "128", "-smp", "1", "-nodefaults", "-display", "none",
		"-no-reboot", "-monitor", "none", "-serial", "stdio",
		"-kernel", kernel, "-append", "console=ttyS0 panic=-1 loglevel=1")
	var out bytes.Buffer
	c := exec.CommandContext(pctx, l.QEMU, args...)
	c.Stdout, c.Stderr = &out, &out
	t0 := time.Now()
	err := c.Run()
	took := time.Since(t0)
	switch {
	case pctx.Err() != nil:
		return 0, fmt.Errorf("the probe guest did not run to its end in %v (console: %s)",
			l.ProbeTimeout, firstLines(tail(out.String(), 2), 2))
	case err != nil:
		return 0, fmt.Errorf("%v: %s", err, firstLines(out.String(), 3))
	case !strings.Contains(out.String(), probePanic):
		return 0, fmt.Errorf("the probe guest exited before its kernel ran: %s", firstLines(out.String(), 3))
	}
	return took, nil
}

// firstLines returns s's first n non-empty lines joined by " / ".
func firstLines(s string, n int) string {
	var ls []string
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" && len(ls) < n {
			ls = append(ls, line)
		}
	}
	if len(ls) == 0 {
		return "no output"
	}
	return strings.Join(ls, " / ")
}

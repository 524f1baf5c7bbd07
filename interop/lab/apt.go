//go:build linux

package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// aptLockRetry is how often apt runs again while another package manager holds a lock.
const aptLockRetry = 5 * time.Second

// apt runs apt-get with args, waiting up to AptLockTimeout for any other apt or dpkg run (an
// unattended upgrade, a second CI job) to release its locks rather than failing at once. apt-get's
// own DPkg::Lock::Timeout waits for dpkg's frontend lock; it does not cover the package lists' lock
// that "apt-get update" takes, so a run that still reports a held lock is retried until the deadline.
func (l *Lab) apt(ctx context.Context, args ...string) error {
	wait := l.AptLockTimeout
	deadline := time.Now().Add(wait)
	full := append([]string{"-q", "-o", "DPkg::Lock::Timeout=" + strconv.Itoa(int(wait.Seconds()))}, args...)
	for attempt := 1; ; attempt++ {
		var out bytes.Buffer
		c := l.cmd(ctx, l.AptGet, full...)
		w := l.Log
		if w == nil {
			w = io.Discard
		}
		c.Stdout, c.Stderr = io.MultiWriter(w, &out), io.MultiWriter(w, &out)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		err := c.Run()
		if err == nil {
			return nil
		}
		if !aptLockHeld(out.String()) || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("apt-get %s: %w: %s", strings.Join(args, " "), err, firstLines(out.String(), 3))
		}
		l.logf("apt-get %s: another package manager holds a lock; waiting (attempt %d)", args[0], attempt)
		retry := l.aptRetry
		if retry == 0 {
			retry = aptLockRetry
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// aptLockHeld reports whether apt-get's output says it could not take a lock another process holds.
func aptLockHeld(out string) bool {
	return strings.Contains(out, "Could not get lock") || strings.Contains(out, "Unable to lock") ||
		strings.Contains(out, "Unable to acquire the dpkg frontend lock")
}

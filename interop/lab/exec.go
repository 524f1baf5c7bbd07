//go:build linux

package lab

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// statusMark precedes the exit status at the end of a command channel reply.
var statusMark = []byte("\x1eGOROCE_RC=")

// ExitError is a guest command's non-zero exit status.
type ExitError struct {
	Status int
	Output string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("exit status %d: %s", e.Status, tail(e.Output, 10))
}

// DialNS connects to addr (host:port) from inside the lab's namespace. The socket is created on a
// thread switched into the namespace; once created it stays there, whatever thread later uses it.
func DialNS(ctx context.Context, addr string) (net.Conn, error) { return dialNS(ctx, Namespace, addr) }

func dialNS(ctx context.Context, ns, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is not unlocked if switching back fails: the runtime then retires it.
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("namespace %s: %w", ns, err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// Exec runs cmd with sh -c in the guest and returns its merged stdout and stderr; a non-zero exit
// status is an *ExitError.
func (g *Guest) Exec(ctx context.Context, cmd string) (string, error) {
	var out bytes.Buffer
	err := g.ExecIO(ctx, cmd, nil, &out)
	return out.String(), err
}

// ExecIO runs cmd in the guest with stdin forwarded (nil: /dev/null) and its merged stdout and stderr
// streamed to out; a non-zero exit status is an *ExitError (whose Output is empty: it went to out).
func (g *Guest) ExecIO(ctx context.Context, cmd string, stdin io.Reader, out io.Writer) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := dialNS(dctx, g.lab.namespace(), net.JoinHostPort(g.IP.String(), strconv.Itoa(GuestCmdPort)))
	cancel()
	if err != nil {
		return fmt.Errorf("vm%d command channel: %w", g.N, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	mode := "n"
	if stdin != nil {
		mode = "i"
	}
	if _, err := fmt.Fprintf(c, "%s %s\n", mode, base64.StdEncoding.EncodeToString([]byte(cmd))); err != nil {
		return err
	}
	if stdin != nil {
		go func() {
			_, _ = io.Copy(c, stdin)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
	}
	// Stream everything but the last few bytes, which may be the start of the status mark.
	keep := len(statusMark) + 16
	var buf []byte
	chunk := make([]byte, 64<<10)
	var capture *bytes.Buffer
	if b, ok := out.(*bytes.Buffer); ok {
		capture = b
	}
	for {
		n, rerr := c.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if bytes.LastIndex(buf, statusMark) < 0 && len(buf) > keep {
			if _, err := out.Write(buf[:len(buf)-keep]); err != nil {
				return err
			}
			buf = append(buf[:0], buf[len(buf)-keep:]...)
		}
		if rerr != nil {
			break
		}
	}
	i := bytes.LastIndex(buf, statusMark)
	if i < 0 {
		_, _ = out.Write(buf)
		if ctx.Err() != nil {
			return fmt.Errorf("vm%d: %q: %w", g.N, cmd, ctx.Err())
		}
		return fmt.Errorf("vm%d: %q: command channel closed without a status", g.N, cmd)
	}
	if _, err := out.Write(buf[:i]); err != nil {
		return err
	}
	rest := buf[i+len(statusMark):]
	if j := bytes.IndexByte(rest, '\n'); j >= 0 {
		rest = rest[:j]
	}
	st, err := strconv.Atoi(string(rest))
	if err != nil {
		return fmt.Errorf("vm%d: bad status %q", g.N, rest)
	}
	if st != 0 {
		e := &ExitError{Status: st}
		if capture != nil {
			e.Output = capture.String()
		}
		return e
	}
	return nil
}

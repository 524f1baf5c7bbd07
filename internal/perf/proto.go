package perf

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/goroce/goroce"
)

// protoVersion is the control protocol's version: parent and child must agree, which they do when
// the child is the parent's own binary.
const protoVersion = 1

// Control channel timeouts: how long the parent waits for each reply. Setup and teardown are quick;
// the bounds are there so that a wedged child ends the run with an error instead of hanging it.
const (
	helloTimeout = 30 * time.Second
	startTimeout = 30 * time.Second
	markTimeout  = 10 * time.Second
	stopTimeout  = 30 * time.Second
	// exitTimeout is how long a child may take to exit once its stdin closed before it is killed.
	exitTimeout = 5 * time.Second
)

// maxLine bounds one control message.
const maxLine = 1 << 20

// Operations of the control channel.
const (
	opHello = "hello" // child to parent, first line: protocol version and pid
	opStart = "start" // set up the child's side of a measurement
	opMark  = "mark"  // the timed interval begins: snapshot the counters
	opStop  = "stop"  // end the measurement, report the counters
)

// request is a line from parent to child.
type request struct {
	Op   string    `json:"op"`
	Spec *Spec     `json:"spec,omitempty"` // start: what to measure
	Addr string    `json:"addr,omitempty"` // start: the IP address the child binds
	Peer *Endpoint `json:"peer,omitempty"` // start: the parent's side
}

// reply is a line from child to parent. Err, when set, says the request failed.
type reply struct {
	Op       string      `json:"op"`
	Err      string      `json:"err,omitempty"`
	Version  int         `json:"version,omitempty"`  // hello
	PID      int         `json:"pid,omitempty"`      // hello
	Endpoint *Endpoint   `json:"endpoint,omitempty"` // start
	Report   *PeerReport `json:"report,omitempty"`   // stop
}

// Endpoint is what one side of a measurement tells the other: for goroce, its queue pairs and the
// memory region the peer reads or writes; for TCP and UDP, the address to send to.
type Endpoint struct {
	Addr string            `json:"addr,omitempty"` // TCP and UDP: host:port
	QPs  []goroce.Endpoint `json:"qps,omitempty"`  // in their text form`
	MR   *MRInfo           `json:"mr,omitempty"`
}

// MRInfo names a memory region to the peer: QP i uses Slot bytes at Addr + i*Slot.
type MRInfo struct {
	Addr uint64 `json:"addr"`
	RKey uint32 `json:"rkey"`
	Slot int    `json:"slot"`
}

// PeerReport is what the child reports when a measurement stops.
type PeerReport struct {
	// Stats are the child's goroce device counters over its whole life (goroce kinds only).
	Stats *goroce.Stats `json:"stats,omitempty"`
	// Messages counts what the child's side completed: receives (goroce SEND, echoes for the
	// ping-pongs), datagrams (UDP) or read calls (TCP).
	Messages uint64 `json:"messages"`
	// Bytes counts the payload bytes the child received.
	Bytes uint64 `json:"bytes"`
	// Runs counts coalesced runs received (UDP GRO).
	Runs uint64 `json:"runs,omitempty"`
	// Mallocs and Packets are the child's heap allocations and goroce packets (sent and received)
	// from the mark to the stop; Marked says whether a mark came.
	Mallocs uint64 `json:"mallocs,omitempty"`
	Packets uint64 `json:"packets,omitempty"`
	Marked  bool   `json:"marked,omitempty"`
	// CPU is the child's CPU time from the mark to the stop request; 0 when there was no mark or
	// the child could not measure it.
	CPU time.Duration `json:"cpu,omitempty"`
	// Err is the first error the child's side met while it ran.
	Err string `json:"err,omitempty"`
}

// ChildCommand says how to start the child process: normally the running binary
// (os.Executable) with the arguments that make it serve, `perf loopback -child` for goroce.
type ChildCommand struct {
	Path string
	Args []string
	Env  []string // added to the parent's environment
}

// ErrChild wraps every failure of the child process or of the control channel.
var ErrChild = errors.New("perf child")

// Child is the parent's handle on a child process serving measurements. Its methods are called
// from one goroutine at a time; one request is outstanding at a time.
type Child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan reply    // decoded replies, closed when stdout ends
	exited chan struct{} // closed when the child has exited and exitErr is set
	stderr *tailBuffer
	// exitErr is cmd.Wait's result, written by the reader goroutine before it closes exited.
	exitErr error
	pid     int
	broken  error // set once the channel is out of step (a timeout) or gone; later calls fail with it
	closed  bool
	running bool // start succeeded and stop has not been called since: cleanup has a measurement to end
}

// StartChild starts the child and waits for its hello.
func StartChild(ctx context.Context, cc ChildCommand) (*Child, error) {
	if cc.Path == "" {
		return nil, fmt.Errorf("%w: no command", ErrChild)
	}
	cmd := exec.Command(cc.Path, cc.Args...)
	cmd.Env = append(os.Environ(), cc.Env...)
	c := &Child{cmd: cmd, lines: make(chan reply, 1), exited: make(chan struct{}), stderr: &tailBuffer{max: 8 << 10}}
	cmd.Stderr = c.stderr
	cmd.WaitDelay = exitTimeout
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChild, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChild, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s: %w", ErrChild, cc.Path, err)
	}
	c.pid = cmd.Process.Pid
	go c.read(stdout)
	r, err := c.wait(ctx, opHello, helloTimeout)
	if err == nil && r.Version != protoVersion {
		err = fmt.Errorf("%w: protocol version %d, want %d", ErrChild, r.Version, protoVersion)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// PID returns the child's process id.
func (c *Child) PID() int { return c.pid }

// watch returns a context that ends with ctx or when the child exits, whichever comes first, so
// that a measurement does not wait for a dead peer; its cause then says how the child ended.
func (c *Child) watch(ctx context.Context) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-c.exited:
			cancel(fmt.Errorf("%w: exited during the measurement%s", ErrChild, c.exitNote()))
		case <-wctx.Done():
		}
	}()
	return wctx, func() { cancel(nil) }
}

// read decodes the child's stdout into c.lines until it ends, then waits for the child to exit:
// exec.Cmd wants every read of the pipe done before Wait.
func (c *Child) read(stdout io.Reader) {
	defer close(c.exited)
	defer func() { c.exitErr = c.cmd.Wait() }()
	defer close(c.lines)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			r = reply{Op: "?", Err: fmt.Sprintf("undecodable line %q: %v", truncate(sc.Text(), 200), err)}
		}
		c.lines <- r
	}
}

// call sends req and waits up to timeout for its reply.
func (c *Child) call(ctx context.Context, req request, timeout time.Duration) (reply, error) {
	if c.broken != nil {
		return reply{}, c.broken
	}
	b, err := json.Marshal(req)
	if err != nil {
		return reply{}, fmt.Errorf("%w: encode %s: %w", ErrChild, req.Op, err)
	}
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		select {
		case <-c.exited:
			c.broken = fmt.Errorf("%w: exited before %s%s", ErrChild, req.Op, c.exitNote())
		default:
			c.broken = fmt.Errorf("%w: send %s: %w%s", ErrChild, req.Op, err, c.stderrNote())
		}
		return reply{}, c.broken
	}
	return c.wait(ctx, req.Op, timeout)
}

// wait waits for the reply to op.
func (c *Child) wait(ctx context.Context, op string, timeout time.Duration) (reply, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r, ok := <-c.lines:
		switch {
		case !ok:
			c.broken = fmt.Errorf("%w: exited while answering %s%s", ErrChild, op, c.exitNote())
		case r.Op != op:
			c.broken = fmt.Errorf("%w: answered %s with %q: %s", ErrChild, op, r.Op, r.Err)
		case r.Err != "":
			return r, fmt.Errorf("%w: %s: %s", ErrChild, op, r.Err)
		default:
			return r, nil
		}
	case <-t.C:
		c.broken = fmt.Errorf("%w: no answer to %s within %v%s", ErrChild, op, timeout, c.stderrNote())
	case <-ctx.Done():
		c.broken = fmt.Errorf("%w: %s: %w", ErrChild, op, ctx.Err())
	}
	return reply{}, c.broken
}

// start asks the child to set up its side of s, bound to addr, facing peer.
func (c *Child) start(ctx context.Context, s Spec, addr string, peer Endpoint) (Endpoint, error) {
	r, err := c.call(ctx, request{Op: opStart, Spec: &s, Addr: addr, Peer: &peer}, startTimeout)
	if err != nil {
		return Endpoint{}, err
	}
	if r.Endpoint == nil {
		return Endpoint{}, fmt.Errorf("%w: start: no endpoint in the reply", ErrChild)
	}
	c.running = true
	return *r.Endpoint, nil
}

// mark tells the child that the timed interval begins.
func (c *Child) mark(ctx context.Context) error {
	_, err := c.call(ctx, request{Op: opMark}, markTimeout)
	return err
}

// stop ends the child's measurement and returns its report. An error the child's side met while
// running comes back as an error with the report.
func (c *Child) stop(ctx context.Context) (PeerReport, error) {
	c.running = false
	r, err := c.call(ctx, request{Op: opStop}, stopTimeout)
	if err != nil {
		return PeerReport{}, err
	}
	if r.Report == nil {
		return PeerReport{}, fmt.Errorf("%w: stop: no report in the reply", ErrChild)
	}
	if r.Report.Err != "" {
		return *r.Report, fmt.Errorf("%w: peer side: %s", ErrChild, r.Report.Err)
	}
	return *r.Report, nil
}

// cleanup stops the child's measurement after a failure on the parent's side, so that the next one
// starts from a clean child; it gives up quietly, since the first error is the one to report. After
// stop, or with no measurement started, it does nothing: a run defers it once start has succeeded.
func (c *Child) cleanup() {
	if !c.running || c.broken != nil {
		return
	}
	_, _ = c.call(context.Background(), request{Op: opStop}, stopTimeout)
}

// Close ends the child: it closes its stdin, which makes it stop whatever it runs and exit, and
// kills it if it has not exited within a few seconds. Close returns the child's exit error, if any,
// with the end of its stderr.
func (c *Child) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.broken == nil {
		c.broken = fmt.Errorf("%w: closed", ErrChild)
	}
	c.stdin.Close()
	go func() { // drain replies nobody waits for, so that the reader reaches the end
		for range c.lines {
		}
	}()
	select {
	case <-c.exited:
	case <-time.After(exitTimeout):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	if c.exitErr != nil {
		return fmt.Errorf("%w: pid %d: %w%s", ErrChild, c.pid, c.exitErr, c.stderrNote())
	}
	return nil
}

// exitNote waits briefly for the status of a child whose stdout ended, for an error message.
func (c *Child) exitNote() string {
	select {
	case <-c.exited:
		if c.exitErr != nil {
			return fmt.Sprintf(" (%v)%s", c.exitErr, c.stderrNote())
		}
	case <-time.After(time.Second):
	}
	return c.stderrNote()
}

// stderrNote returns the end of the child's stderr for an error message, or nothing.
func (c *Child) stderrNote() string {
	s := strings.TrimSpace(c.stderr.String())
	if s == "" {
		return ""
	}
	return "; child's stderr: " + s
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// tcpStream measures a Go TCP stream to the child: s.Size-byte writes for the interval, counted as
// they return; the child reads and discards, and reports what it read, which must be all of it.
func tcpStream(ctx context.Context, ch *Child, s Spec, local, remote netip.Addr) (Result, error) {
	res := newResult()
	ep, err := ch.start(ctx, s, remote.String(), Endpoint{})
	if err != nil {
		return res, err
	}
	defer ch.cleanup()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local.AsSlice()}, Timeout: startTimeout}
	c, err := d.DialContext(ctx, "tcp", ep.Addr)
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	defer c.Close()
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return res, fmt.Errorf("%s: dial returned a %T", s.Title, c)
	}
	unhook := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Now()) })
	defer unhook()
	buf := make([]byte, s.Size)
	w := newWindow(s)
	if err := tc.SetWriteDeadline(w.end.Add(drainTimeout)); err != nil {
		return res, err
	}
	var total uint64
	var cpu cpuSpan
	for started := false; ; {
		n, err := tc.Write(buf)
		total += uint64(n)
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return res, fmt.Errorf("%s: write after %d bytes: %w", s.Title, total, err)
		}
		now := time.Now()
		if w.in(now) {
			if !started {
				started = true
				if err := cpu.beginAfter(func() error { return ch.mark(ctx) }); err != nil {
					return res, err
				}
			}
			res.Messages++
			res.Bytes += uint64(n)
		}
		if !now.Before(w.end) {
			cpu.end()
			break
		}
	}
	if err := tc.CloseWrite(); err != nil {
		return res, fmt.Errorf("%s: close: %w", s.Title, err)
	}
	rep, err := ch.stop(ctx)
	if err != nil {
		return res, err
	}
	res.Elapsed = s.Duration
	res.Gbps = gbps(res.Bytes, res.Elapsed)
	res.setCPU(&cpu, &rep)
	if rep.Bytes != total {
		res.notef("MISMATCH: the child read %d bytes of the %d written", rep.Bytes, total)
	}
	return res, nil
}

// tcpServer is the child's side of a TCP stream: it accepts one connection and reads it to its
// end, discarding what it reads.
type tcpServer struct {
	ln       net.Listener
	done     chan struct{}
	stopping atomic.Bool
	mu       sync.Mutex
	c        net.Conn
	reads    uint64
	bytes    uint64
	err      error
}

func startTCPServer(s Spec, addr netip.Addr) (*tcpServer, Endpoint, error) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		return nil, Endpoint{}, fmt.Errorf("listen: %w", err)
	}
	t := &tcpServer{ln: ln, done: make(chan struct{})}
	go t.serve(s.Size)
	return t, Endpoint{Addr: ln.Addr().String()}, nil
}

func (t *tcpServer) serve(size int) {
	defer close(t.done)
	if tl, ok := t.ln.(*net.TCPListener); ok {
		tl.SetDeadline(time.Now().Add(startTimeout))
	}
	c, err := t.ln.Accept()
	if err != nil {
		if !t.stopping.Load() {
			t.setErr(fmt.Errorf("accept: %w", err))
		}
		return
	}
	t.mu.Lock()
	t.c = c
	t.mu.Unlock()
	buf := make([]byte, size)
	var reads, bytes uint64
	for {
		n, err := c.Read(buf)
		reads++
		bytes += uint64(n)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.setErr(fmt.Errorf("read after %d bytes: %w", bytes, err))
			}
			break
		}
	}
	t.mu.Lock()
	t.reads, t.bytes = reads, bytes
	t.mu.Unlock()
}

func (t *tcpServer) setErr(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.err = err
	}
}

func (t *tcpServer) mark() {}

// stop waits for the stream's end (the parent closed its side before asking), then closes.
func (t *tcpServer) stop() PeerReport {
	t.stopping.Store(true)
	t.ln.Close()
	select {
	case <-t.done:
	case <-time.After(serverStopTimeout):
		t.mu.Lock()
		if t.c != nil {
			t.c.Close()
		}
		t.mu.Unlock()
		<-t.done
		t.setErr(fmt.Errorf("the stream did not end within %v of the stop", serverStopTimeout))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.c != nil {
		t.c.Close()
	}
	rep := PeerReport{Messages: t.reads, Bytes: t.bytes}
	if t.err != nil {
		rep.Err = t.err.Error()
	}
	return rep
}

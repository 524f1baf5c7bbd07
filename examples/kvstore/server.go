package kvstore

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/goroce/goroce"
)

// Config is a table's geometry and the options of the server's queue pairs. Zero fields take the
// defaults.
type Config struct {
	Slots    int // slots in the table: DefaultSlots unless set
	MaxKey   int // longest key in bytes: DefaultMaxKey unless set
	MaxValue int // longest value in bytes: DefaultMaxValue unless set
	Probes   int // slots a key may live in, from its home slot on: DefaultProbes (at most Slots) unless set
	// Connect is the options of the server's queue pairs: goroce.DefaultConnectOptions unless set.
	// Access must allow RemoteRead, RemoteWrite and RemoteAtomic.
	Connect *goroce.ConnectOptions
}

// Server owns a table and gives clients queue pairs to reach it. After setup it does nothing: the
// clients' READs, WRITEs and atomics run on the device.
//
// ServeConn runs on its caller's goroutine and owns its client's queue pair until the connection
// ends; Serve starts one such goroutine per connection. Close ends all of them and waits for them.
type Server struct {
	dev    *goroce.Device
	layout layout
	opts   *goroce.ConnectOptions
	pd     *goroce.PD
	cq     *goroce.CQ
	table  *goroce.MR

	// mu guards conns, listeners and closed.
	mu        sync.Mutex
	conns     map[net.Conn]int // connections being served, with how many goroutines serve each
	listeners map[net.Listener]struct{}
	closed    bool
	wg        sync.WaitGroup // goroutines serving connections
}

// ErrServerClosed is what Serve returns after Close.
var ErrServerClosed = errors.New("kvstore: server closed")

// NewServer registers an empty table on dev. The device stays the caller's: Close the Server before it.
func NewServer(dev *goroce.Device, cfg Config) (*Server, error) {
	l := layout{Slots: cfg.Slots, MaxKey: cfg.MaxKey, MaxValue: cfg.MaxValue, Probes: cfg.Probes}
	if l.Slots == 0 {
		l.Slots = DefaultSlots
	}
	if l.MaxKey == 0 {
		l.MaxKey = DefaultMaxKey
	}
	if l.MaxValue == 0 {
		l.MaxValue = DefaultMaxValue
	}
	if l.Probes == 0 {
		l.Probes = min(DefaultProbes, l.Slots)
	}
	if err := l.validate(); err != nil {
		return nil, fmt.Errorf("kvstore: %w", err)
	}
	s := &Server{dev: dev, layout: l, opts: cfg.Connect,
		conns: map[net.Conn]int{}, listeners: map[net.Listener]struct{}{}}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	// The server's queue pairs complete nothing (no request of theirs and no receive), but a QP needs
	// CQs.
	if s.cq, err = dev.CreateCQ(16); err != nil {
		s.pd.Close()
		return nil, err
	}
	// AllocMR memory is page-aligned and zeroed: every version word aligned, every slot empty.
	access := goroce.LocalWrite | goroce.RemoteRead | goroce.RemoteWrite | goroce.RemoteAtomic
	if s.table, err = s.pd.AllocMR(l.Slots*l.slotSize(), access); err != nil {
		s.cq.Close()
		s.pd.Close()
		return nil, err
	}
	return s, nil
}

// Serve accepts connections on ln and serves each on its own goroutine, until ln fails or the
// server closes (then it returns ErrServerClosed). Close closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			return err
		}
		if !s.begin(conn) {
			conn.Close()
			return ErrServerClosed
		}
		go func() {
			defer s.end(conn)
			defer conn.Close()
			_ = s.ServeConn(conn)
		}()
	}
}

// ServeConn sets up the client on conn: it creates and connects a queue pair for it and sends it the
// table. It then keeps the queue pair until conn ends (the client closed it, or the server closed),
// and returns nil then; it returns an error if the setup failed.
func (s *Server) ServeConn(conn net.Conn) error {
	if !s.begin(conn) {
		return ErrServerClosed
	}
	defer s.end(conn)
	peer, err := readHello(conn)
	if err != nil {
		return err
	}
	qp, err := s.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	if err := qp.Connect(peer, s.opts); err != nil {
		return err
	}
	if err := writeTable(conn, qp.Endpoint(), s.table, s.layout); err != nil {
		return err
	}
	// The client sends nothing more: a read ends when the connection does.
	_, _ = io.Copy(io.Discard, conn)
	return nil
}

// begin records work on conn for Close to end and wait for, unless the server is closed.
func (s *Server) begin(conn net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[conn]++
	s.wg.Add(1)
	return true
}

// end undoes begin.
func (s *Server) end(conn net.Conn) {
	s.mu.Lock()
	if s.conns[conn]--; s.conns[conn] == 0 {
		delete(s.conns, conn)
	}
	s.mu.Unlock()
	s.wg.Done()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close closes the listeners Serve runs on and the clients' connections, waits for every ServeConn to
// return (destroying its queue pair), and deregisters the table. It does not close the device.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(s.table.Close(), s.cq.Close(), s.pd.Close())
}

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/testaddr"
)

// transfer runs both sides in this process over loopback: a TCP listener on port 0 at one address of
// a testaddr pair (each side's device binds port 4791 at its end's address), and a client dialing
// from the other.
func transfer(t *testing.T, opts Options) (sent, received Result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srvAddr, cliAddr := testaddr.Pair()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(srvAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type outcome struct {
		res Result
		err error
	}
	server := make(chan outcome, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			server <- outcome{err: err}
			return
		}
		defer conn.Close()
		res, err := Receive(ctx, conn, Options{Network: opts.Network})
		server <- outcome{res, err}
	}()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(cliAddr, 0))}
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sent, err = Send(ctx, conn, opts)
	o := <-server
	if err != nil || o.err != nil {
		t.Fatalf("client: %v; server: %v", err, o.err)
	}
	return sent, o.res
}

func TestTransfer(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"chunks", Options{Size: 4<<20 + 123, Chunk: 64 << 10, Depth: 8}},
		{"one WRITE", Options{Size: 1000}},
		{"depth 1", Options{Size: 1 << 20, Chunk: 100 << 10, Depth: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, received := transfer(t, tc.opts)
			if sent.Bytes != tc.opts.Size || received.Bytes != tc.opts.Size {
				t.Errorf("moved %d and %d bytes, want %d", sent.Bytes, received.Bytes, tc.opts.Size)
			}
			if !bytes.Equal(sent.Data, received.Data) {
				t.Fatal("the server's region differs from the client's buffer")
			}
			if sent.Checksum != received.Checksum {
				t.Errorf("checksums %08x and %08x", sent.Checksum, received.Checksum)
			}
			t.Logf("client: %v", sent)
			t.Logf("server: %v", received)
		})
	}
}

// The data a caller gives arrives as given.
func TestTransferData(t *testing.T) {
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i ^ i>>8 ^ i>>16)
	}
	_, received := transfer(t, Options{Data: data, Chunk: 256 << 10})
	if !bytes.Equal(received.Data, data) {
		t.Fatal("the server's region differs from the data sent")
	}
}

// A server that is not a transfer server, or a client that goes away, ends a side with an error
// instead of a hang.
func TestTransferPeerGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvAddr, nobody := testaddr.Pair()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(srvAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			conn.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n...........")) // as long as a ready
			conn.Close()
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := Send(ctx, conn, Options{Size: 1 << 20}); err == nil {
		t.Fatal("Send to a server that is not one succeeded")
	}

	// A client that says hello and hangs up.
	server := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			server <- err
			return
		}
		defer conn.Close()
		_, err = Receive(ctx, conn, Options{})
		server <- err
	}()
	conn2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ep := goroce.Endpoint{GID: goroce.GIDFromAddr(nobody), Port: 9, QPN: 1, MTU: goroce.MTU1024}
	hello, _ := ep.AppendBinary([]byte(magic))
	hello = binary.BigEndian.AppendUint64(hello, 1<<20)
	if _, err := conn2.Write(hello); err != nil {
		t.Fatal(err)
	}
	ready := make([]byte, readyLen)
	if _, err := conn2.Read(ready); err != nil {
		t.Fatal(err)
	}
	conn2.Close()
	if err := <-server; !errors.Is(err, ErrClientGone) {
		t.Fatalf("Receive after the client left: %v, want ErrClientGone", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"64MiB": 64 << 20, "1": 1, "2K": 2000, "3GiB": 3 << 30, "10B": 10, "5M": 5e6} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "0", "1.5M", "12X"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded", in)
		}
	}
}

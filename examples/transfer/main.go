// Command transfer moves a buffer from one process to another with RDMA WRITEs over goroce and
// reports the throughput each side saw.
//
// Run the server, then the client:
//
//	go run ./examples/transfer -listen 127.0.0.1:7000
//	go run ./examples/transfer -connect 127.0.0.1:7000 -size 64MiB
//
// The two sides meet over TCP, where they exchange their goroce Endpoints (binary form) and the
// address and rkey of the server's region. Each opens its device on the address its end of the TCP
// connection has, on an ephemeral UDP port that the Endpoint carries. The client then WRITEs the
// buffer in chunks with several in flight, the last one a WRITE with immediate that carries the
// data's CRC-32C; the server checks it and tells the client. Send and Receive are the two sides, for a
// program or a test to call.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
)

func main() {
	listen := flag.String("listen", "", "serve transfers on this TCP address, for example 127.0.0.1:7000")
	connect := flag.String("connect", "", "send to the server at this TCP address")
	size := flag.String("size", "64MiB", "bytes to send: a number with an optional K, M, G, KiB, MiB or GiB")
	chunk := flag.String("chunk", "1MiB", "bytes per RDMA WRITE")
	depth := flag.Int("depth", DefaultDepth, "RDMA WRITEs in flight")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *listen, *connect, *size, *chunk, *depth); err != nil {
		fmt.Fprintln(os.Stderr, "transfer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, listen, connect, size, chunk string, depth int) error {
	if (listen == "") == (connect == "") {
		flag.Usage()
		return fmt.Errorf("give one of -listen and -connect")
	}
	if listen != "" {
		return serve(ctx, listen)
	}
	n, err := parseSize(size)
	if err != nil {
		return err
	}
	c, err := parseSize(chunk)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", connect)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := Send(ctx, conn, Options{Size: n, Chunk: c, Depth: depth})
	if err != nil {
		return err
	}
	fmt.Println("sent", res, "verified by the server")
	return nil
}

// serve handles one client at a time until ctx ends.
func serve(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	fmt.Println("listening on", ln.Addr())
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		res, err := Receive(ctx, conn, Options{})
		conn.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "transfer from", conn.RemoteAddr(), "failed:", err)
			continue
		}
		fmt.Println("received", res, "from", conn.RemoteAddr(), "intact")
	}
}

// parseSize parses a byte count with an optional suffix: K, M, G (powers of 1000) or KiB, MiB, GiB
// (powers of 1024).
func parseSize(s string) (int, error) {
	units := []struct {
		suffix string
		scale  int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"B", 1}}
	scale := 1
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, scale = rest, u.scale
			break
		}
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * scale, nil
}

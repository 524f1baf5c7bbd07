package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/pingpong"
)

func init() {
	register(command{"pingpong", "a peer for ibv_rc_pingpong, ibv_uc_pingpong and ibv_ud_pingpong: same flags, TCP exchange and output", runPingpong})
}

// pingpongArgs are what goroce pingpong's command line says: the run's options and where its TCP
// exchange goes.
type pingpongArgs struct {
	host    string // server to connect to; empty: be the server
	port    int
	timeout time.Duration
	opts    pingpong.Options
}

// parsePingpong parses rc_pingpong's flags (and goroce's -a, -qp-type and -timeout). It returns
// errUsage after printing the usage for what the tools refuse with their usage.
func parsePingpong(args []string) (pingpongArgs, error) {
	var a pingpongArgs
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	both := func(p *int, short, long string, def int, help string) {
		fs.IntVar(p, short, def, help)
		fs.IntVar(p, long, def, help)
	}
	var dev, qpType, addr string
	var ibPort, sl, gidx, size, mtu, rxDepth, iters int
	var odp, ts, events, chk bool
	def := pingpong.DefaultOptions(goroce.RC)
	both(&a.port, "p", "port", pingpong.DefaultPort, "listen on/connect to TCP port")
	fs.StringVar(&dev, "d", "", "IB device (ignored: goroce is the device)")
	fs.StringVar(&dev, "ib-dev", "", "IB device (ignored)")
	both(&ibPort, "i", "ib-port", 1, "port of the IB device (ignored)")
	both(&size, "s", "size", def.Size, "size of message to exchange (ud: 2048)")
	both(&mtu, "m", "mtu", def.MTU.Bytes(), "path MTU (ud: the port MTU, 2048)")
	both(&rxDepth, "r", "rx-depth", def.RxDepth, "number of receives to post at a time")
	both(&iters, "n", "iters", def.Iters, "number of exchanges")
	both(&sl, "l", "sl", 0, "service level (ignored)")
	fs.BoolVar(&events, "e", false, "sleep on CQ events (goroce always does)")
	fs.BoolVar(&events, "events", false, "sleep on CQ events (goroce always does)")
	both(&gidx, "g", "gid-idx", -1, "local port GID index (goroce has one GID, the IPv4-mapped address)")
	fs.BoolVar(&odp, "o", false, "use on-demand paging (not supported)")
	fs.BoolVar(&odp, "odp", false, "use on-demand paging (not supported)")
	fs.BoolVar(&ts, "t", false, "get CQE with timestamp (not supported)")
	fs.BoolVar(&ts, "ts", false, "get CQE with timestamp (not supported)")
	fs.BoolVar(&chk, "c", false, "validate received buffer")
	fs.BoolVar(&chk, "chk", false, "validate received buffer")
	fs.StringVar(&addr, "a", "", "local IP address of the goroce device (default: the address the TCP exchange uses)")
	fs.StringVar(&addr, "addr", "", "local IP address of the goroce device")
	fs.StringVar(&qpType, "qp-type", "rc", "rc (ibv_rc_pingpong), uc (ibv_uc_pingpong) or ud (ibv_ud_pingpong)")
	fs.DurationVar(&a.timeout, "timeout", 0, "give up after this long (0: never, like rc_pingpong)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage:")
		fmt.Fprintln(w, "  goroce pingpong [flags]          start a server and wait for connection")
		fmt.Fprintln(w, "  goroce pingpong [flags] <host>   connect to server at <host>")
		fs.PrintDefaults()
	}
	var err error
	if a.host, err = parseWithHost(fs, args); err != nil {
		return a, err
	}
	switch {
	case odp:
		return a, errors.New("on-demand paging is not supported by goroce")
	case ts:
		return a, errors.New("completion timestamps are not supported by goroce")
	case a.port <= 0 || a.port > 65535, size <= 0, rxDepth <= 1, iters <= 0:
		fs.Usage()
		return a, errUsage
	}
	m, ok := goroce.MTUFromBytes(mtu)
	if !ok {
		fs.Usage()
		return a, errUsage
	}
	var typ goroce.QPType
	switch strings.ToLower(qpType) {
	case "rc":
		typ = goroce.RC
	case "uc":
		typ = goroce.UC
	case "ud":
		typ = goroce.UD
	default:
		return a, fmt.Errorf("-qp-type %q: rc, uc or ud", qpType)
	}
	// Start from the tool's defaults (ud_pingpong's differ) and apply the flags given.
	a.opts = pingpong.DefaultOptions(typ)
	a.opts.RxDepth, a.opts.Iters, a.opts.Check = rxDepth, iters, chk
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "s", "size":
			a.opts.Size = size
		case "m", "mtu":
			a.opts.MTU = m
		}
	})
	if typ == goroce.UD && a.opts.Size > a.opts.MTU.Bytes() {
		return a, fmt.Errorf("-s %d: a UD datagram must fit the %d-byte path MTU", a.opts.Size, a.opts.MTU.Bytes())
	}
	if addr != "" {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return a, fmt.Errorf("-a: %v", err)
		}
		a.opts.Addr = ip.Unmap()
	}
	return a, nil
}

func runPingpong(args []string) error {
	a, err := parsePingpong(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	port := strconv.Itoa(a.port)
	if a.host == "" {
		// The server listens before it prints its address, so that a client started after that line
		// connects.
		var srv *pingpong.Server
		if srv, err = pingpong.Listen(ctx, ":"+port, a.opts); err == nil {
			_, err = srv.Serve(ctx, os.Stdout)
		}
	} else {
		_, err = pingpong.Connect(ctx, net.JoinHostPort(a.host, port), a.opts, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError(1)
	}
	return nil
}

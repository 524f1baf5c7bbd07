package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/rping"
)

func init() {
	register(command{"rping", "a peer for librdmacm's rping: connects through the RDMA CM, same flags, protocol and output", runRping})
}

// rpingArgs are what goroce rping's command line says.
type rpingArgs struct {
	server  bool
	addr    string // -a: the address to serve on, or the server's
	source  string // -I: the client's local address
	port    int
	timeout time.Duration
	write   string // -w: the pcapng file of the run's packets, the CM's MADs included
	opts    rping.Options
}

// rpingBoolFlags are rping's flags without a value, which getopt lets a user run together ("-vVd").
const rpingBoolFlags = "scvVdPq"

// splitRpingFlags turns "-vVd" into "-v" "-V" "-d", as getopt reads it; the flag package does not.
func splitRpingFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if len(a) > 2 && a[0] == '-' && a[1] != '-' && strings.Trim(a[1:], rpingBoolFlags) == "" {
			for _, c := range a[1:] {
				out = append(out, "-"+string(c))
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// parseRping parses rping's flags (and goroce's -timeout). It returns errUsage after printing the
// usage where rping prints its usage.
func parseRping(args []string) (rpingArgs, error) {
	a := rpingArgs{opts: rping.DefaultOptions()}
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	var server, client, selfQP bool
	fs.BoolVar(&server, "s", false, "server side")
	fs.BoolVar(&client, "c", false, "client side")
	fs.StringVar(&a.addr, "a", "", "address: the server's (client), or the local one to serve on (server)")
	fs.StringVar(&a.source, "I", "", "source address to bind to for client (default: the route's toward -a)")
	fs.IntVar(&a.port, "p", rping.DefaultPort, "port")
	fs.IntVar(&a.opts.Count, "C", 0, "ping count times (0: forever)")
	fs.IntVar(&a.opts.Size, "S", rping.DefaultSize, "ping data size")
	fs.BoolVar(&a.opts.Verbose, "v", false, "display ping data to stdout")
	fs.BoolVar(&a.opts.Check, "V", false, "validate ping data")
	fs.BoolVar(&a.opts.Debug, "d", false, "debug printfs")
	fs.BoolVar(&a.opts.Persistent, "P", false, "persistent server mode allowing multiple connections")
	fs.BoolVar(&selfQP, "q", false, "use self-created, self-modified QP (goroce always does)")
	fs.DurationVar(&a.timeout, "timeout", 0, "give up after this long (0: never, like rping); ends a -P server without an error")
	fs.StringVar(&a.write, "w", "", "write goroce's packets, the connection manager's included, to `FILE`, pcapng, as tcpdump -w does (goroce dump -explain tells the CM's story)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage:")
		fmt.Fprintln(w, "  goroce rping -s [-vVd] [-S size] [-C count] -a addr [-p port] [-P]")
		fmt.Fprintln(w, "  goroce rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(splitRpingFlags(args)); err != nil {
		return a, errUsage // the flag package has printed what was wrong, and the usage
	}
	switch {
	case fs.NArg() > 0:
		return a, fmt.Errorf("unexpected argument %q: rping takes only flags", fs.Arg(0))
	case server == client:
		fs.Usage()
		return a, errUsage
	case a.port <= 0 || a.port > 65535:
		return a, fmt.Errorf("-p %d: the port is 1..65535", a.port)
	case a.addr == "" && server:
		return a, errors.New("-s needs -a: the local address to serve on (a goroce device has one address)")
	case a.addr == "":
		return a, errors.New("-c needs -a: the server's address")
	case a.source != "" && server:
		return a, errors.New("-I is for the client")
	case a.opts.Persistent && !server:
		return a, errors.New("-P is for the server")
	}
	a.server = server
	if err := a.opts.Validate(); err != nil {
		return a, err
	}
	return a, nil
}

func runRping(args []string) error { return rpingMain(args, os.Stdout, os.Stderr) }

// rpingMain runs goroce rping with its output on stdout and stderr.
func rpingMain(args []string, stdout, stderr io.Writer) error {
	a, err := parseRping(args)
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
	remote, err := resolveRping(ctx, a.addr)
	if err != nil {
		return err
	}
	local := remote
	if !a.server {
		if local, err = rpingSource(ctx, a.source, remote); err != nil {
			return err
		}
	}
	cfg := goroce.Config{Addr: local, Port: goroce.DefaultPort}
	if a.write != "" {
		var done func()
		if cfg.Tracer, done, err = captureRun("rping", "w", a.write, stderr); err != nil {
			return err
		}
		defer done() // after the device has closed
	}
	dev, err := goroce.Open(cfg)
	if err != nil {
		return err
	}
	defer dev.Close()
	if a.opts.Debug {
		// goroce's own debug line, after rping's: what its CM sent, resent and dropped.
		defer func() { fmt.Fprintln(stdout, cmCounters(dev)) }()
	}
	if a.server {
		srv, err := rping.Listen(dev, uint16(a.port), a.opts)
		if err != nil {
			return err
		}
		defer srv.Close()
		_, err = srv.Serve(ctx, stdout, stderr)
		if a.opts.Persistent && ctx.Err() != nil {
			return nil // ^C or -timeout ends a persistent server
		}
		return err
	}
	_, err = rping.Connect(ctx, dev, net.JoinHostPort(remote.String(), strconv.Itoa(a.port)), a.opts, stdout, stderr)
	return err
}

// resolveRping turns -a (an address or a name) into an IP address.
func resolveRping(ctx context.Context, host string) (netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("-a %s: invalid hostname or IP address (%v)", host, err)
	}
	return ips[0].Unmap(), nil
}

// rpingSource returns the client's local address: -I's, or the one the kernel's route toward the
// server takes, as rdma_resolve_addr without a source picks it. Nothing is sent.
func rpingSource(ctx context.Context, source string, remote netip.Addr) (netip.Addr, error) {
	if source != "" {
		ip, err := resolveRping(ctx, source)
		if err != nil {
			return ip, fmt.Errorf("-I: %v", err)
		}
		return ip, nil
	}
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(remote, goroce.DefaultPort)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %v: %v", remote, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// cmCounters returns the device's nonzero CM counters on one line, "cm counters: Sent[ConnectRequest]=1 ...".
func cmCounters(dev *goroce.Device) string {
	st := dev.Stats().CM
	var b strings.Builder
	b.WriteString("cm counters:")
	st.Each(func(name string, v uint64) {
		if v != 0 {
			fmt.Fprintf(&b, " %s=%d", name, v)
		}
	})
	return b.String()
}

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
	"github.com/goroce/goroce/interop/perftest"
)

// goroce perf <test>: a peer for the perftest programs (ib_write_bw, ib_read_lat, ...), run by package
// perftest; perf.go dispatches to it.

// findPerftest returns the perftest program name names ("write_bw" or "ib_write_bw"), or nil.
func findPerftest(name string) *perftest.Test {
	if t, ok := perftest.ParseTest(name); ok {
		return &t
	}
	return nil
}

func perftestUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: goroce perf <test> [perftest flags] [host]")
	fmt.Fprintln(w, "  a peer for perftest's ib_<test>: server without a host, client with one")
	var names []string
	for _, t := range perftest.Tests() {
		names = append(names, string(t))
	}
	fmt.Fprintf(w, "  tests: %s\n", strings.Join(names, ", "))
}

// perftestArgs are what goroce perf <test>'s command line says: the run's options, where its TCP
// exchange goes, and goroce's own flags.
type perftestArgs struct {
	host    string // server to connect to; empty: be the server
	port    int
	timeout time.Duration
	stats   bool // print the device's counters to stderr at the end
	opts    perftest.Options
}

// parsePerftest parses perftest's flags for test t (and goroce's -addr, -timeout and -stats). It
// returns errUsage after printing the usage for what perftest refuses with its usage.
func parsePerftest(t perftest.Test, args []string) (perftestArgs, error) {
	var a perftestArgs
	fs := flag.NewFlagSet("perf "+string(t), flag.ContinueOnError)
	o := perftest.DefaultOptions(t)
	both := func(p *int, short, long string, def int, help string) {
		fs.IntVar(p, short, def, help)
		if long != "" {
			fs.IntVar(p, long, def, help)
		}
	}
	var dev, atomicType, connType, addr string
	var ibPort, qps, mtu, duration int
	var ignored, rdmaCM bool
	both(&a.port, "p", "port", perftest.DefaultPort, "listen on/connect to TCP port")
	fs.StringVar(&dev, "d", "", "IB device (ignored: goroce is the device)")
	fs.StringVar(&dev, "ib-dev", "", "IB device (ignored)")
	both(&ibPort, "i", "ib-port", 1, "port of the IB device (ignored)")
	both(&o.Size, "s", "size", o.Size, "size of message to exchange")
	both(&o.Iters, "n", "iters", o.Iters, "number of exchanges")
	both(&mtu, "m", "mtu", 0, "path MTU (256 to 4096; default: 4096, lowered to the peer's)")
	both(&o.GIDIndex, "x", "gid-index", o.GIDIndex, "GID index (goroce has one GID, the IPv4-mapped address)")
	both(&qps, "q", "qp", 1, "number of QPs (only 1)")
	both(&o.TxDepth, "t", "tx-depth", o.TxDepth, "size of the send queue")
	both(&o.RxDepth, "r", "rx-depth", o.RxDepth, "receives kept posted")
	both(&o.CQMod, "Q", "cq-mod", o.CQMod, "completion every this many sends")
	both(&o.OutReads, "o", "outs", o.OutReads, "outstanding READs and atomics")
	both(&duration, "D", "duration", 0, "run for seconds (not supported)")
	fs.BoolVar(&o.All, "a", false, "run all message sizes from 2 to 2^23")
	fs.BoolVar(&o.All, "all", false, "run all message sizes")
	fs.BoolVar(&ignored, "F", false, "ignore CPU frequency warnings (goroce measures with the monotonic clock)")
	fs.BoolVar(&ignored, "e", false, "use events (goroce always waits on the CQ)")
	fs.BoolVar(&rdmaCM, "R", false, "connect with rdma_cm (not supported)")
	fs.StringVar(&atomicType, "A", "FETCH_AND_ADD", "atomic type: FETCH_AND_ADD or CMP_AND_SWAP")
	fs.StringVar(&atomicType, "atomic_type", "FETCH_AND_ADD", "atomic type")
	fs.StringVar(&connType, "c", "RC", "connection type (only RC)")
	fs.StringVar(&addr, "addr", "", "local IP address of the goroce device (default: the address the TCP exchange uses)")
	fs.DurationVar(&a.timeout, "timeout", 0, "give up after this long (0: never)")
	fs.BoolVar(&a.stats, "stats", false, "print the goroce device's counters to stderr at the end (goroce's own flag)")
	fs.Usage = func() {
		perftestUsage(fs.Output())
		fs.PrintDefaults()
	}
	var err error
	if a.host, err = parseWithHost(fs, args); err != nil {
		return a, err
	}
	switch {
	case rdmaCM:
		return a, errors.New("-R: rdma_cm is not supported by goroce; use the Ethernet exchange")
	case duration != 0:
		return a, errors.New("-D: duration mode is not supported; use -n")
	case qps != 1:
		return a, errors.New("-q: goroce perf runs one QP")
	case !strings.EqualFold(connType, "RC"):
		return a, fmt.Errorf("-c %s: goroce perf runs RC", connType)
	case o.All && !t.AllSizes():
		return a, fmt.Errorf("-a is not supported for %s", t)
	case a.port <= 0 || a.port > 65535, o.Size <= 0, o.Iters < 2, o.TxDepth < 1, o.RxDepth < 1, o.CQMod < 1,
		o.OutReads < 1 || o.OutReads > 128:
		fs.Usage()
		return a, errUsage
	}
	switch strings.ToUpper(atomicType) {
	case "FETCH_AND_ADD":
	case "CMP_AND_SWAP":
		o.AtomicCAS = true
	default:
		return a, fmt.Errorf("-A %s: FETCH_AND_ADD or CMP_AND_SWAP", atomicType)
	}
	if mtu != 0 {
		m, ok := goroce.MTUFromBytes(mtu)
		if !ok {
			return a, fmt.Errorf("-m %d: 256, 512, 1024, 2048 or 4096", mtu)
		}
		o.MTU = m
	}
	if addr != "" {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return a, fmt.Errorf("-addr: %v", err)
		}
		o.Addr = ip.Unmap()
	}
	a.opts = o
	return a, nil
}

func runPerftest(t *perftest.Test, args []string) error {
	a, err := parsePerftest(*t, args)
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
	var res perftest.Result
	if a.host == "" {
		var srv *perftest.Server
		if srv, err = perftest.Listen(ctx, ":"+port, a.opts); err == nil {
			res, err = srv.Serve(ctx, os.Stdout)
		}
	} else {
		res, err = perftest.Connect(ctx, net.JoinHostPort(a.host, port), a.opts, os.Stdout)
	}
	if a.stats && res.Stats != nil {
		printDeviceStats(os.Stderr, *res.Stats)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError(1)
	}
	return nil
}

// printDeviceStats prints a device's counters on one line, name=value, for tests and curious users:
// what went out in GSO runs, what came in, and whether anything was retransmitted or dropped.
func printDeviceStats(w io.Writer, s goroce.Stats) {
	fmt.Fprintf(w, "goroce stats: tx_packets=%d tx_gso=%d gso_fallback=%d rx_packets=%d rx_gro=%d drop_icrc=%d drop_malformed=%d "+
		"completer_retry_err=%d duplicate_request=%d out_of_seq_request=%d\n",
		s.TxPackets, s.TxGSO, s.GSOFallback, s.RxPackets, s.RxGRO, s.DropICRC, s.DropMalformed,
		s.QP.CompleterRetryErr, s.QP.DuplicateRequest, s.QP.OutOfSeqRequest)
}

package main

import (
	"context"
	"errors"
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
// perftest; perf.go dispatches to it, perftest_flags.go reads perftest's options.

// findPerftest returns the perftest program name names ("write_bw" or "ib_write_bw"), or nil.
func findPerftest(name string) *perftest.Test {
	if t, ok := perftest.ParseTest(name); ok {
		return &t
	}
	return nil
}

// perftestNames returns the tests goroce perf runs, comma-separated.
func perftestNames() string {
	var names []string
	for _, t := range perftest.Tests() {
		names = append(names, string(t))
	}
	return strings.Join(names, ", ")
}

func perftestUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: goroce perf <test> [perftest options] [host]")
	fmt.Fprintln(w, "  a peer for perftest 6.06's ib_<test>: server without a host, client with one")
	fmt.Fprintf(w, "  tests: %s\n", perftestNames())
	fmt.Fprintln(w, "  goroce perf <test> -h lists the options")
}

// perftestArgs are what goroce perf <test>'s command line says: the run's options, where its TCP
// exchange goes, and goroce's own options.
type perftestArgs struct {
	host    string // server to connect to; empty: be the server
	port    int
	source  netip.Addr // --source_ip: the TCP connection's local address
	timeout time.Duration
	stats   bool   // print the device's counters to stderr at the end
	pcap    string // -pcap: the pcapng file of the run's packets
	help    bool   // -h
	version bool   // -V
	opts    perftest.Options
}

// parsePerftest parses perftest's options for test t (and goroce's -addr, -timeout and -stats) and
// checks them as perftest does. Its errors are one line that names the option; -h and -V return
// errHelp and errVersion.
func parsePerftest(t perftest.Test, args []string) (perftestArgs, error) {
	a := perftestArgs{port: perftest.DefaultPort, opts: perftest.DefaultOptions(t)}
	if err := parsePerftestArgs(&a, t, args); err != nil {
		return a, err
	}
	if a.source.IsValid() {
		a.opts.SourceIP = a.source
	}
	if err := a.opts.Validate(); err != nil {
		return a, &flagError{strings.TrimPrefix(err.Error(), perftest.ErrBadOptions.Error()+": ")}
	}
	return a, nil
}

func runPerftest(t *perftest.Test, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return perftestMain(ctx, *t, args, os.Stdout, os.Stderr)
}

// perftestListening, when set (by tests), learns the address a goroce perf server listens on.
var perftestListening func(net.Addr)

// perftestMain is goroce perf <test> with its output on stdout and stderr: perftest's report on
// stdout, goroce's error on stderr.
func perftestMain(ctx context.Context, t perftest.Test, args []string, stdout, stderr io.Writer) error {
	a, err := parsePerftest(t, args)
	switch {
	case errors.Is(err, errHelp):
		perftestUsage(stdout)
		printPerftestFlags(stdout, t)
		return nil
	case errors.Is(err, errVersion):
		fmt.Fprintf(stdout, "Version: %s\n", perftest.Version)
		return nil
	case err != nil:
		return err
	}
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	if a.pcap != "" {
		var done func()
		if a.opts.Tracer, done, err = captureRun("perf", "pcap", a.pcap, stderr); err != nil {
			return err
		}
		defer done() // after the run, whose devices have closed
	}
	port := strconv.Itoa(a.port)
	var res perftest.Result
	if a.host == "" {
		host := ""
		if a.source.IsValid() {
			host = a.source.String()
		}
		var srv *perftest.Server
		if srv, err = perftest.Listen(ctx, net.JoinHostPort(host, port), a.opts); err == nil {
			if perftestListening != nil {
				perftestListening(srv.Addr())
			}
			res, err = srv.Serve(ctx, stdout)
		}
	} else {
		res, err = perftest.Connect(ctx, net.JoinHostPort(a.host, port), a.opts, stdout)
	}
	if a.stats && res.Stats != nil {
		printDeviceStats(stderr, *res.Stats)
	}
	if a.opts.RunInfinitely && (err == nil || ctx.Err() != nil) {
		// --run_infinitely runs until it is stopped (Ctrl-C or -timeout), as perftest's does.
		return nil
	}
	if err != nil {
		fmt.Fprintf(stderr, "goroce perf %s: %v\n", t, err)
		return exitError(1)
	}
	return nil
}

// printDeviceStats prints a device's counters on one line, name=value, for tests and curious users:
// what went out in GSO runs, what came in, and whether anything was retransmitted or dropped.
func printDeviceStats(w io.Writer, s goroce.Stats) {
	fmt.Fprintf(w, "goroce stats: tx_packets=%d tx_gso=%d gso_fallback=%d rx_packets=%d rx_gro=%d drop_icrc=%d drop_malformed=%d "+
		"completer_retry_err=%d local_ack_timeout_err=%d rcvd_seq_err=%d rcvd_rnr_err=%d tail_probes=%d duplicate_request=%d out_of_seq_request=%d\n",
		s.TxPackets, s.TxGSO, s.GSOFallback, s.RxPackets, s.RxGRO, s.DropICRC, s.DropMalformed,
		s.QP.CompleterRetryErr, s.QP.Timeouts, s.QP.RcvdSeqErr, s.QP.RcvdRNRErr, s.QP.TailProbes, s.QP.DuplicateRequest, s.QP.OutOfSeqRequest)
}

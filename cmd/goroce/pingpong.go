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
	register(command{"pingpong", "a peer for ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and ibv_srq_pingpong: same flags, TCP exchange and output", runPingpong})
}

// pingpongArgs are what goroce pingpong's command line says: the run's options and where its TCP
// exchange goes.
type pingpongArgs struct {
	host    string // server to connect to; empty: be the server
	port    int
	timeout time.Duration
	write   string // -w: the pcapng file of the run's packets
	opts    pingpong.Options
}

// maxSL is the largest service level: the SL is 4 bits (IBTA Vol 1 7.6.5).
const maxSL = 15

// parsePingpong parses the pingpong tools' flags (rdma-core 44's ibv_rc_pingpong getopt string
// "p:d:i:s:m:r:n:l:eg:oOPtcjN", ibv_srq_pingpong's -q, and goroce's -a, -qp-type, -srq and -timeout). It
// returns errUsage after printing the usage for what the tools refuse with their usage, and a
// one-line error naming the flag for a flag goroce does not know or cannot do.
func parsePingpong(args []string) (pingpongArgs, error) {
	var a pingpongArgs
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	both := func(p *int, short, long string, def int, help string) {
		fs.IntVar(p, short, def, help)
		fs.IntVar(p, long, def, help)
	}
	bothBool := func(p *bool, short, long, help string) {
		fs.BoolVar(p, short, false, help)
		fs.BoolVar(p, long, false, help)
	}
	var dev, qpType, addr string
	var ibPort, sl, gidx, size, mtu, numQP, rxDepth, iters int
	var events, odp, iodp, prefetch, ts, chk, dm, newSend, srq bool
	// Every flag of the tools either works or fails with a one-line error naming it. Some change
	// nothing on the wire and are accepted as they are:
	//   -e  goroce always sleeps on the CQ (CQ.Wait); a goroutine that spins on CQ.Poll starves Go's
	//       network poller and runs a 1-byte pingpong 200 times slower (see package pingpong).
	//   -o  on-demand paging: goroce's regions are Go memory that is never pinned, so it has nothing
	//       to do; -O (implicit ODP, a region of the whole address space) likewise, with the buffer
	//       registered alone; -P (ibv_advise_mr prefetch) with either: the buffer is resident.
	//   -N  ibv_wr_* post API: goroce has one post API, and the same SEND goes out.
	//   -l  the SL travels in no RoCEv2 header (rxe ignores it too); checked to be 4 bits.
	//   -d, -i, -g  goroce is the device, with one port and one GID.
	// -t (completion timestamps) and -j (device memory) have no goroce counterpart and are refused,
	// as rxe refuses them ("The device isn't completion timestamp capable", "Device doesn't support
	// dm allocation").
	def := pingpong.DefaultOptions(goroce.RC)
	both(&a.port, "p", "port", pingpong.DefaultPort, "listen on/connect to TCP port")
	fs.StringVar(&dev, "d", "", "IB device (ignored: goroce is the device)")
	fs.StringVar(&dev, "ib-dev", "", "IB device (ignored)")
	both(&ibPort, "i", "ib-port", 1, "port of the IB device (ignored: goroce has one)")
	both(&size, "s", "size", def.Size, "size of message to exchange (ud: 2048)")
	both(&mtu, "m", "mtu", def.MTU.Bytes(), "path MTU (ud: the port MTU, 2048)")
	both(&numQP, "q", "num-qp", pingpong.DefaultSRQOptions().NumQP, "srq: number of QPs sharing the SRQ (1 to 255)")
	both(&rxDepth, "r", "rx-depth", def.RxDepth, "number of receives to post at a time")
	both(&iters, "n", "iters", def.Iters, "number of exchanges (srq: counted over all the QPs, as ibv_srq_pingpong does)")
	both(&sl, "l", "sl", 0, "service level, 0 to 15 (ignored: a RoCEv2 packet carries none)")
	bothBool(&events, "e", "events", "sleep on CQ events (goroce always does: its CQ.Wait is faster than polling)")
	both(&gidx, "g", "gid-idx", -1, "local port GID index (goroce has one GID, the IPv4-mapped address)")
	bothBool(&odp, "o", "odp", "use on-demand paging (accepted: goroce never pins its memory)")
	bothBool(&iodp, "O", "iodp", "use implicit on-demand paging (accepted as -o: goroce registers the buffer alone)")
	bothBool(&prefetch, "P", "prefetch", "prefetch an ODP MR (accepted with -o or -O: the buffer is resident)")
	bothBool(&ts, "t", "ts", "get CQE with timestamp (not supported)")
	bothBool(&chk, "c", "chk", "validate received buffer")
	bothBool(&dm, "j", "dm", "use device memory (not supported)")
	bothBool(&newSend, "N", "new_send", "use new post send WR API (accepted: goroce has one post API)")
	fs.StringVar(&addr, "a", "", "local IP address of the goroce device (default: the address the TCP exchange uses)")
	fs.StringVar(&addr, "addr", "", "local IP address of the goroce device")
	fs.StringVar(&qpType, "qp-type", "rc", "rc (ibv_rc_pingpong), uc (ibv_uc_pingpong), ud (ibv_ud_pingpong) or srq (ibv_srq_pingpong)")
	fs.BoolVar(&srq, "srq", false, "be ibv_srq_pingpong (-qp-type srq): -q QPs sharing one SRQ")
	fs.DurationVar(&a.timeout, "timeout", 0, "give up after this long (0: never, like rc_pingpong)")
	fs.StringVar(&a.write, "w", "", "write goroce's packets to `FILE`, pcapng, as tcpdump -w does (for Wireshark, tshark and goroce dump)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage:")
		fmt.Fprintln(w, "  goroce pingpong [flags]          start a server and wait for connection")
		fmt.Fprintln(w, "  goroce pingpong [flags] <host>   connect to server at <host>")
		fmt.Fprintln(w, "The flags are ibv_rc_pingpong's; -qp-type uc or ud makes it ibv_uc_pingpong or ibv_ud_pingpong,")
		fmt.Fprintln(w, "and -srq ibv_srq_pingpong (e.g. goroce pingpong -srq -q 4 <host>).")
		fs.PrintDefaults()
	}
	var err error
	if a.host, err = parseGetopt(fs, args); err != nil {
		return a, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	given := func(short, long string) bool { return set[short] || set[long] }
	switch {
	case ts:
		return a, errors.New("-t: completion timestamps are not supported by goroce")
	case dm:
		return a, errors.New("-j: goroce has no device memory (ibv_alloc_dm)")
	case prefetch && !odp && !iodp:
		return a, errors.New("-P: prefetch is valid only with on-demand memory region (-o or -O)")
	case sl < 0 || sl > maxSL:
		return a, fmt.Errorf("-l %d: a service level is 0 to %d", sl, maxSL)
	case a.port <= 0 || a.port > 65535, ibPort < 1, size <= 0, rxDepth <= 1, iters <= 0:
		fs.Usage()
		return a, errUsage
	}
	m, ok := goroce.MTUFromBytes(mtu)
	if !ok {
		fs.Usage()
		return a, errUsage
	}
	if srq {
		if set["qp-type"] && !strings.EqualFold(qpType, "srq") {
			return a, fmt.Errorf("-srq with -qp-type %s: ibv_srq_pingpong runs RC QPs", qpType)
		}
		qpType = "srq"
	}
	switch strings.ToLower(qpType) {
	case "rc":
		a.opts = pingpong.DefaultOptions(goroce.RC)
	case "uc":
		a.opts = pingpong.DefaultOptions(goroce.UC)
	case "ud":
		a.opts = pingpong.DefaultOptions(goroce.UD)
	case "srq":
		a.opts = pingpong.DefaultSRQOptions()
	default:
		return a, fmt.Errorf("-qp-type %q: rc, uc, ud or srq", qpType)
	}
	// Start from the tool's defaults (ud_pingpong's differ) and apply the flags given.
	a.opts.RxDepth, a.opts.Iters, a.opts.Check = rxDepth, iters, chk
	if given("s", "size") {
		a.opts.Size = size
	}
	if given("m", "mtu") {
		a.opts.MTU = m
	}
	if given("q", "num-qp") {
		if !a.opts.SRQ {
			return a, errors.New("-q: only ibv_srq_pingpong has several QPs; add -srq")
		}
		a.opts.NumQP = numQP
	}
	if a.opts.SRQ {
		switch {
		case a.opts.RxDepth < a.opts.NumQP:
			return a, fmt.Errorf("-r %d is too small for %d QPs: at least one receive per QP", a.opts.RxDepth, a.opts.NumQP)
		case a.opts.NumQP < 1 || a.opts.NumQP >= pingpong.MaxQP:
			return a, fmt.Errorf("-q %d: 1 to %d QPs", a.opts.NumQP, pingpong.MaxQP-1)
		}
	}
	if a.opts.Type == goroce.UD && a.opts.Size > a.opts.MTU.Bytes() {
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

// parseGetopt parses args as getopt_long does for the C tools: the optional host argument may stand
// among the flags (parseWithHost), short flags may be bundled ("-ce") and take their value joined
// ("-n10"). It returns the host, or "" when there is none. A flag fs does not define, or a bad value,
// is a one-line error that names it; -h and a second host print the usage.
func parseGetopt(fs *flag.FlagSet, args []string) (string, error) {
	args = splitShortFlags(fs, args)
	// package flag writes its complaint, then calls Usage: keep the complaint, and print the usage
	// only when there is none.
	var complaint strings.Builder
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(&complaint)
	host, err := parseWithHost(fs, args)
	fs.Usage = usage
	fs.SetOutput(out)
	if err == nil {
		return host, nil
	}
	msg, _, _ := strings.Cut(complaint.String(), "\n")
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "", fmt.Errorf("unknown flag %s (see goroce pingpong -h)", asGiven(args, name))
	}
	if msg != "" {
		return "", errors.New(msg)
	}
	usage()
	return "", errUsage
}

// asGiven returns the flag called name as args spell it ("--report_gbits"), or "-name".
func asGiven(args []string, name string) string {
	for _, arg := range args {
		f, _, _ := strings.Cut(arg, "=")
		if strings.HasPrefix(f, "-") && strings.TrimLeft(f, "-") == name {
			return f
		}
	}
	return "-" + name
}

// splitShortFlags rewrites getopt's short forms that package flag does not read: "-ce" becomes "-c",
// "-e" when every letter is a boolean flag, and "-n10" becomes "-n", "10" when the first letter is a
// flag that takes a value. Arguments that are defined flags, values and everything after "--" stay.
func splitShortFlags(fs *flag.FlagSet, args []string) []string {
	isBool := func(f *flag.Flag) bool {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return ok && b.IsBoolFlag()
	}
	var out []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return append(out, args[i:]...)
		}
		if len(arg) < 2 || arg[0] != '-' || arg[1] == '-' {
			out = append(out, arg)
			continue
		}
		name, _, hasValue := strings.Cut(arg[1:], "=")
		if f := fs.Lookup(name); f != nil || hasValue || len(name) == 1 {
			out = append(out, arg)
			if f != nil && !hasValue && !isBool(f) && i+1 < len(args) {
				i++
				out = append(out, args[i]) // its value, whatever it looks like
			}
			continue
		}
		first := fs.Lookup(name[:1])
		switch {
		case first != nil && !isBool(first):
			out = append(out, "-"+name[:1], name[1:])
		case first != nil && allBool(fs, name, isBool):
			for _, c := range name {
				out = append(out, "-"+string(c))
			}
		default:
			out = append(out, arg) // unknown: Parse names it
		}
	}
	return out
}

// allBool reports whether every letter of name is a boolean flag of fs.
func allBool(fs *flag.FlagSet, name string, isBool func(*flag.Flag) bool) bool {
	for _, c := range name {
		f := fs.Lookup(string(c))
		if f == nil || !isBool(f) {
			return false
		}
	}
	return true
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
	if a.write != "" {
		var done func()
		if a.opts.Tracer, done, err = captureRun("pingpong", "w", a.write, os.Stderr); err != nil {
			return err
		}
		defer done() // after the run, whose device has closed
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

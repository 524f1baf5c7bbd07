package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/perftest"
)

// perftest's command line, as its parser (perftest_parameters.c) reads it with getopt_long: short
// options that may be clustered (-aF) and take their value attached or as the next argument (-s1024,
// -s 1024), long options with "=value" or the next argument, abbreviated to any unique prefix, and the
// server's host anywhere among them. Every option of perftest 6.06 is in perftestFlags: goroce
// implements it, accepts and ignores it where it means nothing for a software device (saying why), or
// refuses it with a one-line reason. Anything else is an unknown flag.

// perftestFlag is one of perftest 6.06's options.
type perftestFlag struct {
	short byte     // 0 if none
	long  []string // perftest's long names
	value string   // the value's name in the usage; "" for a switch
	help  string
	// only, if set, names the tests perftest offers the option to; onlyWhat says which in words.
	only     func(perftest.Test) bool
	onlyWhat string
	// set applies the option's value; nil refuses the option with refuse as the reason.
	set    func(a *perftestArgs, v string) error
	refuse string
}

// name returns how errors name the option: "-q (--qp)".
func (f *perftestFlag) name() string {
	switch {
	case f.short != 0 && len(f.long) > 0:
		return fmt.Sprintf("-%c (--%s)", f.short, f.long[0])
	case f.short != 0:
		return fmt.Sprintf("-%c", f.short)
	}
	return "--" + f.long[0]
}

// Test classes for perftestFlag.only.
var (
	bwTests  = func(t perftest.Test) bool { return !t.Latency() }
	latTests = func(t perftest.Test) bool { return t.Latency() }
	sendTest = func(t perftest.Test) bool { return t.Verb() == perftest.Send }
	readsOut = func(t perftest.Test) bool { return t.Verb() == perftest.Read || t.Verb() == perftest.Atomic }
	atomics  = func(t perftest.Test) bool { return t.Verb() == perftest.Atomic }
	carries  = func(t perftest.Test) bool { return t.Verb() == perftest.Write || t.Verb() == perftest.Send }
)

// intArg parses a number as perftest's strtol(optarg, NULL, 0) does: decimal, 0x hex or 0 octal.
func intArg(v string, lo, hi int) (int, error) {
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil || n < int64(lo) || n > int64(hi) {
		return 0, fmt.Errorf("%q: should be between %d and %d", v, lo, hi)
	}
	return int(n), nil
}

// intFlag sets *field(a) to the option's value, between lo and hi.
func intFlag(field func(a *perftestArgs) *int, lo, hi int) func(*perftestArgs, string) error {
	return func(a *perftestArgs, v string) error {
		n, err := intArg(v, lo, hi)
		if err == nil {
			*field(a) = n
		}
		return err
	}
}

// boolFlag sets *field(a).
func boolFlag(field func(a *perftestArgs) *bool) func(*perftestArgs, string) error {
	return func(a *perftestArgs, _ string) error { *field(a) = true; return nil }
}

// ignored accepts an option that changes nothing on goroce; the usage says why.
func ignored(*perftestArgs, string) error { return nil }

// secondsFlag sets *field(a) to the option's value in whole seconds.
func secondsFlag(field func(a *perftestArgs) *time.Duration, lo, hi int) func(*perftestArgs, string) error {
	return func(a *perftestArgs, v string) error {
		n, err := intArg(v, lo, hi)
		if err == nil {
			*field(a) = time.Duration(n) * time.Second
		}
		return err
	}
}

// floatFlag sets *field(a) to a non-negative number.
func floatFlag(field func(a *perftestArgs) *float64) func(*perftestArgs, string) error {
	return func(a *perftestArgs, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 {
			return fmt.Errorf("%q: a number, not negative", v)
		}
		*field(a) = f
		return nil
	}
}

// refused texts shared by several options.
const (
	noRDMACM   = "goroce exchanges over TCP, or over rdma_cm with the QPs connected by it (-R)"
	noDC       = "DC and AES-XTS are mlx5 features"
	noRate     = "goroce perf has no rate limiter"
	heapBuffer = "goroce allocates its buffers from the Go heap"
)

// perftestFlags are perftest 6.06's options, from its usage (ib_<test> --help in the lab's Debian
// bookworm guests) and parser.
var perftestFlags = []*perftestFlag{
	{short: 'a', long: []string{"all"}, help: "run sizes from 2 till 2^23", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.All })},
	{short: 'A', long: []string{"atomic_type"}, value: "type", help: "type of atomic operation: CMP_AND_SWAP or FETCH_AND_ADD (default FETCH_AND_ADD)",
		only: atomics, onlyWhat: "the atomic tests", set: func(a *perftestArgs, v string) error {
			switch strings.ToUpper(v) {
			case "FETCH_AND_ADD":
				a.opts.AtomicCAS = false
			case "CMP_AND_SWAP":
				a.opts.AtomicCAS = true
			default:
				return fmt.Errorf("%q: CMP_AND_SWAP or FETCH_AND_ADD", v)
			}
			return nil
		}},
	{short: 'b', long: []string{"bidirectional"}, help: "measure bidirectional bandwidth (default unidirectional)",
		only: bwTests, onlyWhat: "bandwidth tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.Bidirectional })},
	{short: 'c', long: []string{"connection"}, value: "RC", help: "connection type: RC only", set: func(a *perftestArgs, v string) error {
		if !strings.EqualFold(v, "RC") {
			return fmt.Errorf("%s: goroce perf runs RC QPs", v)
		}
		return nil
	}},
	{short: 'C', long: []string{"report-cycles"}, only: latTests, onlyWhat: "latency tests", refuse: "goroce measures time, not CPU cycles"},
	{short: 'd', long: []string{"ib-dev"}, value: "dev", help: "IB device (ignored: goroce is the device)", set: ignored},
	{short: 'D', long: []string{"duration"}, value: "seconds", help: "run test for a customized period of seconds",
		set: secondsFlag(func(a *perftestArgs) *time.Duration { return &a.opts.Duration }, 1, 1<<30)},
	{short: 'e', long: []string{"events"}, help: "sleep on CQ events (ignored: goroce always waits on the CQ)", set: ignored},
	{short: 'X', long: []string{"vector"}, value: "vector", help: "completion vector (ignored)", set: ignored},
	{short: 'f', long: []string{"margin"}, value: "seconds", help: "measure results within margins (default duration/4)",
		set: secondsFlag(func(a *perftestArgs) *time.Duration { return &a.opts.Margin }, 0, 1<<30)},
	{short: 'F', long: []string{"CPU-freq"}, help: "ignore CPU frequency warnings (ignored: goroce measures with the monotonic clock)", set: ignored},
	{short: 'g', long: []string{"mcg"}, only: sendTest, onlyWhat: "SEND tests", refuse: "multicast runs on UD QPs; goroce perf runs RC"},
	{short: 'h', long: []string{"help"}, help: "show this help", set: boolFlag(func(a *perftestArgs) *bool { return &a.help })},
	{short: 'H', long: []string{"report-histogram"}, help: "print out all results (default print summary only)",
		only: latTests, onlyWhat: "latency tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.Histogram })},
	{short: 'i', long: []string{"ib-port"}, value: "port", help: "port of the IB device (ignored: goroce's device has one)",
		set: func(_ *perftestArgs, v string) error { _, err := intArg(v, 1, 3); return err }},
	{short: 'I', long: []string{"inline_size"}, value: "size", help: "max size of message to be sent in inline",
		only: carries, onlyWhat: "WRITE and SEND tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.InlineSize }, 0, perftest.MaxInline)},
	{short: 'l', long: []string{"post_list"}, value: "list size", help: "post list of send WQEs of <list size> size (instead of single post)",
		only: bwTests, onlyWhat: "bandwidth tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.PostList }, 1, 15000)},
	{long: []string{"recv_post_list"}, value: "list size", help: "post list of receive WQEs of <list size> size (instead of single post)",
		only: bwTests, onlyWhat: "bandwidth tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.RecvPostList }, 1, 16384)},
	{short: 'L', long: []string{"hop_limit"}, value: "hop_limit", help: "hop limit: 64 only (goroce sends every packet with TTL 64)",
		set: func(_ *perftestArgs, v string) error {
			if n, err := intArg(v, 0, 255); err != nil || n != 64 {
				return fmt.Errorf("%s: goroce sends every packet with TTL 64", v)
			}
			return nil
		}},
	{short: 'm', long: []string{"mtu"}, value: "mtu", help: "MTU size: 256 - 4096 (default 4096, lowered to the peer's)", set: func(a *perftestArgs, v string) error {
		n, err := intArg(v, 0, 1<<20)
		m, ok := goroce.MTUFromBytes(n)
		if err != nil || !ok {
			return fmt.Errorf("%s: 256, 512, 1024, 2048 or 4096", v)
		}
		a.opts.MTU = m
		return nil
	}},
	{short: 'M', long: []string{"MGID"}, value: "gid", only: sendTest, onlyWhat: "SEND tests", refuse: "multicast runs on UD QPs; goroce perf runs RC"},
	{short: 'n', long: []string{"iters"}, value: "iters", help: "number of exchanges (at least 5)",
		set: intFlag(func(a *perftestArgs) *int { return &a.opts.Iters }, perftest.MinIters, 100000000)},
	{short: 'N', long: []string{"noPeak"}, help: "cancel peak-bw calculation",
		only: bwTests, onlyWhat: "bandwidth tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.NoPeak })},
	{short: 'o', long: []string{"outs"}, value: "num", help: "num of outstanding read/atom (default 128)",
		only: readsOut, onlyWhat: "READ and atomic tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.OutReads }, 1, 128)},
	{short: 'O', long: []string{"dualport"}, only: bwTests, onlyWhat: "bandwidth tests", refuse: "goroce's device has one port"},
	{short: 'p', long: []string{"port"}, value: "port", help: "listen on/connect to TCP port (default 18515)",
		set: intFlag(func(a *perftestArgs) *int { return &a.port }, 1, 65535)},
	{short: 'q', long: []string{"qp"}, value: "num of qp's", help: "num of qp's (default 1)",
		only: bwTests, onlyWhat: "bandwidth tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.QPs }, 1, perftest.MaxQPs)},
	{short: 'Q', long: []string{"cq-mod"}, value: "n", help: "generate a CQE only after <n> completions (default 100)",
		only: bwTests, onlyWhat: "bandwidth tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.CQMod }, 1, 1024)},
	{short: 'r', long: []string{"rx-depth"}, value: "dep", help: "rx queue size (default 512)",
		only: sendTest, onlyWhat: "SEND tests", set: intFlag(func(a *perftestArgs) *int { return &a.opts.RxDepth }, 1, 16384)},
	{short: 'R', long: []string{"rdma_cm"}, help: "connect the QPs with rdma_cm, and exchange over an rdma_cm connection on the same port (the peer runs -R)",
		set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.RDMACM })},
	{short: 's', long: []string{"size"}, value: "size", help: "size of message to exchange (atomics: always 8)",
		set: intFlag(func(a *perftestArgs) *int { return &a.opts.Size }, 1, perftest.MaxSize)},
	{short: 'S', long: []string{"sl"}, value: "sl", help: "SL (accepted: with a GID perftest puts no SL in the address either, and goroce sends no VLAN priority)",
		set: func(_ *perftestArgs, v string) error { _, err := intArg(v, 0, 15); return err }},
	{short: 't', long: []string{"tx-depth"}, value: "dep", help: "size of tx queue (default 128)",
		set: intFlag(func(a *perftestArgs) *int { return &a.opts.TxDepth }, 1, 15000)},
	{short: 'T', long: []string{"tos"}, value: "tos", refuse: "TOS only valid for rdma_cm based QP and RawEth QP, as perftest says; --tclass sets the traffic class"},
	{short: 'u', long: []string{"qp-timeout"}, value: "timeout", help: "QP timeout, 4 usec * 2^timeout (default 14)", set: func(a *perftestArgs, v string) error {
		n, err := intArg(v, 0, 31)
		a.opts.Timeout = uint8(n)
		return err
	}},
	{short: 'U', long: []string{"report-unsorted"}, help: "(implies -H) print out unsorted results",
		only: latTests, onlyWhat: "latency tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.Unsorted })},
	{short: 'V', long: []string{"version"}, help: "display version number", set: boolFlag(func(a *perftestArgs) *bool { return &a.version })},
	{short: 'w', long: []string{"limit_bw"}, value: "value", help: "fail unless the average bandwidth reaches <value>",
		only: bwTests, onlyWhat: "bandwidth tests", set: floatFlag(func(a *perftestArgs) *float64 { return &a.opts.LimitBW })},
	{short: 'W', long: []string{"report-counters"}, value: "counters", refuse: "goroce has no sysfs counters; goroce's -stats prints its device's"},
	{short: 'x', long: []string{"gid-index"}, value: "index", help: "GID index (printed only: goroce has one GID, its address: IPv4-mapped, or IPv6 with an IPv6 -addr)",
		set: intFlag(func(a *perftestArgs) *int { return &a.opts.GIDIndex }, 0, 64)},
	{short: 'y', long: []string{"limit_msgrate"}, value: "value", help: "fail unless the message rate reaches <value> Mpps",
		only: bwTests, onlyWhat: "bandwidth tests", set: floatFlag(func(a *perftestArgs) *float64 { return &a.opts.LimitMsgRate })},
	{short: 'z', long: []string{"com_rdma_cm", "comm_rdma_cm"}, refuse: noRDMACM},

	{long: []string{"out_json"}, refuse: "goroce prints perftest's text report only"},
	{long: []string{"out_json_file"}, value: "file", refuse: "goroce prints perftest's text report only"},
	{long: []string{"cpu_util"}, refuse: "goroce does not measure CPU utilization"},
	{long: []string{"dlid"}, value: "lid", refuse: "RoCE has no LIDs"},
	{long: []string{"dont_xchg_versions"}, help: "do not exchange versions and MTU with other side",
		set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.NoVersionExchange })},
	{long: []string{"force-link"}, value: "link", help: "link type: Ethernet only", set: func(_ *perftestArgs, v string) error {
		if !strings.EqualFold(v, "Ethernet") {
			return fmt.Errorf("%s: goroce's link is Ethernet", v)
		}
		return nil
	}},
	{long: []string{"inline_recv"}, value: "size", refuse: "goroce has no inline receive"},
	{long: []string{"use-srq"}, only: sendTest, onlyWhat: "SEND tests", refuse: "goroce perf posts receives on each QP"},
	{long: []string{"ipv6"}, refuse: "goroce perf's GID is its device's address: give -addr an IPv6 address for an IPv6 GID"},
	{long: []string{"source_ip"}, value: "ip", help: "source IP of the TCP connection (default: from the routing table)", set: func(a *perftestArgs, v string) error {
		ip, err := netip.ParseAddr(v)
		if err != nil || !ip.Unmap().Is4() {
			return fmt.Errorf("%q: an IPv4 address", v)
		}
		a.source = ip.Unmap()
		return nil
	}},
	{long: []string{"latency_gap"}, value: "delay", only: latTests, onlyWhat: "latency tests", refuse: "goroce perf sends each message as soon as it may"},
	{long: []string{"mmap"}, value: "file", refuse: heapBuffer},
	{long: []string{"mmap-offset"}, value: "offset", refuse: heapBuffer},
	{long: []string{"odp"}, refuse: heapBuffer},
	{long: []string{"use_hugepages"}, refuse: heapBuffer},
	{long: []string{"mr_per_qp"}, help: "create memory region for each qp", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.MRPerQP })},
	{long: []string{"output"}, value: "units", refuse: "goroce perf prints perftest's full report"},
	{long: []string{"use_old_post_send"}, help: "use ibv_post_send (accepted: goroce has one post path)", set: ignored},
	{long: []string{"perform_warm_up"}, help: "warm up before measuring (Atomic, Read and Write BW tests)",
		set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.WarmUp })},
	{long: []string{"pkey_index"}, value: "index", help: "P_Key index: 0 only (goroce has the default P_Key)", set: func(_ *perftestArgs, v string) error {
		if n, err := intArg(v, 0, 0xffff); err != nil || n != 0 {
			return fmt.Errorf("%s: goroce has only the default P_Key, index 0", v)
		}
		return nil
	}},
	{long: []string{"report-both"}, help: "report RX & TX results separately on bidirectional BW tests",
		only: bwTests, onlyWhat: "bandwidth tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.ReportBoth })},
	{long: []string{"report_gbits"}, help: "report Max/Average BW of test in Gbit/sec (instead of MiB/sec)",
		only: bwTests, onlyWhat: "bandwidth tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.ReportGbits })},
	{long: []string{"report-per-port"}, refuse: "it reports dual-port runs, and goroce's device has one port"},
	{long: []string{"reversed"}, refuse: "goroce perf's client sends"},
	{long: []string{"run_infinitely"}, help: "run test forever, print results every <duration> seconds",
		only: bwTests, onlyWhat: "bandwidth tests", set: boolFlag(func(a *perftestArgs) *bool { return &a.opts.RunInfinitely })},
	{long: []string{"retry_count"}, value: "value", help: "retry count in rdma_cm mode (accepted and unused, as perftest without -R)",
		set: func(_ *perftestArgs, v string) error { _, err := intArg(v, 0, 7); return err }},
	{long: []string{"tclass"}, value: "value", help: "traffic class (IP TOS byte) of the QPs' packets", set: func(a *perftestArgs, v string) error {
		n, err := intArg(v, 0, 255)
		a.opts.TrafficClass = uint8(n)
		return err
	}},
	{long: []string{"wait_destroy"}, value: "seconds", refuse: "goroce's resources are its process's; nothing outside looks at them"},
	{long: []string{"disable_pcie_relaxed"}, help: "disable PCIe relaxed ordering (ignored: no PCIe)", set: ignored},
	{long: []string{"burst_size"}, value: "size", refuse: noRate},
	{long: []string{"typical_pkt_size"}, value: "bytes", refuse: noRate},
	{long: []string{"rate_limit"}, value: "rate", refuse: noRate},
	{long: []string{"rate_units"}, value: "units", refuse: noRate},
	{long: []string{"rate_limit_type"}, value: "type", refuse: noRate},
	{long: []string{"log_dci_streams"}, value: "n", refuse: noDC},
	{long: []string{"log_active_dci_streams"}, value: "n", refuse: noDC},
	{long: []string{"aes_xts"}, refuse: noDC},
	{long: []string{"encrypt_on_tx"}, refuse: noDC},
	{long: []string{"sig_before"}, refuse: noDC},
	{long: []string{"aes_block_size"}, value: "size", refuse: noDC},
	{long: []string{"data_enc_keys_number"}, value: "n", refuse: noDC},
	{long: []string{"kek_path"}, value: "path", refuse: noDC},
	{long: []string{"credentials_path"}, value: "path", refuse: noDC},
	{long: []string{"data_enc_key_app_path"}, value: "path", refuse: noDC},
}

// goroceFlags are goroce's own options next to perftest's; they take one dash or two, as Go's flags
// do, and "=value" or the next argument.
var goroceFlags = []struct {
	name, value, help string
	set               func(a *perftestArgs, v string) error
}{
	{"addr", "ip", "local IP address of the goroce device (default: the address the TCP exchange uses)", func(a *perftestArgs, v string) error {
		ip, err := netip.ParseAddr(v)
		if err != nil {
			return err
		}
		a.opts.Addr = ip.Unmap()
		return nil
	}},
	{"timeout", "duration", "give up after this long (0: never)", func(a *perftestArgs, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%q: a duration such as 90s", v)
		}
		a.timeout = d
		return nil
	}},
	{"stats", "", "print the goroce device's counters to stderr at the end", func(a *perftestArgs, _ string) error {
		a.stats = true
		return nil
	}},
	{"pcap", "file", "write goroce's packets to FILE, pcapng, as tcpdump -w does (perftest's -w is --limit_bw)", func(a *perftestArgs, v string) error {
		if v == "" {
			return errors.New("a file name")
		}
		a.pcap = v
		return nil
	}},
}

// errHelp and errVersion end parsing for -h and -V, which print and exit.
var (
	errHelp    = errors.New("help")
	errVersion = errors.New("version")
)

// flagError is a command-line error: a one-line message naming the option.
type flagError struct{ msg string }

func (e *flagError) Error() string { return e.msg }

// lookupLong returns the option a long name names, exactly or as a unique prefix (getopt_long).
func lookupLong(name string) (*perftestFlag, error) {
	var match []*perftestFlag
	for _, f := range perftestFlags {
		for _, l := range f.long {
			if l == name {
				return f, nil
			}
			if strings.HasPrefix(l, name) {
				match = append(match, f)
				break
			}
		}
	}
	switch len(match) {
	case 0:
		return nil, &flagError{fmt.Sprintf("unknown flag --%s: not an option of perftest 6.06 (-h lists goroce perf's)", name)}
	case 1:
		return match[0], nil
	}
	var names []string
	for _, f := range match {
		names = append(names, "--"+f.long[0])
	}
	return nil, &flagError{fmt.Sprintf("flag --%s is ambiguous: %s", name, strings.Join(names, ", "))}
}

func lookupShort(c byte) (*perftestFlag, error) {
	for _, f := range perftestFlags {
		if f.short == c {
			return f, nil
		}
	}
	return nil, &flagError{fmt.Sprintf("unknown flag -%c: not an option of perftest 6.06 (-h lists goroce perf's)", c)}
}

// apply applies an option to a run of test t: it refuses options goroce does not support and those
// perftest does not offer to t, with a one-line error that names the option.
func (f *perftestFlag) apply(a *perftestArgs, t perftest.Test, v string) error {
	if err := f.allowed(t); err != nil {
		return err
	}
	if err := f.set(a, v); err != nil {
		return &flagError{fmt.Sprintf("%s %v", f.name(), err)}
	}
	return nil
}

// allowed refuses an option goroce does not support, or perftest does not offer to test t.
func (f *perftestFlag) allowed(t perftest.Test) error {
	switch {
	case f.only != nil && !f.only(t):
		return &flagError{fmt.Sprintf("%s is not an option of ib_%s: %s only", f.name(), t, f.onlyWhat)}
	case f.set == nil:
		return &flagError{fmt.Sprintf("%s is not supported: %s", f.name(), f.refuse)}
	}
	return nil
}

// parsePerftestArgs reads args as perftest's getopt_long does, with goroce's own options among them,
// into a; the one argument that is no option is the server's host.
func parsePerftestArgs(a *perftestArgs, t perftest.Test, args []string) error {
	var hosts []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		next := func(name string) (string, error) {
			if i+1 >= len(args) {
				return "", &flagError{fmt.Sprintf("%s needs a value", name)}
			}
			i++
			return args[i], nil
		}
		if arg == "--" {
			hosts = append(hosts, args[i+1:]...)
			break
		}
		if ok, err := a.goroceFlag(arg, next); ok {
			if err != nil {
				return err
			}
			continue
		}
		switch {
		case strings.HasPrefix(arg, "--"):
			name, val, hasVal := strings.Cut(arg[2:], "=")
			f, err := lookupLong(name)
			if err != nil {
				return err
			}
			if err := f.allowed(t); err != nil {
				return err
			}
			switch {
			case f.value == "" && hasVal:
				return &flagError{fmt.Sprintf("%s takes no value", f.name())}
			case f.value != "" && !hasVal:
				if val, err = next(f.name()); err != nil {
					return err
				}
			}
			if err := f.apply(a, t, val); err != nil {
				return err
			}
		case strings.HasPrefix(arg, "-") && len(arg) > 1:
			for j := 1; j < len(arg); j++ {
				f, err := lookupShort(arg[j])
				if err != nil {
					return err
				}
				if err := f.allowed(t); err != nil {
					return err
				}
				val := ""
				if f.value != "" {
					if val = arg[j+1:]; val == "" {
						if val, err = next(f.name()); err != nil {
							return err
						}
					}
					j = len(arg)
				}
				if err := f.apply(a, t, val); err != nil {
					return err
				}
			}
		default:
			hosts = append(hosts, arg)
		}
	}
	if len(hosts) > 1 {
		return &flagError{fmt.Sprintf("unexpected argument %q: one server host at most", hosts[1])}
	}
	if len(hosts) == 1 {
		a.host = hosts[0]
	}
	if a.help {
		return errHelp
	}
	if a.version {
		return errVersion
	}
	return nil
}

// goroceFlag handles arg if it is one of goroce's own options ("-addr 10.0.0.1", "--timeout=90s",
// "-stats"); ok says whether it was.
func (a *perftestArgs) goroceFlag(arg string, next func(string) (string, error)) (ok bool, err error) {
	if !strings.HasPrefix(arg, "-") {
		return false, nil
	}
	name, val, hasVal := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-"), "=")
	for _, g := range goroceFlags {
		if g.name != name {
			continue
		}
		switch {
		case g.value == "" && hasVal:
			return true, &flagError{fmt.Sprintf("-%s takes no value", name)}
		case g.value != "" && !hasVal:
			if val, err = next("-" + name); err != nil {
				return true, err
			}
		}
		if err := g.set(a, val); err != nil {
			return true, &flagError{fmt.Sprintf("-%s %v", name, err)}
		}
		return true, nil
	}
	return false, nil
}

// printPerftestFlags prints the options goroce perf takes for test t: perftest's that it implements
// or accepts, and its own.
func printPerftestFlags(w io.Writer, t perftest.Test) {
	type line struct{ key, text string }
	var lines []line
	for _, f := range perftestFlags {
		if f.set == nil || (f.only != nil && !f.only(t)) {
			continue
		}
		var names []string
		if f.short != 0 {
			names = append(names, fmt.Sprintf("-%c", f.short))
		}
		for _, l := range f.long {
			names = append(names, "--"+l)
		}
		n := strings.Join(names, ", ")
		if f.value != "" {
			n += "=<" + f.value + ">"
		}
		key := strings.ToLower(strings.TrimLeft(names[0], "-"))
		lines = append(lines, line{key, fmt.Sprintf("  %s\n      %s\n", n, f.help)})
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].key < lines[j].key })
	fmt.Fprintln(w, "perftest's options:")
	for _, l := range lines {
		fmt.Fprint(w, l.text)
	}
	fmt.Fprintln(w, "goroce's own options (one dash or two):")
	for _, g := range goroceFlags {
		v := ""
		if g.value != "" {
			v = " <" + g.value + ">"
		}
		fmt.Fprintf(w, "  -%s%s\n      %s\n", g.name, v, g.help)
	}
	var refused []string
	for _, f := range perftestFlags {
		if f.set == nil && (f.only == nil || f.only(t)) {
			refused = append(refused, f.name())
		}
	}
	fmt.Fprintf(w, "perftest options goroce perf refuses, each with its reason: %s\n", strings.Join(refused, " "))
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/pingpong"
)

// TestPingpongFlags checks that rc_pingpong's flags reach package pingpong's options as the C tools
// read them; the runs themselves are package pingpong's tests.
func TestPingpongFlags(t *testing.T) {
	rc := pingpong.DefaultOptions(goroce.RC)
	withRC := func(f func(*pingpong.Options)) pingpong.Options { o := rc; f(&o); return o }
	ud := pingpong.DefaultOptions(goroce.UD)
	srq := pingpong.DefaultSRQOptions()
	withSRQ := func(f func(*pingpong.Options)) pingpong.Options { o := srq; f(&o); return o }
	for _, c := range []struct {
		args []string
		host string
		port int
		opts pingpong.Options
	}{
		{nil, "", 18515, rc},
		{[]string{"-p", "9999", "10.0.0.1"}, "10.0.0.1", 9999, rc},
		// The host may stand among the flags, as getopt allows.
		{[]string{"-s", "1", "127.0.0.1", "-n", "7", "-c"}, "127.0.0.1", 18515,
			withRC(func(o *pingpong.Options) { o.Size, o.Iters, o.Check = 1, 7, true })},
		{[]string{"--size", "65536", "--mtu", "4096", "--rx-depth", "16", "-g", "1", "-a", "::ffff:127.0.0.5"}, "", 18515,
			withRC(func(o *pingpong.Options) {
				o.Size, o.MTU, o.RxDepth, o.Addr = 65536, goroce.MTU4096, 16, netip.MustParseAddr("127.0.0.5")
			})},
		{[]string{"-qp-type", "uc"}, "", 18515, pingpong.DefaultOptions(goroce.UC)},
		// ud_pingpong's defaults: 2048-byte datagrams on a 2048-byte MTU, unless the flags say otherwise.
		{[]string{"-qp-type", "ud"}, "", 18515, ud},
		{[]string{"-qp-type", "UD", "-s", "512", "-m", "1024"}, "", 18515,
			func() pingpong.Options { o := ud; o.Size, o.MTU = 512, goroce.MTU1024; return o }()},
		// ibv_srq_pingpong's defaults: 16 QPs; -q and --num-qp set them.
		{[]string{"-qp-type", "srq"}, "", 18515, srq},
		{[]string{"-qp-type", "srq", "-q", "4", "-n", "8", "-c", "10.0.0.1"}, "10.0.0.1", 18515,
			withSRQ(func(o *pingpong.Options) { o.NumQP, o.Iters, o.Check = 4, 8, true })},
		// -srq is -qp-type srq, spelled as ibv_srq_pingpong's users look for it.
		{[]string{"-srq", "-q", "4", "10.0.0.1"}, "10.0.0.1", 18515, withSRQ(func(o *pingpong.Options) { o.NumQP = 4 })},
		{[]string{"-srq", "-qp-type", "SRQ"}, "", 18515, srq},
		{[]string{"-qp-type", "srq", "--num-qp", "255", "-r", "255"}, "", 18515,
			withSRQ(func(o *pingpong.Options) { o.NumQP, o.RxDepth = 255, 255 })},
		// Flags that change nothing on the wire: events (goroce always sleeps on the CQ), ODP,
		// implicit ODP and prefetch (goroce's memory is never pinned), the new post API, the SL,
		// and the device, port and GID index.
		{[]string{"-e", "-o", "-P", "-N", "-l", "3", "-d", "rxe0", "-i", "1", "-g", "0"}, "", 18515, rc},
		{[]string{"--events", "--iodp", "--prefetch", "--new_send", "--sl", "15", "--ib-dev", "rxe0"}, "", 18515, rc},
		// getopt's forms: bundled flags and values joined to their flag.
		{[]string{"-ce", "-n10", "-s1", "-p9000", "127.0.0.1"}, "127.0.0.1", 9000,
			withRC(func(o *pingpong.Options) { o.Check, o.Iters, o.Size = true, 10, 1 })},
		{[]string{"-qp-type", "srq", "-q2", "-oc"}, "", 18515, withSRQ(func(o *pingpong.Options) { o.NumQP, o.Check = 2, true })},
	} {
		a, err := parsePingpong(c.args)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if a.host != c.host || a.port != c.port || a.opts != c.opts {
			t.Errorf("%q: host %q port %d options %+v; want %q, %d, %+v", c.args, a.host, a.port, a.opts, c.host, c.port, c.opts)
		}
	}
	if a, err := parsePingpong([]string{"-timeout", "90s"}); err != nil || a.timeout != 90*time.Second {
		t.Errorf("-timeout 90s: %v, %v", a.timeout, err)
	}
	for _, bad := range [][]string{{"-r", "1"}, {"-n", "0"}, {"-s", "0"}, {"-m", "1000"}, {"-p", "70000"}, {"-i", "0"},
		{"a", "b"}, {"-h"}} {
		if _, err := parsePingpong(bad); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want the usage", bad, err)
		}
	}
	// What goroce cannot do, or the tools refuse, is a one-line error that names the flag.
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"-t"}, "-t"},
		{[]string{"--ts"}, "-t"},
		{[]string{"-j"}, "-j"},
		{[]string{"--dm"}, "-j"},
		{[]string{"-P"}, "-P"},
		{[]string{"-l", "16"}, "-l"},
		{[]string{"-q", "4"}, "-q"},
		{[]string{"-qp-type", "srq", "-q", "0"}, "-q"},
		{[]string{"-qp-type", "srq", "-q", "256", "-r", "500"}, "-q"},
		{[]string{"-qp-type", "srq", "-q", "16", "-r", "8"}, "-r"},
		{[]string{"-qp-type", "xrc"}, "-qp-type"},
		{[]string{"-srq", "-qp-type", "uc"}, "-srq"},
		{[]string{"-srq", "-q", "300"}, "-q"},
		{[]string{"-qp-type", "ud", "-s", "4096"}, "-s"},
		{[]string{"-a", "nowhere"}, "-a"},
		{[]string{"-x"}, "-x"},
		{[]string{"--report_gbits"}, "--report_gbits"},
		{[]string{"-cz"}, "-cz"},
		{[]string{"-n", "many"}, "-n"},
		{[]string{"-n"}, "-n"},
	} {
		_, err := parsePingpong(c.args)
		if err == nil || errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want an error", c.args, err)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, c.flag) || strings.Contains(msg, "flag provided but not defined") {
			t.Errorf("%q: error %q, want one line naming %s", c.args, msg, c.flag)
		}
	}
}

// TestPingpongFlagRuns runs goroce against goroce with each accepted flag of the tools, both sides
// given the same flags as parsePingpong reads them, over an in-memory network: every run must
// complete with the figures the flags ask for, so a flag accepted as a no-op is seen to change
// nothing that breaks a run.
func TestPingpongFlagRuns(t *testing.T) {
	for _, flags := range [][]string{
		{"-srq", "-q", "4", "-n", "40", "-c"},
		{"-srq", "-q1", "-s", "65536", "-n", "10", "-r", "8", "-e"},
		{"-qp-type", "srq", "-q", "3", "-r", "3", "-n", "30", "-s", "64"},
		{"-e", "-n", "50", "-c"},
		{"--events", "-qp-type", "uc", "-n", "50"},
		{"-e", "-qp-type", "ud", "-s", "1024", "-m", "1024", "-n", "50"},
		{"-o", "-P", "-n", "20", "-c"},
		{"-O", "-n", "20"},
		{"-N", "-l", "3", "-d", "rxe0", "-i", "1", "-g", "1", "-n", "20"},
		{"-ce", "-n20", "-s8192", "-m4096"},
	} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			net := goroce.NewMemNetwork()
			parse := func(extra ...string) pingpong.Options {
				a, err := parsePingpong(append(append([]string{}, flags...), extra...))
				if err != nil {
					t.Fatalf("%q: %v", flags, err)
				}
				a.opts.Network = net
				return a.opts
			}
			so, co := parse("-a", "10.9.0.1"), parse("-a", "10.9.0.2", "127.0.0.1")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv, err := pingpong.Listen(ctx, "127.0.0.1:0", so)
			if err != nil {
				t.Fatal(err)
			}
			var sout strings.Builder
			type result struct {
				res pingpong.Result
				err error
			}
			done := make(chan result, 1)
			go func() {
				r, err := srv.Serve(ctx, &sout)
				done <- result{r, err}
			}()
			var cout strings.Builder
			cres, cerr := pingpong.Connect(ctx, srv.Addr().String(), co, &cout)
			s := <-done
			if s.err != nil || cerr != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", s.err, sout.String(), cerr, cout.String())
			}
			want := fmt.Sprintf("%d bytes in ", 2*so.Size*so.Iters)
			for _, x := range []struct {
				name string
				out  string
				res  pingpong.Result
			}{{"server", sout.String(), s.res}, {"client", cout.String(), cres}} {
				if !strings.Contains(x.out, want) || strings.Contains(x.out, "invalid data") {
					t.Errorf("%s output lacks %q or found invalid data:\n%s", x.name, want, x.out)
				}
				if n := max(so.NumQP, 1); len(x.res.LocalQPs) != n || len(x.res.RemoteQPs) != n {
					t.Errorf("%s: %d local and %d remote QPs, want %d", x.name, len(x.res.LocalQPs), len(x.res.RemoteQPs), n)
				}
			}
		})
	}
}

// TestPingpongCapture: goroce pingpong -w, client and server over loopback sockets each writing its own
// capture; goroce dump then finds every packet of the run in each, every ICRC verified, and the two
// files hold the same number of RoCEv2 packets (each side saw every packet of the run, none lost).
func TestPingpongCapture(t *testing.T) {
	dir := t.TempDir()
	files := [2]string{filepath.Join(dir, "server.pcapng"), filepath.Join(dir, "client.pcapng")}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close() // the port is free again for the server; a rare race with another test is not fatal
	common := []string{"-p", port, "-n", "20", "-s", "8192", "-m", "4096", "-c", "-timeout", "30s"}
	errc := make(chan error, 1)
	go func() { errc <- runPingpong(append([]string{"-a", "127.0.15.1", "-w", files[0]}, common...)) }()
	var cerr error
	for range 100 { // until the server listens
		if cerr = runPingpong(append(append([]string{"-a", "127.0.15.2", "-w", files[1]}, common...), "127.0.0.1")); cerr == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cerr != nil {
		t.Fatalf("client: %v", cerr)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server: %v", err)
	}
	var counts [2]int
	for i, f := range files {
		var out bytes.Buffer
		total, ok := dump(&out, dumpOptions{}, f)
		if !ok || total.roce < 2*20*2 || total.icrcOK != total.roce {
			t.Fatalf("dump %s: %s\n%s", f, total.line(), lastLines(out.String(), 5))
		}
		counts[i] = total.roce
	}
	if counts[0] != counts[1] {
		t.Errorf("the server's capture has %d RoCEv2 packets, the client's %d", counts[0], counts[1])
	}
}

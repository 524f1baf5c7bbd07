//go:build interop

package interop

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/lab"
)

// perftestCase is one perftest run: goroce perf <test> against ib_<test> in the guest, with the same
// flags on both sides. The cases cover the verbs the pingpong tests do not: RDMA WRITE (write_bw),
// READ with multi-packet responses (read_bw and read_lat at path MTU 1024 and 4096), both atomics
// (atomic_bw), SEND streams (send_bw) and the latency tests.
type perftestCase struct {
	test  string
	flags string
	size  int
	iters int
}

func (c perftestCase) name() string {
	return c.test + strings.ReplaceAll(c.flags, " ", "")
}

func (c perftestCase) args() string {
	return fmt.Sprintf("-s %d -n %d %s", c.size, c.iters, c.flags)
}

// perftestCases are small enough that both roles of all of them run in about a minute and a half under
// TCG emulation.
var perftestCases = []perftestCase{
	{test: "write_bw", flags: "-m 1024", size: 65536, iters: 50},
	{test: "write_bw", flags: "-m 4096", size: 65536, iters: 50},
	{test: "read_bw", flags: "-m 1024", size: 65536, iters: 30},
	{test: "read_bw", flags: "-m 4096", size: 65536, iters: 30},
	{test: "atomic_bw", flags: "-A FETCH_AND_ADD", size: 8, iters: 100},
	{test: "atomic_bw", flags: "-A CMP_AND_SWAP", size: 8, iters: 100},
	{test: "send_bw", flags: "-m 1024", size: 65536, iters: 30},
	{test: "send_bw", flags: "-m 4096", size: 16384, iters: 50},
	{test: "read_lat", flags: "-m 1024", size: 8192, iters: 50},
	{test: "send_lat", flags: "-m 1024", size: 64, iters: 100},
	{test: "send_lat", flags: "-m 4096", size: 8192, iters: 50},
	{test: "write_lat", flags: "-m 1024", size: 64, iters: 50},
	{test: "write_lat", flags: "-m 4096", size: 8192, iters: 30},
}

var (
	perftestBWResult  = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d{6})\s*$`)
	perftestLatResult = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d\d)(\s+\d+\.\d\d){6}\s*$`)
)

// perftestResult returns the result line a side printed, or "" if none.
func perftestResult(t *testing.T, c perftestCase, who, out string) string {
	t.Helper()
	re := perftestBWResult
	if strings.HasSuffix(c.test, "_lat") {
		re = perftestLatResult
	}
	m := re.FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	if m[1] != strconv.Itoa(c.size) || m[2] != strconv.Itoa(c.iters) {
		t.Errorf("%s result line %q: want %d bytes, %d iterations", who, m[0], c.size, c.iters)
	}
	if v, _ := strconv.ParseFloat(m[3], 64); strings.HasSuffix(c.test, "_lat") && v <= 0 {
		t.Errorf("%s result line %q: t_min is not positive", who, m[0])
	}
	if strings.HasSuffix(c.test, "_bw") {
		if v, _ := strconv.ParseFloat(m[4], 64); v <= 0 {
			t.Errorf("%s result line %q: average bandwidth is not positive", who, m[0])
		}
	}
	return m[0]
}

// checkPerftest checks both sides' results: every side that measures prints a line; the server of a
// bandwidth test prints the client's report, which proves the reports exchange.
func checkPerftest(t *testing.T, c perftestCase, client, clientOut, server, serverOut string) {
	t.Helper()
	cl := perftestResult(t, c, client, clientOut)
	sl := perftestResult(t, c, server, serverOut)
	if cl == "" {
		t.Errorf("%s (client) printed no result line:\n%s", client, clientOut)
	}
	switch c.test {
	case "read_lat":
		if sl != "" {
			t.Errorf("%s (server) printed a result line; ib_read_lat's server does not:\n%s", server, serverOut)
		}
	case "send_lat", "send_bw", "write_lat":
		if sl == "" {
			t.Errorf("%s (server) printed no result line:\n%s", server, serverOut)
		}
	default:
		if sl != cl {
			t.Errorf("%s (server) printed %q, not the client's report %q", server, sl, cl)
		}
	}
}

// TestPerftestGoroceClient: ib_<test> -x 1 serves in the guest, goroce perf <test> connects.
func TestPerftestGoroceClient(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range perftestCases {
		t.Run(c.name(), func(t *testing.T) {
			port := 18815 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			type result struct {
				out string
				err error
			}
			srv := make(chan result, 1)
			go func() {
				out, err := g.Exec(ctx, fmt.Sprintf("timeout 90 ib_%s -d rxe0 -x 1 -p %d %s", c.test, port, c.args()))
				srv <- result{out, err}
			}()
			if err := waitListen(ctx, g, port); err != nil {
				t.Fatalf("ib_%s does not listen: %v", c.test, err)
			}
			args := append([]string{"perf", c.test, "-x", "1", "-p", strconv.Itoa(port), "-timeout", "90s"}, strings.Fields(c.args())...)
			cout, cerr := lab.NSCommand(ctx, goroceBin, append(args, g.IP.String())...).CombinedOutput()
			s := <-srv
			t.Logf("goroce perf %s (client):\n%s", c.test, cout)
			t.Logf("ib_%s (server, vm%d):\n%s", c.test, g.N, s.out)
			if cerr != nil {
				t.Errorf("goroce perf: %v", cerr)
			}
			if s.err != nil {
				t.Errorf("ib_%s: %v", c.test, s.err)
			}
			checkPerftest(t, c, "goroce perf", string(cout), "ib_"+c.test, s.out)
		})
	}
}

// TestPerftestGoroceServer: goroce perf <test> serves on the host side, ib_<test> -x 1 connects from
// the guest.
func TestPerftestGoroceServer(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range perftestCases {
		t.Run(c.name(), func(t *testing.T) {
			port := 18915 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := append([]string{"perf", c.test, "-x", "1", "-p", strconv.Itoa(port), "-timeout", "90s"}, strings.Fields(c.args())...)
			cmd := lab.NSCommand(ctx, goroceBin, args...)
			var sout lockedBuffer
			cmd.Stdout, cmd.Stderr = &sout, &sout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() { waited <- cmd.Wait() }()
			// goroce perf prints its banner once it listens.
			for !strings.Contains(sout.String(), "Waiting for client") {
				select {
				case err := <-waited:
					t.Fatalf("goroce perf ended before listening: %v\n%s", err, sout.String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 90 ib_%s -d rxe0 -x 1 -p %d %s %s", c.test, port, c.args(), lab.HostIP))
			serr := <-waited
			t.Logf("goroce perf %s (server):\n%s", c.test, sout.String())
			t.Logf("ib_%s (client, vm%d):\n%s", c.test, g.N, out)
			if serr != nil {
				t.Errorf("goroce perf: %v", serr)
			}
			if cerr != nil {
				t.Errorf("ib_%s: %v", c.test, cerr)
			}
			checkPerftest(t, c, "ib_"+c.test, out, "goroce perf", sout.String())
		})
	}
}

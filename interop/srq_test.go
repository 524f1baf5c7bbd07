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

// srqCase is a run of ibv_srq_pingpong against goroce pingpong -srq: numQP RC QPs a side,
// their receives from one SRQ, the exchange of 256 addresses each way whatever -q says.
type srqCase struct {
	numQP, size, rxDepth, iters int
	events                      bool // -e on both sides: the C tool sleeps on its completion channel
}

func (c srqCase) name() string {
	n := fmt.Sprintf("q%d-s%d-r%d-n%d", c.numQP, c.size, c.rxDepth, c.iters)
	if c.events {
		n += "-e"
	}
	return n
}

// flags are the flags both programs get. -c makes each side check what it received: rdma-core 44's
// srq_pingpong checks the first byte of each page on its server (its buffer is zeros, so that check
// cannot fail); goroce checks every byte it received on both sides, and that each receive carried -s
// bytes.
func (c srqCase) flags() []string {
	f := []string{"-q", strconv.Itoa(c.numQP), "-s", strconv.Itoa(c.size), "-r", strconv.Itoa(c.rxDepth),
		"-n", strconv.Itoa(c.iters), "-c"}
	if c.events {
		f = append(f, "-e")
	}
	return f
}

func (c srqCase) goroceArgs(port int) []string {
	return append([]string{"pingpong", "-srq", "-g", "1", "-a", lab.HostIP, "-p", strconv.Itoa(port),
		"-timeout", "90s"}, c.flags()...)
}

// srqCases are one QP and four, each in both roles. Four QPs with 8 receives make both sides refill
// their SRQ every few messages; their 200 exchanges are counted over all the QPs, as srq_pingpong does.
var srqCases = []srqCase{
	{numQP: 1, size: 4096, rxDepth: 500, iters: 200},
	{numQP: 4, size: 4096, rxDepth: 8, iters: 200, events: true},
	{numQP: 4, size: 65536, rxDepth: 500, iters: 40},
}

// checkSRQOutput checks the lines of an SRQ run: a local and a remote address line for each QP, then
// rc_pingpong's two figures.
func checkSRQOutput(t testing.TB, who, out, localIP, remoteIP string, c srqCase) {
	t.Helper()
	lines := pingpongLines(localIP, remoteIP)
	for i, re := range lines {
		want := 1
		if i < 2 {
			want = c.numQP
		}
		if got := len(re.FindAllString(out, -1)); got != want {
			t.Errorf("%s output has %d lines matching %v, want %d:\n%s", who, got, re, want, out)
		}
	}
	if want := fmt.Sprintf("%d bytes in ", 2*c.size*c.iters); !strings.Contains(out, want) {
		t.Errorf("%s output lacks %q:\n%s", who, want, out)
	}
	if strings.Contains(out, "invalid data") {
		t.Errorf("%s found invalid data:\n%s", who, out)
	}
}

// TestSRQGoroceClient: ibv_srq_pingpong -g 1 serves in the guest, goroce pingpong -srq
// connects.
func TestSRQGoroceClient(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range srqCases {
		t.Run(c.name(), onGuest(g, nil, func(t testing.TB) {
			port := 18815 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := execBackground(ctx, g, fmt.Sprintf("timeout 90 ibv_srq_pingpong -d rxe0 -g 1 -p %d %s", port, strings.Join(c.flags(), " ")))
			if err := waitListen(ctx, g, port); err != nil {
				t.Fatalf("ibv_srq_pingpong does not listen: %v", err)
			}
			cout, cerr := lab.NSCommand(ctx, goroceBin, append(c.goroceArgs(port), g.IP.String())...).CombinedOutput()
			s := <-srv
			t.Logf("goroce pingpong -srq (client):\n%s", cout)
			t.Logf("ibv_srq_pingpong (server, vm%d):\n%s", g.N, s.out)
			if cerr != nil {
				t.Errorf("goroce pingpong: %v", cerr)
			}
			if s.err != nil {
				t.Errorf("ibv_srq_pingpong: %v", s.err)
			}
			checkSRQOutput(t, "goroce pingpong", string(cout), lab.HostIP, g.IP.String(), c)
			checkSRQOutput(t, "ibv_srq_pingpong", s.out, g.IP.String(), lab.HostIP, c)
		}))
	}
}

// TestSRQGoroceServer: goroce pingpong -srq serves on the host side, ibv_srq_pingpong -g 1
// connects from the guest.
func TestSRQGoroceServer(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range srqCases {
		t.Run(c.name(), onGuest(g, nil, func(t testing.TB) {
			port := 18835 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sout, waited := startGoroce(ctx, t, "local address", c.goroceArgs(port))
			out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 90 ibv_srq_pingpong -d rxe0 -g 1 -p %d %s %s", port, strings.Join(c.flags(), " "), lab.HostIP))
			serr := <-waited
			t.Logf("goroce pingpong -srq (server):\n%s", sout.String())
			t.Logf("ibv_srq_pingpong (client, vm%d):\n%s", g.N, out)
			if serr != nil {
				t.Errorf("goroce pingpong: %v", serr)
			}
			if cerr != nil {
				t.Errorf("ibv_srq_pingpong: %v", cerr)
			}
			checkSRQOutput(t, "goroce pingpong", sout.String(), lab.HostIP, g.IP.String(), c)
			checkSRQOutput(t, "ibv_srq_pingpong", out, g.IP.String(), lab.HostIP, c)
		}))
	}
}

// TestSRQQPCountMismatch: goroce notices in the exchange that ibv_srq_pingpong runs another number of
// QPs, says so and fails, in both roles; srq_pingpong, which does not notice, fails too instead of
// waiting forever: as a server, when goroce closes the connection without "done"; as a client, when
// goroce answers with no QP ("Failed to modify QP[0] to RTR").
func TestSRQQPCountMismatch(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	mismatch := regexp.MustCompile(`the peer announced (\d+) QPs, this side runs (\d+)`)
	for _, role := range []string{"goroce-client", "goroce-server"} {
		t.Run(role, onGuest(g, nil, func(t testing.TB) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			tool := "timeout 60 ibv_srq_pingpong -d rxe0 -g 1 -q 2 -n 20"
			var gout, rout string
			var gerr, rerr error
			if role == "goroce-client" {
				port := 18855
				srv := execBackground(ctx, g, fmt.Sprintf("%s -p %d", tool, port))
				if err := waitListen(ctx, g, port); err != nil {
					t.Fatalf("ibv_srq_pingpong does not listen: %v", err)
				}
				args := []string{"pingpong", "-srq", "-q", "4", "-n", "20", "-g", "1", "-a", lab.HostIP,
					"-p", strconv.Itoa(port), "-timeout", "60s", g.IP.String()}
				out, err := lab.NSCommand(ctx, goroceBin, args...).CombinedOutput()
				gout, gerr = string(out), err
				r := <-srv
				rout, rerr = r.out, r.err
			} else {
				port := 18856
				sout, waited := startGoroce(ctx, t, "local address", []string{"pingpong", "-srq", "-q", "4", "-n", "20",
					"-g", "1", "-a", lab.HostIP, "-p", strconv.Itoa(port), "-timeout", "60s"})
				rout, rerr = g.Exec(ctx, fmt.Sprintf("%s -p %d %s", tool, port, lab.HostIP))
				gerr = <-waited
				gout = sout.String()
			}
			t.Logf("goroce pingpong -q 4:\n%s", gout)
			t.Logf("ibv_srq_pingpong -q 2 (vm%d): %v\n%s", g.N, rerr, rout)
			if gerr == nil {
				t.Errorf("goroce pingpong -q 4 against -q 2 succeeded")
			}
			if m := mismatch.FindStringSubmatch(gout); m == nil || m[1] != "2" || m[2] != "4" {
				t.Errorf("goroce pingpong does not report the mismatch (2 QPs against 4):\n%s", gout)
			}
			if rerr == nil {
				t.Errorf("ibv_srq_pingpong -q 2 against -q 4 succeeded")
			} else if strings.Contains(rerr.Error(), "exit status 124") {
				t.Errorf("ibv_srq_pingpong ran until its timeout: %v", rerr)
			}
		}))
	}
}

// TestRCFlags: ibv_rc_pingpong -e (sleeping on its completion channel) against goroce pingpong -e,
// in both roles (goroce always sleeps on its CQ; the C tool's event path is what this runs); and
// every flag the guest's ibv_rc_pingpong and ibv_srq_pingpong list in their usage is a flag of
// goroce pingpong, short and long, which either works or names itself in a one-line refusal.
func TestRCFlags(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	t.Run("usage", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		help, _ := lab.NSCommand(ctx, goroceBin, "pingpong", "-h").CombinedOutput()
		listed := func(name string) bool {
			return regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(name) + `\s`).Match(help)
		}
		flagRE := regexp.MustCompile(`(?m)^\s+-(\w), --([\w-]+)`)
		for _, tool := range []string{"ibv_rc_pingpong", "ibv_srq_pingpong"} {
			usage, _ := g.Exec(ctx, tool+" -h") // the tools print their usage and exit 1
			flags := flagRE.FindAllStringSubmatch(usage, -1)
			if len(flags) < 10 {
				t.Fatalf("%s -h lists %d flags:\n%s", tool, len(flags), usage)
			}
			var names []string
			for _, f := range flags {
				names = append(names, f[1])
				for _, name := range f[1:] {
					if !listed(name) {
						t.Errorf("%s's -%s is not a flag of goroce pingpong (from %q)", tool, name, f[0])
					}
				}
			}
			t.Logf("%s: flags %s", tool, strings.Join(names, " "))
		}
	}))
	const size, iters = 4096, 100
	flags := fmt.Sprintf("-e -s %d -m 1024 -n %d -c", size, iters)
	for i, role := range []string{"goroce-client", "goroce-server"} {
		t.Run("events-"+role, onGuest(g, nil, func(t testing.TB) {
			port := 18865 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := append([]string{"pingpong", "-g", "1", "-a", lab.HostIP, "-p", strconv.Itoa(port), "-timeout", "90s"},
				strings.Fields(flags)...)
			var gout, rout string
			var gerr, rerr error
			if role == "goroce-client" {
				srv := execBackground(ctx, g, fmt.Sprintf("timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -p %d %s", port, flags))
				if err := waitListen(ctx, g, port); err != nil {
					t.Fatalf("ibv_rc_pingpong does not listen: %v", err)
				}
				out, err := lab.NSCommand(ctx, goroceBin, append(args, g.IP.String())...).CombinedOutput()
				gout, gerr = string(out), err
				r := <-srv
				rout, rerr = r.out, r.err
			} else {
				sout, waited := startGoroce(ctx, t, "local address", args)
				rout, rerr = g.Exec(ctx, fmt.Sprintf("timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -p %d %s %s", port, flags, lab.HostIP))
				gerr = <-waited
				gout = sout.String()
			}
			t.Logf("goroce pingpong -e:\n%s", gout)
			t.Logf("ibv_rc_pingpong -e (vm%d):\n%s", g.N, rout)
			if gerr != nil {
				t.Errorf("goroce pingpong: %v", gerr)
			}
			if rerr != nil {
				t.Errorf("ibv_rc_pingpong: %v", rerr)
			}
			checkPingpongOutput(t, "goroce pingpong", gout, lab.HostIP, g.IP.String(), size, iters)
			checkPingpongOutput(t, "ibv_rc_pingpong", rout, g.IP.String(), lab.HostIP, size, iters)
		}))
	}
}

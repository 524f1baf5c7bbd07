//go:build interop

package interop

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/lab"
)

// Tests of goroce's RDMA CM against rxe's (the kernel's ib_cm and rdma_cm under librdmacm's rping):
// goroce rping in both roles, with the data checked on both sides, a request goroce refuses, either
// side disconnecting first, and several connections at once.

// rpingCase is one rping run: its ping size (-S) and count (-C).
type rpingCase struct{ size, count int }

func (c rpingCase) name() string { return fmt.Sprintf("S%d-C%d", c.size, c.count) }

// rpingCases: rping's smallest size (in one packet), a multi-packet READ and WRITE at path MTU 1024,
// and rping's largest buffer (64 packets each way per ping).
var rpingCases = []rpingCase{{size: 26, count: 20}, {size: 4000, count: 10}, {size: 65535, count: 4}}

// rpingPingLines counts the lines of prefix (rping -v's "ping data: " or "server ping data: ") that
// carry rping's text of size bytes for pings 0, 1, ..., in order.
func checkRpingLines(t testing.TB, who, out, prefix string, c rpingCase) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix) + `(rdma-ping-(\d+): [A-Za-z\[\\\]^_` + "`" + `]*)$`)
	ms := re.FindAllStringSubmatch(out, -1)
	if len(ms) != c.count {
		t.Errorf("%s printed %d lines of %q, want %d", who, len(ms), prefix, c.count)
		return
	}
	for i, m := range ms {
		if n, _ := strconv.Atoi(m[2]); n != i || len(m[1]) != c.size-1 {
			t.Errorf("%s line %d: ping %s with %d bytes of text, want ping %d with %d", who, i, m[2], len(m[1]), i, c.size-1)
		}
	}
}

// clip shortens each line of out to 150 bytes for the log: rping's lines of 64 KiB pings are that long.
// A data mismatch stays whole: it says where the sink differs and what it held there.
func clip(out string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if len(l) > 150 && !strings.Contains(l, "data mismatch") {
			lines[i] = fmt.Sprintf("%s... (%d bytes)", l[:150], len(l))
		}
	}
	return strings.Join(lines, "\n")
}

// guestRping returns a guest command that runs rping with args under timeout seconds, its stderr
// after its stdout: rping's stdout is block-buffered when not a terminal, and its stderr lines
// ("client DISCONNECT EVENT...") would otherwise land inside its last ping line.
func guestRping(timeout int, args string) string {
	return fmt.Sprintf(`timeout %d rping %s 2>/tmp/rping.err.$$; s=$?; cat /tmp/rping.err.$$; rm -f /tmp/rping.err.$$; exit $s`, timeout, args)
}

// startGoroceRping starts goroce rping -s in the namespace and waits until it listens (its -d line
// "rdma_listen"). The returned function waits for it to end, after an interrupt (^C) if stop, and
// returns its output.
func startGoroceRping(t testing.TB, ctx context.Context, args ...string) func(stop bool) (string, error) {
	t.Helper()
	cmd := lab.NSCommand(ctx, goroceBin, append([]string{"rping", "-s", "-d", "-a", lab.HostIP}, args...)...)
	out, waited := startReady(t, cmd, "goroce rping ended before listening",
		func(s string) bool { return strings.Contains(s, "rdma_listen") })
	return func(stop bool) (string, error) {
		if stop {
			_ = cmd.Process.Signal(os.Interrupt)
		}
		err := <-waited
		return out.String(), err
	}
}

// waitRpingListen waits until rping -s listens on port in the guest (its rdma_cm id in LISTEN).
func waitRpingListen(ctx context.Context, g *lab.Guest, port int) error {
	out, err := g.Exec(ctx, fmt.Sprintf(`for i in $(seq 200); do rdma res show cm_id | grep LISTEN | grep -Eq ':%d( |$)' && exit 0; sleep 0.05; done; rdma res show cm_id; exit 1`, port))
	if err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}

// TestRpingGoroceServer: goroce rping -s -v -V on the host side; the guest's rping -c -v -V connects
// through rxe's CM, and both check every ping's data (rping's client compares what the WRITE brought
// back, goroce's server what its READ brought).
func TestRpingGoroceServer(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range rpingCases {
		t.Run(c.name(), onGuest(g, nil, func(t testing.TB) {
			port := 7300 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			wait := startGoroceRping(t, ctx, "-v", "-V", "-p", strconv.Itoa(port), "-S", strconv.Itoa(c.size), "-timeout", "90s")
			out, cerr := g.Exec(ctx, guestRping(90, fmt.Sprintf("-c -v -V -a %s -p %d -S %d -C %d", lab.HostIP, port, c.size, c.count)))
			sout, serr := wait(false)
			t.Logf("goroce rping -s:\n%s", clip(sout))
			t.Logf("rping -c (vm%d):\n%s", g.N, clip(out))
			if cerr != nil {
				t.Errorf("rping -c: %v", cerr)
			}
			if serr != nil {
				t.Errorf("goroce rping -s: %v", serr)
			}
			checkRpingLines(t, "rping -c", out, "ping data: ", c)
			checkRpingLines(t, "goroce rping -s", sout, "server ping data: ", c)
			if !strings.Contains(sout, "server DISCONNECT EVENT...") {
				t.Errorf("goroce rping -s did not report the client's disconnection")
			}
		}))
	}
}

// TestRpingGoroceClient: the guest's rping -s -v serves; goroce rping -c -v -V connects and checks
// every ping's data.
func TestRpingGoroceClient(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range rpingCases {
		t.Run(c.name(), onGuest(g, nil, func(t testing.TB) {
			port := 7400 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := execBackground(ctx, g, guestRping(90, fmt.Sprintf("-s -v -V -a %s -p %d -S %d", g.IP, port, c.size)))
			if err := waitRpingListen(ctx, g, port); err != nil {
				t.Fatalf("rping -s does not listen: %v", err)
			}
			out, cerr := lab.NSCommand(ctx, goroceBin, "rping", "-c", "-v", "-V", "-a", g.IP.String(), "-p", strconv.Itoa(port),
				"-S", strconv.Itoa(c.size), "-C", strconv.Itoa(c.count), "-timeout", "90s").CombinedOutput()
			s := <-srv
			t.Logf("goroce rping -c:\n%s", clip(string(out)))
			t.Logf("rping -s (vm%d):\n%s", g.N, clip(s.out))
			if cerr != nil {
				t.Errorf("goroce rping -c: %v", cerr)
			}
			if s.err != nil {
				t.Errorf("rping -s: %v", s.err)
			}
			checkRpingLines(t, "goroce rping -c", string(out), "ping data: ", c)
			checkRpingLines(t, "rping -s", s.out, "server ping data: ", c)
		}))
	}
}

// TestRpingRejected: goroce refuses a request for a port nobody listens on (REJ, invalid service
// ID, reason 8), and the guest's rping -c reports the rejection and fails.
func TestRpingRejected(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wait := startGoroceRping(t, ctx, "-p", "7500", "-timeout", "30s")
	out, err := g.Exec(ctx, guestRping(30, fmt.Sprintf("-c -a %s -p 7501 -C 1", lab.HostIP)))
	t.Logf("rping -c (vm%d):\n%s", g.N, out)
	if err == nil {
		t.Errorf("rping -c succeeded against a port nobody listens on")
	}
	if !strings.Contains(out, "RDMA_CM_EVENT_REJECTED, error 8") {
		t.Errorf("rping -c did not see a rejection with reason 8 (invalid service ID)")
	}
	// goroce's server is still there for the right port.
	out, err = g.Exec(ctx, guestRping(30, fmt.Sprintf("-c -V -a %s -p 7500 -C 2", lab.HostIP)))
	sout, serr := wait(false)
	if err != nil || serr != nil {
		t.Errorf("the run after the rejection: rping -c %v, goroce %v\n%s\n%s", err, serr, out, sout)
	}
}

// TestRpingDisconnectFirst: each side goes away in the middle of an endless run (rping -C 0). The
// guest's rping -s is killed: its CM sends a DREQ and goroce's client reports the disconnection and
// ends without an error. goroce's server stops (its -timeout): the guest's rping -c does the same.
func TestRpingDisconnectFirst(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	t.Run("guest-server", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		srv := execBackground(ctx, g, guestRping(10, fmt.Sprintf("-s -a %s -p 7510", g.IP)))
		if err := waitRpingListen(ctx, g, 7510); err != nil {
			t.Fatalf("rping -s does not listen: %v", err)
		}
		out, err := lab.NSCommand(ctx, goroceBin, "rping", "-c", "-V", "-a", g.IP.String(), "-p", "7510", "-timeout", "60s").CombinedOutput()
		s := <-srv
		t.Logf("goroce rping -c:\n%s\nrping -s (vm%d): %v\n%s", out, g.N, s.err, s.out)
		if err != nil {
			t.Errorf("goroce rping -c: %v", err)
		}
		if !strings.Contains(string(out), "client DISCONNECT EVENT...") {
			t.Errorf("goroce rping -c did not report the disconnection")
		}
	}))
	t.Run("goroce-server", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		wait := startGoroceRping(t, ctx, "-p", "7511", "-timeout", "10s")
		out, err := g.Exec(ctx, guestRping(60, fmt.Sprintf("-c -V -a %s -p 7511", lab.HostIP)))
		sout, serr := wait(false)
		t.Logf("rping -c (vm%d):\n%s\ngoroce rping -s: %v\n%s", g.N, out, serr, sout)
		if err != nil {
			t.Errorf("rping -c: %v", err)
		}
		if !strings.Contains(out, "client DISCONNECT EVENT...") {
			t.Errorf("rping -c did not report the disconnection")
		}
	}))
}

// TestRpingSeveral: goroce rping -s -P takes several of the guest's rping clients at once, each
// checking its data.
func TestRpingSeveral(t *testing.T) {
	const clients = 4
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wait := startGoroceRping(t, ctx, "-P", "-V", "-p", "7520", "-S", "1000", "-timeout", "60s")
	out, err := g.Exec(ctx, fmt.Sprintf(`for i in $(seq %d); do (timeout 60 rping -c -v -V -a %s -p 7520 -S 1000 -C 5 > /tmp/rping.$i 2>/tmp/rping.e$i; echo "exit $?" >> /tmp/rping.$i; cat /tmp/rping.e$i >> /tmp/rping.$i) & done; wait; cat /tmp/rping.[0-9]*; rm -f /tmp/rping.*`,
		clients, lab.HostIP))
	if err != nil {
		t.Fatalf("guest: %v\n%s", err, out)
	}
	t.Logf("rping -c x%d (vm%d):\n%s", clients, g.N, clip(out))
	if n := strings.Count(out, "exit 0"); n != clients {
		t.Errorf("%d of %d clients succeeded", n, clients)
	}
	if n := strings.Count(out, "ping data: rdma-ping-"); n != clients*5 {
		t.Errorf("%d pings, want %d", n, clients*5)
	}
	// The persistent server runs until ^C; its connections all ended before.
	sout, serr := wait(true)
	t.Logf("goroce rping -s -P: %v\n%s", serr, sout)
	if strings.Count(sout, "server DISCONNECT EVENT...") != clients || strings.Contains(sout, "failed") {
		t.Errorf("goroce rping -s -P output:\n%s", sout)
	}
}

// rxeCMRetries returns the guest CM's resends and the duplicates it received, summed over every
// message (the kernel's cm_tx_retries and cm_rx_duplicates of rxe0's port 1).
func rxeCMRetries(ctx context.Context, t testing.TB, g *lab.Guest) (retries, dups int) {
	t.Helper()
	out, err := g.Exec(ctx, `for d in /sys/class/infiniband/rxe0/ports/1 /sys/class/infiniband_cm/rxe0/1; do [ -d $d/cm_tx_retries ] || continue; cat $d/cm_tx_retries/* | awk '{s+=$1} END {print s}'; cat $d/cm_rx_duplicates/* | awk '{s+=$1} END {print s}'; exit 0; done; exit 1`)
	if err != nil {
		t.Fatalf("reading rxe's CM counters: %v\n%s", err, out)
	}
	if _, err := fmt.Sscan(out, &retries, &dups); err != nil {
		t.Fatalf("rxe's CM counters: %q: %v", out, err)
	}
	return retries, dups
}

// goroceCMRetries returns the CM resends and duplicates in goroce rping -d's "cm counters:" lines.
func goroceCMRetries(out string) (retries, dups int) {
	for _, m := range regexp.MustCompile(`\b(Retries|Duplicates)\[\w+\]=(\d+)`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[2])
		if m[1] == "Retries" {
			retries += n
		} else {
			dups += n
		}
	}
	return retries, dups
}

// TestRpingLoss: rping -V in both roles with 3% of the packets lost each way in the guest: the
// transport's retransmissions and both CMs' MAD resends must recover, and every ping's data check.
// Each role makes several connections (a persistent server, one client after the other), so that
// the CM's MADs (REQ, REP, RTU, DREQ, DREP) meet the loss too; the resends each side counted are
// logged (a run may lose none of them: 3% of some 60 MADs).
func TestRpingLoss(t *testing.T) {
	const conns = 6
	c := rpingCase{size: 4000, count: 10}
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	loss := func(t testing.TB) { injectLoss(ctx, t, g, 3) }
	loss(t)
	defer clearLoss(t, g)
	rxeRetries0, rxeDups0 := rxeCMRetries(ctx, t, g)
	var goroceRetries, goroceDups int
	t.Run("goroce-server", onGuest(g, loss, func(t testing.TB) {
		wait := startGoroceRping(t, ctx, "-P", "-v", "-V", "-p", "7530", "-S", strconv.Itoa(c.size), "-timeout", "5m")
		for i := 0; i < conns; i++ {
			out, err := g.Exec(ctx, guestRping(120, fmt.Sprintf("-c -v -V -a %s -p 7530 -S %d -C %d", lab.HostIP, c.size, c.count)))
			t.Logf("rping -c #%d (vm%d):\n%s", i, g.N, out)
			if err != nil {
				t.Errorf("rping -c #%d: %v", i, err)
			}
			checkRpingLines(t, "rping -c", out, "ping data: ", c)
		}
		sout, serr := wait(true)
		t.Logf("goroce rping -s -P:\n%s", clip(sout))
		if serr != nil {
			t.Errorf("goroce rping -s -P: %v", serr)
		}
		if n := strings.Count(sout, "server ping data: "); n != conns*c.count {
			t.Errorf("goroce rping -s -P printed %d pings, want %d", n, conns*c.count)
		}
		// A client's DREQ lost to the netem loss is not sent again: rping exits right after
		// rdma_disconnect, and destroying its id cancels the DREQ's retries (the kernel's ib_cm
		// enters timewait), so the server, goroce's as rxe's, never hears of that disconnection. One
		// such loss in the six connections is common at 3% (about one run in six), two are rare.
		if n := strings.Count(sout, "server DISCONNECT EVENT..."); n < conns-2 || n > conns {
			t.Errorf("goroce rping -s -P saw %d disconnections of %d connections", n, conns)
		} else if n < conns {
			t.Logf("%d of %d clients' DREQs lost on the way, never resent", conns-n, conns)
		}
		r, d := goroceCMRetries(sout)
		goroceRetries, goroceDups = goroceRetries+r, goroceDups+d
	}))
	t.Run("goroce-client", onGuest(g, loss, func(t testing.TB) {
		srv := execBackground(ctx, g, guestRping(240, fmt.Sprintf("-s -P -v -V -a %s -p 7531 -S %d", g.IP, c.size)))
		if err := waitRpingListen(ctx, g, 7531); err != nil {
			t.Fatalf("rping -s does not listen: %v", err)
		}
		for i := 0; i < conns; i++ {
			out, err := lab.NSCommand(ctx, goroceBin, "rping", "-c", "-d", "-v", "-V", "-a", g.IP.String(), "-p", "7531",
				"-S", strconv.Itoa(c.size), "-C", strconv.Itoa(c.count), "-timeout", "120s").CombinedOutput()
			t.Logf("goroce rping -c #%d:\n%s", i, clip(string(out)))
			if err != nil {
				t.Errorf("goroce rping -c #%d: %v", i, err)
			}
			checkRpingLines(t, "goroce rping -c", string(out), "ping data: ", c)
			r, d := goroceCMRetries(string(out))
			goroceRetries, goroceDups = goroceRetries+r, goroceDups+d
		}
		if _, err := g.Exec(ctx, "pkill -INT -x rping; true"); err != nil {
			t.Logf("stopping rping -s: %v", err)
		}
		s := <-srv
		t.Logf("rping -s -P (vm%d):\n%s", g.N, clip(s.out))
		if n := strings.Count(s.out, "server ping data: "); n != conns*c.count {
			t.Errorf("rping -s -P printed %d pings, want %d", n, conns*c.count)
		}
	}))
	rxeRetries, rxeDups := rxeCMRetries(ctx, t, g)
	sent, recv := netemDrops(ctx, t, g, "eth0"), netemDrops(ctx, t, g, "ifb0")
	t.Logf("lost: %d packets rxe sent, %d packets goroce sent; CM resends: rxe %d (duplicates received %d), goroce %d (duplicates received %d); rxe counters: %s",
		sent, recv, rxeRetries-rxeRetries0, rxeDups-rxeDups0, goroceRetries, goroceDups, rxeCounters(ctx, g))
	if sent == 0 || recv == 0 {
		t.Errorf("loss was not injected both ways: %d and %d packets dropped", sent, recv)
	}
}

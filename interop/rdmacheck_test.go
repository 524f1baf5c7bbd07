//go:build interop

package interop

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/syncbuf"
	"github.com/goroce/goroce/interop/lab"
)

// rdmacheck checks the data of the verbs the pingpong and perftest tests do not: SEND with immediate,
// RDMA WRITE, RDMA WRITE with immediate and RDMA READ of 1 B, 4 KiB, 64 KiB and 1 MiB, fetch-and-add
// and compare-and-swap; each side checks every byte it receives or finds written into its memory, the
// immediates and byte counts of its receive completions, and the atomics' original values and final
// memory. rdmacheck.c runs in the guest on rxe, its Go mirror (rdmacheck_peer_test.go) on goroce.

// rdmacheckGuestPath is where the tests put rdmacheck in the guest.
const rdmacheckGuestPath = "/tmp/rdmacheck"

// installRdmacheck builds interop/rdmacheck/rdmacheck.c with the host's gcc and copies it into the
// guest. Without gcc or libibverbs-dev it skips the test, or fails it when CI is set.
func installRdmacheck(t testing.TB, g *lab.Guest) {
	t.Helper()
	_, gccErr := exec.LookPath("gcc")
	_, hdrErr := os.Stat("/usr/include/infiniband/verbs.h")
	if gccErr != nil || hdrErr != nil {
		msg := "rdmacheck needs gcc and libibverbs-dev on the host: apt-get install gcc libibverbs-dev"
		if os.Getenv("CI") != "" {
			t.Fatalf("%s (CI is set, so this is a failure)", msg)
		}
		t.Skip(msg)
	}
	bin := filepath.Join(t.TempDir(), "rdmacheck")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", bin, "rdmacheck/rdmacheck.c", "-libverbs").CombinedOutput(); err != nil {
		t.Fatalf("building rdmacheck: %v\n%s", err, out)
	}
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncbuf.Buffer
	if err := g.ExecIO(ctx, "cat > "+rdmacheckGuestPath+" && chmod +x "+rdmacheckGuestPath, f, &out); err != nil {
		t.Fatalf("copying rdmacheck into vm%d: %v\n%s", g.N, err, out.String())
	}
}

// rdmacheckPeer starts the goroce side in the namespace: the test binary itself, with rdmacheckEnv
// set. conns are "client:PORT:IP" or "server:PORT"; it returns once every server listens.
func rdmacheckPeer(ctx context.Context, t testing.TB, flags []string, conns ...string) (out *syncbuf.Buffer, wait func() error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := lab.NSCommand(ctx, self, append(flags, conns...)...)
	cmd.Env = append(os.Environ(), rdmacheckEnv+"=1")
	out, waited := startReady(t, cmd, "goroce rdmacheck peer ended before listening", func(s string) bool {
		for _, c := range conns {
			if role, rest, _ := strings.Cut(c, ":"); role == "server" && !strings.Contains(s, "rdmacheck["+rest+"]: listening") {
				return false
			}
		}
		return true
	})
	return out, func() error { return <-waited }
}

// checkRdmacheck checks one side's verdict: exit status, no mismatch, and the number of checks.
func checkRdmacheck(t testing.TB, who, out string, err error, passed string) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", who, err)
	}
	if strings.Contains(out, "FAIL") || !strings.Contains(out, passed) {
		t.Errorf("%s does not report %q:\n%s", who, passed, out)
	}
}

// rdmacheckChecks is how many checks a run makes with messages up to maxSize: four verbs per size,
// three atomics.
func rdmacheckChecks(maxSize int) int {
	n := 3
	for _, s := range []int{1, 4096, 65536, 1 << 20} {
		if s <= maxSize {
			n += 4
		}
	}
	return n
}

// TestRdmacheck runs rdmacheck against goroce in both roles at path MTU 1024 and 4096, all sizes:
// goroce as the requester of every verb against rxe's responder, then the other way round.
func TestRdmacheck(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	install := func(t testing.TB) { installRdmacheck(t, g) }
	install(t)
	port := 19015
	for _, role := range []string{"goroce-client", "goroce-server"} {
		for _, mtu := range []int{1024, 4096} {
			port++
			t.Run(fmt.Sprintf("%s-m%d", role, mtu), onGuest(g, install, func(t testing.TB) {
				runRdmacheck(t, g, role, mtu, port, 90*time.Second)
			}))
		}
	}
}

// TestRdmacheckLoss runs the rdmacheck checks in both roles with 3% of the packets lost each way (netem
// in the guest, as TestPingpongLoss does): WRITEs, READs, immediates and atomics recover through both
// sides' retransmission, and every byte still checks. Atomics must still execute exactly once.
func TestRdmacheckLoss(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	installWithLoss := func(t testing.TB) {
		installRdmacheck(t, g)
		injectLoss(ctx, t, g, 3)
	}
	installWithLoss(t)
	defer clearLoss(t, g)
	t.Logf("rxe counters before: %s", rxeCounters(ctx, g))
	for i, role := range []string{"goroce-client", "goroce-server"} {
		t.Run(role, onGuest(g, installWithLoss, func(t testing.TB) {
			runRdmacheck(t, g, role, 1024, 19041+i, 150*time.Second)
		}))
	}
	t.Logf("netem dropped %d sent and %d received packets in the guest; rxe counters after: %s",
		netemDrops(ctx, t, g, "eth0"), netemDrops(ctx, t, g, "ifb0"), rxeCounters(ctx, g))
	if netemDrops(ctx, t, g, "eth0")+netemDrops(ctx, t, g, "ifb0") == 0 {
		t.Fatal("no packet was lost: the test proved nothing")
	}
}

// runRdmacheck runs one rdmacheck connection, goroce in role against rdmacheck in guest g, and
// checks both sides' verdicts.
func runRdmacheck(t testing.TB, g *lab.Guest, role string, mtu, port int, limit time.Duration) {
	t.Helper()
	runRdmacheckGID(t, g, role, mtu, port, limit, netip.MustParseAddr(lab.HostIP), 1)
}

// runRdmacheckGID is runRdmacheck with goroce's device on addr and rdmacheck on rxe's GID gidIndex
// (1 is the IPv4-mapped GID of the guest's address). The TCP exchange stays on IPv4.
func runRdmacheckGID(t testing.TB, g *lab.Guest, role string, mtu, port int, limit time.Duration, addr netip.Addr, gidIndex int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit+30*time.Second)
	defer cancel()
	flags := []string{"-m", strconv.Itoa(mtu), "-addr", addr.String()}
	tool := fmt.Sprintf("timeout %d %s -g %d -m %d -p %d", int(limit.Seconds()), rdmacheckGuestPath, gidIndex, mtu, port)
	var gout, rout string
	var gerr, rerr error
	if role == "goroce-client" {
		srv := execBackground(ctx, g, tool)
		if err := waitListen(ctx, g, port); err != nil {
			t.Fatalf("rdmacheck does not listen: %v", err)
		}
		out, wait := rdmacheckPeer(ctx, t, flags, fmt.Sprintf("client:%d:%s", port, g.IP))
		gerr = wait()
		gout = out.String()
		r := <-srv
		rout, rerr = r.out, r.err
	} else {
		out, wait := rdmacheckPeer(ctx, t, flags, fmt.Sprintf("server:%d", port))
		rout, rerr = g.Exec(ctx, tool+" "+lab.HostIP)
		gerr = wait()
		gout = out.String()
	}
	t.Logf("goroce:\n%s", gout)
	t.Logf("rdmacheck (vm%d):\n%s", g.N, rout)
	n := rdmacheckChecks(1 << 20)
	checkRdmacheck(t, "goroce", gout, gerr, fmt.Sprintf("rdmacheck[%d]: %d checks passed", port, n))
	checkRdmacheck(t, "rdmacheck", rout, rerr, fmt.Sprintf("rdmacheck: %d checks passed", n))
}

// TestRdmacheckQPs runs four rdmacheck connections at the same time, each with its own QP on one
// goroce device and its own rxe process: two with goroce as the client, two with goroce serving. The
// goroce side starts the checks of all four together, once all are connected.
func TestRdmacheckQPs(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	install := func(t testing.TB) { installRdmacheck(t, g) }
	install(t)
	onGuest(g, install, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const maxSize = 1 << 20
		ports := []int{19031, 19032, 19033, 19034}
		tool := func(port int) string {
			return fmt.Sprintf("timeout 90 %s -g 1 -m 1024 -z %d -p %d", rdmacheckGuestPath, maxSize, port)
		}
		rout := make([]string, len(ports))
		rerr := make([]error, len(ports))
		var wg sync.WaitGroup
		// rxe serves the first two connections, goroce the other two.
		for i, p := range ports[:2] {
			wg.Go(func() { rout[i], rerr[i] = g.Exec(ctx, tool(p)) })
			if err := waitListen(ctx, g, p); err != nil {
				t.Fatalf("rdmacheck does not listen on %d: %v", p, err)
			}
		}
		out, wait := rdmacheckPeer(ctx, t, []string{"-m", "1024", "-z", strconv.Itoa(maxSize)},
			fmt.Sprintf("client:%d:%s", ports[0], g.IP), fmt.Sprintf("client:%d:%s", ports[1], g.IP),
			fmt.Sprintf("server:%d", ports[2]), fmt.Sprintf("server:%d", ports[3]))
		for i, p := range ports[2:] {
			wg.Go(func() { rout[2+i], rerr[2+i] = g.Exec(ctx, tool(p)+" "+lab.HostIP) })
		}
		gerr := wait()
		wg.Wait()
		t.Logf("goroce:\n%s", out.String())
		n := rdmacheckChecks(maxSize)
		for i, p := range ports {
			t.Logf("rdmacheck port %d (vm%d):\n%s", p, g.N, rout[i])
			checkRdmacheck(t, fmt.Sprintf("rdmacheck port %d", p), rout[i], rerr[i], fmt.Sprintf("rdmacheck: %d checks passed", n))
			checkRdmacheck(t, "goroce", out.String(), nil, fmt.Sprintf("rdmacheck[%d]: %d checks passed", p, n))
		}
		if gerr != nil {
			t.Errorf("goroce: %v", gerr)
		}
	})(t)
}

//go:build interop

// Package interop tests goroce against Linux soft-RoCE (rxe) in qemu guests (see lab). Run as root:
//
//	go test -tags interop ./interop/...
//
// goroce runs on the host side of the lab's bridge (10.77.0.1, inside the namespace); rxe in guest 1
// (10.77.0.11). Each test checks both programs' exit status and output.
package interop

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/syncbuf"
	"github.com/goroce/goroce/interop/lab"
)

// goroceBin is the goroce command, built once by TestMain.
var goroceBin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "goroce-interop-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		goroceBin = filepath.Join(dir, "goroce")
		if out, err := exec.Command("go", "build", "-o", goroceBin, "../cmd/goroce").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building goroce: %v\n%s", err, out)
			return 1
		}
		defer lab.Shutdown()
		return m.Run()
	}()
	os.Exit(code)
}

// pingpongLines are the lines ibv_rc_pingpong prints; goroce pingpong must print the same.
func pingpongLines(localIP, remoteIP string) []*regexp.Regexp {
	q := regexp.QuoteMeta
	return []*regexp.Regexp{
		// ud_pingpong prints a colon before the GID of its local address; the others a comma.
		regexp.MustCompile(`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ::ffff:` + q(localIP) + `$`),
		regexp.MustCompile(`(?m)^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:` + q(remoteIP) + `$`),
		regexp.MustCompile(`(?m)^\d+ bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`),
		regexp.MustCompile(`(?m)^\d+ iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`),
	}
}

func checkPingpongOutput(t testing.TB, who, out, localIP, remoteIP string, size, iters int) {
	t.Helper()
	for _, re := range pingpongLines(localIP, remoteIP) {
		if !re.MatchString(out) {
			t.Errorf("%s output lacks a line matching %v:\n%s", who, re, out)
		}
	}
	if want := fmt.Sprintf("%d bytes in ", 2*size*iters); !strings.Contains(out, want) {
		t.Errorf("%s output lacks %q:\n%s", who, want, out)
	}
	if strings.Contains(out, "invalid data") {
		t.Errorf("%s found invalid data:\n%s", who, out)
	}
}

// waitListen waits until a TCP port listens in the guest.
func waitListen(ctx context.Context, g *lab.Guest, port int) error {
	_, err := g.Exec(ctx, fmt.Sprintf(`for i in $(seq 200); do ss -Hltn "sport = :%d" | grep -q . && exit 0; sleep 0.05; done; exit 1`, port))
	return err
}

type pingpongCase struct {
	size, mtu, iters int
	uc               bool // ibv_uc_pingpong and goroce pingpong -qp-type uc
	ud               bool // ibv_ud_pingpong and goroce pingpong -qp-type ud
}

func (c pingpongCase) name() string {
	n := fmt.Sprintf("s%d-m%d", c.size, c.mtu)
	switch {
	case c.uc:
		n = "uc-" + n
	case c.ud:
		n = "ud-" + n
	}
	return n
}

// flags are the flags both programs get; -c makes each check the data it receives. ud_pingpong takes
// neither -m (a datagram is bounded by the port MTU) nor -c.
func (c pingpongCase) flags() []string {
	if c.ud {
		return []string{"-s", strconv.Itoa(c.size), "-n", strconv.Itoa(c.iters)}
	}
	return []string{"-s", strconv.Itoa(c.size), "-m", strconv.Itoa(c.mtu), "-n", strconv.Itoa(c.iters), "-c"}
}

func (c pingpongCase) tool() string {
	switch {
	case c.uc:
		return "ibv_uc_pingpong"
	case c.ud:
		return "ibv_ud_pingpong"
	}
	return "ibv_rc_pingpong"
}

func (c pingpongCase) goroceArgs(port int) []string {
	args := []string{"pingpong", "-g", "1", "-a", lab.HostIP, "-p", strconv.Itoa(port), "-timeout", "90s"}
	switch {
	case c.uc:
		args = append(args, "-qp-type", "uc")
	case c.ud:
		args = append(args, "-qp-type", "ud", "-m", strconv.Itoa(c.mtu)) // -m: the size goroce allows
	}
	return append(args, c.flags()...)
}

// pingpongCases cover a single byte, one packet, multi-packet messages up to 1 MiB at path MTU 1024
// and 4096, and UC.
var pingpongCases = []pingpongCase{
	{size: 1, mtu: 1024, iters: 200},
	{size: 4096, mtu: 1024, iters: 200},
	{size: 65536, mtu: 1024, iters: 30},
	{size: 65536, mtu: 4096, iters: 30},
	{size: 1 << 20, mtu: 4096, iters: 5},
	{size: 4096, mtu: 1024, iters: 100, uc: true},
	{size: 2048, mtu: 4096, iters: 100, ud: true},
}

// TestPingpongGoroceClient: ibv_rc_pingpong -g 1 serves in the guest, goroce pingpong connects.
func TestPingpongGoroceClient(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range pingpongCases {
		t.Run(c.name(), onGuest(g, nil, func(t testing.TB) {
			port := 18515 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := execBackground(ctx, g, fmt.Sprintf("timeout 90 %s -d rxe0 -g 1 -p %d %s", c.tool(), port, strings.Join(c.flags(), " ")))
			if err := waitListen(ctx, g, port); err != nil {
				t.Fatalf("%s does not listen: %v", c.tool(), err)
			}
			cmd := lab.NSCommand(ctx, goroceBin, append(c.goroceArgs(port), g.IP.String())...)
			cout, cerr := cmd.CombinedOutput()
			s := <-srv
			t.Logf("goroce pingpong (client):\n%s", cout)
			t.Logf("%s (server, vm%d):\n%s", c.tool(), g.N, s.out)
			if cerr != nil {
				t.Errorf("goroce pingpong: %v", cerr)
			}
			if s.err != nil {
				t.Errorf("%s: %v", c.tool(), s.err)
			}
			checkPingpongOutput(t, "goroce pingpong", string(cout), lab.HostIP, g.IP.String(), c.size, c.iters)
			checkPingpongOutput(t, c.tool(), s.out, g.IP.String(), lab.HostIP, c.size, c.iters)
		}))
	}
}

// TestPingpongGoroceServer: goroce pingpong serves on the host side, ibv_rc_pingpong -g 1 connects
// from the guest.
func TestPingpongGoroceServer(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	for i, c := range pingpongCases {
		t.Run(c.name(), onGuest(g, nil, func(t testing.TB) {
			port := 18615 + i
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sout, waited := startGoroce(ctx, t, "local address", c.goroceArgs(port))
			out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 90 %s -d rxe0 -g 1 -p %d %s %s", c.tool(), port, strings.Join(c.flags(), " "), lab.HostIP))
			serr := <-waited
			t.Logf("goroce pingpong (server):\n%s", sout.String())
			t.Logf("%s (client, vm%d):\n%s", c.tool(), g.N, out)
			if serr != nil {
				t.Errorf("goroce pingpong: %v", serr)
			}
			if cerr != nil {
				t.Errorf("%s: %v", c.tool(), cerr)
			}
			checkPingpongOutput(t, "goroce pingpong", sout.String(), lab.HostIP, g.IP.String(), c.size, c.iters)
			checkPingpongOutput(t, c.tool(), out, g.IP.String(), lab.HostIP, c.size, c.iters)
		}))
	}
}

// startGoroce starts goroce with args in the lab's namespace and returns once its output shows ready
// (the line a server prints once it listens: "local address" for pingpong, "Waiting for client" for
// perf). out collects its stdout and stderr; waited yields its exit.
func startGoroce(ctx context.Context, t testing.TB, ready string, args []string) (out *syncbuf.Buffer, waited <-chan error) {
	t.Helper()
	return startReady(t, lab.NSCommand(ctx, goroceBin, args...), "goroce "+args[0]+" ended before listening",
		func(s string) bool { return strings.Contains(s, ready) })
}

// startReady starts cmd with its stdout and stderr in out and returns once ready(output so far) is
// true; if cmd ends first, the test fails with ended, the exit and the output. waited yields its exit.
func startReady(t testing.TB, cmd *exec.Cmd, ended string, ready func(out string) bool) (out *syncbuf.Buffer, waited <-chan error) {
	t.Helper()
	out = new(syncbuf.Buffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	for !ready(out.String()) {
		select {
		case err := <-ch:
			t.Fatalf("%s: %v\n%s", ended, err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return out, ch
}

// lossScript makes guest 1 drop pct percent of the packets it sends (netem on eth0) and of those it
// receives (redirected through ifb0 to a second netem): loss in both directions, inside the lab.
const lossScript = `tc qdisc add dev eth0 root netem loss %[1]d%% &&
ip link set ifb0 up &&
tc qdisc add dev eth0 handle ffff: ingress &&
tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0 &&
tc qdisc add dev ifb0 root netem loss %[1]d%%`

const lossOffScript = `tc qdisc del dev eth0 root; tc qdisc del dev eth0 ingress; tc qdisc del dev ifb0 root; true`

// clearLoss removes the loss the tests inject in guest g (lossScript, lossGuestSends,
// lossGuestReceives) and fails the test if a netem queue is left on any interface: a case that runs
// after a loss test must not run with its loss. The tests used to run lossOffScript and ignore how
// it went.
func clearLoss(t testing.TB, g *lab.Guest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := g.Exec(ctx, lossOffScript+"; tc qdisc show")
	if err != nil {
		t.Errorf("removing the injected loss in vm%d: %v\n%s", g.N, err, out)
		return
	}
	if strings.Contains(out, "netem") {
		t.Errorf("vm%d still has a netem queue after the injected loss was removed:\n%s", g.N, out)
	}
}

// injectLoss makes netem in guest g drop percent of the packets each way.
func injectLoss(ctx context.Context, t testing.TB, g *lab.Guest, percent int) {
	t.Helper()
	if out, err := g.Exec(ctx, fmt.Sprintf(lossScript, percent)); err != nil {
		t.Fatalf("injecting loss: %v\n%s", err, out)
	}
}

// netemDrops returns how many packets the netem qdisc on dev dropped.
func netemDrops(ctx context.Context, t *testing.T, g *lab.Guest, dev string) int {
	t.Helper()
	out, err := g.Exec(ctx, "tc -s qdisc show dev "+dev)
	if err != nil {
		t.Fatalf("tc: %v", err)
	}
	m := regexp.MustCompile(`qdisc netem [^\n]*\n[^\n]*\(dropped (\d+),`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no netem drop count in:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// rxeCounters returns rxe's counters that show recovery from loss.
func rxeCounters(ctx context.Context, g *lab.Guest) string {
	out, _ := g.Exec(ctx, `cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for c in completer_retry_err rcvd_seq_err duplicate_request out_of_seq_request retry_exceeded_err; do printf '%s=%s ' $c $(cat $c); done`)
	return out
}

// TestPingpongLoss runs goroce pingpong against ibv_rc_pingpong, in both roles, with 3% of the packets
// lost each way: both sides' retransmission must recover and the data must check.
func TestPingpongLoss(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	loss := func(t testing.TB) { injectLoss(ctx, t, g, 3) }
	loss(t)
	defer clearLoss(t, g)
	c := pingpongCase{size: 65536, mtu: 1024, iters: 30}
	t.Logf("rxe counters before: %s", rxeCounters(ctx, g))
	for _, role := range []string{"goroce-client", "goroce-server"} {
		t.Run(role, onGuest(g, loss, func(t testing.TB) {
			port := 18715
			if role == "goroce-server" {
				port++
			}
			var gout, rout string
			var gerr, rerr error
			if role == "goroce-client" {
				srv := execBackground(ctx, g, fmt.Sprintf("timeout 120 %s -d rxe0 -g 1 -p %d %s", c.tool(), port, strings.Join(c.flags(), " ")))
				if err := waitListen(ctx, g, port); err != nil {
					t.Fatalf("%s does not listen: %v", c.tool(), err)
				}
				out, err := lab.NSCommand(ctx, goroceBin, append(c.goroceArgs(port), g.IP.String())...).CombinedOutput()
				gout, gerr = string(out), err
				r := <-srv
				rout, rerr = r.out, r.err
			} else {
				cmd := lab.NSCommand(ctx, goroceBin, c.goroceArgs(port)...)
				var sout syncbuf.Buffer
				cmd.Stdout, cmd.Stderr = &sout, &sout
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				for !strings.Contains(sout.String(), "local address") {
					if ctx.Err() != nil {
						t.Fatalf("goroce pingpong did not listen:\n%s", sout.String())
					}
					time.Sleep(20 * time.Millisecond)
				}
				rout, rerr = g.Exec(ctx, fmt.Sprintf("timeout 120 %s -d rxe0 -g 1 -p %d %s %s", c.tool(), port, strings.Join(c.flags(), " "), lab.HostIP))
				gerr = cmd.Wait()
				gout = sout.String()
			}
			t.Logf("goroce pingpong:\n%s", gout)
			t.Logf("%s (vm%d):\n%s", c.tool(), g.N, rout)
			if rerr != nil {
				t.Errorf("%s: %v", c.tool(), rerr)
			}
			checkPingpongOutput(t, c.tool(), rout, g.IP.String(), lab.HostIP, c.size, c.iters)
			if rerr == nil && strings.Contains(gout, "transport retry counter exceeded") {
				// The pingpong protocol's own race under loss: each side ends once its last SEND and
				// its last receive have completed. When rxe's ACK of goroce's last SEND is lost and rxe
				// has what it needs (serving: goroce's SEND is the run's last message; as the client's
				// peer: rxe's own last SEND was ACKed), rxe ends and destroys its QP, and goroce
				// retransmits to a QP that no longer exists until its retries run out. ibv_rc_pingpong
				// in goroce's place has the same race; only rxe's side can prove the run here, and its
				// -c check above covered every iteration. Seen in both roles, at 3% loss each way.
				t.Logf("goroce's last SEND lost its ACK after rxe had finished (the pingpong protocol's end-of-run race under loss)")
				return
			}
			if gerr != nil {
				t.Errorf("goroce pingpong: %v", gerr)
			}
			checkPingpongOutput(t, "goroce pingpong", gout, lab.HostIP, g.IP.String(), c.size, c.iters)
		}))
	}
	sent, recv := netemDrops(ctx, t, g, "eth0"), netemDrops(ctx, t, g, "ifb0")
	t.Logf("lost: %d packets rxe sent, %d packets goroce sent; rxe counters after: %s", sent, recv, rxeCounters(ctx, g))
	if sent == 0 || recv == 0 {
		t.Errorf("loss was not injected both ways: %d and %d packets dropped", sent, recv)
	}
}

// execResult is what a guest command left.
type execResult struct {
	out string
	err error
}

// execBackground runs cmd in guest g while the caller goes on; the channel yields its result.
func execBackground(ctx context.Context, g *lab.Guest, cmd string) <-chan execResult {
	ch := make(chan execResult, 1)
	go func() {
		out, err := g.Exec(ctx, cmd)
		ch <- execResult{out, err}
	}()
	return ch
}

// selfPeer starts this test binary in the lab's namespace as a goroce peer of a librdmacm example:
// env selects the peer's main (an init function checks it), args are its arguments, "server
// LOCAL-IP PORT" or "client LOCAL-IP SERVER-IP:PORT". For a server it returns once the peer prints
// "listening". The function it returns waits for the peer's end and gives its output.
func selfPeer(ctx context.Context, t testing.TB, env string, args ...string) func() (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := lab.NSCommand(ctx, self, args...)
	cmd.Env = append(os.Environ(), env+"=1")
	out, waited := startReady(t, cmd, "the goroce peer ended before listening",
		func(s string) bool { return args[0] != "server" || strings.Contains(s, "listening") })
	return func() (string, error) {
		err := <-waited
		return out.String(), err
	}
}

// openSelfPeer checks a selfPeer's arguments and opens its device on LOCAL-IP at RoCEv2's port. On
// an error it prints it and returns the exit code the peer's main returns.
func openSelfPeer(args []string) (*goroce.Device, int) {
	if len(args) != 3 || args[0] != "server" && args[0] != "client" {
		fmt.Println("usage: server|client LOCAL-IP PORT|SERVER:PORT")
		return nil, 2
	}
	local, err := netip.ParseAddr(args[1])
	if err != nil {
		fmt.Println(err)
		return nil, 2
	}
	dev, err := goroce.Open(goroce.Config{Addr: local, Port: goroce.DefaultPort})
	if err != nil {
		fmt.Println(err)
		return nil, 1
	}
	return dev, 0
}

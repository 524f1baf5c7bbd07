//go:build interop

package interop

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/lab"
	"github.com/goroce/goroce/interop/udaddy"
)

// Tests of goroce against librdmacm's udaddy (package interop/udaddy): a UD service resolved through
// rxe's CM with SIDR, then ten 100-byte datagrams each way, goroce in both roles. The goroce side is
// the test binary itself, run in the lab's namespace with udaddyEnv set.

// udaddyEnv, when set, makes the test binary a goroce peer of udaddy; its arguments are
// "server LOCAL-IP PORT" or "client LOCAL-IP SERVER-IP:PORT".
const udaddyEnv = "GOROCE_UDADDY_PEER"

func init() {
	if os.Getenv(udaddyEnv) != "" {
		os.Exit(udaddyPeerMain(os.Args[1:]))
	}
}

// udaddyPeerMain runs the peer and prints "received N", then "end 0" or the error.
func udaddyPeerMain(args []string) int {
	dev, code := openSelfPeer(args)
	if dev == nil {
		return code
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var n int
	var err error
	if args[0] == "server" {
		port, _ := strconv.Atoi(args[2])
		n, err = udaddy.Server(ctx, dev, uint16(port), udaddy.DefaultCount, udaddy.DefaultSize, func() { fmt.Println("listening") })
	} else {
		n, err = udaddy.Client(ctx, dev, args[2], udaddy.DefaultCount, udaddy.DefaultSize)
	}
	fmt.Printf("received %d\n", n)
	if err != nil {
		fmt.Printf("end: %v\n", err)
		return 1
	}
	fmt.Println("end 0")
	st := dev.Stats().CM
	fmt.Printf("CM: SIDR_REQ sent %d received %d, SIDR_REP sent %d received %d, dropped %d\n",
		st.Sent[7], st.Rcvd[7], st.Sent[8], st.Rcvd[8], st.Dropped)
	return 0
}

// udaddyPeer starts the goroce peer in the namespace (selfPeer).
func udaddyPeer(ctx context.Context, t testing.TB, args ...string) func() (string, error) {
	t.Helper()
	return selfPeer(ctx, t, udaddyEnv, args...)
}

// udaddyDone is what udaddy prints when its transfers completed and it ends without an error.
func udaddyDone(out string) bool {
	return strings.Contains(out, "data transfers complete") && strings.Contains(out, "return status 0")
}

// TestUdaddyGoroceServer: the guest's udaddy client resolves goroce's UD service through SIDR, sends
// its ten messages and takes goroce's ten back; both end without an error.
func TestUdaddyGoroceServer(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	t.Run("udaddy", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		wait := udaddyPeer(ctx, t, "server", lab.HostIP, strconv.Itoa(udaddy.DefaultPort))
		out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 60 udaddy -s %s", lab.HostIP))
		sout, serr := wait()
		t.Logf("goroce (server):\n%s\nudaddy (vm%d):\n%s", sout, g.N, out)
		if cerr != nil || !udaddyDone(out) {
			t.Errorf("udaddy: %v", cerr)
		}
		if serr != nil || !strings.Contains(sout, fmt.Sprintf("received %d\nend 0", udaddy.DefaultCount)) {
			t.Errorf("goroce server: %v", serr)
		}
	}))
}

// TestUdaddyGoroceClient: goroce's udaddy client resolves the guest's udaddy server through SIDR,
// sends ten messages and takes ten back.
func TestUdaddyGoroceClient(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	t.Run("udaddy", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		srv := execBackground(ctx, g, "timeout 60 udaddy")
		if err := waitRpingListen(ctx, g, udaddy.DefaultPort); err != nil {
			t.Fatalf("udaddy does not listen: %v", err)
		}
		wait := udaddyPeer(ctx, t, "client", lab.HostIP, fmt.Sprintf("%s:%d", g.IP, udaddy.DefaultPort))
		cout, cerr := wait()
		s := <-srv
		t.Logf("goroce (client):\n%s\nudaddy (vm%d):\n%s", cout, g.N, s.out)
		if cerr != nil || !strings.Contains(cout, fmt.Sprintf("received %d\nend 0", udaddy.DefaultCount)) {
			t.Errorf("goroce client: %v", cerr)
		}
		if s.err != nil || !udaddyDone(s.out) {
			t.Errorf("udaddy server: %v", s.err)
		}
	}))
}

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
	"github.com/goroce/goroce/interop/rdmacm"
)

// Tests of goroce against librdmacm's rdma_server and rdma_client (package interop/rdmacm): a
// connection through rxe's CM and one 16-byte SEND each way, goroce in both roles. The goroce side
// is the test binary itself, run in the lab's namespace with rdmacmEnv set.

// rdmacmEnv, when set, makes the test binary a goroce peer of rdma_server or rdma_client; its
// arguments are "server LOCAL-IP PORT" or "client LOCAL-IP SERVER-IP:PORT".
const rdmacmEnv = "GOROCE_RDMACM_PEER"

func init() {
	if os.Getenv(rdmacmEnv) != "" {
		os.Exit(rdmacmPeerMain(os.Args[1:]))
	}
}

// rdmacmPeerMain runs the peer and prints what it received: "received: <hex>", then "end 0" or the
// error, as the examples end with "rdma_server: end 0".
func rdmacmPeerMain(args []string) int {
	dev, code := openSelfPeer(args)
	if dev == nil {
		return code
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var got rdmacm.Message
	var err error
	var msg rdmacm.Message
	copy(msg[:], "goroce "+args[0])
	if args[0] == "server" {
		port, _ := strconv.Atoi(args[2])
		got, err = rdmacm.Server(ctx, dev, uint16(port), msg, func() { fmt.Println("listening") })
	} else {
		got, err = rdmacm.Client(ctx, dev, args[2], msg)
	}
	if err != nil {
		fmt.Printf("end: %v\n", err)
		return 1
	}
	fmt.Printf("received: %x\nend 0\n", got[:])
	return 0
}

// rdmacmPeer starts the goroce peer in the namespace (selfPeer).
func rdmacmPeer(ctx context.Context, t testing.TB, args ...string) func() (string, error) {
	t.Helper()
	return selfPeer(ctx, t, rdmacmEnv, args...)
}

// zeros16 is what rdma_server and rdma_client send: their 16-byte buffer, never written.
const zeros16 = "received: 00000000000000000000000000000000"

// TestRdmacmGoroceServer: the guest's rdma_client connects to goroce's rdma_server peer; each side
// gets the other's 16 bytes and both end without an error.
func TestRdmacmGoroceServer(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	t.Run("rdma_client", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		wait := rdmacmPeer(ctx, t, "server", lab.HostIP, "7600")
		out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 60 rdma_client -s %s -p 7600", lab.HostIP))
		sout, serr := wait()
		t.Logf("goroce (server):\n%s\nrdma_client (vm%d):\n%s", sout, g.N, out)
		if cerr != nil || !strings.Contains(out, "rdma_client: end 0") {
			t.Errorf("rdma_client: %v", cerr)
		}
		if serr != nil || !strings.Contains(sout, zeros16) {
			t.Errorf("goroce server: %v", serr)
		}
	}))
}

// TestRdmacmGoroceClient: goroce's rdma_client peer connects to the guest's rdma_server.
func TestRdmacmGoroceClient(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	t.Run("rdma_server", onGuest(g, nil, func(t testing.TB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		srv := execBackground(ctx, g, "timeout 60 rdma_server -p 7601")
		if err := waitRpingListen(ctx, g, 7601); err != nil {
			t.Fatalf("rdma_server does not listen: %v", err)
		}
		wait := rdmacmPeer(ctx, t, "client", lab.HostIP, g.IP.String()+":7601")
		cout, cerr := wait()
		s := <-srv
		t.Logf("goroce (client):\n%s\nrdma_server (vm%d):\n%s", cout, g.N, s.out)
		if cerr != nil || !strings.Contains(cout, zeros16) {
			t.Errorf("goroce client: %v", cerr)
		}
		if s.err != nil || !strings.Contains(s.out, "rdma_server: end 0") {
			t.Errorf("rdma_server: %v", s.err)
		}
	}))
}

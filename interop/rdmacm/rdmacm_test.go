package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// TestServerClient: Server and Client against each other over an in-memory network, with 5% of the
// datagrams lost (MADs included), each message arriving whole at the other side.
func TestServerClient(t *testing.T) {
	for _, loss := range []float64{0, 0.05} {
		net := goroce.NewMemNetwork()
		if err := net.Impair(goroce.Impairment{Loss: loss, Seed: 3}); err != nil {
			t.Fatal(err)
		}
		open := func(a string) *goroce.Device {
			d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(a), Port: goroce.DefaultPort, Network: net})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			return d
		}
		srv, cli := open("10.0.0.2"), open("10.0.0.1")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		smsg, cmsg := Message{'s', 'e', 'r', 'v', 'e', 'r'}, Message{'c', 'l', 'i', 'e', 'n', 't'}
		type result struct {
			m   Message
			err error
		}
		served := make(chan result, 1)
		listening := make(chan struct{})
		go func() {
			m, err := Server(ctx, srv, DefaultPort, smsg, func() { close(listening) })
			served <- result{m, err}
		}()
		<-listening
		got, err := Client(ctx, cli, "10.0.0.2:7471", cmsg)
		s := <-served
		if err != nil || s.err != nil {
			t.Fatalf("loss %v: client %v, server %v", loss, err, s.err)
		}
		if got != smsg || s.m != cmsg {
			t.Errorf("loss %v: the client got %q, the server %q", loss, got, s.m)
		}
	}
}

// TestClientRefused: a client whose server does not listen gets the REJ's error.
func TestClientRefused(t *testing.T) {
	net := goroce.NewMemNetwork()
	a, _ := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.1"), Port: goroce.DefaultPort, Network: net})
	b, _ := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.2"), Port: goroce.DefaultPort, Network: net})
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Client(ctx, a, "10.0.0.2:7471", Message{}); !errorsIsRefused(err) {
		t.Fatalf("client to nobody: %v", err)
	}
}

func errorsIsRefused(err error) bool { return errors.Is(err, goroce.ErrConnRefused) }

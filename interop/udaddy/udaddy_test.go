package udaddy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// TestUdaddy: goroce's udaddy server and client against each other in memory: ten messages of 100
// bytes each way.
func TestUdaddy(t *testing.T) {
	net := goroce.NewMemNetwork()
	open := func(a string) *goroce.Device {
		d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(a), Port: goroce.DefaultPort, Network: net})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	srv, cli := open("10.0.0.2"), open("10.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	listening := make(chan struct{})
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := Server(ctx, srv, DefaultPort, DefaultCount, DefaultSize, func() { close(listening) })
		done <- result{n, err}
	}()
	<-listening
	n, err := Client(ctx, cli, "10.0.0.2:7174", DefaultCount, DefaultSize)
	if err != nil || n != DefaultCount {
		t.Fatalf("client received %d: %v", n, err)
	}
	if r := <-done; r.err != nil || r.n != DefaultCount {
		t.Fatalf("server received %d: %v", r.n, r.err)
	}
}

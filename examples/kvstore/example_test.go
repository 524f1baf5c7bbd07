package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/examples/kvstore"
)

// A server and a client on the in-memory network, set up over a net.Pipe: a test needs no socket.
// Across machines the server runs Serve on a TCP listener and the client dials it.
func Example() {
	network := goroce.NewMemNetwork()
	serverDev, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.1"), Network: network})
	if err != nil {
		panic(err)
	}
	defer serverDev.Close()
	server, err := kvstore.NewServer(serverDev, kvstore.Config{Slots: 256})
	if err != nil {
		panic(err)
	}
	defer server.Close()

	clientDev, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.2"), Network: network})
	if err != nil {
		panic(err)
	}
	defer clientDev.Close()
	clientEnd, serverEnd := net.Pipe()
	go server.ServeConn(serverEnd)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := kvstore.NewClient(ctx, clientDev, clientEnd, nil)
	if err != nil {
		panic(err)
	}
	defer client.Close()

	if err := client.Put(ctx, []byte("greeting"), []byte("hello, one-sided world")); err != nil {
		panic(err)
	}
	v, err := client.Get(ctx, []byte("greeting"))
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s\n", v)
	_, err = client.Get(ctx, []byte("farewell"))
	fmt.Println(errors.Is(err, kvstore.ErrNotFound))
	// Output:
	// hello, one-sided world
	// true
}

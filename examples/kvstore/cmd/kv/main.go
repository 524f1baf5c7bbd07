// Command kv runs a kvstore server or talks to one.
//
//	kv serve -listen 127.0.0.1:7100 [-slots 4096] [-key 32] [-value 224]
//	kv put -server 127.0.0.1:7100 KEY VALUE
//	kv get -server 127.0.0.1:7100 KEY
//	kv bench -server 127.0.0.1:7100 [-clients 4] [-keys 64] [-duration 5s] [-writes 0.1]
//
// The server opens its goroce device on the listening address, with an ephemeral UDP port, and
// answers only connection setup on the TCP listener; GETs and PUTs are RDMA READs, WRITEs and
// atomics on its table. A client opens its device on the address its end of the TCP connection has.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/examples/kvstore"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serve(ctx, args)
	case "put", "get":
		err = putGet(ctx, cmd, args)
	case "bench":
		err = bench(ctx, args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kv:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  kv serve -listen ADDR:PORT [-slots N] [-key N] [-value N]
  kv put -server ADDR:PORT KEY VALUE
  kv get -server ADDR:PORT KEY
  kv bench -server ADDR:PORT [-clients N] [-keys N] [-duration D] [-writes F]`)
	os.Exit(2)
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:7100", "TCP address for connection setup; the device opens on its IP")
	var cfg kvstore.Config
	fs.IntVar(&cfg.Slots, "slots", 4096, "slots in the table")
	fs.IntVar(&cfg.MaxKey, "key", kvstore.DefaultMaxKey, "longest key in bytes")
	fs.IntVar(&cfg.MaxValue, "value", kvstore.DefaultMaxValue, "longest value in bytes")
	fs.Parse(args)
	addr, err := netip.ParseAddrPort(*listen)
	if err != nil {
		return err
	}
	if addr.Addr().IsUnspecified() {
		return errors.New("listen on one address: the device opens on it")
	}
	dev, err := goroce.Open(goroce.Config{Addr: addr.Addr()})
	if err != nil {
		return err
	}
	defer dev.Close()
	server, err := kvstore.NewServer(dev, cfg)
	if err != nil {
		return err
	}
	defer server.Close()
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", *listen)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { server.Close() })
	fmt.Printf("serving %d slots on %v (RoCE on %v)\n", cfg.Slots, ln.Addr(), dev.LocalAddr())
	if err := server.Serve(ln); !errors.Is(err, kvstore.ErrServerClosed) {
		return err
	}
	return nil
}

// dial connects a client: TCP to the server, and a device on the connection's local address.
func dial(ctx context.Context, server string) (*kvstore.Client, func(), error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", server)
	if err != nil {
		return nil, nil, err
	}
	local, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	dev, err := goroce.Open(goroce.Config{Addr: local.Addr().Unmap()})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	c, err := kvstore.NewClient(ctx, dev, conn, nil)
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	return c, func() { c.Close(); dev.Close() }, nil
}

func putGet(ctx context.Context, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	server := fs.String("server", "127.0.0.1:7100", "the server's TCP address")
	fs.Parse(args)
	want := 1
	if cmd == "put" {
		want = 2
	}
	if fs.NArg() != want {
		usage()
	}
	c, done, err := dial(ctx, *server)
	if err != nil {
		return err
	}
	defer done()
	key := []byte(fs.Arg(0))
	if cmd == "put" {
		return c.Put(ctx, key, []byte(fs.Arg(1)))
	}
	v, err := c.Get(ctx, key)
	if err != nil {
		return err
	}
	fmt.Printf("%s\n", v)
	return nil
}

// bench runs clients that GET and PUT random keys for a while and reports the rate.
func bench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	server := fs.String("server", "127.0.0.1:7100", "the server's TCP address")
	clients := fs.Int("clients", 4, "clients, each with its own queue pair and goroutine")
	keys := fs.Int("keys", 64, "distinct keys")
	duration := fs.Duration("duration", 5*time.Second, "how long to run")
	writes := fs.Float64("writes", 0.1, "fraction of operations that are PUTs")
	fs.Parse(args)
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total kvstore.Stats
		first error
	)
	start := time.Now()
	for i := range *clients {
		c, done, err := dial(ctx, *server)
		if err != nil {
			return err
		}
		defer done()
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			value := make([]byte, 64)
			var err error
			for ctx.Err() == nil && err == nil {
				key := fmt.Appendf(nil, "key%d", rng.IntN(*keys))
				if rng.Float64() < *writes {
					err = c.Put(ctx, key, value)
				} else if _, err = c.Get(ctx, key); errors.Is(err, kvstore.ErrNotFound) {
					err = nil
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && ctx.Err() == nil && first == nil {
				first = err
			}
			s := c.Stats()
			total.Gets += s.Gets
			total.Puts += s.Puts
			total.ReadRetries += s.ReadRetries
			total.LockRetries += s.LockRetries
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	ops := float64(total.Gets + total.Puts)
	fmt.Printf("%d GETs, %d PUTs in %v: %.0f ops/s; %d read retries, %d lock retries\n",
		total.Gets, total.Puts, elapsed.Round(time.Millisecond), ops/elapsed.Seconds(), total.ReadRetries, total.LockRetries)
	return first
}

package kvstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// cluster is a server and its clients' devices on one in-memory network.
type cluster struct {
	net    *goroce.MemNetwork
	server *Server
	hosts  int
}

// newCluster starts a server with cfg.
func newCluster(t *testing.T, cfg Config) *cluster {
	t.Helper()
	cl := &cluster{net: goroce.NewMemNetwork()}
	dev, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.1"), Network: cl.net})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	if cl.server, err = NewServer(dev, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.server.Close(); err != nil {
			t.Error(err)
		}
	})
	return cl
}

// device opens a client device on the cluster's network.
func (cl *cluster) device(t *testing.T) *goroce.Device {
	t.Helper()
	cl.hosts++
	dev, err := goroce.Open(goroce.Config{Addr: netip.AddrFrom4([4]byte{10, 0, 1, byte(cl.hosts)}), Network: cl.net})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// client connects a client on dev, over a net.Pipe: the setup needs no socket either.
func (cl *cluster) client(t *testing.T, dev *goroce.Device, opts *goroce.ConnectOptions) *Client {
	t.Helper()
	c1, c2 := net.Pipe()
	go cl.server.ServeConn(c2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewClient(ctx, dev, c1, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPutGet(t *testing.T) {
	cl := newCluster(t, Config{})
	dev := cl.device(t)
	a, b := cl.client(t, dev, nil), cl.client(t, cl.device(t), nil)
	ctx := testContext(t)

	for k, v := range map[string]string{"alpha": "1", "beta": "two", "empty": ""} {
		if err := a.Put(ctx, []byte(k), []byte(v)); err != nil {
			t.Fatalf("Put(%q): %v", k, err)
		}
	}
	if err := a.Put(ctx, []byte("alpha"), bytes.Repeat([]byte("x"), DefaultMaxValue)); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"alpha": string(bytes.Repeat([]byte("x"), DefaultMaxValue)), "beta": "two", "empty": ""} {
		for _, c := range []*Client{a, b} {
			got, err := c.Get(ctx, []byte(k))
			if err != nil || string(got) != want {
				t.Errorf("Get(%q) = %q, %v; want %q", k, got, err, want)
			}
		}
	}
	if s := a.Stats(); s.Puts != 4 || s.Gets != 3 {
		t.Errorf("stats %+v, want 4 puts and 3 gets", s)
	}
}

func TestMissingKey(t *testing.T) {
	cl := newCluster(t, Config{MaxKey: 8, MaxValue: 16})
	c := cl.client(t, cl.device(t), nil)
	ctx := testContext(t)
	if _, err := c.Get(ctx, []byte("nothing")); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a missing key: %v, want ErrNotFound", err)
	}
	if err := c.Put(ctx, []byte("some"), []byte("value")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, []byte("other")); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a missing key: %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, []byte("too long a key")); !errors.Is(err, ErrKeyLength) {
		t.Errorf("Get of a long key: %v, want ErrKeyLength", err)
	}
	if err := c.Put(ctx, nil, []byte("v")); !errors.Is(err, ErrKeyLength) {
		t.Errorf("Put of an empty key: %v, want ErrKeyLength", err)
	}
	if err := c.Put(ctx, []byte("k"), make([]byte, 17)); !errors.Is(err, ErrValueTooLarge) {
		t.Errorf("Put of a long value: %v, want ErrValueTooLarge", err)
	}
}

// Keys that share slots fill the probe sequences, from several clients at once, until none is left.
func TestTableFull(t *testing.T) {
	const slots = 8
	cl := newCluster(t, Config{Slots: slots, Probes: slots})
	ctx := testContext(t)
	var wg sync.WaitGroup
	for w := range 4 {
		c := cl.client(t, cl.device(t), nil)
		wg.Go(func() {
			for i := range 2 {
				k := fmt.Sprintf("key%d", w*2+i)
				if err := c.Put(ctx, []byte(k), []byte(k)); err != nil {
					t.Errorf("Put(%s): %v", k, err)
				}
			}
		})
	}
	wg.Wait()
	c := cl.client(t, cl.device(t), nil)
	for i := range slots {
		k := fmt.Sprintf("key%d", i)
		if v, err := c.Get(ctx, []byte(k)); err != nil || string(v) != k {
			t.Errorf("Get(%s) = %q, %v", k, v, err)
		}
	}
	if err := c.Put(ctx, []byte("one more"), nil); !errors.Is(err, ErrTableFull) {
		t.Errorf("Put into a full table: %v, want ErrTableFull", err)
	}
}

// workload is concurrent writers and readers on a few keys. Every value says who wrote it and when,
// and its length and bytes follow from that, so a torn value cannot pass for a whole one.
type workload struct {
	keys    int
	writers int
	puts    int // per writer
	readers int
}

// maxValue is the table's MaxValue in the workloads.
const maxValue = 1000

// value returns what writer w puts under key k at its seq-th put.
func value(k, w, seq int) []byte {
	n := 8 + (seq*37+w*11)%(maxValue-8)
	b := make([]byte, n)
	binary.LittleEndian.PutUint16(b[0:], uint16(k))
	binary.LittleEndian.PutUint16(b[2:], uint16(w))
	binary.LittleEndian.PutUint32(b[4:], uint32(seq))
	for i := 8; i < n; i++ {
		b[i] = byte(i*k + w*31 + seq*7)
	}
	return b
}

// parse checks that v is a whole value of key k and returns its writer and seq.
func parse(k int, v []byte) (w, seq int, err error) {
	if len(v) < 8 {
		return 0, 0, fmt.Errorf("value of %d bytes", len(v))
	}
	w, seq = int(binary.LittleEndian.Uint16(v[2:])), int(binary.LittleEndian.Uint32(v[4:]))
	if got := int(binary.LittleEndian.Uint16(v[0:])); got != k {
		return 0, 0, fmt.Errorf("value of key %d under key %d", got, k)
	}
	want := value(k, w, seq)
	if len(v) != len(want) {
		return 0, 0, fmt.Errorf("torn value: %d bytes, writer %d's put %d has %d", len(v), w, seq, len(want))
	}
	for i := range v {
		if v[i] != want[i] {
			return 0, 0, fmt.Errorf("torn value: byte %d is %#x, writer %d's put %d has %#x", i, v[i], w, seq, want[i])
		}
	}
	return w, seq, nil
}

func key(k int) []byte { return fmt.Appendf(nil, "key-%d", k) }

// run runs the workload with clients made by newClient and checks that every GET returned a whole
// value, that no reader saw a writer's values of a key go back in time, and that each key ends with
// the last value one of the writers put there.
func (wl workload) run(t *testing.T, ctx context.Context, newClient func() *Client, seed uint64) Stats {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		total   Stats
		writing = make(chan struct{})
		last    = make([][]int, wl.writers) // last[w][k]: writer w's last seq for key k, -1 for none
	)
	add := func(s Stats) {
		mu.Lock()
		defer mu.Unlock()
		total.Gets += s.Gets
		total.Puts += s.Puts
		total.ReadRetries += s.ReadRetries
		total.LockRetries += s.LockRetries
	}
	var writers sync.WaitGroup
	for w := range wl.writers {
		c := newClient()
		last[w] = make([]int, wl.keys)
		for k := range last[w] {
			last[w][k] = -1
		}
		writers.Go(func() {
			defer func() { add(c.Stats()) }()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for seq := range wl.puts {
				k := rng.IntN(wl.keys)
				if err := c.Put(ctx, key(k), value(k, w, seq)); err != nil {
					t.Errorf("writer %d: Put: %v", w, err)
					return
				}
				last[w][k] = seq
			}
		})
	}
	for r := range wl.readers {
		c := newClient()
		wg.Go(func() {
			defer func() { add(c.Stats()) }()
			rng := rand.New(rand.NewPCG(seed, uint64(1000+r)))
			seen := make(map[[2]int]int) // (key, writer) → seq
			for done := false; !done; {
				select {
				case <-writing:
					done = true
				default:
				}
				k := rng.IntN(wl.keys)
				v, err := c.Get(ctx, key(k))
				if errors.Is(err, ErrNotFound) {
					continue
				}
				if err != nil {
					t.Errorf("reader %d: Get: %v", r, err)
					return
				}
				w, seq, err := parse(k, v)
				if err != nil {
					t.Errorf("reader %d, key %d: %v", r, k, err)
					return
				}
				if prev, ok := seen[[2]int{k, w}]; ok && seq < prev {
					t.Errorf("reader %d, key %d: writer %d's put %d after its put %d", r, k, w, seq, prev)
				}
				seen[[2]int{k, w}] = seq
			}
		})
	}
	writers.Wait()
	close(writing)
	wg.Wait()
	if t.Failed() {
		return total
	}
	if want := uint64(wl.writers * wl.puts); total.Puts != want || total.Gets == 0 {
		t.Errorf("%d puts and %d gets, want %d puts and some gets", total.Puts, total.Gets, want)
	}

	c := newClient()
	for k := range wl.keys {
		v, err := c.Get(ctx, key(k))
		if err != nil {
			t.Errorf("key %d: %v", k, err)
			continue
		}
		w, seq, err := parse(k, v)
		if err != nil {
			t.Errorf("key %d: %v", k, err)
			continue
		}
		if seq != last[w][k] {
			t.Errorf("key %d ends with writer %d's put %d, not its last there (%d)", k, w, seq, last[w][k])
		}
	}
	return total
}

// Writers race on the same keys while readers read them: no GET returns a torn value. Run with -race.
func TestConcurrentPutsAndGets(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	// With 256-byte packets a slot takes five, and a READ can meet a WRITE half done.
	opts := goroce.DefaultConnectOptions()
	opts.MTU = goroce.MTU256
	cl := newCluster(t, Config{Slots: 64, MaxValue: maxValue, Connect: &opts})
	devs := []*goroce.Device{cl.device(t), cl.device(t)}
	n := 0
	newClient := func() *Client {
		n++
		return cl.client(t, devs[n%len(devs)], &opts)
	}
	wl := workload{keys: 3, writers: 4, puts: 300, readers: 3}
	if testing.Short() {
		wl.puts = 50
	}
	s := wl.run(t, testContext(t), newClient, seed)
	t.Logf("%+v", s)
}

// The same on a network that loses, duplicates and reorders packets: the transport retransmits, the
// responders answer duplicates without running them twice, and the store stays whole.
func TestLossyNetwork(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	opts := goroce.DefaultConnectOptions()
	opts.Timeout = 13 // 4.096 us * 2^13, about 34 ms: retransmit sooner than the default 67 ms
	opts.MTU = goroce.MTU256
	cl := newCluster(t, Config{Slots: 64, MaxValue: maxValue, Connect: &opts})
	dev := cl.device(t)
	newClient := func() *Client { return cl.client(t, dev, &opts) }
	imp := goroce.Impairment{Loss: 0.05, Duplicate: 0.02, Reorder: 0.02, ReorderBy: 300 * time.Microsecond, Seed: seed}
	if err := cl.net.Impair(imp); err != nil {
		t.Fatal(err)
	}
	wl := workload{keys: 3, writers: 3, puts: 100, readers: 2}
	if testing.Short() {
		wl.puts = 30
	}
	s := wl.run(t, testContext(t), newClient, seed)
	ns := cl.net.Stats()
	t.Logf("%+v; network %+v", s, ns)
	if ns.Dropped == 0 {
		t.Error("the network dropped nothing")
	}
}

// A slot another client holds is not read until it is released: Get and Put retry until their
// context ends, and succeed after the release.
func TestLockedSlot(t *testing.T) {
	cl := newCluster(t, Config{})
	a, b := cl.client(t, cl.device(t), nil), cl.client(t, cl.device(t), nil)
	ctx := testContext(t)
	k := []byte("k")
	if err := a.Put(ctx, k, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	slot := b.table.probe(hashKey(k), 0)
	s, err := b.read(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.lock(ctx, slot, s.version); !ok || err != nil {
		t.Fatalf("lock: %v, %v", ok, err)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if v, err := a.Get(short, k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of a locked slot: %q, %v; want the deadline", v, err)
	}
	if err := a.Put(short, k, []byte("v2")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put to a locked slot: %v; want the deadline", err)
	}
	if s := a.Stats(); s.ReadRetries == 0 {
		t.Errorf("no read retries: %+v", s)
	}

	// Release as a writer does, without writing: the version moves on, the contents stay.
	release := &goroce.SendWR{Opcode: goroce.WRFetchAdd, Flags: goroce.Signaled, CompareAdd: 1,
		SGL:        []goroce.SGE{b.buf.SGE(b.atomicAt(), wordSize)},
		RemoteAddr: b.table.addr + uint64(slot*b.table.slotSize()) + offVersion, RKey: b.table.rkey}
	if err := b.run(ctx, release); err != nil {
		t.Fatal(err)
	}
	// The checksum covers the version, so the slot now reads as torn until rewritten: bump it by a
	// whole write instead.
	if ok, err := b.lock(ctx, slot, s.version+2); !ok || err != nil {
		t.Fatalf("lock: %v, %v", ok, err)
	}
	if err := b.write(ctx, slot, s.version+4, k, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Get(ctx, k); err != nil || string(v) != "v1" {
		t.Fatalf("Get after the release: %q, %v", v, err)
	}
	if err := a.Put(ctx, k, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get(ctx, k); err != nil || string(v) != "v2" {
		t.Fatalf("Get: %q, %v", v, err)
	}
}

// A slot whose bytes do not match its checksum, as a READ that mixed two writes would see it, is read
// again, not returned.
func TestTornSlot(t *testing.T) {
	cl := newCluster(t, Config{})
	a, b := cl.client(t, cl.device(t), nil), cl.client(t, cl.device(t), nil)
	ctx := testContext(t)
	k := []byte("k")
	if err := a.Put(ctx, k, []byte("whole")); err != nil {
		t.Fatal(err)
	}
	// b overwrites the value without the lock: the version stays even, the checksum stops matching.
	slot := b.table.probe(hashKey(k), 0)
	copy(b.buf.Bytes()[b.bodyAt():], "xx")
	wr := &goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{b.buf.SGE(b.bodyAt(), 2)},
		RemoteAddr: b.table.addr + uint64(slot*b.table.slotSize()+offKey+b.table.MaxKey), RKey: b.table.rkey}
	if err := b.run(ctx, wr); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if v, err := a.Get(short, k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of a torn slot: %q, %v; want the deadline", v, err)
	}
	if err := b.Put(short, k, []byte("again")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put to a torn slot: %v; want the deadline", err)
	}
}

// A client whose server is gone fails with the transport's error instead of hanging, and keeps failing.
func TestServerGone(t *testing.T) {
	cl := newCluster(t, Config{})
	c := cl.client(t, cl.device(t), nil) // gives up after 8 ACK timeouts of 67 ms
	ctx := testContext(t)
	if err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := cl.server.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := c.Get(ctx, []byte("k"))
	if !errors.Is(err, goroce.ErrRetryExceeded) && !errors.Is(err, goroce.ErrRemoteAccess) {
		t.Fatalf("Get from a closed server: %v", err)
	}
	if _, err2 := c.Get(ctx, []byte("k")); !errors.Is(err2, err) {
		t.Fatalf("second Get: %v, want %v again", err2, err)
	}
}

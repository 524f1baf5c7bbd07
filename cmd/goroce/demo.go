package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/wire"
)

func init() {
	register(command{"demo", "two software NICs on loopback: an RC connection, SEND, WRITE with immediate, READ and an atomic, traced packet by packet", runDemo})
}

type demoOptions struct {
	a, b  netip.Addr
	mtu   int
	loss  float64
	seed  uint64
	quiet bool
	write string // a pcapng file to capture the packets in
}

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	a := fs.String("a", "127.0.0.1", "address of device A (the requester)")
	b := fs.String("b", "127.0.0.2", "address of device B (the responder)")
	mtu := fs.Int("mtu", 1024, "path MTU: 256, 512, 1024, 2048 or 4096")
	loss := fs.Float64("loss", 0, "percentage of packets each device drops on send, to watch recovery")
	seed := fs.Uint64("seed", 0, "seed for -loss (0 picks one and prints it)")
	quiet := fs.Bool("q", false, "do not trace packets, print only the outcome")
	write := fs.String("w", "", "write the packets to `FILE`, pcapng, as tcpdump -w does (for Wireshark, tshark and goroce dump), the lost ones marked")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: goroce demo [-a addr] [-b addr] [-mtu n] [-loss percent] [-seed n] [-q] [-w file.pcapng]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	o := demoOptions{mtu: *mtu, loss: *loss, seed: *seed, quiet: *quiet, write: *write}
	var err error
	if o.a, err = netip.ParseAddr(*a); err != nil {
		return fmt.Errorf("-a: %v", err)
	}
	if o.b, err = netip.ParseAddr(*b); err != nil {
		return fmt.Errorf("-b: %v", err)
	}
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return demo(os.Stdout, o)
}

// tracePrinter prints a device's packets and completions as they happen. Both devices' goroutines
// call it, so it serializes its output.
type tracePrinter struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
	names map[netip.Addr]string
	quiet bool
	buf   []byte
}

// name names a device by its address: packets leave from the port of their QP, and go to 4791.
func (p *tracePrinter) name(a netip.AddrPort) string {
	if n, ok := p.names[a.Addr()]; ok {
		return n
	}
	return a.String()
}

func (p *tracePrinter) stamp(at time.Time) string {
	return fmt.Sprintf("%9.3fms", float64(at.Sub(p.start).Microseconds())/1000)
}

// Packet prints each packet once, when it is sent.
func (p *tracePrinter) Packet(e *goroce.TraceEvent) {
	if e.Dir != goroce.Sent || p.quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = e.Packet.AppendText(p.buf[:0])
	fmt.Fprintf(p.w, "%s  %s -> %s  %s\n", p.stamp(e.At), p.name(e.From), p.name(e.To), p.buf)
}

// lost prints a packet the impaired network dropped.
func (p *tracePrinter) lost(b []byte, from, to netip.AddrPort) {
	if p.quiet {
		return
	}
	pkt, err := wire.Parse(b)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s  %s -> %s  LOST: %v\n", p.stamp(time.Now()), p.name(from), p.name(to), pkt)
}

func (p *tracePrinter) Completion(at time.Time, wc goroce.Completion) {
	if p.quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s  completion on QP %v: %v %v wr=%d len=%d", p.stamp(at), wc.QPN, wc.Opcode, wc.Status, wc.WRID, wc.ByteLen)
	if wc.Flags&goroce.WithImm != 0 {
		fmt.Fprintf(p.w, " imm=%#x", wc.Imm)
	}
	fmt.Fprintln(p.w)
}

func demo(w io.Writer, o demoOptions) (err error) {
	mtu, ok := wire.MTUFromBytes(o.mtu)
	if !ok {
		return fmt.Errorf("-mtu %d: not an InfiniBand MTU", o.mtu)
	}
	tp := &tracePrinter{w: w, start: time.Now(), quiet: o.quiet, names: map[netip.Addr]string{}}
	var tracer goroce.Tracer = tp
	lost := tp.lost
	if o.write != "" {
		// Both devices into one file, each packet once; the loss callback marks the packets the
		// impaired host drops. Deferred first, so it runs after the devices have closed.
		cw, err := capture.Create(o.write, nil)
		if err != nil {
			return fmt.Errorf("-w: %w", err)
		}
		defer func() {
			if cerr := cw.Close(); cerr != nil {
				if err == nil {
					err = fmt.Errorf("-w %s: %w", o.write, cerr)
				}
				return
			}
			fmt.Fprintf(w, "\nwrote %d packets to %s (goroce dump %s)\n", cw.Packets(), o.write, o.write)
		}()
		ct := cw.Tracer(tp)
		tracer = ct
		lost = func(b []byte, from, to netip.AddrPort) {
			ct.Lost(b, from, to)
			tp.lost(b, from, to)
		}
	}
	var network goroce.Network
	if o.loss > 0 {
		h, err := goroce.NewImpairedHost(goroce.Impairment{Loss: o.loss / 100, Seed: o.seed, Dropped: lost})
		if err != nil {
			return err
		}
		network = h
	}
	open := func(addr netip.Addr, name string) (*goroce.Device, error) {
		tp.names[addr] = name
		cfg := goroce.Config{Addr: addr, Port: goroce.DefaultPort, Tracer: tracer, Network: network}
		d, err := goroce.Open(cfg)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", name, err)
		}
		return d, nil
	}
	fmt.Fprintf(w, "goroce demo: device A on %v, device B on %v, UDP port %d, path MTU %d", o.a, o.b, goroce.DefaultPort, o.mtu)
	if o.loss > 0 {
		fmt.Fprintf(w, ", %.1f%% loss (-seed %d)", o.loss, o.seed)
	}
	fmt.Fprintln(w)
	devA, err := open(o.a, "A")
	if err != nil {
		return err
	}
	defer devA.Close()
	devB, err := open(o.b, "B")
	if err != nil {
		return err
	}
	defer devB.Close()

	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()
	cqA, _ := devA.CreateCQ(64)
	cqB, _ := devB.CreateCQ(64)
	qpA, err := pdA.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqA, RecvCQ: cqA})
	if err != nil {
		return err
	}
	qpB, err := pdB.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqB, RecvCQ: cqB})
	if err != nil {
		return err
	}
	ia, ib := qpA.Endpoint(), qpB.Endpoint()
	fmt.Fprintf(w, "A: QP %v, first PSN %v, GID %v\nB: QP %v, first PSN %v, GID %v\n", ia.QPN, ia.PSN, ia.GID, ib.QPN, ib.PSN, ib.GID)
	opts := goroce.DefaultConnectOptions()
	opts.MTU, opts.Timeout = mtu, 10 // 4 ms ACK timeout: loss recovers quickly
	if err := qpA.Connect(ib, &opts); err != nil {
		return err
	}
	if err := qpB.Connect(ia, &opts); err != nil {
		return err
	}
	fmt.Fprintln(w, "both QPs connected (RESET -> INIT -> RTR -> RTS)")

	// Memory: A's source and landing buffers; B's receive buffers, an RDMA target and a counter.
	const sendLen, writeLen, readLen = 3000, 2500, 5000
	srcA, _ := pdA.RegMR(make([]byte, 8192), goroce.LocalWrite)
	fillText(srcA.Bytes())
	landA, _ := pdA.RegMR(make([]byte, 8192), goroce.LocalWrite)
	recvB, _ := pdB.RegMR(make([]byte, 8192), goroce.LocalWrite)
	targetB, _ := pdB.RegMR(make([]byte, 8192), goroce.LocalWrite|goroce.RemoteWrite|goroce.RemoteRead|goroce.RemoteAtomic)
	for i := 4096; i < 8192; i++ {
		targetB.Bytes()[i] = byte('a' + i%26)
	}
	binary.NativeEndian.PutUint64(targetB.Bytes()[8184:], 41)

	step := func(s string) {
		if !o.quiet {
			fmt.Fprintf(w, "\n--- %s\n", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	one := func(cq *goroce.CQ) (goroce.Completion, error) {
		wc := make([]goroce.Completion, 1)
		if _, err := cq.Wait(ctx, wc); err != nil {
			return goroce.Completion{}, fmt.Errorf("waiting for a completion: %w", err)
		}
		if wc[0].Status != goroce.StatusSuccess {
			return wc[0], fmt.Errorf("work request %d failed: %v", wc[0].WRID, wc[0].Status)
		}
		return wc[0], nil
	}

	step(fmt.Sprintf("SEND of %d bytes: segmented by the %d-byte MTU, AckReq on the last packet, one ACK", sendLen, o.mtu))
	if err := qpB.PostRecv(&goroce.RecvWR{WRID: 100, SGL: []goroce.SGE{recvB.SGE(0, 4096)}}); err != nil {
		return err
	}
	if err := qpA.PostSend(&goroce.SendWR{WRID: 1, Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{srcA.SGE(0, sendLen)}}); err != nil {
		return err
	}
	if _, err := one(cqA); err != nil {
		return err
	}
	if _, err := one(cqB); err != nil {
		return err
	}

	step(fmt.Sprintf("RDMA WRITE with immediate of %d bytes into B's memory: the immediate consumes a receive at B", writeLen))
	if err := qpB.PostRecv(&goroce.RecvWR{WRID: 101}); err != nil {
		return err
	}
	if err := qpA.PostSend(&goroce.SendWR{WRID: 2, Opcode: goroce.WRRDMAWriteImm, Imm: 0xC0FFEE, Flags: goroce.Signaled,
		SGL: []goroce.SGE{srcA.SGE(0, writeLen)}, RemoteAddr: targetB.Addr(), RKey: targetB.RKey()}); err != nil {
		return err
	}
	if _, err := one(cqA); err != nil {
		return err
	}
	if _, err := one(cqB); err != nil {
		return err
	}

	step(fmt.Sprintf("RDMA READ of %d bytes from B: one request, the responses take one PSN each", readLen))
	if err := qpA.PostSend(&goroce.SendWR{WRID: 3, Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
		SGL: []goroce.SGE{landA.SGE(0, readLen)}, RemoteAddr: targetB.Addr() + 3000, RKey: targetB.RKey()}); err != nil {
		return err
	}
	if _, err := one(cqA); err != nil {
		return err
	}

	step("ATOMIC FETCH_AND_ADD of 1 on B's counter: the reply carries the value before the add")
	if err := qpA.PostSend(&goroce.SendWR{WRID: 4, Opcode: goroce.WRFetchAdd, Flags: goroce.Signaled,
		SGL: []goroce.SGE{landA.SGE(8184, 8)}, RemoteAddr: targetB.Addr() + 8184, RKey: targetB.RKey(), CompareAdd: 1}); err != nil {
		return err
	}
	if _, err := one(cqA); err != nil {
		return err
	}

	fmt.Fprintln(w, "\n--- checking the data on both sides")
	var problems []string
	check := func(what string, ok bool) {
		mark := "ok"
		if !ok {
			mark = "WRONG"
			problems = append(problems, what)
		}
		fmt.Fprintf(w, "  %-58s %s\n", what, mark)
	}
	check(fmt.Sprintf("B received the %d bytes A sent", sendLen), bytes.Equal(recvB.Bytes()[:sendLen], srcA.Bytes()[:sendLen]))
	check(fmt.Sprintf("B's memory holds the %d bytes A wrote", writeLen), bytes.Equal(targetB.Bytes()[:writeLen], srcA.Bytes()[:writeLen]))
	check(fmt.Sprintf("A read back %d bytes of B's memory", readLen), bytes.Equal(landA.Bytes()[:readLen], targetB.Bytes()[3000:3000+readLen]))
	check("A got the counter's old value, 41", binary.NativeEndian.Uint64(landA.Bytes()[8184:]) == 41)
	check("B's counter is now 42", binary.NativeEndian.Uint64(targetB.Bytes()[8184:]) == 42)

	fmt.Fprintln(w, "\n--- counters")
	printStats(w, "A", devA.Stats())
	printStats(w, "B", devB.Stats())
	if len(problems) > 0 {
		return fmt.Errorf("data check failed: %v", problems)
	}
	return nil
}

// printStats prints a device's non-zero counters, rxe's names first.
func printStats(w io.Writer, name string, s goroce.Stats) {
	fmt.Fprintf(w, "  %s: tx %d packets (%d bytes), rx %d packets (%d bytes)", name, s.TxPackets, s.TxBytes, s.RxPackets, s.RxBytes)
	for _, d := range []struct {
		n string
		v uint64
	}{{"drop_malformed", s.DropMalformed}, {"drop_icrc", s.DropICRC}, {"drop_unknown_qpn", s.DropUnknownQPN},
		{"drop_wrong_peer", s.DropWrongPeer}, {"drop_truncated", s.DropTruncated}, {"gso_fallback", s.GSOFallback}} {
		if d.v > 0 {
			fmt.Fprintf(w, ", %s %d", d.n, d.v)
		}
	}
	fmt.Fprintln(w)
	line := "    "
	s.QP.Each(func(n string, v uint64) {
		if v == 0 || n == "sent_pkts" || n == "rcvd_pkts" {
			return
		}
		line += fmt.Sprintf("%s=%d ", n, v)
	})
	if line != "    " {
		fmt.Fprintln(w, line)
	}
}

// fillText fills b with readable text, so that a capture of the demo shows what moved.
func fillText(b []byte) {
	const s = "goroce: RDMA over Converged Ethernet v2, in Go. "
	for i := range b {
		b[i] = s[i%len(s)]
	}
}

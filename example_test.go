package goroce_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/goroce/goroce"
)

// A first program: two devices on the in-memory network, one RC connection, and a SEND, an RDMA
// WRITE, an RDMA READ and a fetch-and-add from A to B, each checked through Completion.Err. Between
// two hosts the same code opens its device on the host's address (no Network) and sends its
// Endpoint to the peer over any channel (Endpoint.MarshalBinary).
func Example() {
	network := goroce.NewMemNetwork() // no sockets: the devices talk in memory, on any OS
	var qps [2]*goroce.QP
	var cqs [2]*goroce.CQ
	var mrs [2]*goroce.MR
	for i, addr := range []string{"10.0.0.1", "10.0.0.2"} {
		dev, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(addr), Network: network})
		check(err)
		pd, err := dev.AllocPD()
		check(err)
		cqs[i], err = dev.CreateCQ(16)
		check(err)
		qps[i], err = pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqs[i], RecvCQ: cqs[i]})
		check(err)
		mrs[i], err = pd.AllocMR(64, goroce.LocalWrite|goroce.RemoteWrite|goroce.RemoteRead|goroce.RemoteAtomic)
		check(err)
		defer closeAll(dev, pd, cqs[i], qps[i], mrs[i])
	}
	check(qps[0].Connect(qps[1].Endpoint(), nil)) // connect both ends before either sends
	check(qps[1].Connect(qps[0].Endpoint(), nil))
	a, b := mrs[0], mrs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	await := func(cq *goroce.CQ) goroce.Completion { // the next completion, which must have succeeded
		wc := make([]goroce.Completion, 1)
		_, err := cq.Wait(ctx, wc)
		check(err)
		check(wc[0].Err()) // a failure matches its status: errors.Is(err, goroce.ErrRemoteAccess)
		return wc[0]
	}

	check(qps[1].PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{b.SGE(0, 64)}}))
	copy(a.Bytes(), "hello")
	check(qps[0].PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{a.SGE(0, 5)}}))
	await(cqs[0])
	fmt.Printf("B received %q\n", b.Bytes()[:await(cqs[1]).ByteLen])
	onB := func(op goroce.WROpcode, local goroce.SGE, off uint64) goroce.Completion { // op at B's region + off
		check(qps[0].PostSend(&goroce.SendWR{Opcode: op, Flags: goroce.Signaled, SGL: []goroce.SGE{local},
			RemoteAddr: b.Addr() + off, RKey: b.RKey(), CompareAdd: 1})) // CompareAdd: the addend
		return await(cqs[0])
	}
	copy(a.Bytes()[8:], "world")
	onB(goroce.WRRDMAWrite, a.SGE(8, 5), 16)
	rd := onB(goroce.WRRDMARead, a.SGE(24, 5), 16)
	fmt.Printf("A read back %q\n", a.Bytes()[24:24+rd.ByteLen])
	onB(goroce.WRFetchAdd, a.SGE(32, 8), 40) // the original value, in host byte order, lands at a[32:40]
	fmt.Println("fetch-and-add returned", binary.NativeEndian.Uint64(a.Bytes()[32:]), "and left", binary.NativeEndian.Uint64(b.Bytes()[40:]))
	// Output:
	// B received "hello"
	// A read back "world"
	// fetch-and-add returned 0 and left 1
}

// RDMA WRITE puts bytes into the peer's registered memory without involving its CPU: the peer learns
// nothing unless the last WRITE carries an immediate, which completes one of its receives. Several
// work requests go in one PostSend, as a chain of ibv_send_wr does.
func Example_rdmaWrite() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	connect(qa, qb)
	src := a.mr(64, goroce.LocalWrite)
	dst := b.mr(64, goroce.LocalWrite|goroce.RemoteWrite) // what B lets A do

	// A WRITE with immediate consumes a receive at B, which needs no buffer: the data goes to RemoteAddr.
	check(qb.PostRecv(&goroce.RecvWR{WRID: 7}))
	copy(src.Bytes(), "hello, remote memory")
	check(qa.PostSend(
		&goroce.SendWR{WRID: 1, Opcode: goroce.WRRDMAWrite, SGL: []goroce.SGE{src.SGE(0, 7)},
			RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		&goroce.SendWR{WRID: 2, Opcode: goroce.WRRDMAWriteImm, Flags: goroce.Signaled, Imm: 20,
			SGL: []goroce.SGE{src.SGE(7, 13)}, RemoteAddr: dst.Addr() + 7, RKey: dst.RKey()},
	))
	wc := a.wait() // only the signaled WRITE completes at A (a failed one would complete either way)
	fmt.Println("A:", wc.WRID, wc.Opcode)
	wc = b.wait()
	fmt.Println("B:", wc.WRID, wc.Opcode, "imm", wc.Imm)
	fmt.Printf("B's memory: %q\n", dst.Bytes()[:wc.Imm])
	// Output:
	// A: 2 RDMA_WRITE
	// B: 7 RECV_RDMA_WITH_IMM imm 20
	// B's memory: "hello, remote memory"
}

// RDMA READ copies from the peer's registered memory into a local region; the completion's ByteLen
// says how much.
func Example_rdmaRead() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	connect(qa, qb)
	dst := a.mr(64, goroce.LocalWrite) // a READ writes locally: LocalWrite
	src := b.mr(64, goroce.RemoteRead)
	copy(src.Bytes(), "B's data, read by A")

	check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
		SGL: []goroce.SGE{dst.SGE(0, 19)}, RemoteAddr: src.Addr(), RKey: src.RKey()}))
	wc := a.wait()
	fmt.Println(wc.Opcode, wc.ByteLen)
	fmt.Printf("%q\n", dst.Bytes()[:wc.ByteLen])
	// Output:
	// RDMA_READ 19
	// "B's data, read by A"
}

// Compare-and-swap replaces the peer's 8-byte word if it holds CompareAdd, and returns the word's
// original value into the local SGE either way. Both the remote word and the returned value are in
// host byte order (binary.NativeEndian), as rxe has them, not in network order: the peer stores and
// reads its word as a plain uint64. The remote address must be 8-byte aligned.
func Example_compareSwap() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	connect(qa, qb)
	orig := a.mr(8, goroce.LocalWrite) // the original value lands here
	word := b.mr(8, goroce.LocalWrite|goroce.RemoteAtomic)
	binary.NativeEndian.PutUint64(word.Bytes(), 5)

	cas := func(compare, swap uint64) {
		check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRCompareSwap, Flags: goroce.Signaled,
			CompareAdd: compare, Swap: swap, SGL: []goroce.SGE{orig.SGE(0, 8)},
			RemoteAddr: word.Addr(), RKey: word.RKey()}))
		a.wait()
		fmt.Printf("CAS(%d→%d): original %d, now %d\n", compare, swap,
			binary.NativeEndian.Uint64(orig.Bytes()), binary.NativeEndian.Uint64(word.Bytes()))
	}
	cas(5, 9) // swaps
	cas(5, 7) // does not: the word holds 9
	// Output:
	// CAS(5→9): original 5, now 9
	// CAS(5→7): original 9, now 9
}

// Fetch-and-add adds CompareAdd to the peer's 8-byte word and returns the original value into the
// local SGE, both in host byte order (binary.NativeEndian), as for compare-and-swap.
func Example_fetchAdd() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	connect(qa, qb)
	orig := a.mr(8, goroce.LocalWrite)
	counter := b.mr(8, goroce.LocalWrite|goroce.RemoteAtomic)
	binary.NativeEndian.PutUint64(counter.Bytes(), 40)

	for range 2 {
		check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRFetchAdd, Flags: goroce.Signaled, CompareAdd: 1,
			SGL: []goroce.SGE{orig.SGE(0, 8)}, RemoteAddr: counter.Addr(), RKey: counter.RKey()}))
		a.wait()
		fmt.Println("fetched", binary.NativeEndian.Uint64(orig.Bytes()))
	}
	fmt.Println("counter", binary.NativeEndian.Uint64(counter.Bytes()))
	// Output:
	// fetched 40
	// fetched 41
	// counter 42
}

// SEND with immediate delivers a message into the peer's next posted receive, and 32 bits of
// immediate data into its completion. A SEND that finds no receive posted waits (RNR NAKs) and fails
// with ErrRNRRetryExceeded after ConnectOptions.RNRRetry tries: post receives first.
func Example_sendWithImmediate() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	connect(qa, qb)
	src := a.mr(64, goroce.LocalWrite)
	dst := b.mr(64, goroce.LocalWrite) // receives write locally

	check(qb.PostRecv(&goroce.RecvWR{WRID: 100, SGL: []goroce.SGE{dst.SGE(0, 64)}}))
	n := copy(src.Bytes(), "ping")
	check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSendImm, Flags: goroce.Signaled, Imm: 0xC0FFEE,
		SGL: []goroce.SGE{src.SGE(0, n)}}))
	fmt.Println("A:", a.wait().Opcode)
	wc := b.wait()
	fmt.Printf("B: receive %d, %v, %q, imm %#x (flag %v)\n", wc.WRID, wc.Opcode, dst.Bytes()[:wc.ByteLen],
		wc.Imm, wc.Flags&goroce.WithImm != 0)
	// Output:
	// A: SEND
	// B: receive 100, RECV, "ping", imm 0xc0ffee (flag true)
}

// A shared receive queue feeds the receives of every QP created with it: a server with many
// connections posts one pool of buffers instead of one per connection. The completion's QPN says
// which connection a message came on.
func Example_sharedReceiveQueue() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	srq, err := b.pd.CreateSRQ(16, 1)
	check(err)
	b.opened = append(b.opened, srq) // closed after the QPs that use it
	a1, a2 := a.qp(goroce.RC, nil), a.qp(goroce.RC, nil)
	b1, b2 := b.qp(goroce.RC, srq), b.qp(goroce.RC, srq)
	connect(a1, b1)
	connect(a2, b2)
	src := a.mr(64, goroce.LocalWrite)
	pool := b.mr(2*32, goroce.LocalWrite)
	check(srq.PostRecv( // two receives for whichever QP needs one first
		&goroce.RecvWR{WRID: 0, SGL: []goroce.SGE{pool.SGE(0, 32)}},
		&goroce.RecvWR{WRID: 1, SGL: []goroce.SGE{pool.SGE(32, 32)}},
	))
	names := map[goroce.QPN]string{b1.QPN(): "b1", b2.QPN(): "b2"}
	for _, s := range []struct {
		qp  *goroce.QP
		msg string
	}{{a2, "to b2"}, {a1, "to b1"}} {
		n := copy(src.Bytes(), s.msg)
		check(s.qp.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{src.SGE(0, n)}}))
		a.wait()
		wc := b.wait()
		buf := pool.Bytes()[wc.WRID*32:]
		fmt.Printf("%s took receive %d: %q\n", names[wc.QPN], wc.WRID, buf[:wc.ByteLen])
	}
	fmt.Println("receives left:", srq.Len())
	// Output:
	// b2 took receive 0: "to b2"
	// b1 took receive 1: "to b1"
	// receives left: 0
}

// A UD queue pair sends datagrams of up to one MTU to any UD queue pair that shares its Q_Key, with no
// connection: each SendWR names the destination (an address handle, QPN and Q_Key). The receive buffer
// starts with the 40-byte GRH (Completion.Flags has WithGRH, ByteLen counts it): for IPv4 peers 20
// unused bytes and the IPv4 header, for IPv6 the IPv6 header. IBTA Annex A17.4.5.2.
func Example_unreliableDatagram() {
	const grhLen = 40
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.UD, nil), b.qp(goroce.UD, nil)
	opts := goroce.DefaultConnectOptions()
	opts.QKey = 0x1234
	check(qa.Connect(goroce.Endpoint{}, &opts)) // UD: ready to send anywhere, no peer
	check(qb.Connect(goroce.Endpoint{}, &opts))
	src := a.mr(64, goroce.LocalWrite)
	dst := b.mr(grhLen+64, goroce.LocalWrite)

	check(qb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{dst.SGE(0, grhLen+64)}}))
	to := qb.Endpoint() // learned out of band, as for RC
	n := copy(src.Bytes(), "datagram")
	check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{src.SGE(0, n)},
		AH: to.AH(), RemoteQPN: to.QPN, RemoteQKey: opts.QKey}))
	a.wait()
	wc := b.wait()
	grh := dst.Bytes()[:grhLen]
	from := netip.AddrFrom4([4]byte(grh[20+12 : 20+16])) // the IPv4 header's source address
	fmt.Printf("%d bytes with GRH %v, from %v (QP ok: %v): %q\n", wc.ByteLen, wc.Flags&goroce.WithGRH != 0,
		from, wc.SrcQP == qa.QPN(), dst.Bytes()[grhLen:wc.ByteLen])
	// Output:
	// 48 bytes with GRH true, from 10.0.0.1 (QP ok: true): "datagram"
}

// The in-memory network lets an application's tests run without sockets, on any operating system, and
// makes it lose, delay, reorder or mark packets on request. An RC transfer completes intact despite
// the loss: the requester retransmits after its ACK timeout, here shortened so the test is quick.
func ExampleNewMemNetwork() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	opts := goroce.DefaultConnectOptions()
	opts.Timeout = 12 // 4.096 us * 2^12: retransmit after about 17 ms, not 67
	check(qa.Connect(qb.Endpoint(), &opts))
	check(qb.Connect(qa.Endpoint(), &opts))
	const size = 256 << 10 // 64 packets of 4096 bytes
	src := a.mr(size, goroce.LocalWrite)
	dst := b.mr(size, goroce.LocalWrite|goroce.RemoteWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i * 7)
	}

	check(network.Impair(goroce.Impairment{Loss: 0.1, Seed: 1})) // drop one datagram in ten
	check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
		SGL: []goroce.SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	a.wait()
	check(network.Impair(goroce.Impairment{})) // back to a perfect network
	fmt.Println("datagrams lost:", network.Stats().Dropped > 0)
	fmt.Println("retransmitted:", qa.Counters().CompleterRetryErr > 0)
	fmt.Println("intact:", bytes.Equal(src.Bytes(), dst.Bytes()))
	// Output:
	// datagrams lost: true
	// retransmitted: true
	// intact: true
}

// An Endpoint is what a peer needs to connect to a queue pair; programs exchange it out of band in its
// 26-byte binary form or its text form.
func ExampleEndpoint_MarshalBinary() {
	e, err := goroce.ParseEndpoint("000011:a1b2c3@127.0.0.1:4791/4096")
	check(err)
	b, err := e.MarshalBinary()
	check(err)
	var got goroce.Endpoint
	check(got.UnmarshalBinary(b))
	fmt.Println(len(b), got == e)
	fmt.Println("QPN", got.QPN, "PSN", got.PSN, "at", got.Addr(), "MTU", got.MTU.Bytes())
	// Output:
	// 26 true
	// QPN 0x000011 PSN 0xa1b2c3 at 127.0.0.1:4791 MTU 4096
}

// A failed work request completes with an error status; Completion.Err turns it into an error that
// matches one of the Err* values with errors.Is. The QP is then in the error state, and the device
// reports it on Events.
func ExampleCompletion_Err() {
	network := goroce.NewMemNetwork()
	a, b := newNode(network, "10.0.0.1"), newNode(network, "10.0.0.2")
	defer a.close()
	defer b.close()
	qa, qb := a.qp(goroce.RC, nil), b.qp(goroce.RC, nil)
	connect(qa, qb)
	src := a.mr(8, goroce.LocalWrite)
	readOnly := b.mr(8, goroce.RemoteRead) // no RemoteWrite

	check(qa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, SGL: []goroce.SGE{src.SGE(0, 8)},
		RemoteAddr: readOnly.Addr(), RKey: readOnly.RKey()})) // unsignaled: errors complete anyway
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	_, err := a.cq.Wait(ctx, wc)
	check(err)
	err = wc[0].Err()
	fmt.Println(errors.Is(err, goroce.ErrRemoteAccess), wc[0].Status)
	select {
	case ev := <-a.dev.Events():
		fmt.Println(ev.Type, ev.QP == qa, qa.State())
	case <-ctx.Done():
		panic(ctx.Err())
	}
	// Output:
	// true remote access error
	// QP fatal true ERR
}

// check stops an example at its first error.
func check(err error) {
	if err != nil {
		panic(err)
	}
}

// closeAll closes cs newest first, as ibverbs wants objects destroyed (queue pairs before their CQs,
// regions before their protection domain), and stops the example at an error.
func closeAll(cs ...io.Closer) {
	for i := len(cs) - 1; i >= 0; i-- {
		check(cs[i].Close())
	}
}

// node is one device of the examples, on an in-memory network, with a protection domain and a
// completion queue for its queue pairs.
type node struct {
	dev    *goroce.Device
	pd     *goroce.PD
	cq     *goroce.CQ
	opened []io.Closer // closed newest first by close
}

func newNode(network *goroce.MemNetwork, addr string) *node {
	dev, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(addr), Network: network})
	check(err)
	pd, err := dev.AllocPD()
	check(err)
	cq, err := dev.CreateCQ(16)
	check(err)
	return &node{dev: dev, pd: pd, cq: cq, opened: []io.Closer{dev, pd, cq}}
}

// qp creates a queue pair of type typ on n's CQ, taking its receives from srq if it is not nil.
func (n *node) qp(typ goroce.QPType, srq *goroce.SRQ) *goroce.QP {
	q, err := n.pd.CreateQP(goroce.QPInit{Type: typ, SendCQ: n.cq, RecvCQ: n.cq, SRQ: srq})
	check(err)
	n.opened = append(n.opened, q)
	return q
}

// mr allocates and registers size bytes with the rights in access.
func (n *node) mr(size int, access goroce.Access) *goroce.MR {
	m, err := n.pd.AllocMR(size, access)
	check(err)
	n.opened = append(n.opened, m)
	return m
}

// wait returns n's next completion, which must have succeeded.
func (n *node) wait() goroce.Completion {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	_, err := n.cq.Wait(ctx, wc)
	check(err)
	check(wc[0].Err())
	return wc[0]
}

// close closes what n opened, newest first: regions and queue pairs, then the CQ, the PD and the
// device, as ibverbs wants them destroyed.
func (n *node) close() { closeAll(n.opened...) }

// connect connects two RC queue pairs to each other. Between processes the Endpoints travel out of
// band, in their binary or text form.
func connect(a, b *goroce.QP) {
	check(a.Connect(b.Endpoint(), nil))
	check(b.Connect(a.Endpoint(), nil))
}

// Connecting the way RDMA applications do, through the RDMA connection manager: a listener on a port
// (rdma_listen), a request taken and accepted on one side and Dial on the other (rdma_connect), each
// ending with a connected RC queue pair and its CQs. Here the server posts its receive on a QP of its
// own before it accepts, as rdma_cm programs do, so that the client's first SEND finds it
// (Listener.Accept instead makes a QP for each connection); the client uses the QP Dial made. Close disconnects (DREQ), and the peer's Conn.Done closes. rping, perftest
// -R and librdmacm's examples connect so, and goroce rping speaks with them.
func ExampleDevice_Dial() {
	// The CM finds its peer at the UDP port it has itself: RoCEv2's 4791, as every RoCE device.
	network := goroce.NewMemNetwork()
	server, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.1"), Port: goroce.DefaultPort, Network: network})
	check(err)
	defer server.Close()
	client, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.2"), Port: goroce.DefaultPort, Network: network})
	check(err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The server: its QP, with a receive posted, then Listen and Accept.
	pd, err := server.AllocPD()
	check(err)
	cq, err := server.CreateCQ(8)
	check(err)
	qp, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
	check(err)
	buf, err := pd.AllocMR(64, goroce.LocalWrite)
	check(err)
	check(qp.Init())
	check(qp.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{buf.SGE(0, 64)}}))
	ln, err := server.Listen(7471, nil)
	check(err)
	defer ln.Close()
	accepted := make(chan *goroce.Conn, 1)
	go func() {
		req, err := ln.Request(ctx) // the REQ, before anything is answered (RDMA_CM_EVENT_CONNECT_REQUEST)
		check(err)
		so := goroce.DefaultCMOptions()
		so.PD, so.QP = pd, qp
		c, err := req.Accept(ctx, &so) // REP; returns once the RTU has come (ESTABLISHED)
		check(err)
		accepted <- c
	}()

	// The client: Dial, then a SEND on the connection's QP.
	co := goroce.DefaultCMOptions()
	co.PrivateData = []byte("hello from the client")
	c, err := client.Dial(ctx, ln.Addr().String(), &co)
	check(err)
	s := <-accepted
	fmt.Printf("server got %q\n", bytes.TrimRight(s.PrivateData(), "\x00"))
	check(c.QP().PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline, InlineData: []byte("ping")}))
	wc := make([]goroce.Completion, 1)
	_, err = s.RecvCQ().Wait(ctx, wc)
	check(err)
	check(wc[0].Err())
	fmt.Printf("server received %q\n", buf.Bytes()[:wc[0].ByteLen])

	check(c.Close()) // DREQ
	<-s.Done()
	fmt.Println("server saw:", s.Err())
	check(s.Close())
	check(qp.Close())
	// Output:
	// server got "hello from the client"
	// server received "ping"
	// server saw: goroce: connection disconnected by the peer
}

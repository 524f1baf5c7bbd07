package goroce_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/goroce/goroce"
)

// ExampleDevice_ResolveUD: a UD service as librdmacm's udaddy sets one up. The server offers its UD QP
// on an rdma_cm port with ListenUD; the client learns the QP's number and Q_Key with ResolveUD and
// sends it a datagram.
func ExampleDevice_ResolveUD() {
	network := goroce.NewMemNetwork()
	server, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.1"), Port: goroce.DefaultPort, Network: network})
	check(err)
	defer server.Close()
	client, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.2"), Port: goroce.DefaultPort, Network: network})
	check(err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Each side's UD QP and a region for its messages (a receive starts with 40 bytes of GRH).
	udQP := func(d *goroce.Device) (*goroce.QP, *goroce.CQ, *goroce.MR) {
		pd, err := d.AllocPD()
		check(err)
		cq, err := d.CreateCQ(8)
		check(err)
		qp, err := pd.CreateQP(goroce.QPInit{Type: goroce.UD, SendCQ: cq, RecvCQ: cq})
		check(err)
		buf, err := pd.AllocMR(256, goroce.LocalWrite)
		check(err)
		return qp, cq, buf
	}

	// The server posts its receive in INIT, then offers the QP on port 7174: ListenUD brings it to RTS
	// with rdma_cm's Q_Key and answers every SIDR request with its QPN.
	sqp, scq, sbuf := udQP(server)
	check(sqp.Init())
	check(sqp.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{sbuf.SGE(0, 256)}}))
	ln, err := server.ListenUD(7174, sqp, nil)
	check(err)
	defer ln.Close()

	// The client resolves the service and sends to what it learned.
	cqp, ccq, _ := udQP(client)
	svc, err := client.ResolveUD(ctx, "10.0.0.1:7174", &goroce.UDOptions{QP: cqp})
	check(err)
	fmt.Printf("QPN %v, Q_Key %#x\n", svc.QPN == sqp.QPN(), uint32(svc.QKey))
	wr := goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline, InlineData: []byte("hello")}
	svc.Address(&wr)
	check(cqp.PostSend(&wr))
	wc := make([]goroce.Completion, 1)
	_, err = ccq.Wait(ctx, wc)
	check(err)

	_, err = scq.Wait(ctx, wc)
	check(err)
	fmt.Printf("%q from QP %v\n", sbuf.Bytes()[40:wc[0].ByteLen], wc[0].SrcQP == cqp.QPN())
	// Output:
	// QPN true, Q_Key 0x1234567
	// "hello" from QP true
}

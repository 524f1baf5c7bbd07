package goroce_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/goroce/goroce"
)

// Two software NICs on loopback: an RC connection and an RDMA WRITE from one to the other.
func Example() {
	devA, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("127.0.2.1")})
	if err != nil {
		panic(err)
	}
	defer devA.Close()
	devB, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr("127.0.2.2")})
	if err != nil {
		panic(err)
	}
	defer devB.Close()

	// ibv_alloc_pd, ibv_create_cq, ibv_create_qp on each side.
	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()
	cqA, _ := devA.CreateCQ(16)
	cqB, _ := devB.CreateCQ(16)
	qpA, _ := pdA.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqA, RecvCQ: cqA})
	qpB, _ := pdB.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqB, RecvCQ: cqB})

	// The out-of-band exchange (QPN, PSN, GID), then RESET -> INIT -> RTR -> RTS.
	if err := qpA.Connect(qpB.Endpoint(), nil); err != nil {
		panic(err)
	}
	if err := qpB.Connect(qpA.Endpoint(), nil); err != nil {
		panic(err)
	}

	// ibv_reg_mr: A's source buffer, B's target that A may write.
	src, _ := pdA.RegMR([]byte("hello, remote memory"), goroce.LocalWrite)
	dst, _ := pdB.RegMR(make([]byte, 64), goroce.LocalWrite|goroce.RemoteWrite)

	// ibv_post_send an RDMA WRITE with immediate, then wait for its completions (ibv_req_notify_cq +
	// ibv_poll_cq): A's says the WRITE is acknowledged, B's that the data is in B's memory, for B to read.
	if err := qpB.PostRecv(&goroce.RecvWR{WRID: 7}); err != nil {
		panic(err)
	}
	err = qpA.PostSend(&goroce.SendWR{
		WRID: 1, Opcode: goroce.WRWriteImm, Imm: 42, Flags: goroce.Signaled,
		SGL:        []goroce.SGE{src.SGE(0, len(src.Bytes()))},
		RemoteAddr: dst.Addr(), RKey: dst.RKey(),
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	if _, err := cqA.Wait(ctx, wc); err != nil {
		panic(err)
	}
	fmt.Println("A:", wc[0].Opcode, wc[0].Status, wc[0].ByteLen)
	if _, err := cqB.Wait(ctx, wc); err != nil {
		panic(err)
	}
	fmt.Println("B:", wc[0].Opcode, wc[0].Status, "imm", wc[0].Imm)
	fmt.Printf("%s\n", dst.Bytes()[:20])
	// Output:
	// A: RDMA_WRITE success 20
	// B: RECV_RDMA_WITH_IMM success imm 42
	// hello, remote memory
}

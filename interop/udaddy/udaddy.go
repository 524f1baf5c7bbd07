// Package udaddy is a goroce peer for librdmacm's udaddy (rdma-core librdmacm/examples/udaddy.c): a UD
// service resolved through the RDMA CM (SIDR on an RDMA_PS_UDP port, 7174 by default), then datagrams
// each way. udaddy's client posts its receives, resolves the service and sends its messages (10 of 100
// bytes by default, SEND with immediate, the immediate its QPN); its server posts its receives,
// accepts, takes the client's messages and then sends as many back, to the address in the first
// one's GRH and the QPN in its immediate, with its own Q_Key. Both UD QPs hold rdma_cm's Q_Key
// (goroce.RDMAUDPQKey). Server and Client do the same and return how many messages they received,
// each checked for its length and sender.
package udaddy

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/goroce/goroce"
)

// DefaultPort is udaddy's rdma_cm port in the RDMA_PS_UDP space.
const DefaultPort = 7174

// udaddy's defaults: its -C and -S.
const (
	DefaultCount = 10
	DefaultSize  = 100
)

// grhLen is the GRH each UD receive buffer starts with.
const grhLen = 40

// endpoint is one side's UD QP, its CQs and one receive buffer per message. Sends and receives
// complete on CQs of their own, so that waiting for the one never consumes the other: a client's
// replies may complete before its own sends have been reaped.
type endpoint struct {
	pd    *goroce.PD
	scq   *goroce.CQ // send completions
	rcq   *goroce.CQ // receive completions
	qp    *goroce.QP
	mr    *goroce.MR
	count int
	size  int
}

func newEndpoint(dev *goroce.Device, count, size int) (*endpoint, error) {
	if count <= 0 || size <= 0 {
		return nil, fmt.Errorf("udaddy: count %d and size %d must be positive", count, size)
	}
	e := &endpoint{count: count, size: size}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.scq, err = dev.CreateCQ(count); err == nil {
		e.rcq, err = dev.CreateCQ(count)
	}
	if err == nil {
		e.qp, err = e.pd.CreateQP(goroce.QPInit{Type: goroce.UD, SendCQ: e.scq, RecvCQ: e.rcq, MaxSendWR: count,
			MaxRecvWR: count, MaxSendSGE: 1, MaxRecvSGE: 1})
	}
	if err == nil {
		e.mr, err = e.pd.AllocMR(count*(grhLen+size)+size, goroce.LocalWrite)
	}
	if err == nil {
		err = e.qp.Init()
	}
	for i := 0; err == nil && i < count; i++ {
		err = e.qp.PostRecv(&goroce.RecvWR{WRID: uint64(i), SGL: []goroce.SGE{e.mr.SGE(i*(grhLen+size), grhLen+size)}})
	}
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *endpoint) close() {
	if e.qp != nil {
		_ = e.qp.Close()
	}
	if e.mr != nil {
		_ = e.mr.Close()
	}
	for _, cq := range []*goroce.CQ{e.scq, e.rcq} {
		if cq != nil {
			_ = cq.Close()
		}
	}
	if e.pd != nil {
		_ = e.pd.Close()
	}
}

// peer is where the first datagram came from: the GRH's source address (IPv4 in its last 20 bytes,
// IPv6 in its first 40) and the QPN in its immediate.
type peer struct {
	addr netip.Addr
	qpn  goroce.QPN
}

// receive waits for count datagrams, checks each (a SEND with immediate of size bytes), and returns
// the sender of the first.
func (e *endpoint) receive(ctx context.Context) (int, peer, error) {
	var from peer
	wc := make([]goroce.Completion, 8)
	got := 0
	for got < e.count {
		n, err := e.rcq.Wait(ctx, wc)
		if err != nil {
			return got, from, fmt.Errorf("udaddy: after %d of %d messages: %w", got, e.count, err)
		}
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return got, from, fmt.Errorf("udaddy: receive: %w", err)
			}
			if c.Flags&goroce.WithImm == 0 || c.Flags&goroce.WithGRH == 0 || int(c.ByteLen) != grhLen+e.size {
				return got, from, fmt.Errorf("udaddy: message of %d bytes (flags %v); want %d with immediate and GRH", c.ByteLen, c.Flags, grhLen+e.size)
			}
			if got == 0 {
				g := e.mr.Bytes()[int(c.WRID)*(grhLen+e.size):]
				if g[0]>>4 == 6 {
					from.addr = netip.AddrFrom16([16]byte(g[8:24]))
				} else {
					from.addr = netip.AddrFrom4([4]byte(g[20+12 : 20+16]))
				}
				from.qpn = goroce.QPN(c.Imm)
			}
			got++
		}
	}
	return got, from, nil
}

// send sends count messages of size bytes to wr's destination, SEND with immediate (this QP's QPN),
// and waits for their completions.
func (e *endpoint) send(ctx context.Context, wr goroce.SendWR) error {
	off := e.count * (grhLen + e.size)
	for i := range e.size {
		e.mr.Bytes()[off+i] = byte(i)
	}
	wr.Opcode, wr.Flags, wr.Imm = goroce.WRSendImm, goroce.Signaled, uint32(e.qp.QPN())
	wr.SGL = []goroce.SGE{e.mr.SGE(off, e.size)}
	for i := range e.count {
		wr.WRID = uint64(1000 + i)
		if err := e.qp.PostSend(&wr); err != nil {
			return fmt.Errorf("udaddy: send %d: %w", i, err)
		}
	}
	wc := make([]goroce.Completion, 8)
	for done := 0; done < e.count; {
		n, err := e.scq.Wait(ctx, wc)
		if err != nil {
			return fmt.Errorf("udaddy: after %d of %d sends: %w", done, e.count, err)
		}
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return fmt.Errorf("udaddy: send: %w", err)
			}
			done++
		}
	}
	return nil
}

// Server answers SIDR requests on port with a UD QP whose receives are posted first, calls listening
// once it answers, takes count messages of size bytes and sends as many back to the first one's
// sender, as udaddy's server does. It returns how many messages it received.
func Server(ctx context.Context, dev *goroce.Device, port uint16, count, size int, listening func()) (int, error) {
	e, err := newEndpoint(dev, count, size)
	if err != nil {
		return 0, err
	}
	defer e.close()
	l, err := dev.ListenUD(port, e.qp, nil)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	if listening != nil {
		listening()
	}
	got, from, err := e.receive(ctx)
	if err != nil {
		return got, err
	}
	err = e.send(ctx, goroce.SendWR{AH: &goroce.AddressHandle{DGID: goroce.GIDFromAddr(from.addr), HopLimit: 64},
		RemoteQPN: from.qpn, RemoteQKey: l.QKey()})
	return got, err
}

// Client resolves the UD service at address ("host:port") with a UD QP whose receives are posted
// first, sends count messages of size bytes and takes as many back, as udaddy's client does. It
// returns how many messages it received.
func Client(ctx context.Context, dev *goroce.Device, address string, count, size int) (int, error) {
	e, err := newEndpoint(dev, count, size)
	if err != nil {
		return 0, err
	}
	defer e.close()
	s, err := dev.ResolveUD(ctx, address, &goroce.UDOptions{QP: e.qp})
	if err != nil {
		return 0, err
	}
	var wr goroce.SendWR
	s.Address(&wr)
	if err := e.send(ctx, wr); err != nil {
		return 0, err
	}
	got, _, err := e.receive(ctx)
	return got, err
}

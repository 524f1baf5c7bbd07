// Package rdmacm is a goroce peer for librdmacm's smallest examples, rdma_server and rdma_client
// (rdma-core librdmacm/examples): a connection through the RDMA CM on an RDMA_PS_TCP port (7471 by
// default), then one SEND of 16 bytes each way. The client posts its receive, connects, sends its
// message and waits for the server's; the server posts its receive, accepts, waits for the client's
// message and then sends its own. Each side then disconnects (a DREQ, possibly crossing the
// peer's). The examples send 16 bytes of zeros, sent inline, on QPs of one send and one receive work
// request, and check nothing; Server and Client return what they received, so that a caller can.
package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goroce/goroce"
)

// DefaultPort is the examples' rdma_cm port (their -p).
const DefaultPort = 7471

// MessageLen is the size of each side's message and receive buffer.
const MessageLen = 16

// Message is one side's message.
type Message [MessageLen]byte

// ErrShort is returned when the peer's SEND did not fill the receive buffer.
var ErrShort = errors.New("rdmacm: the peer's message is not 16 bytes")

// endpoint is one side's QP, its CQ and its receive buffer, made before the connection as
// rdma_create_ep makes them: one WR each way, one SGE, 16 bytes inline, every send signaled.
type endpoint struct {
	pd   *goroce.PD
	cq   *goroce.CQ
	qp   *goroce.QP
	recv *goroce.MR
	done []goroce.Completion // completions taken from the CQ and not yet waited for
}

// newEndpoint makes the QP in INIT with its receive posted, before the CM connects it.
func newEndpoint(dev *goroce.Device) (*endpoint, error) {
	e := &endpoint{}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(2); err == nil {
		e.qp, err = e.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 1, MaxRecvWR: 1,
			MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: MessageLen})
	}
	if err == nil {
		err = e.qp.Init()
	}
	if err == nil {
		e.recv, err = e.pd.AllocMR(MessageLen, goroce.LocalWrite)
	}
	if err == nil {
		err = e.qp.PostRecv(&goroce.RecvWR{WRID: 1, SGL: []goroce.SGE{e.recv.SGE(0, MessageLen)}})
	}
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// options are rdma_connect's and rdma_accept's with a NULL conn_param: no READs or atomics either
// way, retry counts of 7, and the endpoint's QP.
func (e *endpoint) options() *goroce.CMOptions {
	o := goroce.DefaultCMOptions()
	o.QP = e.qp
	o.ResponderResources, o.InitiatorDepth = 0, 0
	return &o
}

// send sends msg inline and waits for its completion.
func (e *endpoint) send(ctx context.Context, msg Message) error {
	if err := e.qp.PostSend(&goroce.SendWR{WRID: 2, Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline,
		InlineData: msg[:]}); err != nil {
		return fmt.Errorf("rdma_post_send: %w", err)
	}
	wc, err := e.wait(ctx, 2)
	if err != nil {
		return fmt.Errorf("rdma_get_send_comp: %w", err)
	}
	return wc.Err()
}

// receive waits for the peer's message.
func (e *endpoint) receive(ctx context.Context) (Message, error) {
	var m Message
	wc, err := e.wait(ctx, 1)
	if err == nil {
		err = wc.Err()
	}
	if err != nil {
		return m, fmt.Errorf("rdma_get_recv_comp: %w", err)
	}
	if wc.ByteLen != MessageLen {
		return m, fmt.Errorf("%w: %d bytes", ErrShort, wc.ByteLen)
	}
	copy(m[:], e.recv.Bytes())
	return m, nil
}

// wait returns the completion of work request wrid, keeping the other one if it comes first.
func (e *endpoint) wait(ctx context.Context, wrid uint64) (goroce.Completion, error) {
	var wc [2]goroce.Completion
	for {
		for i, c := range e.done {
			if c.WRID == wrid {
				e.done = append(e.done[:i], e.done[i+1:]...)
				return c, nil
			}
		}
		n, err := e.cq.Wait(ctx, wc[:])
		if err != nil {
			return goroce.Completion{}, err
		}
		e.done = append(e.done, wc[:n]...)
	}
}

func (e *endpoint) close() {
	if e.qp != nil {
		_ = e.qp.Close()
	}
	if e.recv != nil {
		_ = e.recv.Close()
	}
	if e.cq != nil {
		_ = e.cq.Close()
	}
	if e.pd != nil {
		_ = e.pd.Close()
	}
}

// Server serves one rdma_client on an rdma_cm port of dev, as rdma_server does: it takes the first
// connection request, accepts it with its receive posted, waits for the client's message, sends msg,
// and disconnects. listening, if not nil, is called once the port listens. It returns the client's
// message.
func Server(ctx context.Context, dev *goroce.Device, port uint16, msg Message, listening func()) (Message, error) {
	l, err := dev.Listen(port, nil)
	if err != nil {
		return Message{}, fmt.Errorf("rdma_listen: %w", err)
	}
	defer l.Close()
	if listening != nil {
		listening()
	}
	req, err := l.Request(ctx)
	if err != nil {
		return Message{}, fmt.Errorf("rdma_get_request: %w", err)
	}
	e, err := newEndpoint(dev)
	if err != nil {
		_ = req.Reject(nil)
		return Message{}, err
	}
	defer e.close()
	c, err := req.Accept(ctx, e.options())
	if err != nil {
		return Message{}, fmt.Errorf("rdma_accept: %w", err)
	}
	defer c.Close()
	got, err := e.receive(ctx)
	if err != nil {
		return got, err
	}
	err = e.send(ctx, msg)
	if errors.Is(err, goroce.ErrFlushed) && errors.Is(c.Err(), goroce.ErrDisconnected) {
		// The client disconnects as soon as it has the message: its DREQ may be handled before the ACK
		// of the SEND, which then completes flushed. rdma_server takes any completion as the end.
		err = nil
	}
	return got, err
}

// Client connects to an rdma_server at address ("host:port") over dev, as rdma_client does: its
// receive posted, it connects, sends msg, waits for the server's message, and disconnects. It
// returns the server's message.
func Client(ctx context.Context, dev *goroce.Device, address string, msg Message) (Message, error) {
	e, err := newEndpoint(dev)
	if err != nil {
		return Message{}, err
	}
	defer e.close()
	c, err := dev.Dial(ctx, address, e.options())
	if err != nil {
		return Message{}, fmt.Errorf("rdma_connect: %w", err)
	}
	defer c.Close()
	if err := e.send(ctx, msg); err != nil {
		return Message{}, err
	}
	got, err := e.receive(ctx)
	if err == nil {
		// rdma_server disconnects once its SEND completes, which takes this side's ACK. Closing at once
		// can move the QP to the error state before that ACK leaves, and the server's SEND then
		// retries into a QP that is gone (its rdma_get_send_comp never returns in time). So the client
		// lets the server go first, for a while.
		select {
		case <-c.Done():
		case <-ctx.Done():
		case <-time.After(serverGrace):
		}
	}
	return got, err
}

// serverGrace is how long Client waits for the server's disconnection after the server's message.
const serverGrace = 2 * time.Second

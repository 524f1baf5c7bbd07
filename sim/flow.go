package sim

import (
	"fmt"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
)

// Op is what a flow's work requests do.
type Op uint8

// Flow operations.
const (
	OpWrite Op = iota // RDMA WRITEs from Src into Dst's memory
	OpRead            // RDMA READs Src issues against Dst's memory: the data travels from Dst to Src
	OpSend            // SENDs from Src into receives posted at Dst
)

func (o Op) String() string {
	switch o {
	case OpWrite:
		return "WRITE"
	case OpRead:
		return "READ"
	case OpSend:
		return "SEND"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// ParseOp parses WRITE, READ or SEND (any case).
func ParseOp(s string) (Op, error) {
	switch s {
	case "write", "WRITE":
		return OpWrite, nil
	case "read", "READ":
		return OpRead, nil
	case "send", "SEND":
		return OpSend, nil
	}
	return 0, fmt.Errorf("sim: unknown operation %q (want write, read or send)", s)
}

// FlowSpec describes a flow: one RC connection between two hosts that moves Size bytes as a stream of
// MsgSize work requests, Depth of them outstanding.
type FlowSpec struct {
	Name     string
	Src, Dst *Host
	Op       Op
	Size     int64 // bytes; 0 runs until the simulation stops
	MsgSize  int   // bytes per work request; 0 means 64 KiB, or Size if smaller
	Depth    int   // work requests outstanding; 0 means 8
	Start    Time
	QP       QPOptions
}

// FlowStats is what a flow achieved.
type FlowStats struct {
	Posted, Completed int64 // bytes
	Messages          int64 // work requests completed successfully
	Finish            Time  // when the last byte completed; 0 while running
	Err               qp.Status
	ErrAt             Time
}

// Flow is a running flow.
type Flow struct {
	Spec       FlowSpec
	Req, Resp  *Endpoint // the requester on Src and the responder on Dst
	Stats      FlowStats
	idx        int
	s          *Sim
	src, dst   *mr.Region
	nextID     uint64
	recvPosted int
}

// AddFlow creates the flow's connection and schedules its start.
func (s *Sim) AddFlow(spec FlowSpec) (*Flow, error) {
	if spec.MsgSize <= 0 {
		spec.MsgSize = 64 << 10
	}
	if spec.Size > 0 && int64(spec.MsgSize) > spec.Size {
		spec.MsgSize = int(spec.Size)
	}
	if spec.Depth <= 0 {
		spec.Depth = 8
	}
	if spec.Name == "" {
		spec.Name = fmt.Sprintf("f%d", len(s.flows))
	}
	spec.QP.defaults()
	spec.QP.SendDepth = max(spec.QP.SendDepth, spec.Depth)
	spec.QP.RecvDepth = max(spec.QP.RecvDepth, spec.Depth)
	req, resp, err := s.ConnectRC(spec.Src, spec.Dst, spec.QP)
	if err != nil {
		return nil, err
	}
	f := &Flow{Spec: spec, Req: req, Resp: resp, idx: len(s.flows), s: s}
	req.flow, resp.flow = int32(f.idx), int32(f.idx)
	if f.src, err = spec.Src.Register(spec.MsgSize, mr.LocalWrite); err != nil {
		return nil, err
	}
	if f.dst, err = spec.Dst.Register(spec.MsgSize, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead); err != nil {
		return nil, err
	}
	req.OnCompletion = f.onCompletion
	resp.OnCompletion = f.onCompletion
	s.flows = append(s.flows, f)
	s.At(spec.Start, f.start)
	return f, nil
}

// Index returns the flow's position in Sim.Flows.
func (f *Flow) Index() int { return f.idx }

// Done reports whether the flow has moved all its bytes or failed.
func (f *Flow) Done() bool { return f.Stats.Finish != 0 || f.Stats.Err != qp.StatusSuccess }

// FCT returns the flow completion time, or 0 if it has not completed.
func (f *Flow) FCT() Time {
	if f.Stats.Finish == 0 {
		return 0
	}
	return f.Stats.Finish - f.Spec.Start
}

// Goodput returns completed bytes per second over the flow's life so far (up to now if running).
func (f *Flow) Goodput(now Time) float64 {
	end := now
	if f.Stats.Finish != 0 {
		end = f.Stats.Finish
	}
	if end <= f.Spec.Start {
		return 0
	}
	return float64(f.Stats.Completed) * 8 / (end - f.Spec.Start).Seconds()
}

// DataEndpoint returns the endpoint the flow's payload arrives at.
func (f *Flow) DataEndpoint() *Endpoint {
	if f.Spec.Op == OpRead {
		return f.Req
	}
	return f.Resp
}

func (f *Flow) start() {
	if f.Spec.Op == OpSend {
		for i := 0; i < f.Spec.Depth; i++ {
			f.postRecv()
		}
	}
	for i := 0; i < f.Spec.Depth; i++ {
		if !f.post() {
			break
		}
	}
}

func (f *Flow) postRecv() {
	sgl := []mr.SGE{{Addr: f.dst.IOVA(), Length: uint32(f.Spec.MsgSize), LKey: f.dst.LKey()}}
	if f.Resp.PostRecv(&qp.RecvWR{ID: uint64(f.recvPosted), SGL: sgl}) == nil {
		f.recvPosted++
	}
}

// post posts the next message; false when the flow has posted all its bytes.
func (f *Flow) post() bool {
	n := int64(f.Spec.MsgSize)
	if f.Spec.Size > 0 {
		n = min(n, f.Spec.Size-f.Stats.Posted)
	}
	if n <= 0 || f.Stats.Err != qp.StatusSuccess {
		return false
	}
	wr := qp.SendWR{ID: f.nextID, Flags: qp.Signaled,
		SGL: []mr.SGE{{Addr: f.src.IOVA(), Length: uint32(n), LKey: f.src.LKey()}}}
	switch f.Spec.Op {
	case OpWrite:
		wr.Opcode, wr.RemoteAddr, wr.RKey = qp.WRWrite, f.dst.IOVA(), f.dst.RKey()
	case OpRead:
		wr.Opcode, wr.RemoteAddr, wr.RKey = qp.WRRead, f.dst.IOVA(), f.dst.RKey()
	case OpSend:
		wr.Opcode = qp.WRSend
	}
	if err := f.Req.PostSend(&wr); err != nil {
		return false
	}
	f.nextID++
	f.Stats.Posted += n
	return true
}

func (f *Flow) onCompletion(ep *Endpoint, wc *qp.Completion) {
	if wc.Status != qp.StatusSuccess {
		if f.Stats.Err == qp.StatusSuccess {
			f.Stats.Err, f.Stats.ErrAt = wc.Status, f.s.now
		}
		return
	}
	if ep == f.Resp {
		if wc.Opcode == qp.CompRecv {
			f.postRecv()
		}
		return
	}
	f.Stats.Completed += int64(wc.ByteLen)
	f.Stats.Messages++
	if f.Spec.Size > 0 && f.Stats.Completed >= f.Spec.Size {
		f.Stats.Finish = f.s.now
		return
	}
	f.post()
}

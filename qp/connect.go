package qp

import (
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// ConnectParams are the attributes that take a queue pair from RESET to RTS. Which ones a transition
// uses depends on the QP type: UC ignores the RDMA READ, retry and RNR attributes, UD uses only the
// Q_Key and the SQ PSN.
type ConnectParams struct {
	AccessFlags mr.Access     // remote operations the peer may perform (RC, UC)
	QKey        wire.QKey     // UD
	AV          AddressHandle // the peer (RC, UC)
	PathMTU     wire.MTU
	DestQPN     wire.QPN
	RQPSN       wire.PSN // the first PSN the peer sends
	SQPSN       wire.PSN // the first PSN this QP sends
	Timeout     uint8
	RetryCnt    uint8
	RNRRetry    uint8
	MinRNRTimer uint8
	// RdAtomic, when not 0, is max_rd_atomic and max_dest_rd_atomic alike, as ibv_rc_pingpong and
	// perftest set them.
	RdAtomic uint8
	// MaxRdAtomic (the READs and atomics this QP may have outstanding as requester, its initiator
	// depth) and MaxDestRdAtomic (those it accepts as responder, its responder resources) are used
	// when RdAtomic is 0: the RDMA CM agrees on the two apart, each side's initiator depth bounded by
	// the other's responder resources (IBTA Vol 1 12.6.5, 12.6.8).
	MaxRdAtomic, MaxDestRdAtomic uint8
}

// Connect moves q from RESET through INIT and RTR to RTS, giving each transition the attributes it
// requires for q's type: the sequence an application runs with ibv_modify_qp after exchanging QPNs,
// PSNs and GIDs out of band.
func (q *QP) Connect(now time.Time, p *ConnectParams) error {
	rd, destRd := p.MaxRdAtomic, p.MaxDestRdAtomic
	if p.RdAtomic != 0 {
		rd, destRd = p.RdAtomic, p.RdAtomic
	}
	init := Attr{State: StateInit, AccessFlags: p.AccessFlags, QKey: p.QKey}
	rtr := Attr{State: StateRTR, AV: p.AV, PathMTU: p.PathMTU, DestQPN: p.DestQPN, RQPSN: p.RQPSN,
		MaxDestRdAtomic: destRd, MinRNRTimer: p.MinRNRTimer}
	rts := Attr{State: StateRTS, SQPSN: p.SQPSN, Timeout: p.Timeout, RetryCnt: p.RetryCnt, RNRRetry: p.RNRRetry,
		MaxRdAtomic: rd}
	var masks [3]AttrMask
	switch q.typ {
	case RC:
		masks = [3]AttrMask{
			AttrState | AttrAccessFlags,
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic,
		}
	case UC:
		masks = [3]AttrMask{
			AttrState | AttrAccessFlags,
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			AttrState | AttrSQPSN,
		}
	case UD:
		masks = [3]AttrMask{AttrState | AttrQKey, AttrState, AttrState | AttrSQPSN}
	}
	for i, a := range []*Attr{&init, &rtr, &rts} {
		if err := q.Modify(now, a, masks[i]); err != nil {
			return err
		}
	}
	return nil
}

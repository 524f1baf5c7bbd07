package qp

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// State is a queue pair's state. The values are those of enum ibv_qp_state. IBTA Vol 1 10.3.1 (QP state
// diagram).
type State uint8

// Queue pair states.
const (
	StateReset State = iota // just created: no packets in or out
	StateInit               // receives may be posted; no packets in or out
	StateRTR                // ready to receive: the responder runs
	StateRTS                // ready to send: requester and responder run
	StateSQD                // send queue drain: no new send work request starts
	StateSQE                // send queue error (UC, UD): sends flushed, receives run
	StateErr                // error: everything outstanding is flushed
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// AttrMask names the fields of an Attr that a Modify sets. The values are those of enum ibv_qp_attr_mask.
type AttrMask uint32

// Attribute mask bits.
const (
	AttrState           AttrMask = 1 << 0
	AttrAccessFlags     AttrMask = 1 << 3
	AttrPKey            AttrMask = 1 << 4 // IBV_QP_PKEY_INDEX: goroce keeps the key itself
	AttrPort            AttrMask = 1 << 5 // accepted and ignored: a goroce device has one port
	AttrQKey            AttrMask = 1 << 6
	AttrAV              AttrMask = 1 << 7
	AttrPathMTU         AttrMask = 1 << 8
	AttrTimeout         AttrMask = 1 << 9
	AttrRetryCnt        AttrMask = 1 << 10
	AttrRNRRetry        AttrMask = 1 << 11
	AttrRQPSN           AttrMask = 1 << 12
	AttrMaxQPRdAtomic   AttrMask = 1 << 13
	AttrMinRNRTimer     AttrMask = 1 << 15
	AttrSQPSN           AttrMask = 1 << 16
	AttrMaxDestRdAtomic AttrMask = 1 << 17
	AttrDestQPN         AttrMask = 1 << 20
)

var attrNames = map[AttrMask]string{
	AttrState: "state", AttrAccessFlags: "access flags", AttrPKey: "P_Key", AttrPort: "port", AttrQKey: "Q_Key",
	AttrAV: "address vector", AttrPathMTU: "path MTU", AttrTimeout: "timeout", AttrRetryCnt: "retry count",
	AttrRNRRetry: "RNR retry", AttrRQPSN: "RQ PSN", AttrMaxQPRdAtomic: "max RD atomic",
	AttrMinRNRTimer: "min RNR timer", AttrSQPSN: "SQ PSN", AttrMaxDestRdAtomic: "max dest RD atomic",
	AttrDestQPN: "dest QPN",
}

func (m AttrMask) String() string {
	s := ""
	for b := AttrMask(1); b != 0 && b <= m; b <<= 1 {
		if m&b == 0 {
			continue
		}
		if s != "" {
			s += ", "
		}
		if n, ok := attrNames[b]; ok {
			s += n
		} else {
			s += fmt.Sprintf("attr(%#x)", uint32(b))
		}
	}
	return s
}

// Attr holds a queue pair's attributes. It mirrors struct ibv_qp_attr. Modify reads the fields its mask
// names; Query returns all of them.
type Attr struct {
	State           State
	AccessFlags     mr.Access // remote operations the peer may perform on this QP: RemoteWrite, RemoteRead, RemoteAtomic
	PKey            wire.PKey
	QKey            wire.QKey
	AV              AddressHandle // the peer (RC, UC)
	PathMTU         wire.MTU
	Timeout         uint8 // local ACK timeout: 4.096 us * 2^Timeout; 0 disables the timer (0..31)
	RetryCnt        uint8 // transport retries before failing (0..7)
	RNRRetry        uint8 // RNR retries before failing; 7 means retry forever (0..7)
	RQPSN           wire.PSN
	SQPSN           wire.PSN
	MaxRdAtomic     uint8 // READs and atomics this QP may have outstanding as requester
	MaxDestRdAtomic uint8 // READs and atomics this QP accepts outstanding as responder
	MinRNRTimer     uint8 // RNR NAK timer code this QP's responder sends (0..31)
	DestQPN         wire.QPN
}

// Limits a Modify enforces.
const (
	MaxTimeout     = 31
	MaxRetryCnt    = 7
	MaxRNRRetry    = 7
	MaxMinRNRTimer = 31
	// MaxRdAtomic bounds MaxRdAtomic and MaxDestRdAtomic, as rxe's RXE_MAX_QP_RD_ATOM does.
	MaxRdAtomic = 128
)

// Errors Modify returns. They match with errors.Is; the message names the offending attribute.
var (
	ErrInvalidTransition = errors.New("qp: invalid state transition")
	ErrMissingAttr       = errors.New("qp: attribute required by the transition is missing")
	ErrUnexpectedAttr    = errors.New("qp: attribute not allowed in the transition")
	ErrInvalidAttr       = errors.New("qp: attribute value out of range")
)

// AttrError says which attribute made Modify fail. It unwraps to one of the Err* sentinels above.
type AttrError struct {
	Err      error
	Attr     AttrMask
	From, To State
	Type     Type
}

func (e *AttrError) Error() string {
	return fmt.Sprintf("%v (%v QP %v->%v: %v)", e.Err, e.Type, e.From, e.To, e.Attr)
}

func (e *AttrError) Unwrap() error { return e.Err }

// transition lists what a state change needs and allows, per QP type. It follows the table libibverbs
// and the kernel use (ib_modify_qp_is_ok in drivers/infiniband/core/verbs.c); IBTA Vol 1 11.2.4.2.
type transition struct {
	required, optional [3]AttrMask // by RC, UC, UD
}

func typeIndex(t Type) int { return int(t - RC) }

const (
	anyToResetOrErr = AttrState
)

var transitions = map[[2]State]transition{
	{StateReset, StateInit}: {
		required: [3]AttrMask{AttrAccessFlags, AttrAccessFlags, AttrQKey},
		optional: [3]AttrMask{AttrPKey | AttrPort, AttrPKey | AttrPort, AttrPKey | AttrPort},
	},
	{StateInit, StateInit}: {
		optional: [3]AttrMask{AttrPKey | AttrPort | AttrAccessFlags, AttrPKey | AttrPort | AttrAccessFlags, AttrPKey | AttrPort | AttrQKey},
	},
	{StateInit, StateRTR}: {
		required: [3]AttrMask{
			AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			0,
		},
		optional: [3]AttrMask{
			AttrPKey | AttrAccessFlags,
			AttrPKey | AttrAccessFlags,
			AttrPKey | AttrQKey,
		},
	},
	{StateRTR, StateRTS}: {
		required: [3]AttrMask{AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic, AttrSQPSN, AttrSQPSN},
		optional: [3]AttrMask{AttrAccessFlags | AttrMinRNRTimer, AttrAccessFlags, AttrQKey},
	},
	{StateRTS, StateRTS}: {
		optional: [3]AttrMask{AttrAccessFlags | AttrMinRNRTimer, AttrAccessFlags, AttrQKey},
	},
	{StateRTS, StateSQD}: {},
	{StateSQD, StateRTS}: {
		optional: [3]AttrMask{AttrAccessFlags | AttrMinRNRTimer, AttrAccessFlags, AttrQKey},
	},
	{StateSQD, StateSQD}: {
		optional: [3]AttrMask{
			AttrAV | AttrAccessFlags | AttrMinRNRTimer | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic | AttrMaxDestRdAtomic | AttrPKey,
			AttrAV | AttrAccessFlags | AttrPKey,
			AttrPKey | AttrQKey,
		},
	},
	{StateSQE, StateRTS}: {
		// Only UC and UD have SQE; an RC QP never reaches it.
		optional: [3]AttrMask{0, AttrAccessFlags, AttrQKey},
	},
}

// checkTransition validates a Modify from cur with the given mask and returns the target state.
func checkTransition(t Type, cur State, a *Attr, mask AttrMask) (State, error) {
	to := cur
	if mask&AttrState != 0 {
		to = a.State
	}
	if to > StateErr {
		return cur, &AttrError{Err: ErrInvalidAttr, Attr: AttrState, From: cur, To: to, Type: t}
	}
	fail := func(err error, m AttrMask) (State, error) {
		return cur, &AttrError{Err: err, Attr: m, From: cur, To: to, Type: t}
	}
	if to == StateReset || to == StateErr {
		if extra := mask &^ anyToResetOrErr; extra != 0 {
			return fail(ErrUnexpectedAttr, extra)
		}
		return to, nil
	}
	tr, ok := transitions[[2]State{cur, to}]
	if !ok || (cur == StateSQE && t == RC) {
		return fail(ErrInvalidTransition, AttrState)
	}
	i := typeIndex(t)
	if missing := tr.required[i] &^ mask; missing != 0 {
		return fail(ErrMissingAttr, missing)
	}
	if extra := mask &^ (tr.required[i] | tr.optional[i] | AttrState); extra != 0 {
		return fail(ErrUnexpectedAttr, extra)
	}
	// Value ranges.
	switch {
	case mask&AttrPathMTU != 0 && !a.PathMTU.Valid():
		return fail(ErrInvalidAttr, AttrPathMTU)
	case mask&AttrTimeout != 0 && a.Timeout > MaxTimeout:
		return fail(ErrInvalidAttr, AttrTimeout)
	case mask&AttrRetryCnt != 0 && a.RetryCnt > MaxRetryCnt:
		return fail(ErrInvalidAttr, AttrRetryCnt)
	case mask&AttrRNRRetry != 0 && a.RNRRetry > MaxRNRRetry:
		return fail(ErrInvalidAttr, AttrRNRRetry)
	case mask&AttrMinRNRTimer != 0 && a.MinRNRTimer > MaxMinRNRTimer:
		return fail(ErrInvalidAttr, AttrMinRNRTimer)
	case mask&AttrRQPSN != 0 && !a.RQPSN.Valid():
		return fail(ErrInvalidAttr, AttrRQPSN)
	case mask&AttrSQPSN != 0 && !a.SQPSN.Valid():
		return fail(ErrInvalidAttr, AttrSQPSN)
	case mask&AttrDestQPN != 0 && (!a.DestQPN.Valid() || a.DestQPN == wire.QPNSMI):
		return fail(ErrInvalidAttr, AttrDestQPN)
	case mask&AttrMaxQPRdAtomic != 0 && a.MaxRdAtomic > MaxRdAtomic:
		return fail(ErrInvalidAttr, AttrMaxQPRdAtomic)
	case mask&AttrMaxDestRdAtomic != 0 && a.MaxDestRdAtomic > MaxRdAtomic:
		return fail(ErrInvalidAttr, AttrMaxDestRdAtomic)
	case mask&AttrAccessFlags != 0 && a.AccessFlags&^(mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic) != 0:
		return fail(ErrInvalidAttr, AttrAccessFlags)
	}
	return to, nil
}

// roundRdAtomic rounds a read/atomic depth up to a power of two, as rxe does; Query reports the result.
func roundRdAtomic(n uint8) uint8 {
	if n <= 1 {
		return n
	}
	return uint8(1 << bits.Len8(n-1))
}

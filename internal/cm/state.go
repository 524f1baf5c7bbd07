package cm

import "strconv"

// State is the state of one connection (or service ID resolution) in the engine. The names are those of
// IBTA Vol 1 12.9 (communication establishment state diagrams) as Linux spells them (enum ib_cm_state in
// include/rdma/ib_cm.h).
type State uint8

// Connection states.
const (
	// StateIdle is where a connection starts and ends: an engine frees an idle connection once its
	// owner has polled its last event.
	StateIdle        State = iota
	StateReqSent           // active: REQ sent, waiting for REP (resent on timeout)
	StateReqRcvd           // passive: REQ handed to the owner, waiting for Accept or Reject
	StateMRAReqSent        // passive: as StateReqRcvd, and an MRA told the active side to wait
	StateMRAReqRcvd        // active: the passive side sent an MRA; waiting longer for REP
	StateRepSent           // passive: REP sent, waiting for RTU (resent on timeout)
	StateRepRcvd           // active: REP handed to the owner, waiting for Confirm or Reject
	StateMRARepSent        // active: as StateRepRcvd, and an MRA told the passive side to wait
	StateMRARepRcvd        // passive: the active side sent an MRA; waiting longer for RTU
	StateEstablished       // both: connected
	StateDreqSent          // DREQ sent, waiting for DREP (resent on timeout)
	StateTimewait          // disconnected; the QP may still see stray packets, its number is not reused yet
	StateSIDRReqSent       // active: SIDR_REQ sent, waiting for SIDR_REP
	StateSIDRReqRcvd       // passive: SIDR_REQ handed to the owner, waiting for AnswerSIDR
	StateSIDRRepSent       // passive: SIDR_REP sent; kept a while to answer a duplicate SIDR_REQ again
	numStates
)

var stateNames = [numStates]string{"IDLE", "REQ_SENT", "REQ_RCVD", "MRA_REQ_SENT", "MRA_REQ_RCVD", "REP_SENT",
	"REP_RCVD", "MRA_REP_SENT", "MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT", "SIDR_REQ_SENT",
	"SIDR_REQ_RCVD", "SIDR_REP_SENT"}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

func states(ss ...State) uint32 {
	var m uint32
	for _, s := range ss {
		m |= 1 << s
	}
	return m
}

// transitions is the one table of legal state changes: transitions[from] has bit to set. IBTA Vol 1
// 12.9.5-12.9.7 (active, passive and disconnection state diagrams), with Linux's cm.c for what the
// diagrams leave open (which REJ reasons lead to timewait, cm_rej_handler). A new connection leaves
// StateIdle; every path ends in it again.
var transitions = [numStates]uint32{
	StateIdle:        states(StateReqSent, StateReqRcvd, StateSIDRReqSent, StateSIDRReqRcvd),
	StateReqSent:     states(StateMRAReqRcvd, StateRepRcvd, StateTimewait, StateIdle),
	StateMRAReqRcvd:  states(StateReqSent, StateRepRcvd, StateTimewait, StateIdle),
	StateReqRcvd:     states(StateMRAReqSent, StateRepSent, StateTimewait, StateIdle),
	StateMRAReqSent:  states(StateRepSent, StateTimewait, StateIdle),
	StateRepSent:     states(StateMRARepRcvd, StateEstablished, StateTimewait, StateIdle),
	StateMRARepRcvd:  states(StateRepSent, StateEstablished, StateTimewait, StateIdle),
	StateRepRcvd:     states(StateMRARepSent, StateEstablished, StateTimewait, StateIdle),
	StateMRARepSent:  states(StateEstablished, StateTimewait, StateIdle),
	StateEstablished: states(StateDreqSent, StateTimewait),
	StateDreqSent:    states(StateTimewait),
	StateTimewait:    states(StateIdle),
	StateSIDRReqSent: states(StateIdle),
	StateSIDRReqRcvd: states(StateSIDRRepSent, StateIdle),
	StateSIDRRepSent: states(StateIdle),
}

// canMove reports whether from -> to is in the table.
func canMove(from, to State) bool {
	return from < numStates && to < numStates && transitions[from]&(1<<to) != 0
}

// preEstablished reports whether s is one of the states of connection establishment, before
// ESTABLISHED.
func (s State) preEstablished() bool {
	return s >= StateReqSent && s <= StateMRARepRcvd
}

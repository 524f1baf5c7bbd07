package goroce

import (
	"errors"
	"fmt"

	"github.com/goroce/goroce/internal/datapath"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
)

// Errors of the device API. They match with errors.Is.
var (
	ErrClosed     = datapath.ErrClosed // the object (or its device) is closed
	ErrBusy       = errors.New("goroce: resource still in use")
	ErrBadConfig  = datapath.ErrBadConfig // an invalid argument or configuration
	ErrForeign    = errors.New("goroce: object belongs to another device or protection domain")
	ErrTooManyQPs = datapath.ErrTooManyQPs // Config.MaxQPs reached

	// ErrQueueFull: a post found the send or receive queue full (MaxSendWR, MaxRecvWR).
	ErrQueueFull = errors.New("goroce: work queue full")
	// ErrBadState: the QP's state does not allow the operation (a send before RTS, as IBTA C10-96 says).
	ErrBadState = errors.New("goroce: operation not allowed in the QP's state")
	// ErrBadWR: the work request is malformed: an opcode the QP type cannot carry, too many SGEs, inline
	// data too long, a UD message longer than the MTU, an atomic without its 8 bytes.
	ErrBadWR = errors.New("goroce: invalid work request")
	// ErrBadSGE: a scatter/gather element does not lie inside a region this QP's protection domain
	// holds under that local key, with the rights the operation needs. Checked when posted.
	ErrBadSGE = errors.New("goroce: scatter/gather element outside its memory region")
	// ErrNoRoom: CQ.Wait was given no room for a completion.
	ErrNoRoom = errors.New("goroce: no room for a completion")
)

// Errors of failed work requests, one per completion status; Completion.Err returns a *WCError that
// matches its status's.
var (
	ErrLocalLength      = errors.New("goroce: local length error")               // IBV_WC_LOC_LEN_ERR
	ErrLocalQPOperation = errors.New("goroce: local QP operation error")         // IBV_WC_LOC_QP_OP_ERR
	ErrLocalProtection  = errors.New("goroce: local protection error")           // IBV_WC_LOC_PROT_ERR
	ErrFlushed          = errors.New("goroce: work request flushed")             // IBV_WC_WR_FLUSH_ERR
	ErrBadResponse      = errors.New("goroce: bad response")                     // IBV_WC_BAD_RESP_ERR
	ErrLocalAccess      = errors.New("goroce: local access error")               // IBV_WC_LOC_ACCESS_ERR
	ErrRemoteInvalid    = errors.New("goroce: remote invalid request error")     // IBV_WC_REM_INV_REQ_ERR
	ErrRemoteAccess     = errors.New("goroce: remote access error")              // IBV_WC_REM_ACCESS_ERR
	ErrRemoteOperation  = errors.New("goroce: remote operation error")           // IBV_WC_REM_OP_ERR
	ErrRetryExceeded    = errors.New("goroce: transport retry counter exceeded") // IBV_WC_RETRY_EXC_ERR
	ErrRNRRetryExceeded = errors.New("goroce: RNR retry counter exceeded")       // IBV_WC_RNR_RETRY_EXC_ERR
	ErrRemoteAborted    = errors.New("goroce: remote aborted error")             // IBV_WC_REM_ABORT_ERR
	ErrFatal            = errors.New("goroce: fatal error")                      // IBV_WC_FATAL_ERR
	ErrGeneral          = errors.New("goroce: general error")                    // IBV_WC_GENERAL_ERR
	errUnknownStatus    = errors.New("goroce: unknown completion status")
)

var statusErrors = map[Status]error{
	StatusLocLenErr: ErrLocalLength, StatusLocQPOpErr: ErrLocalQPOperation, StatusLocProtErr: ErrLocalProtection,
	StatusWRFlushErr: ErrFlushed, StatusBadRespErr: ErrBadResponse, StatusLocAccessErr: ErrLocalAccess,
	StatusRemInvReqErr: ErrRemoteInvalid, StatusRemAccessErr: ErrRemoteAccess, StatusRemOpErr: ErrRemoteOperation,
	StatusRetryExcErr: ErrRetryExceeded, StatusRNRRetryExcErr: ErrRNRRetryExceeded, StatusRemAbortErr: ErrRemoteAborted,
	StatusFatalErr: ErrFatal, StatusGeneralErr: ErrGeneral,
}

// WCError is a failed work request: Completion.Err's error. It matches (errors.Is) the Err* value of its
// status, for example ErrRemoteAccess.
type WCError struct {
	Status Status
	WRID   uint64
	QPN    QPN
	Opcode CompletionOpcode
}

func (e *WCError) Error() string {
	return fmt.Sprintf("goroce: %v on QP %v, work request %d: %v", e.Opcode, e.QPN, e.WRID, e.Status)
}

// Unwrap returns the status's Err* value.
func (e *WCError) Unwrap() error {
	if err, ok := statusErrors[e.Status]; ok {
		return err
	}
	return errUnknownStatus
}

// Err returns nil for a successful completion and a *WCError otherwise, which matches the status's
// Err* value with errors.Is.
func (c *Completion) Err() error {
	if c.Status == StatusSuccess {
		return nil
	}
	return &WCError{Status: c.Status, WRID: c.WRID, QPN: c.QPN, Opcode: c.Opcode}
}

// postError maps an engine's refusal of a work request to the API's errors, keeping the engine's words.
func postError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, datapath.ErrClosed):
		return err
	case errors.Is(err, qp.ErrQueueFull):
		return ErrQueueFull
	case errors.Is(err, qp.ErrInvalidState):
		return ErrBadState
	case errors.Is(err, mr.ErrBadKey), errors.Is(err, mr.ErrBounds), errors.Is(err, mr.ErrWrongPD),
		errors.Is(err, mr.ErrPermission):
		return fmt.Errorf("%w (%v)", ErrBadSGE, err)
	}
	return fmt.Errorf("%w (%v)", ErrBadWR, err)
}

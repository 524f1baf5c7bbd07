package mr

import "errors"

// The two categories every data-path error belongs to. Each maps onto the NAK code a responder returns
// for the failed request. IBTA Vol 1 9.7.5.2.1 Table 44 (NAK codes).
var (
	// ErrRemoteAccess is the category of protection failures: a bad or stale key, an access outside the
	// region, a missing right or a foreign protection domain. A responder answers with NAK remote access
	// error.
	ErrRemoteAccess = errors.New("mr: remote access error")

	// ErrInvalidRequest is the category of requests that cannot be valid whatever the keys: a misaligned
	// atomic, an impossible length, an invalidation of a region that cannot be invalidated. A responder
	// answers with NAK invalid request.
	ErrInvalidRequest = errors.New("mr: invalid request")
)

// categoryError is a precomputed data-path error that errors.Is-matches its category. The values are
// package-level pointers so the data path returns them without allocating.
type categoryError struct {
	msg      string
	category error
}

func (e *categoryError) Error() string { return e.msg }

// Unwrap returns the category, so errors.Is(err, ErrRemoteAccess) holds for every protection failure.
func (e *categoryError) Unwrap() error { return e.category }

// Data-path errors. Each matches itself and its category with errors.Is.
var (
	// ErrBadKey reports a key that names no valid region: never issued, deregistered, invalidated, or
	// stale after its slot was reused. Category ErrRemoteAccess.
	ErrBadKey error = &categoryError{"mr: bad or stale key", ErrRemoteAccess}

	// ErrWrongPD reports a key whose region belongs to another protection domain than the QP's.
	// Category ErrRemoteAccess.
	ErrWrongPD error = &categoryError{"mr: region belongs to another protection domain", ErrRemoteAccess}

	// ErrPermission reports a region registered without a right the access needs. Category
	// ErrRemoteAccess.
	ErrPermission error = &categoryError{"mr: access not permitted by the region", ErrRemoteAccess}

	// ErrBounds reports an access that does not lie wholly inside the region, including one whose
	// VA+length wraps past 2^64. Category ErrRemoteAccess.
	ErrBounds error = &categoryError{"mr: access outside the region", ErrRemoteAccess}

	// ErrMisaligned reports an atomic whose VA is not 8-byte aligned. Category ErrInvalidRequest.
	ErrMisaligned error = &categoryError{"mr: atomic address not 8-byte aligned", ErrInvalidRequest}

	// ErrLength reports a length that cannot be valid: above MaxMessage, an atomic not 8 bytes long, or
	// more data than a scatter/gather list holds. Category ErrInvalidRequest.
	ErrLength error = &categoryError{"mr: invalid length", ErrInvalidRequest}

	// ErrNotInvalidatable reports a LocalInvalidate or RemoteInvalidate of a region registered without
	// the Invalidatable option, as rxe refuses to invalidate an MR that is not IB_MR_TYPE_MEM_REG.
	// Category ErrInvalidRequest.
	ErrNotInvalidatable error = &categoryError{"mr: region cannot be invalidated", ErrInvalidRequest}
)

// Control-path errors, returned by registration and deregistration.
var (
	// ErrInvalidAccess reports a registration asking for RemoteWrite or RemoteAtomic without LocalWrite,
	// which ibv_reg_mr refuses with EINVAL.
	ErrInvalidAccess = errors.New("mr: remote write or atomic access requires local write")

	// ErrUnknownAccess reports access bits this package does not define.
	ErrUnknownAccess = errors.New("mr: unknown access bits")

	// ErrEmpty reports a registration of zero bytes.
	ErrEmpty = errors.New("mr: empty region")

	// ErrIOVARange reports a region whose IOVA plus length would pass 2^64-1.
	ErrIOVARange = errors.New("mr: region end wraps past 2^64")

	// ErrTableFull reports that all 2^24 region slots are in use.
	ErrTableFull = errors.New("mr: region table full")

	// ErrBadPD reports a nil protection domain, one from another table, or one already deallocated.
	ErrBadPD = errors.New("mr: invalid protection domain")

	// ErrPDBusy reports a DeallocPD of a domain that still has registered regions (EBUSY in libibverbs).
	ErrPDBusy = errors.New("mr: protection domain has registered regions")

	// ErrNotRegistered reports a Deregister of a region that is not (or no longer) registered here.
	ErrNotRegistered = errors.New("mr: region not registered")

	// ErrStillValid reports a Revalidate of a region that has not been invalidated.
	ErrStillValid = errors.New("mr: region still valid")
)

package sandbox

import (
	"errors"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/backend"
)

// Errors the API maps to statuses.
var (
	ErrNotFound        = errors.New("sandbox not found")
	ErrUnknownTemplate = errors.New("unknown template")
	ErrTooMany         = errors.New("too many sandboxes")
	ErrInvalid         = errors.New("invalid request")
	// ErrUnrestorable: a sandbox saved to disk could not be brought back
	// (an UnrestorableError says which).
	ErrUnrestorable = errors.New("the sandbox could not be restored")
	// ErrConflict: the request does not fit the sandbox's state.
	ErrConflict = errors.New("conflict")
	// ErrShuttingDown: the manager is stopping and takes no new sandbox.
	ErrShuttingDown = errors.New("the server is shutting down")
	// ErrPoolEmpty: a create that takes only a pooled sandbox
	// (CreateRequest.PoolOnly) found none ready.
	ErrPoolEmpty = errors.New("no pooled sandbox is ready")
)

// PublicError is a refusal whose message is fit for clients, with a cause
// that is not (host paths, a backend's words): the API logs the cause and
// answers with Err alone.
type PublicError struct {
	Err   error // what the client is told; wraps the kind (ErrInvalid, …)
	Cause error
}

func (e *PublicError) Error() string { return e.Err.Error() }

func (e *PublicError) Unwrap() error { return e.Err }

// UnrestorableError is a restore that failed: its saved state is corrupt,
// or of another version of the backend's runtime, or the host lacks
// what it needs. The saved state stays, for another try or a kill.
type UnrestorableError struct {
	ID string
	// Snapshot: ID is a snapshot's, which a sandbox was to start from,
	// rather than a paused sandbox's.
	Snapshot bool
	Err      error // the backend's words: for the log, not for clients
}

func (e *UnrestorableError) Error() string {
	if e.Snapshot {
		return fmt.Sprintf("start from snapshot %s: %v", e.ID, e.Err)
	}
	return fmt.Sprintf("restore sandbox %s: %v", e.ID, e.Err)
}

func (e *UnrestorableError) Unwrap() []error { return []error{ErrUnrestorable, e.Err} }

// Public is what a client is told: the backend's reason where it gave
// one fit for clients (a backend.StateError).
func (e *UnrestorableError) Public() string {
	why := "(it may be corrupt, or saved by another version of the runtime)"
	var se *backend.StateError
	if errors.As(e.Err, &se) {
		why = "(" + se.Error() + ")"
	}
	if e.Snapshot {
		return fmt.Sprintf("no sandbox can start from snapshot %s %s; delete it", e.ID, why)
	}
	return fmt.Sprintf("sandbox %s could not be restored from its saved state %s; it stays paused until killed", e.ID, why)
}

// ErrHostFull: starting another sandbox would leave the host too little of
// its task space or memory. A client is answered 503 with a retry hint.
var ErrHostFull = errors.New("the host has no room for another sandbox now")

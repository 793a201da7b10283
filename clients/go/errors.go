package lockservice

import (
	"errors"
	"strings"
)

// The kinds of error the client returns. Every error it returns is an
// *Error whose Kind is one of these, so callers test them with errors.Is:
//
//	if errors.Is(err, lockservice.ErrTimeout) { ... }
var (
	// ErrTimeout: the key was not granted within the acquire's wait (the
	// server answered T), or a node never answered within the request's
	// bound.
	ErrTimeout = errors.New("timeout")
	// ErrStale: the token does not hold the key (already released, expired
	// or force-released).
	ErrStale = errors.New("stale token")
	// ErrRejected: the server refused the request (an E answer: a share
	// that does not match the key's kind, a limit, a lease beyond the
	// server's maximum).
	ErrRejected = errors.New("rejected")
	// ErrNoConnection: no node could be reached, or none answered in time.
	ErrNoConnection = errors.New("no connection")
	// ErrInvalid: the client refused the request before sending it (a bad
	// key, lease, wait, share, token or name).
	ErrInvalid = errors.New("invalid argument")
	// ErrCancelled: the caller's context ended first. The error also wraps
	// the context's own error (context.Canceled or
	// context.DeadlineExceeded).
	ErrCancelled = errors.New("cancelled")
	// ErrLost: a lock (or a leadership) can no longer be trusted: a renewal
	// was refused, or its lease ran out while renewals failed.
	ErrLost = errors.New("lock lost")
)

// Error is the error type of every failed call. Kind is one of the Err*
// sentinels above; errors.Is matches Kind, and Cause when there is one.
type Error struct {
	// Kind is ErrTimeout, ErrStale, ErrRejected, ErrNoConnection,
	// ErrInvalid, ErrCancelled or ErrLost.
	Kind error
	// Op is the operation: "acquire", "release", "renew", "observe", ...
	Op string
	// Key is the key (or election) concerned, when there is one.
	Key string
	// Message says more: the server's message for ErrRejected, what failed
	// for ErrNoConnection.
	Message string
	// Cause is an underlying error (the context's error for ErrCancelled).
	Cause error
}

// Error formats the error as "lockservice: <op> <key>: <kind>: <message>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("lockservice: ")
	b.WriteString(e.Op)
	if e.Key != "" {
		b.WriteString(" ")
		b.WriteString(e.Key)
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Unwrap returns Kind and, when set, Cause, so errors.Is sees both.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Kind, e.Cause}
	}
	return []error{e.Kind}
}

func newError(kind error, op, key, msg string) *Error {
	return &Error{Kind: kind, Op: op, Key: key, Message: msg}
}

func cancelled(op, key string, cause error) *Error {
	return &Error{Kind: ErrCancelled, Op: op, Key: key, Cause: cause}
}

package baton

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The kinds of error a call returns; test with [errors.Is]. Every kind but
// [ErrIndeterminate] is definite: the call did nothing on the server.
var (
	// ErrInvalid: an argument broke a rule (checked before sending, or by
	// the server); the message names the rule and the value.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotAcquired: the resource was held or had waiters ahead, or the
	// wait ran out; [*NotAcquiredError] says which resource blocked.
	ErrNotAcquired = errors.New("not acquired")
	// ErrNotOwner: the lease is no longer this holder's (it expired, was
	// released, fenced or replaced): stop the work it protects.
	ErrNotOwner = errors.New("not the owner")
	// ErrPermissionDenied: the server's auth rules refuse this principal.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnauthenticated: no token, or one the server does not know.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrExhausted: a server limit (waiters, sessions, connections) or a
	// tenant's quota refused the call; nothing was applied (the message
	// names the limit or the quota).
	ErrExhausted = errors.New("resource exhausted")
	// ErrUnavailable: no server could be reached; nothing was sent.
	ErrUnavailable = errors.New("unavailable")
	// ErrExpiredOnArrival: a grant came back after its TTL had passed on
	// this process's clock; the client released it.
	ErrExpiredOnArrival = errors.New("expired on arrival")
	// ErrIndeterminate: the request may or may not have taken effect (the
	// answer was lost or late); never returned for a call known to have
	// done nothing.
	ErrIndeterminate = errors.New("outcome unknown")
)

// Error is a failed call: its kind (one of the Err values, matched by
// [errors.Is]) and what happened.
type Error struct {
	Kind    error
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap gives the kind.
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) error {
	return errorf(ErrInvalid, format, args...)
}

// NotAcquiredError is why an acquire got nothing; it matches
// [ErrNotAcquired].
type NotAcquiredError struct {
	// Reason: "held" (try-once, a resource was held or had waiters),
	// "timed out" (the wait ran out), or "ended" (a repeat of a request
	// whose lease has ended).
	Reason string
	// Resource is the first requested resource that blocked ("" if none
	// was named).
	Resource string
	// HolderToken is its holder's token (0 if it only had waiters).
	HolderToken uint64
	// Blockers is every requested resource that was held or had requests
	// waiting ahead, in request order (empty from servers before
	// 2026-12-05).
	Blockers []Blocker
}

// Blocker is a requested resource that stood in the way of an acquire.
type Blocker struct {
	Resource string
	// Readable is false when the caller may not read the resource: its
	// holders give their tokens only (and the counts are given).
	Readable bool
	// Holders lists at most 16 (an exclusive lock has at most one).
	Holders  []BlockingHolder
	NHolders uint64
	// NWaitersAhead counts the requests waiting ahead of this one (for a
	// try-once request, all of them).
	NWaitersAhead uint64
}

// BlockingHolder is a holder of a resource that blocked an acquire.
type BlockingHolder struct {
	Token uint64
	// Holder is its description ("" if none, or not readable).
	Holder string
	// HeldFor is how long it has held the resource, in whole seconds:
	// since its grant, or, with HeldSinceRecovery, since the server
	// restart or leader takeover that loaded it. -1 when not readable.
	HeldFor           time.Duration
	HeldSinceRecovery bool
	// Remaining is its TTL left; -1 when tied to a session
	// (SessionBound) or not readable.
	Remaining    time.Duration
	SessionBound bool
}

// clause says a blocker as the CLI does: `NAME held token=T holder="D"
// for=12s remaining=3000ms waiters_ahead=N`.
func (b Blocker) clause() string {
	var s strings.Builder
	s.WriteString(b.Resource)
	for i, h := range b.Holders {
		sep := ", "
		if i == 0 {
			sep = " held "
		}
		fmt.Fprintf(&s, "%stoken=%d", sep, h.Token)
		if h.Holder != "" {
			fmt.Fprintf(&s, " holder=%q", h.Holder)
		}
		if h.HeldFor >= 0 {
			at := "="
			if h.HeldSinceRecovery {
				at = ">="
			}
			fmt.Fprintf(&s, " for%s%ds", at, int64(h.HeldFor/time.Second))
		}
		switch {
		case h.Remaining >= 0:
			fmt.Fprintf(&s, " remaining=%dms", h.Remaining.Milliseconds())
		case h.SessionBound:
			s.WriteString(" remaining=session")
		}
	}
	if n := uint64(len(b.Holders)); b.NHolders > n {
		fmt.Fprintf(&s, " (and %d more)", b.NHolders-n)
	}
	fmt.Fprintf(&s, " waiters_ahead=%d", b.NWaitersAhead)
	return s.String()
}

func (e *NotAcquiredError) Error() string {
	if len(e.Blockers) > 0 {
		clauses := make([]string, len(e.Blockers))
		for i, b := range e.Blockers {
			clauses[i] = b.clause()
		}
		return fmt.Sprintf("not acquired (%s): %s", e.Reason, strings.Join(clauses, "; "))
	}
	switch {
	case e.Resource != "" && e.HolderToken != 0:
		return fmt.Sprintf("not acquired (%s): %s is held (token %d)", e.Reason, e.Resource, e.HolderToken)
	case e.Resource != "":
		return fmt.Sprintf("not acquired (%s): %s has waiters ahead", e.Reason, e.Resource)
	default:
		return fmt.Sprintf("not acquired (%s)", e.Reason)
	}
}

// Is matches [ErrNotAcquired].
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

package baton

import (
	"context"
	"sync"
	"time"
)

// SessionKeeper follows one lease acquired on a session: it is held while
// the session is, so its safe-until is the session's (for a lease with a
// TTL of its own, the earlier of that and the lease's). It is lost when
// that passes, when the session ends, or when a heartbeat reports the
// lease fenced: its [SessionKeeper.Context] is cancelled at that moment
// and [SessionKeeper.Err] says why.
type SessionKeeper struct {
	session *Session
	lease   *Lease

	mu     sync.Mutex
	reason string
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
}

// Keep follows lease, acquired on this session, until [SessionKeeper.Stop]
// or [SessionKeeper.Release], or until ctx is done.
func (s *Session) Keep(ctx context.Context, lease *Lease) *SessionKeeper {
	k := &SessionKeeper{session: s, lease: lease, stop: make(chan struct{}), done: make(chan struct{})}
	k.ctx, k.cancel = context.WithCancel(ctx)
	go k.follow()
	return k
}

// Lease is the lease followed.
func (k *SessionKeeper) Lease() *Lease { return k.lease }

// Token is the fencing token: carry it into every protected write.
func (k *SessionKeeper) Token() uint64 { return k.lease.Token }

// Session is the session the lease is tied to.
func (k *SessionKeeper) Session() *Session { return k.session }

// Context is cancelled the moment ownership is lost or uncertain (or the
// keeper stopped): run the protected work under it.
func (k *SessionKeeper) Context() context.Context { return k.ctx }

// SafeUntil is where ownership stops being certain (monotonic).
func (k *SessionKeeper) SafeUntil() time.Time {
	safe := k.session.SafeUntil()
	if !k.lease.SessionBound {
		if own := k.lease.ValidUntil.Add(-MarginOf(k.lease.TTL)); own.Before(safe) {
			safe = own
		}
	}
	return safe
}

// Err is nil while ownership is certain now, else an [ErrOwnershipLost]
// saying why; once it failed, it always fails.
func (k *SessionKeeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.reason == "" {
		switch {
		case k.session.RevokedToken(k.lease.Resource) == k.lease.Token:
			k.loseLocked("a heartbeat reported the lease revoked (fenced)")
		case k.session.Ended():
			k.loseLocked("the session ended (" + k.session.Err().Error() + ")")
		case !time.Now().Before(k.SafeUntil()):
			k.loseLocked("no heartbeat was acknowledged before the session's safe-until")
		}
	}
	if k.reason != "" {
		return errorf(ErrOwnershipLost, "%s (token %d): %s; stop the work", k.lease.Resource, k.lease.Token, k.reason)
	}
	return nil
}

func (k *SessionKeeper) loseLocked(why string) {
	if k.reason == "" {
		k.reason = why
		k.cancel()
	}
}

// follow wakes at the safe-until (at least every sixth of the session's
// TTL, when a heartbeat may have moved it) or when the session ends.
func (k *SessionKeeper) follow() {
	defer close(k.done)
	defer k.cancel()
	for k.Err() == nil {
		wait := min(time.Until(k.SafeUntil()), k.session.TTL()/6)
		timer := time.NewTimer(max(wait, 0))
		select {
		case <-k.stop:
			timer.Stop()
			return
		case <-k.ctx.Done():
			timer.Stop()
			k.mu.Lock()
			k.loseLocked("the keeper's parent context ended")
			k.mu.Unlock()
			return
		case <-k.session.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
}

// Stop stops following the lease (it stays held while the session is;
// the keeper no longer vouches for it).
func (k *SessionKeeper) Stop() *Lease {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	k.mu.Lock()
	k.loseLocked("the keeper was stopped: it no longer vouches for the lease")
	k.mu.Unlock()
	return k.lease
}

// Release stops following the lease and gives it back, unless it was lost.
func (k *SessionKeeper) Release(ctx context.Context) error {
	lost := k.Err() != nil
	lease := k.Stop()
	if lost {
		return nil
	}
	_, err := k.session.Release(ctx, lease)
	return err
}

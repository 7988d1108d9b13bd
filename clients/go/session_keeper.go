package baton

import (
	"context"
	"time"
)

// SessionKeeper follows one lease acquired on a session: it is held while
// the session is, so its safe-until is the session's (for a lease with a
// TTL of its own, the earlier of that and the lease's). It is lost when
// that passes, when the session ends, or when a heartbeat reports the
// lease fenced: its [SessionKeeper.Context] is cancelled at that moment
// and [SessionKeeper.Err] says why.
type SessionKeeper struct {
	ownership
	session *Session
	lease   *Lease
	stop    chan struct{}
	done    chan struct{}
}

// Keep follows lease, acquired on this session, until [SessionKeeper.Stop]
// or [SessionKeeper.Release], or until ctx is done.
func (s *Session) Keep(ctx context.Context, lease *Lease) *SessionKeeper {
	k := &SessionKeeper{session: s, lease: lease, stop: make(chan struct{}), done: make(chan struct{})}
	k.init(ctx)
	go k.follow()
	return k
}

// Lease is the lease followed.
func (k *SessionKeeper) Lease() *Lease { return k.lease }

// Token is the fencing token: carry it into every protected write.
func (k *SessionKeeper) Token() uint64 { return k.lease.Token }

// Session is the session the lease is tied to.
func (k *SessionKeeper) Session() *Session { return k.session }

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
	switch {
	case k.session.RevokedToken(k.lease.Resource) == k.lease.Token:
		k.lose("a heartbeat reported the lease revoked (fenced)")
	case k.session.Ended():
		k.lose("the session ended (" + k.session.Err().Error() + ")")
	case !time.Now().Before(k.SafeUntil()):
		k.lose("no heartbeat was acknowledged before the session's safe-until")
	}
	return k.lost(k.lease)
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
			k.lose("the keeper's parent context ended")
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
	k.lose("the keeper was stopped: it no longer vouches for the lease")
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

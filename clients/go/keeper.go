package baton

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrOwnershipLost: a keeper no longer vouches for its lease (its
// safe-until passed without an acknowledged renewal, or the server said
// the lease is no longer this holder's). Stop the protected work.
var ErrOwnershipLost = errors.New("ownership lost")

// MarginOf is the default safety margin of a lease with this TTL: 5% of
// it, at least 10 ms, for the difference between two clocks' rates.
func MarginOf(ttl time.Duration) time.Duration {
	return max(ttl/20, 10*time.Millisecond)
}

// Keeper holds one lease with its own TTL: a goroutine renews it every
// third of its TTL, and its safe-until is where ownership stops being
// certain on this process's monotonic clock: the send time of the last
// acknowledged grant or renewal, plus the time granted, minus the margin.
// The server cannot expire the lease before then, whatever the network
// does. At the safe-until the keeper gives the lease up on its own clock,
// whether or not the server answers: its [Keeper.Context] is cancelled
// and [Keeper.Err] says why. Once lost, it never vouches for the lease
// again.
type Keeper struct {
	client   *Client
	interval time.Duration
	margin   time.Duration

	ownership
	mu        sync.Mutex
	lease     *Lease
	safeUntil time.Time

	stop chan struct{}
	done chan struct{}
}

// KeeperOption sets one option of [Client.Keep].
type KeeperOption func(*Keeper)

// WithRenewInterval renews every d instead of every third of the TTL.
func WithRenewInterval(d time.Duration) KeeperOption {
	return func(k *Keeper) { k.interval = d }
}

// WithSafetyMargin gives the lease up d before its valid-until instead
// of [MarginOf] its TTL.
func WithSafetyMargin(d time.Duration) KeeperOption {
	return func(k *Keeper) { k.margin = d }
}

// Keep starts keeping lease until [Keeper.Stop] or [Keeper.Release], or
// until ctx is done (the keeper then stops as by Stop, and its context
// is cancelled with ctx).
func (c *Client) Keep(ctx context.Context, lease *Lease, options ...KeeperOption) *Keeper {
	k := &Keeper{
		client:   c,
		lease:    lease,
		interval: lease.TTL / 3,
		margin:   MarginOf(lease.TTL),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	k.init(ctx)
	for _, o := range options {
		o(k)
	}
	k.safeUntil = lease.ValidUntil.Add(-k.margin)
	go k.run()
	return k
}

// Lease is the lease as last renewed.
func (k *Keeper) Lease() *Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}

// Token is the fencing token: carry it into every protected write.
func (k *Keeper) Token() uint64 { return k.Lease().Token }

// SafeUntil is where ownership stops being certain (monotonic).
func (k *Keeper) SafeUntil() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.safeUntil
}

// Err is nil while ownership is certain now, else an [ErrOwnershipLost]
// saying why; once it failed, it always fails.
func (k *Keeper) Err() error {
	if !time.Now().Before(k.SafeUntil()) {
		k.lose("no renewal was acknowledged before the lease's safe-until")
	}
	return k.lost(k.Lease())
}

// run renews every interval, each renewal bounded by the safe-until, and
// gives the lease up at the safe-until on this clock.
func (k *Keeper) run() {
	defer close(k.done)
	defer k.cancel()
	nextRenew := time.Now().Add(k.interval)
	for {
		if k.Err() != nil {
			return
		}
		wake := nextRenew
		if safe := k.SafeUntil(); safe.Before(wake) {
			wake = safe
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case <-k.stop:
			timer.Stop()
			return
		case <-k.ctx.Done():
			timer.Stop()
			k.lose("the keeper's parent context ended: " + context.Cause(k.ctx).Error())
			return
		case <-timer.C:
		}
		if time.Now().Before(nextRenew) {
			continue // the safe-until: Err loses it
		}
		k.renewOnce()
		nextRenew = time.Now().Add(k.interval)
	}
}

// renewOnce moves the safe-until on success, loses the lease on a
// definite refusal, and keeps the old safe-until when the outcome is
// unknown (a later renewal may yet succeed before it passes).
func (k *Keeper) renewOnce() {
	ctx, cancel := context.WithDeadline(k.ctx, k.SafeUntil())
	defer cancel()
	go func() {
		select {
		case <-k.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	renewed, err := k.client.Renew(ctx, k.Lease())
	switch {
	case errors.Is(err, ErrNotOwner):
		k.lose("the server no longer knows this lease as ours (" + err.Error() + ")")
	case err == nil:
		k.mu.Lock()
		k.lease = renewed
		if until := renewed.ValidUntil.Add(-k.margin); until.After(k.safeUntil) {
			k.safeUntil = until
		}
		k.mu.Unlock()
	}
}

// Stop stops renewing (the lease then runs out at its TTL; the keeper's
// context is cancelled, as it no longer vouches) and returns the lease as
// last renewed.
func (k *Keeper) Stop() *Lease {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	k.lose("the keeper was stopped: it no longer vouches for the lease")
	return k.Lease()
}

// Release stops renewing and gives the lease back, unless it was lost.
func (k *Keeper) Release(ctx context.Context) error {
	lost := k.Err() != nil
	lease := k.Stop()
	if lost {
		return nil
	}
	_, err := k.client.Release(ctx, lease)
	return err
}

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
// whether or not the server answers; once lost, it never vouches for the
// lease again.
type Keeper struct {
	client   *Client
	interval time.Duration
	margin   time.Duration

	mu        sync.Mutex
	lease     *Lease
	safeUntil time.Time
	reason    string
	lost      chan struct{}

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

// Keep starts keeping lease until [Keeper.Stop] or [Keeper.Release].
func (c *Client) Keep(lease *Lease, options ...KeeperOption) *Keeper {
	k := &Keeper{
		client:   c,
		lease:    lease,
		interval: lease.TTL / 3,
		margin:   MarginOf(lease.TTL),
		lost:     make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
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

// Lost is closed once ownership is lost or uncertain: select on it
// beside the work.
func (k *Keeper) Lost() <-chan struct{} { return k.lost }

// Check is nil while ownership is certain now, else an
// [ErrOwnershipLost] saying why; once it failed, it always fails.
func (k *Keeper) Check() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.reason == "" && !time.Now().Before(k.safeUntil) {
		k.loseLocked("no renewal was acknowledged before the lease's safe-until")
	}
	if k.reason != "" {
		return errorf(ErrOwnershipLost, "%s (token %d): %s; stop the work", k.lease.Resource, k.lease.Token, k.reason)
	}
	return nil
}

func (k *Keeper) lose(why string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.loseLocked(why)
}

func (k *Keeper) loseLocked(why string) {
	if k.reason == "" {
		k.reason = why
		close(k.lost)
	}
}

// run renews every interval, each renewal bounded by the safe-until, and
// gives the lease up at the safe-until on this clock.
func (k *Keeper) run() {
	defer close(k.done)
	nextRenew := time.Now().Add(k.interval)
	for {
		if k.Check() != nil {
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
		case <-timer.C:
		}
		if time.Now().Before(nextRenew) {
			continue // the safe-until: Check loses it
		}
		k.renewOnce()
		nextRenew = time.Now().Add(k.interval)
	}
}

// renewOnce moves the safe-until on success, loses the lease on a
// definite refusal, and keeps the old safe-until when the outcome is
// unknown (a later renewal may yet succeed before it passes).
func (k *Keeper) renewOnce() {
	ctx, cancel := context.WithDeadline(context.Background(), k.SafeUntil())
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

// Stop stops renewing (the lease then runs out at its TTL) and returns
// the lease as last renewed.
func (k *Keeper) Stop() *Lease {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	return k.Lease()
}

// Release stops renewing and gives the lease back, unless it was lost.
func (k *Keeper) Release(ctx context.Context) error {
	lease := k.Stop()
	if k.Check() != nil {
		return nil
	}
	_, err := k.client.Release(ctx, lease)
	return err
}

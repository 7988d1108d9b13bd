package baton

import (
	"context"
	"sync"
)

// ownership is what both keepers say of their lease: certain until it is
// lost, then lost for good with the first reason; its context is
// cancelled at the loss.
type ownership struct {
	lock   sync.Mutex
	reason string
	ctx    context.Context
	cancel context.CancelFunc
}

func (o *ownership) init(parent context.Context) {
	o.ctx, o.cancel = context.WithCancel(parent)
}

// Context is cancelled the moment ownership is lost or uncertain (or the
// keeper stopped): run the protected work under it.
func (o *ownership) Context() context.Context { return o.ctx }

// lose records why ownership ended (the first reason stays) and cancels
// the context.
func (o *ownership) lose(why string) {
	o.lock.Lock()
	defer o.lock.Unlock()
	if o.reason == "" {
		o.reason = why
		o.cancel()
	}
}

// lost is nil while ownership stands, else an [ErrOwnershipLost] naming
// lease and why.
func (o *ownership) lost(lease *Lease) error {
	o.lock.Lock()
	defer o.lock.Unlock()
	if o.reason == "" {
		return nil
	}
	return errorf(ErrOwnershipLost, "%s (token %d): %s; stop the work", lease.Resource, lease.Token, o.reason)
}

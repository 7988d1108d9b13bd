package baton

import (
	"context"
	"crypto/rand"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// Lease is a granted lease. AcquisitionID is a secret: it renews and
// releases the lease; never log it.
type Lease struct {
	Resource      string
	AcquisitionID []byte
	// Token is the fencing token: carry it into every protected write.
	Token uint64
	TTL   time.Duration
	// SessionBound: tied to a session (it lives while the session does).
	SessionBound bool
	// ValidUntil is on this process's monotonic clock (time.Now's
	// reading): the request's send time, plus the time the server says
	// it waited in line, plus the TTL. The server cannot expire the lease
	// before then, whatever the network did.
	ValidUntil time.Time
	// Slot is a shared holder's or a permit's slot (the lowest free one
	// when it was granted; a permit's is below the semaphore's N), -1 for
	// an exclusive lease. A slot's tokens only rise: a permit's writes are
	// fenced by slot.
	Slot int
}

// ValidFor is the time left until ValidUntil (0 once passed).
func (l *Lease) ValidFor() time.Duration { return max(0, time.Until(l.ValidUntil)) }

// Expired says whether ValidUntil has passed.
func (l *Lease) Expired() bool { return !time.Now().Before(l.ValidUntil) }

// Status is a resource as the server reports it (never the acquisition id).
type Status struct {
	Resource string
	// HolderToken is the holder's token, 0 if the resource is free.
	HolderToken uint64
	Remaining   time.Duration
	TTL         time.Duration
	Waiters     uint64
	Holder      string
	// IssuedThrough is the last token the server issued, to any resource,
	// when it answered: every later grant gets a higher one.
	IssuedThrough uint64
	// Permits is a semaphore's number of permits while it has holders or
	// waiters (0: a lock, or free).
	Permits uint32
	// Slots are its shared holders or permits, by slot (HolderToken and
	// the fields after it describe an exclusive holder only).
	Slots []SlotHolder
}

// SlotHolder is a shared holder or a permit, as Status reports it.
type SlotHolder struct {
	Slot      uint32
	Token     uint64
	Remaining time.Duration
	TTL       time.Duration
	Holder    string
}

// Fenced is what an operator fence did.
type Fenced struct {
	Token        uint64
	RevokedToken uint64
}

// acquireSettings are one acquire's options.
type acquireSettings struct {
	ttl    time.Duration
	wait   time.Duration
	holder *string
	// shape is how every resource is held, but those in each.
	shape shape
	// each is the shape of the resources SharedOn and PermitsOn named.
	each map[string]shape
}

// shape is how one resource is held: exclusive (the zero value), shared,
// or a permit of a semaphore of *permits.
type shape struct {
	shared  bool
	permits *uint32
}

// PermitsMax is the most permits a semaphore can have.
const PermitsMax = 4096

// Shared holds every resource of the acquire shared: beside other shared
// holders, never beside an exclusive one (docs/locks.md).
func Shared() AcquireOption {
	return func(a *acquireSettings) { a.shape.shared = true }
}

// Permits holds every resource of the acquire as one of n permits of a
// semaphore (1 to [PermitsMax]); the lease's Slot says which.
func Permits(n uint32) AcquireOption {
	return func(a *acquireSettings) { a.shape.permits = &n }
}

// SharedOn holds resource shared and the acquire's other resources as its
// other options say: shapes mix in one all-or-nothing request.
func SharedOn(resource string) AcquireOption {
	return func(a *acquireSettings) { a.on(resource, func(s *shape) { s.shared = true }) }
}

// PermitsOn holds resource as one of n permits of a semaphore and the
// acquire's other resources as its other options say.
func PermitsOn(resource string, n uint32) AcquireOption {
	return func(a *acquireSettings) { a.on(resource, func(s *shape) { s.permits = &n }) }
}

func (a *acquireSettings) on(resource string, set func(*shape)) {
	if a.each == nil {
		a.each = map[string]shape{}
	}
	s := a.each[resource]
	set(&s)
	a.each[resource] = s
}

// wire is the shape on the wire, or an error naming the rule.
func (s shape) wire() (*pb.LockShape, error) {
	if s.permits == nil {
		return &pb.LockShape{Shared: s.shared}, nil
	}
	permits := *s.permits
	if permits == 0 || permits > PermitsMax {
		return nil, invalidf("permits %d: a semaphore has from 1 to %d permits", permits, PermitsMax)
	}
	if s.shared {
		return nil, invalidf("shared and %d permits: a resource is held shared (a lock) or as a permit (a semaphore), not both", permits)
	}
	return &pb.LockShape{Permits: permits}, nil
}

// shapes are the wire's shapes for names (canonical): none when every one
// is exclusive (the request older servers know).
func (a acquireSettings) shapes(names []string) ([]*pb.LockShape, error) {
	each := map[string]shape{}
	for r, s := range a.each {
		name, err := CheckResource(r, false)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(names, name) {
			return nil, invalidf("a shape for %q, which is not one of the acquire's resources", r)
		}
		each[name] = s
	}
	shapes := make([]*pb.LockShape, len(names))
	plain := true
	for i, name := range names {
		s, ok := each[name]
		if !ok {
			s = a.shape
		}
		w, err := s.wire()
		if err != nil {
			return nil, err
		}
		shapes[i] = w
		plain = plain && !w.Shared && w.Permits == 0
	}
	if plain {
		return nil, nil
	}
	return shapes, nil
}

// AcquireHolder describes the holder of this acquire's leases instead of
// the client's holder.
func AcquireHolder(holder string) AcquireOption {
	return func(a *acquireSettings) { a.holder = &holder }
}

// AcquireOption sets one option of an acquire.
type AcquireOption func(*acquireSettings)

// WithTTL is the lease's TTL (the server's default without it).
func WithTTL(ttl time.Duration) AcquireOption {
	return func(a *acquireSettings) { a.ttl = ttl }
}

// WithWait waits in line up to wait, first come first served, instead of
// trying once.
func WithWait(wait time.Duration) AcquireOption {
	return func(a *acquireSettings) { a.wait = wait }
}

// Acquire takes a lease on resource; [ErrNotAcquired] (a
// [*NotAcquiredError]) if it is held or the wait ran out.
func (c *Client) Acquire(ctx context.Context, resource string, options ...AcquireOption) (*Lease, error) {
	leases, err := c.AcquireAll(ctx, []string{resource}, options...)
	if err != nil {
		return nil, err
	}
	return leases[0], nil
}

// AcquireAll takes a lease on every resource or none, in one request.
func (c *Client) AcquireAll(ctx context.Context, resources []string, options ...AcquireOption) ([]*Lease, error) {
	var a acquireSettings
	for _, o := range options {
		o(&a)
	}
	holder := c.holder
	if a.holder != nil {
		holder = *a.holder
	}
	request, err := c.acquireRequest(resources, a, holder)
	if err != nil {
		return nil, err
	}
	waitMs := request.WaitMs
	// A lease answered to a repeat counts from the first send too.
	sent := time.Now()
	repeat := func(since time.Duration) {
		ms := max(1, uint64(since.Milliseconds()))
		request.FirstSentMsAgo = &ms
		request.WaitMs = waitMs - min(waitMs, ms)
	}
	var response *pb.AcquireResponse
	err = c.call(ctx, a.wait, kind{repeat: repeat}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) error {
		r, err := l.Acquire(ctx, request, o...)
		response = r
		return err
	})
	if err != nil {
		return nil, err
	}
	leases, err := granted(response, sent, len(resources))
	if err != nil {
		return nil, err
	}
	for _, l := range leases {
		if l.Expired() {
			for _, l := range leases {
				_, _ = c.Release(ctx, l)
			}
			return nil, errorf(ErrExpiredOnArrival, "%s: the grant came back after its TTL, counted from when the request was sent; released", l.Resource)
		}
	}
	return leases, nil
}

// acquireRequest checks every argument before anything is sent.
func (c *Client) acquireRequest(resources []string, a acquireSettings, holder string) (*pb.AcquireRequest, error) {
	if len(resources) == 0 {
		return nil, invalidf("name at least one resource")
	}
	names := make([]string, len(resources))
	for i, r := range resources {
		name, err := CheckResource(r, false)
		if err != nil {
			return nil, err
		}
		names[i] = name
	}
	shapes, err := a.shapes(names)
	if err != nil {
		return nil, err
	}
	request := &pb.AcquireRequest{Resources: names, RequestId: make([]byte, 16), Shapes: shapes}
	if a.ttl != 0 {
		ttl, err := millis(a.ttl, "ttl", false)
		if err != nil {
			return nil, err
		}
		request.TtlMs = &ttl
	}
	wait, err := millis(a.wait, "wait", true)
	if err != nil {
		return nil, err
	}
	request.WaitMs = wait
	if holder != "" {
		if _, err := CheckHolder(holder); err != nil {
			return nil, err
		}
		request.Holder = &holder
	}
	requestID(request.RequestId)
	return request, nil
}

// generators are ChaCha8 generators seeded from the system's: a request
// id is as secret as an acquisition id, and a system call per acquire
// would cost more than the rest of the client's work on it.
var generators = sync.Pool{New: func() any {
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		panic(fmt.Sprintf("the system's random generator failed: %v", err))
	}
	return mathrand.NewChaCha8(seed)
}}

// requestID fills id with fresh random bytes.
func requestID(id []byte) {
	g := generators.Get().(*mathrand.ChaCha8)
	_, _ = g.Read(id)
	generators.Put(g)
}

// blockers is a refusal's blockers as the client reports them.
func blockers(all []*pb.Blocker) []Blocker {
	out := make([]Blocker, 0, len(all))
	for _, b := range all {
		holders := make([]BlockingHolder, 0, len(b.GetHolders()))
		for _, h := range b.GetHolders() {
			held, remaining := time.Duration(-1), time.Duration(-1)
			if h.HeldS != nil {
				held = time.Duration(h.GetHeldS()) * time.Second
			}
			if h.RemainingMs != nil {
				remaining = time.Duration(h.GetRemainingMs()) * time.Millisecond
			}
			holders = append(holders, BlockingHolder{
				Token:             h.GetToken(),
				Holder:            h.GetHolder(),
				HeldFor:           held,
				HeldSinceRecovery: h.GetHeldSinceRecovery(),
				Remaining:         remaining,
				SessionBound:      h.GetSessionBound(),
			})
		}
		out = append(out, Blocker{
			Resource:      b.GetResource(),
			Readable:      b.GetReadable(),
			Holders:       holders,
			NHolders:      b.GetNHolders(),
			NWaitersAhead: b.GetNWaitersAhead(),
		})
	}
	return out
}

// granted is the leases of an answer, counted from sent, or why not.
func granted(r *pb.AcquireResponse, sent time.Time, n int) ([]*Lease, error) {
	if na := r.GetNotAcquired(); na != nil {
		reason := map[pb.NotAcquired_Reason]string{
			pb.NotAcquired_HELD:      "held",
			pb.NotAcquired_TIMED_OUT: "timed out",
			pb.NotAcquired_ENDED:     "ended",
		}[na.GetReason()]
		if reason == "" {
			reason = na.GetReason().String()
		}
		return nil, &NotAcquiredError{
			Reason:      reason,
			Resource:    na.GetResource(),
			HolderToken: na.GetHolderToken(),
			Blockers:    blockers(na.GetBlockers()),
		}
	}
	g := r.GetGranted()
	if g == nil || len(g.GetLeases()) != n {
		return nil, errorf(ErrIndeterminate, "unexpected answer to acquire: %v", r)
	}
	leases := make([]*Lease, n)
	for i, l := range g.GetLeases() {
		ttl := time.Duration(l.GetTtlMs()) * time.Millisecond
		leases[i] = &Lease{
			Resource:      l.GetResource(),
			AcquisitionID: l.GetAcquisitionId(),
			Token:         l.GetToken(),
			TTL:           ttl,
			ValidUntil:    sent.Add(time.Duration(l.GetWaitedMs())*time.Millisecond + ttl),
			Slot:          -1,
		}
		if l.Slot != nil {
			leases[i].Slot = int(l.GetSlot())
		}
	}
	return leases, nil
}

// Renew extends the lease by its TTL from now; [ErrNotOwner] if it is no
// longer held (nothing was extended or created).
func (c *Client) Renew(ctx context.Context, lease *Lease) (*Lease, error) {
	sent := time.Now()
	var r *pb.RenewResponse
	err := c.call(ctx, 0, kind{}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) (err error) {
		r, err = l.Renew(ctx, &pb.RenewRequest{Resource: lease.Resource, AcquisitionId: lease.AcquisitionID}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !r.GetRenewed() {
		return nil, errorf(ErrNotOwner, "%s: the lease with token %d is no longer held (expired, released, fenced or replaced); nothing was extended", lease.Resource, lease.Token)
	}
	renewed := *lease
	renewed.Token = r.GetToken()
	renewed.ValidUntil = sent.Add(time.Duration(r.GetRemainingMs()) * time.Millisecond)
	return &renewed, nil
}

// Release gives the lease back; false if it was not held.
func (c *Client) Release(ctx context.Context, lease *Lease) (bool, error) {
	var r *pb.ReleaseResponse
	err := c.call(ctx, 0, kind{}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) (err error) {
		r, err = l.Release(ctx, &pb.ReleaseRequest{Resource: lease.Resource, AcquisitionId: lease.AcquisitionID}, o...)
		return err
	})
	if err != nil {
		return false, err
	}
	return r.GetReleased(), nil
}

// Status reads a resource's holder, remaining TTL and waiters.
func (c *Client) Status(ctx context.Context, resource string) (*Status, error) {
	name, err := CheckResource(resource, true)
	if err != nil {
		return nil, err
	}
	var r *pb.StatusResponse
	err = c.call(ctx, 0, kind{read: true}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) (err error) {
		r, err = l.Status(ctx, &pb.StatusRequest{Resource: name}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return statusOf(r), nil
}

func statusOf(r *pb.StatusResponse) *Status {
	s := &Status{
		Resource:      r.GetResource(),
		Remaining:     time.Duration(r.GetRemainingMs()) * time.Millisecond,
		TTL:           time.Duration(r.GetTtlMs()) * time.Millisecond,
		Waiters:       r.GetNWaiters(),
		Holder:        r.GetHolder(),
		IssuedThrough: r.GetIssuedThrough(),
		Permits:       r.GetPermits(),
	}
	if r.GetHeld() {
		s.HolderToken = r.GetHolderToken()
	}
	for _, x := range r.GetSlots() {
		s.Slots = append(s.Slots, SlotHolder{
			Slot:      x.GetSlot(),
			Token:     x.GetToken(),
			Remaining: time.Duration(x.GetRemainingMs()) * time.Millisecond,
			TTL:       time.Duration(x.GetTtlMs()) * time.Millisecond,
			Holder:    x.GetHolder(),
		})
	}
	return s
}

// List reads up to limit resources under prefix after startAfter, in name
// order (limit 0: the server's default page).
func (c *Client) List(ctx context.Context, prefix, startAfter string, limit uint32) ([]*Status, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	var r *pb.ListResponse
	err := c.call(ctx, 0, kind{read: true}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) (err error) {
		r, err = l.List(ctx, &pb.ListRequest{Prefix: prefix, StartAfter: startAfter, Limit: limit}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Status, len(r.GetEntries()))
	for i, e := range r.GetEntries() {
		out[i] = statusOf(e)
	}
	return out, nil
}

// Fence revokes the resource's lease, if any, and issues a token above
// every earlier one (an operator's action: it needs the fence permission).
func (c *Client) Fence(ctx context.Context, resource string) (*Fenced, error) {
	name, err := CheckResource(resource, true)
	if err != nil {
		return nil, err
	}
	var r *pb.FenceResponse
	err = c.call(ctx, 0, kind{}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) (err error) {
		r, err = l.Fence(ctx, &pb.FenceRequest{Resource: name}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	f := &Fenced{Token: r.GetToken()}
	if r.GetRevoked() {
		f.RevokedToken = r.GetRevokedToken()
	}
	return f, nil
}

// SetPermits changes a semaphore's number of permits while it has holders
// or waiters and returns the number it replaced (an operator's action: it
// needs the fence permission). Lowering it revokes no permit held.
func (c *Client) SetPermits(ctx context.Context, resource string, permits uint32) (uint32, error) {
	name, err := CheckResource(resource, true)
	if err != nil {
		return 0, err
	}
	if permits == 0 || permits > PermitsMax {
		return 0, invalidf("permits %d: a semaphore has from 1 to %d permits", permits, PermitsMax)
	}
	var r *pb.SetPermitsResponse
	err = c.call(ctx, 0, kind{}, func(ctx context.Context, l pb.LeasesClient, o ...grpc.CallOption) (err error) {
		r, err = l.SetPermits(ctx, &pb.SetPermitsRequest{Resource: name, Permits: permits}, o...)
		return err
	})
	if err != nil {
		return 0, err
	}
	return r.GetPrevious(), nil
}

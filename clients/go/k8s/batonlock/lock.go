// Package batonlock is client-go's leader election lock
// (resourcelock.Interface) on a Baton lease, for leaderelection.RunOrDie
// and controller-runtime's manager: the leader holds a Baton lease whose
// fencing token ([Lock.Token]) it carries into every write, so a leader
// that was paused past its lease and resumes is refused where the data is
// written, which Kubernetes' own locks cannot do.
//
// Timing: the lease's TTL is the elector's LeaseDuration (the record's
// LeaseDurationSeconds). The elector renews (Update) every RetryPeriod and
// stops leading when RenewDeadline passes without a renewal, on its own
// clock; since RenewDeadline is below LeaseDuration, a running leader
// stops before Baton could expire its lease. Followers try to acquire
// once the record they observed has not changed for LeaseDuration (the
// record changes only when a new lease is granted); Baton decides: a
// try-once acquire of a held lease is refused. A process paused past its
// lease (GC, SIGSTOP, a frozen VM) cannot know it lost leadership until
// its timers run again: [Lock.Token] then reports no valid token from the
// moment the lease's valid-until passed on this process's monotonic
// clock, and a write it made with an older token is refused by the
// resource (the fence kit). A leader whose lease was lost while it led
// (an operator's fence, or an expiry) does not take the lock again for a
// lease duration: it stops leading when its RenewDeadline passes, and
// another candidate leads with a higher token.
package batonlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"

	baton "github.com/baton-dev/baton/clients/go"
)

// Lock is a resourcelock.Interface on the Baton lease of one resource name.
type Lock struct {
	client   *baton.Client
	name     string
	identity string

	mu    sync.Mutex
	lease *baton.Lease
	// lostUntil: after its lease was lost (fenced, or expired while this
	// candidate led), it does not take the lock again before then, so
	// that it stops leading and another candidate leads.
	lostUntil time.Time
}

var _ rl.Interface = (*Lock)(nil)

// New is the lock on resource name for the candidate identity (stored as
// the lease's holder description, so it is what followers see).
func New(client *baton.Client, name, identity string) (*Lock, error) {
	canonical, err := baton.CheckResource(name, false)
	if err != nil {
		return nil, err
	}
	if _, err := baton.CheckHolder(identity); err != nil {
		return nil, err
	}
	return &Lock{client: client, name: canonical, identity: identity}, nil
}

// record is what Get returns as the raw record: it changes only when a
// new lease is granted (renewals keep it), as the elector expects of a
// record it watches for changes.
type record struct {
	Holder string `json:"holder"`
	Token  uint64 `json:"token"`
}

// Get reads the lease: NotFound while no one holds it.
func (l *Lock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	st, err := l.client.Status(ctx, l.name)
	if err != nil {
		return nil, nil, err
	}
	if st.HolderToken == 0 {
		return nil, nil, apierrors.NewNotFound(schema.GroupResource{Group: "baton", Resource: "leases"}, l.name)
	}
	raw, err := json.Marshal(record{Holder: st.Holder, Token: st.HolderToken})
	if err != nil {
		return nil, nil, err
	}
	return &rl.LeaderElectionRecord{
		HolderIdentity:       st.Holder,
		LeaseDurationSeconds: int(math.Ceil(st.TTL.Seconds())),
	}, raw, nil
}

// Create acquires the lease (try once) with the record's lease duration.
func (l *Lock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	return l.acquire(ctx, ler)
}

// Update renews the lease this candidate holds, or acquires it (try
// once); a record with no holder (the elector's release) releases it.
func (l *Lock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.mu.Lock()
	held := l.lease
	l.mu.Unlock()
	if ler.HolderIdentity == "" {
		if held != nil {
			l.drop(held)
			_, err := l.client.Release(ctx, held)
			return err
		}
		return nil
	}
	if held == nil {
		return l.acquire(ctx, ler)
	}
	renewed, err := l.client.Renew(ctx, held)
	if errors.Is(err, baton.ErrNotOwner) {
		l.drop(held)
		l.mu.Lock()
		l.lostUntil = time.Now().Add(time.Duration(max(ler.LeaseDurationSeconds, 1)) * time.Second)
		l.mu.Unlock()
		return fmt.Errorf("%s: the lease was lost (fenced or expired): %w", l.Describe(), err)
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.lease == held {
		l.lease = renewed
	}
	l.mu.Unlock()
	return nil
}

func (l *Lock) acquire(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.mu.Lock()
	lostUntil := l.lostUntil
	l.mu.Unlock()
	if time.Now().Before(lostUntil) {
		return fmt.Errorf("%s: this candidate lost its lease; it stands back for a lease duration", l.Describe())
	}
	ttl := time.Duration(max(ler.LeaseDurationSeconds, 1)) * time.Second
	lease, err := l.client.Acquire(ctx, l.name, baton.WithTTL(ttl), baton.AcquireHolder(l.identity))
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.lease = lease
	l.mu.Unlock()
	return nil
}

// drop forgets lease if it is still the one held.
func (l *Lock) drop(lease *baton.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease == lease {
		l.lease = nil
	}
}

// Token is the fencing token of the lease this candidate holds, and
// whether it is valid now: held, and before its valid-until on this
// process's monotonic clock (counted from the last renewal's send).
// Carry it into every write made as the leader.
func (l *Lock) Token() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease == nil || l.lease.Expired() {
		return 0, false
	}
	return l.lease.Token, true
}

// RecordEvent is a no-op: Baton's audit log and watch record holders.
func (l *Lock) RecordEvent(string) {}

// Identity is the candidate's identity.
func (l *Lock) Identity() string { return l.identity }

// Describe names the lock.
func (l *Lock) Describe() string { return "baton lease " + l.name }

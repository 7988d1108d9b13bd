package batonlock

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/batontest"
)

// tokenStore stands in for a fenced resource: it refuses a write whose
// token is below one it has accepted (the fence kit's rule).
type tokenStore struct {
	mu      sync.Mutex
	highest uint64
}

func (s *tokenStore) write(token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return fmt.Errorf("stale token %d: %d was written", token, s.highest)
	}
	s.highest = token
	return nil
}

type event struct {
	candidate int
	token     uint64
	leading   bool
}

// Three candidates run client-go's LeaderElector on Baton locks: one
// leads with a token; when its lease is fenced (as a pause past its lease
// would end it) it stops leading and another leads with a higher token,
// and the old leader's write with its token is refused; when that leader
// is cancelled it releases, and the third leads.
func TestClientGoLeaderElectorOnABatonLock(t *testing.T) {
	s := batontest.Start(t)
	events := make(chan event, 16)
	locks := make([]*Lock, 3)
	cancels := make([]context.CancelFunc, 3)
	var wg sync.WaitGroup
	for i := range locks {
		client, err := baton.New(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = client.Close() }()
		lock, err := New(client, "election:k8s", fmt.Sprintf("candidate-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = lock
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		defer cancel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
				Lock: lock, LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond,
				RetryPeriod: 100 * time.Millisecond, ReleaseOnCancel: true, Name: "baton-test",
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(context.Context) {
						token, _ := lock.Token()
						events <- event{candidate: i, token: token, leading: true}
					},
					OnStoppedLeading: func() { events <- event{candidate: i} },
				},
			})
		}()
	}
	store := &tokenStore{}
	// Events in arrival order; a start and a stop may come in either order.
	var seen []event
	next := func(leading bool) event {
		t.Helper()
		for {
			for i, e := range seen {
				if e.leading == leading {
					seen = append(seen[:i], seen[i+1:]...)
					return e
				}
			}
			select {
			case e := <-events:
				seen = append(seen, e)
			case <-time.After(15 * time.Second):
				t.Fatalf("no candidate %s within 15 s", map[bool]string{true: "started", false: "stopped"}[leading])
			}
		}
	}
	first := next(true)
	if first.token == 0 || store.write(first.token) != nil {
		t.Fatalf("the first leader has a token: %+v", first)
	}
	for i, l := range locks {
		if _, ok := l.Token(); ok != (i == first.candidate) {
			t.Fatalf("candidate %d holds a token: %v", i, ok)
		}
	}
	operator, err := baton.New(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = operator.Close() }()
	if _, err := operator.Fence(context.Background(), "election:k8s"); err != nil {
		t.Fatal(err)
	}
	stopped := next(false)
	if stopped.candidate != first.candidate {
		t.Fatalf("the fenced leader stops leading: %+v", stopped)
	}
	second := next(true)
	if second.candidate == first.candidate || second.token <= first.token {
		t.Fatalf("a new leader above the old token: %+v after %+v", second, first)
	}
	if err := store.write(second.token); err != nil {
		t.Fatal(err)
	}
	if err := store.write(first.token); err == nil {
		t.Fatal("the old leader's write with its token must be refused")
	}
	cancels[second.candidate]()
	third := next(true)
	if third.candidate == second.candidate || third.token <= second.token {
		t.Fatalf("after a release, the next leads above: %+v after %+v", third, second)
	}
	t.Logf("leaders: candidate %d (token %d), fenced; %d (token %d), released; %d (token %d)",
		first.candidate, first.token, second.candidate, second.token, third.candidate, third.token)
	for _, cancel := range cancels {
		cancel()
	}
	wg.Wait()
}

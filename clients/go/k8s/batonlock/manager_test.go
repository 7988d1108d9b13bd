package batonlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/batontest"
)

// leaderRunnable is a controller's work: it runs only on the elected
// manager (controller-runtime starts it after the election), reports the
// token it writes with, and stops when the manager does.
type leaderRunnable struct {
	candidate int
	lock      *Lock
	events    chan<- event
}

func (r leaderRunnable) NeedLeaderElection() bool { return true }

func (r leaderRunnable) Start(ctx context.Context) error {
	token, ok := r.lock.Token()
	if !ok {
		return errors.New("started as leader without a valid token")
	}
	r.events <- event{candidate: r.candidate, token: token, leading: true}
	<-ctx.Done()
	return nil
}

// controller-runtime's manager with LeaderElectionResourceLockInterface
// set to a Baton lock, as far as a manager runs without a Kubernetes API
// server (none can run here): two managers, one elected, its leader-only
// runnable holding a token; cancelled, it releases (ReleaseOnCancel) and
// the other manager is elected with a higher token. Untested here: its
// caches, clients and controllers against a real API server (they do not
// touch the lock).
func TestControllerRuntimeManagerOnABatonLock(t *testing.T) {
	s := batontest.Start(t)
	// Nothing listens on port 1: a manager that reached for the API
	// server would fail, so the test also shows the lock needs none.
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	events := make(chan event, 8)
	cancels := make([]context.CancelFunc, 2)
	type stop struct {
		manager int
		err     error
	}
	stops := make(chan stop, 2)
	var wg sync.WaitGroup
	for i := range cancels {
		client, err := baton.New(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = client.Close() }()
		lock, err := New(client, "election:manager", fmt.Sprintf("manager-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		lease, renew, retry := 2*time.Second, 1500*time.Millisecond, 100*time.Millisecond
		mgr, err := ctrl.NewManager(cfg, manager.Options{
			LeaderElection:                      true,
			LeaderElectionID:                    "election:manager",
			LeaderElectionResourceLockInterface: lock,
			LeaderElectionReleaseOnCancel:       true,
			LeaseDuration:                       &lease,
			RenewDeadline:                       &renew,
			RetryPeriod:                         &retry,
			Metrics:                             metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress:              "0",
			// The manager's own log, shown if the test fails.
			Logger: funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{}),
		})
		if err != nil {
			t.Fatalf("manager %d: %v", i, err)
		}
		if err := mgr.Add(leaderRunnable{candidate: i, lock: lock, events: events}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		defer cancel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			stops <- stop{i, mgr.Start(ctx)}
		}()
	}
	// The next election; a manager may stop only when cancelled, cleanly.
	cancelled := map[int]bool{}
	next := func() event {
		t.Helper()
		for {
			select {
			case e := <-events:
				return e
			case s := <-stops:
				if !cancelled[s.manager] || s.err != nil {
					t.Fatalf("manager %d stopped: %v", s.manager, s.err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("no manager was elected within 15 s")
			}
		}
	}
	first := next()
	if first.token == 0 {
		t.Fatalf("the elected manager has a token: %+v", first)
	}
	cancelled[first.candidate] = true
	stopped := time.Now()
	cancels[first.candidate]()
	second := next()
	handover := time.Since(stopped)
	if second.candidate == first.candidate || second.token <= first.token {
		t.Fatalf("after the leader's manager stopped, the other leads above its token: %+v after %+v", second, first)
	}
	t.Logf("managers: %d led with token %d, released on cancel; %d leads with token %d, %d ms later (lease duration %d ms)",
		first.candidate, first.token, second.candidate, second.token, handover.Milliseconds(), (2 * time.Second).Milliseconds())
	cancelled[second.candidate] = true
	cancels[second.candidate]()
	wg.Wait()
	close(stops)
	for s := range stops {
		if s.err != nil {
			t.Fatalf("manager %d stopped with %v", s.manager, s.err)
		}
	}
}

package baton

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/clients/go/batontest"
)

func openSession(t *testing.T, c *Client, ttl time.Duration) *Session {
	t.Helper()
	s, err := c.OpenSession(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.Close(context.Background()) })
	return s
}

func TestASessionKeepsItsLeasesAliveAndClosingReleasesThem(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t), WithHolder("go session"))
	s := openSession(t, c, 300*time.Millisecond)
	lease, err := s.Acquire(ctx, "job:go:session")
	if err != nil {
		t.Fatal(err)
	}
	own, err := s.Acquire(ctx, "job:go:own", WithTTL(5*time.Second))
	if err != nil || own.SessionBound {
		t.Fatalf("a lease of its own on the session: %+v, %v", own, err)
	}
	if !lease.SessionBound || lease.ValidUntil.Before(s.SafeUntil()) {
		t.Fatalf("tied to the session: %+v (session safe until %v)", lease, s.SafeUntil())
	}
	kept := s.Keep(ctx, lease)
	time.Sleep(time.Second) // three session TTLs: only heartbeats keep it
	if err := kept.Err(); err != nil {
		t.Fatalf("kept by heartbeats: %v", err)
	}
	st, err := c.Status(ctx, "job:go:session")
	if err != nil || st.HolderToken != lease.Token || st.Holder != "go session" {
		t.Fatalf("held: %+v, %v", st, err)
	}
	if wasOpen, err := s.Close(ctx); err != nil || !wasOpen {
		t.Fatalf("close: %v, %v", wasOpen, err)
	}
	if st, err := c.Status(ctx, "job:go:session"); err != nil || st.HolderToken != 0 {
		t.Fatalf("released by the close: %+v, %v", st, err)
	}
	// A lease with a TTL of its own outlives the session until its TTL.
	if st, err := c.Status(ctx, "job:go:own"); err != nil || st.HolderToken != own.Token {
		t.Fatalf("a lease of its own is not the session's: %+v, %v", st, err)
	}
	if ok, err := c.Release(ctx, own); err != nil || !ok {
		t.Fatalf("released on its own: %v, %v", ok, err)
	}
	<-kept.Context().Done()
	if _, err := s.Acquire(ctx, "job:go:after"); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("an ended session: %v", err)
	}
}

func TestCancellingAWaitingAcquireWithdrawsTheWait(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	holder, err := c.Acquire(ctx, "job:go:line", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := openSession(t, c, 5*time.Second)
	waiting, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(waiting, "job:go:line", WithWait(30*time.Second))
		done <- err
	}()
	for st, _ := c.Status(ctx, "job:go:line"); st.Waiters == 0; st, _ = c.Status(ctx, "job:go:line") {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotAcquired) || !strings.Contains(err.Error(), "cancelled") {
			t.Fatalf("withdrawn: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled wait still waits")
	}
	st, err := c.Status(ctx, "job:go:line")
	if err != nil || st.Waiters != 0 || st.HolderToken != holder.Token {
		t.Fatalf("no waiter left on the server: %+v, %v", st, err)
	}
}

func TestASessionKeeperIsLostOnAFenceAndAtTheSafeUntilOfAFrozenServer(t *testing.T) {
	ctx := context.Background()
	addr, process := startServer(t)
	c := connect(t, addr, WithDialTimeout(200*time.Millisecond))
	s := openSession(t, c, 2*time.Second)
	fenced, err := s.Acquire(ctx, "job:go:fenced")
	if err != nil {
		t.Fatal(err)
	}
	k := s.Keep(ctx, fenced)
	if _, err := c.Fence(ctx, "job:go:fenced"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a heartbeat did not report the fence")
	}
	if err := k.Err(); !strings.Contains(err.Error(), "revoked (fenced)") {
		t.Fatalf("fenced: %v", err)
	}
	lease, err := s.Acquire(ctx, "job:go:frozen")
	if err != nil {
		t.Fatal(err)
	}
	kept := s.Keep(ctx, lease)
	if err := process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = process.Signal(syscall.SIGCONT) }()
	select {
	case <-kept.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper still vouches for a lease a frozen server may have expired")
	}
	gaveUp := time.Now()
	if deadline := s.SafeUntil().Add(s.margin); gaveUp.After(deadline) {
		t.Fatalf("gave up at %v, after the session could expire at %v", gaveUp, deadline)
	}
	if err := kept.Err(); !errors.Is(err, ErrOwnershipLost) {
		t.Fatalf("lost: %v", err)
	}
}

func TestASessionIsResumedAcrossARestartWithItsLeases(t *testing.T) {
	ctx := context.Background()
	n := batontest.Start(t)
	c := connect(t, n.Addr)
	s := openSession(t, c, 5*time.Second)
	lease, err := s.Acquire(ctx, "job:go:restart")
	if err != nil {
		t.Fatal(err)
	}
	n.Restart(t)
	for s.Resumes() == 0 {
		select {
		case <-s.Done():
			t.Fatalf("the session ended instead of resuming: %v", s.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	st, err := c.Status(ctx, "job:go:restart")
	if err != nil || st.HolderToken != lease.Token {
		t.Fatalf("the lease kept its token after the restart: %+v, %v", st, err)
	}
	if ok, err := s.Release(ctx, lease); err != nil || !ok {
		t.Fatalf("released on the resumed session: %v, %v", ok, err)
	}
}

func TestALostSessionAcquireAnswerIsSentAgainOnTheResumedSession(t *testing.T) {
	ctx := context.Background()
	addr := server(t)
	proxy := newDropProxy(t, addr)
	c := connect(t, proxy.addr())
	s := openSession(t, c, 5*time.Second)
	proxy.arm("lost:go:session")
	lease, err := s.Acquire(ctx, "lost:go:session")
	if err != nil {
		t.Fatalf("the repeat on the resumed session gets the grant: %v", err)
	}
	if proxy.dropped.Load() != 1 || s.Resumes() == 0 {
		t.Fatalf("the fault fired %d times, resumes %d", proxy.dropped.Load(), s.Resumes())
	}
	st, err := connect(t, addr).Status(ctx, "lost:go:session")
	if err != nil || st.HolderToken != lease.Token {
		t.Fatalf("one lease, the one answered: %+v, %v", st, err)
	}
	t.Logf("session answers dropped: %d; resumed %d times; orphan leases: 0", proxy.dropped.Load(), s.Resumes())
}

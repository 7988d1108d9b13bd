package baton

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAKeeperKeepsALeaseAcrossManyTTLsAndReleasesIt(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	lease, err := c.Acquire(ctx, "job:go:kept", WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Keep(ctx, lease)
	time.Sleep(time.Second) // three TTLs: only renewals keep it
	if err := k.Err(); err != nil {
		t.Fatalf("kept: %v", err)
	}
	if k.SafeUntil().Before(lease.ValidUntil) {
		t.Fatalf("renewals moved the safe-until on: %v, first %v", k.SafeUntil(), lease.ValidUntil)
	}
	st, err := c.Status(ctx, "job:go:kept")
	if err != nil || st.HolderToken != lease.Token {
		t.Fatalf("held: %+v, %v", st, err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Status(ctx, "job:go:kept"); st.HolderToken != 0 {
		t.Fatalf("released: %+v", st)
	}
	if k.Context().Err() == nil || !errors.Is(k.Err(), ErrOwnershipLost) {
		t.Fatal("a released lease's keeper no longer vouches for it")
	}
}

func TestAKeeperLosesAFencedLeaseAtItsNextRenewal(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	lease, err := c.Acquire(ctx, "job:go:fenced", WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Keep(ctx, lease)
	if _, err := c.Fence(ctx, "job:go:fenced"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the keeper did not notice the fence")
	}
	err = k.Err()
	if !errors.Is(err, ErrOwnershipLost) || !strings.Contains(err.Error(), "no longer knows this lease") {
		t.Fatalf("check: %v", err)
	}
	k.Stop()
}

// A frozen server (SIGSTOP: TCP still connects, nothing answers): the
// keeper gives the lease up at its safe-until on its own clock, never
// after the time the server could expire it.
func TestAKeeperGivesTheLeaseUpAtItsSafeUntilWhenTheServerIsFrozen(t *testing.T) {
	ctx := context.Background()
	addr, process := startServer(t)
	c := connect(t, addr, WithDialTimeout(200*time.Millisecond))
	lease, err := c.Acquire(ctx, "job:go:frozen", WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Keep(ctx, lease)
	if err := process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = process.Signal(syscall.SIGCONT) }()
	stopped := time.Now()
	var validUntil time.Time
	select {
	case <-k.Context().Done():
		validUntil = k.Lease().ValidUntil
	case <-time.After(5 * time.Second):
		t.Fatal("the keeper still vouches for a lease a frozen server may have expired")
	}
	gaveUp := time.Now()
	if gaveUp.After(validUntil) {
		t.Fatalf("gave up at %v, after the lease's valid-until %v", gaveUp, validUntil)
	}
	if err := k.Err(); !errors.Is(err, ErrOwnershipLost) || !strings.Contains(err.Error(), "safe-until") {
		t.Fatalf("check: %v", err)
	}
	t.Logf("server frozen %v before the keeper gave up, %v before the valid-until",
		gaveUp.Sub(stopped).Round(time.Millisecond), validUntil.Sub(gaveUp).Round(time.Millisecond))
	k.Stop()
}

package baton

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Semaphores and shared locks, unary and on a session: slots, the N kept,
// refusals of another kind or N as definite errors, bad shapes refused
// before anything is sent, and the operator's change of N.
func TestSemaphoresAndSharedLocks(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	ttl := WithTTL(30 * time.Second)
	var permits []*Lease
	for range 2 {
		l, err := c.Acquire(ctx, "go:jobs", ttl, Permits(2))
		if err != nil {
			t.Fatal(err)
		}
		permits = append(permits, l)
	}
	if permits[0].Slot != 0 || permits[1].Slot != 1 || permits[1].Token <= permits[0].Token {
		t.Fatalf("two permits: %+v %+v", permits[0], permits[1])
	}
	var na *NotAcquiredError
	if _, err := c.Acquire(ctx, "go:jobs", ttl, Permits(2)); !errors.As(err, &na) {
		t.Fatalf("a third permit of two: %v", err)
	}
	for _, wrong := range [][]AcquireOption{{ttl}, {ttl, Permits(3)}, {ttl, Shared()}} {
		_, err := c.Acquire(ctx, "go:jobs", wrong...)
		if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrIndeterminate) {
			t.Fatalf("another kind or N must be a definite invalid request: %v", err)
		}
	}
	for _, bad := range [][]AcquireOption{{Permits(0)}, {Permits(PermitsMax + 1)}, {Shared(), Permits(2)}} {
		if _, err := c.Acquire(ctx, "go:new", bad...); !errors.Is(err, ErrInvalid) {
			t.Fatalf("refused before sending: %v", err)
		}
	}
	st, err := c.Status(ctx, "go:jobs")
	if err != nil {
		t.Fatal(err)
	}
	if st.Permits != 2 || len(st.Slots) != 2 || st.Slots[1].Token != permits[1].Token {
		t.Fatalf("status %+v", st)
	}
	if prev, err := c.SetPermits(ctx, "go:jobs", 3); err != nil || prev != 2 {
		t.Fatalf("set permits: %d %v", prev, err)
	}
	s, err := c.OpenSession(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	third, err := s.Acquire(ctx, "go:jobs", Permits(3))
	if err != nil || third.Slot != 2 {
		t.Fatalf("a session's permit: %+v %v", third, err)
	}
	readers := make([]*Lease, 2)
	for i := range readers {
		if readers[i], err = s.Acquire(ctx, "go:doc", Shared()); err != nil {
			t.Fatal(err)
		}
	}
	if readers[0].Slot != 0 || readers[1].Slot != 1 {
		t.Fatalf("shared holders: %+v %+v", readers[0], readers[1])
	}
	if _, err := c.Acquire(ctx, "go:doc", ttl); !errors.As(err, &na) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	exclusive, err := c.Acquire(ctx, "go:free", ttl)
	if err != nil || exclusive.Slot != -1 {
		t.Fatalf("an exclusive lease has no slot: %+v %v", exclusive, err)
	}
}

// One AcquireAll mixes shapes (SharedOn, PermitsOn beside the call's own
// shape), all or nothing, unary and on a session; a shape for a resource
// the call does not name is refused before anything is sent.
func TestOneRequestMixesShapes(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	ttl := WithTTL(30 * time.Second)
	mixed := []AcquireOption{ttl, PermitsOn("go:mix-jobs", 2), SharedOn("go:mix-doc")}
	names := []string{"go:mix-jobs", "go:mix-doc", "go:mix-db"}
	first, err := c.AcquireAll(ctx, names, mixed...)
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Slot != 0 || first[1].Slot != 0 || first[2].Slot != -1 {
		t.Fatalf("slots %d %d %d", first[0].Slot, first[1].Slot, first[2].Slot)
	}
	if _, err := c.AcquireAll(ctx, names[:2], mixed...); err != nil {
		t.Fatal(err)
	}
	var na *NotAcquiredError
	if _, err := c.AcquireAll(ctx, names[:2], mixed...); !errors.As(err, &na) || na.Blockers[0].NHolders != 2 {
		t.Fatalf("a third permit of two: %v", err)
	}
	if st, _ := c.Status(ctx, "go:mix-doc"); len(st.Slots) != 2 {
		t.Fatalf("nothing of the refused request was granted: %+v", st)
	}
	bad := [][]AcquireOption{
		{ttl, SharedOn("go:elsewhere")},
		{ttl, SharedOn("go:mix-doc"), PermitsOn("go:mix-doc", 2)},
		{ttl, PermitsOn("go:mix-jobs", 0)},
	}
	for _, options := range bad {
		if _, err := c.AcquireAll(ctx, []string{"go:mix-doc", "go:mix-jobs"}, options...); !errors.Is(err, ErrInvalid) {
			t.Fatalf("refused before sending: %v", err)
		}
	}
	s, err := c.OpenSession(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	held, err := s.AcquireAll(ctx, []string{"go:mix-doc", "go:mix-other"}, SharedOn("go:mix-doc"))
	if err != nil || held[0].Slot != 2 || held[1].Slot != -1 {
		t.Fatalf("a session's mixed request: %v", err)
	}
}

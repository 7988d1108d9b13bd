package baton

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/baton-dev/baton/clients/go/batontest"
)

func TestAWatchSeesTheSnapshotThenEveryChangeAndEndsAtARestart(t *testing.T) {
	ctx := context.Background()
	n := batontest.Start(t)
	c := connect(t, n.Addr, WithHolder("go watcher test"))
	first, err := c.Acquire(ctx, "w:go:a", WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "w:go:")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if len(w.Holders) != 1 || w.Holders[0].Token != first.Token || w.Holders[0].Holder != "go watcher test" {
		t.Fatalf("snapshot: %+v", w.Holders)
	}
	second, err := c.Acquire(ctx, "w:go:b", WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	fenced, err := c.Fence(ctx, "w:go:b")
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{Kind: "granted", Resource: "w:go:b", Token: second.Token, Holder: "go watcher test"},
		{Kind: "released", Resource: "w:go:a", Token: first.Token, Holder: "go watcher test"},
		{Kind: "fenced", Resource: "w:go:b", Token: fenced.Token, RevokedToken: second.Token, Holder: "go watcher test"},
	}
	seq := w.Seq
	for i, expect := range want {
		got, err := w.Next()
		if err != nil {
			t.Fatal(err)
		}
		if got.Seq <= seq {
			t.Fatalf("change %d: seq %d after %d", i, got.Seq, seq)
		}
		seq, expect.Seq = got.Seq, got.Seq
		if got != expect {
			t.Fatalf("change %d: %+v, want %+v", i, got, expect)
		}
	}
	n.Restart(t)
	if _, err := w.Next(); !errors.Is(err, ErrWatchEnded) {
		t.Fatalf("a restart ends the watch: %v", err)
	}
}

func TestAnElectionHandsLeadershipOnInLineAndObserversSeeIt(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	e, err := c.Election("election:go")
	if err != nil {
		t.Fatal(err)
	}
	a, err := e.Campaign(ctx, "candidate a", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	observed := make(chan Leader, 8)
	observing, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = e.Observe(observing, func(_ *Change, l *Leader) bool {
			if l != nil {
				observed <- *l
			}
			return observing.Err() == nil
		})
	}()
	if got := <-observed; got != (Leader{Token: a.Token(), Value: "candidate a"}) {
		t.Fatalf("observed first: %+v", got)
	}
	elected := make(chan *SessionKeeper, 1)
	go func() {
		b, err := e.Campaign(ctx, "candidate b", 2*time.Second)
		if err != nil {
			t.Error(err)
		}
		elected <- b
	}()
	for st, _ := c.Status(ctx, "election:go"); st.Waiters == 0; st, _ = c.Status(ctx, "election:go") {
		time.Sleep(10 * time.Millisecond)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-elected
	if b.Token() <= a.Token() || b.Err() != nil {
		t.Fatalf("b leads above a: %d after %d (%v)", b.Token(), a.Token(), b.Err())
	}
	if got := <-observed; got != (Leader{Token: b.Token(), Value: "candidate b"}) {
		t.Fatalf("observed next: %+v", got)
	}
	if l, err := e.Leader(ctx); err != nil || l.Value != "candidate b" {
		t.Fatalf("leader: %+v, %v", l, err)
	}
	// A campaign whose context ends first leaves no waiter.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := e.Campaign(short, "candidate c", 2*time.Second); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a campaign that ran out: %v", err)
	}
	if st, _ := c.Status(ctx, "election:go"); st.Waiters != 0 {
		t.Fatalf("waiters left: %+v", st)
	}
	_ = b.Release(ctx)
}

package baton

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/clients/go/batontest"
)

func TestAWatchSeesTheSnapshotThenEveryChangeAndOnceEndsAtARestart(t *testing.T) {
	ctx := context.Background()
	n := batontest.Start(t)
	c := connect(t, n.Addr, WithHolder("go watcher test"))
	first, err := c.Acquire(ctx, "w:go:a", WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "w:go:", WatchOnce())
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

// A watch resumes by itself across three SIGKILLs under eight goroutines
// of churn: every number after the snapshot comes once and in order, and
// the changes lead to the holders a fresh snapshot shows; a number from
// the future is refused.
func TestAWatchResumesAcrossSigkillWithNoGapAndNoDuplicate(t *testing.T) {
	ctx := context.Background()
	n := batontest.Start(t)
	stop := make(chan struct{})
	var workers sync.WaitGroup
	var answers atomic.Int64
	for w := range 8 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			c := connect(t, n.Addr, WithTimeout(2*time.Second))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("r:%d:%d", w, i%3)
				lease, err := c.Acquire(ctx, name, WithTTL(time.Minute))
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if _, err := c.Release(ctx, lease); err == nil {
					answers.Add(2)
				}
			}
		}()
	}
	after := func(k int64) {
		floor := answers.Load() + k
		for answers.Load() < floor {
			time.Sleep(5 * time.Millisecond)
		}
	}
	after(100)
	w, err := connect(t, n.Addr, WithTimeout(2*time.Second)).Watch(ctx, "r:")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	held := map[string]uint64{}
	for _, h := range w.Holders {
		held[h.Resource] = h.Token
	}
	changes := make(chan Change, 100000)
	go func() {
		for {
			c, err := w.Next()
			if err != nil {
				close(changes)
				return
			}
			changes <- c
		}
	}()
	for range 3 {
		after(100)
		n.Restart(t)
	}
	after(100)
	close(stop)
	workers.Wait()
	c := connect(t, n.Addr)
	end, err := c.Acquire(ctx, "r:end", WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	seq, count := w.Seq, 0
	for ch := range changes {
		if ch.Kind == "resnapshot" || ch.Seq != seq+1 {
			t.Fatalf("no gap, no duplicate, no resnapshot: %+v after %d", ch, seq)
		}
		seq, count = ch.Seq, count+1
		switch ch.Kind {
		case "granted", "handed_off":
			if _, was := held[ch.Resource]; was {
				t.Fatalf("granted while held: %+v", ch)
			}
			held[ch.Resource] = ch.Token
		default:
			if held[ch.Resource] != ch.Token {
				t.Fatalf("ended another's lease: %+v", ch)
			}
			delete(held, ch.Resource)
		}
		if ch.Token == end.Token {
			break
		}
	}
	fresh, err := c.Watch(ctx, "r:", WatchOnce())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	now := map[string]uint64{}
	for _, h := range fresh.Holders {
		now[h.Resource] = h.Token
	}
	if !maps.Equal(held, now) {
		t.Fatalf("the changes lead to %v, the holders now are %v", held, now)
	}
	t.Logf("go watch across 3 SIGKILLs: %d changes after seq %d, every one once and in order", count, w.Seq)
	// A number above the last change is not this cluster's.
	if _, err := c.Watch(ctx, "r:", WatchAfter(fresh.Seq+1)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "above the last change") {
		t.Fatalf("from the future: %v", err)
	}
}

// A watch whose stream ends with a restart, while more changes happen
// than the server keeps, takes a new snapshot and says so.
func TestAWatchThatResumesTooLateTakesANewSnapshot(t *testing.T) {
	ctx := context.Background()
	n := batontest.Start(t, "--watch-history", "4")
	c := connect(t, n.Addr, WithTimeout(2*time.Second))
	w, err := c.Watch(ctx, "r:")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	n.Restart(t)
	for range 5 {
		lease, err := c.Acquire(ctx, "r:x", WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(ctx, lease); err != nil {
			t.Fatal(err)
		}
	}
	first, err := w.Next()
	if err != nil || first.Kind != "resnapshot" || first.Seq != w.Seq+10 || len(first.Resnapshot.Holders) != 0 {
		t.Fatalf("a resnapshot at the last change: %+v, %v", first, err)
	}
	var tooOld *WatchTooOldError
	if _, err := c.Watch(ctx, "r:", WatchAfter(w.Seq)); !errors.As(err, &tooOld) || !errors.Is(err, ErrWatchTooOld) || tooOld.OldestSeq != first.Seq-4 {
		t.Fatalf("too old: %v", err)
	}
}

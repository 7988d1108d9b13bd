package fence_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/batontest"
	"github.com/baton-dev/baton/clients/go/fence"
)

// publishIn publishes key under token in a transaction of its own,
// committed only when applied.
func publishIn(t *testing.T, db *sql.DB, token uint64, key string) fence.Decision {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := fence.Publish(ctx, fence.SQL(tx), "statement:go:7", token, "publish "+key, []byte(key), key)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if d.Outcome == fence.Applied {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	} else if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	return d
}

// The stale worker, in Go: worker A holds the lease and publishes; its
// lease is fenced (as a pause past its TTL would end it); worker B
// acquires a higher token and publishes; A's late publish is refused as
// stale, and the resource keeps B's.
func TestAStaleWorkersPublishIsRefusedWhereTheDataIsWritten(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("pgx", batontest.FenceKitDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	server := batontest.Start(t)
	client, err := baton.New(server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()

	a, err := client.Acquire(ctx, "statement:go:7", baton.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := publishIn(t, db, a.Token, "statements/7/a.pdf"); d.Outcome != fence.Applied || !d.OK() {
		t.Fatalf("A publishes: %+v", d)
	}
	if d := publishIn(t, db, a.Token, "statements/7/a.pdf"); d.Outcome != fence.Replayed {
		t.Fatalf("the same publication again is a replay: %+v", d)
	}
	if _, err := client.Fence(ctx, "statement:go:7"); err != nil {
		t.Fatal(err)
	}
	b, err := client.Acquire(ctx, "statement:go:7", baton.WithTTL(30*time.Second))
	if err != nil || b.Token <= a.Token {
		t.Fatalf("B acquires above A: %+v, %v", b, err)
	}
	if d := publishIn(t, db, b.Token, "statements/7/b.pdf"); d.Outcome != fence.Applied {
		t.Fatalf("B publishes: %+v", d)
	}
	stale := publishIn(t, db, a.Token, "statements/7/a-late.pdf")
	if stale.Outcome != fence.Stale || stale.OK() || stale.CurrentToken != b.Token {
		t.Fatalf("A's late publish is stale: %+v", stale)
	}
	g, ok, err := fence.GenerationOf(ctx, fence.SQL(db), "statement:go:7")
	if err != nil || !ok || g.PublishedKey != "statements/7/b.pdf" || g.PublishedToken != b.Token {
		t.Fatalf("the resource keeps B's: %+v %v %v", g, ok, err)
	}
	if d, err := fence.Fence(ctx, fence.SQL(db), "statement:go:7", a.Token, "email", []byte("x"), fence.Options{}); err != nil || d.Outcome != fence.Stale {
		t.Fatalf("any write under A's token: %+v, %v", d, err)
	}
	// One write per generation: B's delete needs a generation of its own.
	if d, _ := fence.Delete(ctx, fence.SQL(db), "statement:go:7", b.Token, "delete", []byte("d")); d.Outcome != fence.GenerationUsed {
		t.Fatalf("a second write under B's token: %+v", d)
	}
	c, err := client.Acquire(ctx, "statement:go:9", baton.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := fence.Delete(ctx, fence.SQL(db), "statement:go:9", c.Token, "delete", []byte("d")); err != nil || d.Outcome != fence.Applied {
		t.Fatalf("a tombstone: %+v, %v", d, err)
	}
	if g, _, _ := fence.GenerationOf(ctx, fence.SQL(db), "statement:go:9"); !g.Deleted || g.Generation != c.Token {
		t.Fatalf("deleted: %+v", g)
	}
	if d, _ := fence.Fence(ctx, fence.SQL(db), "statement:go:9", a.Token, "late", []byte("x"), fence.Options{}); d.OK() {
		t.Fatalf("a write below the tombstone: %+v", d)
	}
	at, err := fence.Cancel(ctx, fence.SQL(db), "statement:go:8", 1<<41, "")
	if err != nil || at != 1<<41 {
		t.Fatalf("cancel: %d, %v", at, err)
	}
	if d, err := fence.Fence(ctx, fence.SQL(db), "statement:go:8", 1<<41, "late", []byte("x"), fence.Options{}); err != nil || d.Outcome != fence.Cancelled {
		t.Fatalf("a write at the cancelled token: %+v, %v", d, err)
	}
	if _, err := fence.Fence(ctx, fence.SQL(db), "statement:go:8", 0, "zero", nil, fence.Options{}); err == nil {
		t.Fatal("token 0 is refused before the database sees it")
	}
	t.Logf("A (token %d) refused as stale after B (token %d) published", a.Token, b.Token)
}

// Readers write their own output under shared leases (Options.Shared); a
// writer granted after them raises the floor, and the reader that wakes
// after the writer wrote is refused; readers never refuse each other.
func TestAReadersLateOutputIsRefusedAfterAWriterWrote(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("pgx", batontest.FenceKitDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	server := batontest.Start(t)
	client, err := baton.New(server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	const name = "report:go"
	write := func(token uint64, op string, shared bool) fence.Decision {
		t.Helper()
		d, err := fence.Fence(ctx, fence.SQL(db), name, token, op, []byte(op), fence.Options{Shared: shared})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	r1, err := client.Acquire(ctx, name, baton.WithTTL(30*time.Second), baton.Shared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := client.Acquire(ctx, name, baton.WithTTL(30*time.Second), baton.Shared())
	if err != nil {
		t.Fatal(err)
	}
	if d := write(r2.Token, "r2", true); d.Outcome != fence.Applied {
		t.Fatalf("the later reader writes: %+v", d)
	}
	if d := write(r1.Token, "r1", true); d.Outcome != fence.Applied {
		t.Fatalf("the earlier reader is not refused by the later one: %+v", d)
	}
	if _, err := client.Fence(ctx, name); err != nil {
		t.Fatal(err)
	}
	w, err := client.Acquire(ctx, name, baton.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := write(w.Token, "w", false); d.Outcome != fence.Applied {
		t.Fatalf("the writer writes: %+v", d)
	}
	if d := write(r1.Token, "r1-late", true); d.Outcome != fence.Stale || d.CurrentToken != w.Token {
		t.Fatalf("the reader's late output: %+v", d)
	}
	if _, err := client.Release(ctx, w); err != nil {
		t.Fatal(err)
	}
	r3, err := client.Acquire(ctx, name, baton.WithTTL(30*time.Second), baton.Shared())
	if err != nil {
		t.Fatal(err)
	}
	if d := write(r3.Token, "r3", true); d.Outcome != fence.Applied {
		t.Fatalf("a reader after the writer: %+v", d)
	}
	if d := write(w.Token, "w-late", false); d.Outcome != fence.Stale || d.CurrentToken != r3.Token {
		t.Fatalf("the writer below a recorded reader: %+v", d)
	}
	t.Logf("stale attempts refused: 2 (reader %d, writer %d)", r1.Token, w.Token)
}

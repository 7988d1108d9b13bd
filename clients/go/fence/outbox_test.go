package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/batontest"
	"github.com/baton-dev/baton/clients/go/fence"
)

// inTx runs f in a pgx transaction and commits it.
func inTx(t *testing.T, conn *pgx.Conn, f func(tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// expect checks one outbox call's answer: expect(t, want, what)(call).
func expect(t *testing.T, want fence.StepOutcome, what string) func(fence.Step, error) fence.Step {
	t.Helper()
	return func(s fence.Step, err error) fence.Step {
		t.Helper()
		if err != nil || s.Outcome != want {
			t.Fatalf("%s: %+v, %v (want %s)", what, s, err, want)
		}
		return s
	}
}

// The outbox on pgx's own API: the intent is enqueued in the transaction
// of the fenced write that decides it; a dispatcher claims it with its
// lease token and sends once; a stale dispatcher (an older token) can
// neither claim it again nor record over the newer claim; a receiver's
// confirmation settles it; a cancelled resource's pending deliveries are
// cancelled; an operator resolves one that needs attention.
func TestTheOutboxSendsOnceUnderTheNewestClaimOnPgx(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, batontest.FenceKitDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	db := fence.Pgx(conn)
	const resource = "statement:go:outbox"
	mail := fence.Intent{Operation: "mail 7", Kind: fence.Unrepeatable, Recipient: "ann@example.com", Payload: []byte("hello")}

	// Not fenced yet: nothing to attach the intent to.
	expect(t, fence.StepMissing, "enqueue before a fenced write")(fence.Enqueue(ctx, db, resource, 1<<40|1, mail))
	var id int64
	inTx(t, conn, func(tx pgx.Tx) {
		d, err := fence.Fence(ctx, fence.Pgx(tx), resource, 1<<40|1, "decide", []byte("d"), fence.Options{})
		if err != nil || d.Outcome != fence.Applied {
			t.Fatalf("fence: %+v, %v", d, err)
		}
		id = expect(t, fence.StepEnqueued, "enqueue")(fence.Enqueue(ctx, fence.Pgx(tx), resource, 1<<40|1, mail)).ID
	})
	expect(t, fence.StepExists, "the same intent again")(fence.Enqueue(ctx, db, resource, 1<<40|1, mail))
	other := mail
	other.Payload = []byte("other")
	expect(t, fence.StepConflict, "the same operation, another payload")(fence.Enqueue(ctx, db, resource, 1<<40|1, other))

	due, err := fence.Due(ctx, db, 10)
	if err != nil || len(due) != 1 || due[0].ID != id || due[0].State != fence.StatePending || due[0].Kind != fence.Unrepeatable {
		t.Fatalf("due: %+v, %v", due, err)
	}
	// Dispatcher A claims with token 5, then B with 6: A is stale from then.
	expect(t, fence.StepClaimed, "A claims")(fence.Claim(ctx, db, id, 5, "dispatcher a"))
	expect(t, fence.StepClaimed, "B claims above A")(fence.Claim(ctx, db, id, 6, "dispatcher b"))
	expect(t, fence.StepStale, "A claims again")(fence.Claim(ctx, db, id, 5, "dispatcher a"))
	expect(t, fence.StepStale, "A begins its send")(fence.BeginSend(ctx, db, id, 5))
	expect(t, fence.StepSending, "B begins its send")(fence.BeginSend(ctx, db, id, 6))
	expect(t, fence.StepStale, "A records over B")(fence.Record(ctx, db, id, 5, fence.Delivered(), "A's late word"))
	expect(t, fence.StepRecorded, "B records")(fence.Record(ctx, db, id, 6, fence.Accepted(time.Minute), "queued by the relay"))
	s := expect(t, fence.StepConfirmed, "the receiver confirms")(fence.Confirm(ctx, db, "mail 7", true, "relay callback"))
	if s.State != fence.StateDelivered || !s.State.Final() {
		t.Fatalf("confirmed: %+v", s)
	}
	expect(t, fence.StepIgnored, "a confirmation after the end")(fence.Confirm(ctx, db, "mail 7", false, "late callback"))
	got, ok, err := fence.Get(ctx, db, id)
	if err != nil || !ok || got.State != fence.StateDelivered || got.ClaimToken != 6 || got.ClaimedBy != "dispatcher b" || got.SendStartedAt.IsZero() {
		t.Fatalf("get: %+v %v %v", got, ok, err)
	}
	if _, ok, err := fence.Get(ctx, db, id+1000); ok || err != nil {
		t.Fatalf("get of nothing: %v %v", ok, err)
	}

	// A second intent, cancelled with its resource before it is sent.
	inTx(t, conn, func(tx pgx.Tx) {
		if _, err := fence.Fence(ctx, fence.Pgx(tx), resource, 1<<40|2, "decide again", []byte("d2"), fence.Options{}); err != nil {
			t.Fatal(err)
		}
		two := mail
		two.Operation = "mail 8"
		expect(t, fence.StepEnqueued, "enqueue the second")(fence.Enqueue(ctx, fence.Pgx(tx), resource, 1<<40|2, two))
	})
	if n, err := fence.CancelDeliveries(ctx, db, resource, "operator"); err != nil || n != 1 {
		t.Fatalf("cancel: %d, %v", n, err)
	}

	// A third, whose send's outcome is unknown: an operator decides.
	inTx(t, conn, func(tx pgx.Tx) {
		if _, err := fence.Fence(ctx, fence.Pgx(tx), "statement:go:outbox2", 1<<40|3, "decide", []byte("d3"), fence.Options{}); err != nil {
			t.Fatal(err)
		}
		three := mail
		three.Operation = "mail 9"
		id = expect(t, fence.StepEnqueued, "enqueue the third")(fence.Enqueue(ctx, fence.Pgx(tx), "statement:go:outbox2", 1<<40|3, three)).ID
	})
	expect(t, fence.StepClaimed, "C claims")(fence.Claim(ctx, db, id, 7, "dispatcher c"))
	expect(t, fence.StepSending, "C sends")(fence.BeginSend(ctx, db, id, 7))
	expect(t, fence.StepRecorded, "C cannot tell")(fence.Record(ctx, db, id, 7, fence.NeedsAttention(), "timed out"))
	s = expect(t, fence.StepResolved, "the operator abandons it")(fence.Resolve(ctx, db, id, fence.ResolveAbandon, "ops", "sent by hand"))
	if s.State != fence.StateAbandoned {
		t.Fatalf("resolved: %+v", s)
	}
}

// Bad input is refused naming the rule, before the database sees it.
func TestBadOutboxInputIsRefusedBeforeAnythingIsSent(t *testing.T) {
	ctx := context.Background()
	var db fence.DB = fence.SQL(nil) // never reached: every call below is refused first
	intent := fence.Intent{Operation: "op", Kind: fence.Idempotent, Recipient: "x", Payload: nil}
	cases := map[string]error{}
	bad := intent
	bad.Operation = ""
	_, cases["operation id is empty"] = fence.Enqueue(ctx, db, "r", 1, bad)
	bad = intent
	bad.Kind = "sometimes"
	_, cases[`receiver kind "sometimes"`] = fence.Enqueue(ctx, db, "r", 1, bad)
	bad = intent
	bad.Recipient = "a\nb"
	_, cases["control character at byte 1"] = fence.Enqueue(ctx, db, "r", 1, bad)
	bad = intent
	bad.Payload = make([]byte, fence.PayloadLenBytesMax+1)
	_, cases["the limit is 1048576 bytes"] = fence.Enqueue(ctx, db, "r", 1, bad)
	_, cases["token 0"] = fence.Claim(ctx, db, 1, 0, "me")
	_, cases["a report must be made by"] = fence.Record(ctx, db, 1, 1, fence.Report{}, "")
	_, cases[`resolution "maybe"`] = fence.Resolve(ctx, db, 1, "maybe", "me", "")
	_, cases["limit 0"] = fence.Due(ctx, db, 0)
	for rule, err := range cases {
		if !errors.Is(err, baton.ErrInvalid) || !strings.Contains(err.Error(), rule) {
			t.Errorf("%s: %v", rule, err)
		}
	}
}

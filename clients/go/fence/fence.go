// Package fence is the fence kit from Go: thin helpers for the fence
// kit's SQL functions (baton.fence, baton.publish, baton.delete,
// baton.cancel), the authoritative generation and the outbox
// (baton.outbox_*), in the caller's connection or transaction: database/sql
// with any PostgreSQL driver ([SQL]) or pgx's own API ([Pgx]). Create or upgrade
// the schema with `psql -v ON_ERROR_STOP=1 -d app -f
// crates/fence/sql/install.sql` (safe to run again).
//
// The check and the effect must commit together: call [Fence] inside the
// transaction that writes the effect, and commit only when the decision
// is [Applied].
package fence

import (
	"context"
	"database/sql"

	baton "github.com/baton-dev/baton/clients/go"
)

// Outcome is what the resource decided, with the Rust and Python kits'
// names.
type Outcome string

// The outcomes.
const (
	Applied        Outcome = "applied"
	Replayed       Outcome = "replayed"
	Stale          Outcome = "stale"
	Conflict       Outcome = "conflict"
	Cancelled      Outcome = "cancelled"
	Deleted        Outcome = "deleted"
	Missing        Outcome = "missing"
	GenerationUsed Outcome = "generation_used"
	OutOfOrder     Outcome = "out_of_order"
)

// Decision is one row of baton.fence and its kin.
type Decision struct {
	Outcome Outcome
	// Token is the token the decision is about (the presented one when
	// applied); 0 if none.
	Token uint64
	// CurrentToken and CurrentSeq are the resource's recorded generation
	// after the call (0 if none).
	CurrentToken uint64
	CurrentSeq   uint64
	Detail       string
	// Result is the operation's saved result (returned again on replay).
	Result []byte
}

// OK says whether the write was applied now, or before with the same
// payload.
func (d Decision) OK() bool { return d.Outcome == Applied || d.Outcome == Replayed }

// Options are [Fence]'s optional arguments.
type Options struct {
	// Result is saved with the operation and returned on a replay.
	Result []byte
	// Seq orders writes within one generation (policy "ordered").
	Seq uint64
	// Policy is "one_per_generation" (the default), "ordered" or "session".
	Policy string
	// MustExist refuses a resource the kit has never seen (Missing).
	MustExist bool
	// Shared is a write made under a shared lease (a reader's own output,
	// baton.fence_shared): refused only below the last exclusive write's
	// token, never because of another reader's. Seq does not apply to it.
	Shared bool
}

const columns = "outcome, token, current_token, current_seq, detail, result"

// Fence checks token against resource and records operation, in q's
// current transaction (baton.fence).
func Fence(ctx context.Context, db DB, resource string, token uint64, operation string, fingerprint []byte, o Options) (Decision, error) {
	name, err := checked(resource, token)
	if err != nil {
		return Decision{}, err
	}
	policy := o.Policy
	if policy == "" {
		policy = "one_per_generation"
	}
	if o.Result == nil {
		o.Result = []byte{}
	}
	if o.Shared {
		return decision(db.queryRow(ctx, "SELECT "+columns+" FROM baton.fence_shared(resource => $1, "+
			"token => $2, operation => $3, fingerprint => $4, result => $5, policy => $6, must_exist => $7)",
			name, int64(token), operation, fingerprint, o.Result, policy, o.MustExist))
	}
	return decision(db.queryRow(ctx, "SELECT "+columns+" FROM baton.fence(resource => $1, token => $2, "+
		"operation => $3, fingerprint => $4, result => $5, seq => $6, policy => $7, must_exist => $8)",
		name, int64(token), operation, fingerprint, o.Result, int64(o.Seq), policy, o.MustExist))
}

// Publish fences and moves the publication pointer to objectKey in one
// statement (baton.publish).
func Publish(ctx context.Context, db DB, resource string, token uint64, operation string, fingerprint []byte, objectKey string) (Decision, error) {
	name, err := checked(resource, token)
	if err != nil {
		return Decision{}, err
	}
	return decision(db.queryRow(ctx, "SELECT "+columns+" FROM baton.publish($1, $2, $3, $4, $5)",
		name, int64(token), operation, fingerprint, objectKey))
}

// Delete is a fenced tombstone (baton.delete): later writes below the
// floor are refused, and the generation is never lowered.
func Delete(ctx context.Context, db DB, resource string, token uint64, operation string, fingerprint []byte) (Decision, error) {
	name, err := checked(resource, token)
	if err != nil {
		return Decision{}, err
	}
	return decision(db.queryRow(ctx, "SELECT "+columns+" FROM baton.delete($1, $2, $3, $4)",
		name, int64(token), operation, fingerprint))
}

// Cancel is a durable cancellation (baton.cancel): every write with a
// token at or below atToken is refused from now on. It returns the
// recorded cancellation token.
func Cancel(ctx context.Context, db DB, resource string, atToken uint64, policy string) (uint64, error) {
	name, err := checked(resource, atToken)
	if err != nil {
		return 0, err
	}
	if policy == "" {
		policy = "one_per_generation"
	}
	var recorded int64
	if err := db.queryRow(ctx, "SELECT baton.cancel($1, $2, $3)", name, int64(atToken), policy).Scan(&recorded); err != nil {
		return 0, err
	}
	return uint64(recorded), nil
}

// Generation is the authoritative state of a resource.
type Generation struct {
	Generation     uint64
	PublishedKey   string
	PublishedToken uint64
	Deleted        bool
}

// GenerationOf is the resource's recorded generation and publication
// pointer; ok false if the fence kit has never seen it.
func GenerationOf(ctx context.Context, db DB, resource string) (g Generation, ok bool, err error) {
	name, err := baton.CheckResource(resource, true)
	if err != nil {
		return Generation{}, false, err
	}
	var generation int64
	var key sql.NullString
	var token sql.NullInt64
	err = db.queryRow(ctx, "SELECT generation, published_key, published_token, deleted FROM baton.resources WHERE resource = $1",
		name).Scan(&generation, &key, &token, &g.Deleted)
	if noRows(err) {
		return Generation{}, false, nil
	}
	if err != nil {
		return Generation{}, false, err
	}
	g.Generation, g.PublishedKey, g.PublishedToken = uint64(generation), key.String, uint64(token.Int64)
	return g, true, nil
}

// checked is the canonical name, and an error naming the rule for a name
// or a token the kit would refuse.
func checked(resource string, token uint64) (string, error) {
	name, err := baton.CheckResource(resource, false)
	if err != nil {
		return "", err
	}
	if err := checkToken(token); err != nil {
		return "", err
	}
	return name, nil
}

func decision(row scanner) (Decision, error) {
	var d Decision
	var outcome string
	var token, currentToken, currentSeq sql.NullInt64
	var detail sql.NullString
	if err := row.Scan(&outcome, &token, &currentToken, &currentSeq, &detail, &d.Result); err != nil {
		return Decision{}, err
	}
	d.Outcome = Outcome(outcome)
	d.Token, d.CurrentToken, d.CurrentSeq = uint64(token.Int64), uint64(currentToken.Int64), uint64(currentSeq.Int64)
	d.Detail = detail.String
	return d, nil
}

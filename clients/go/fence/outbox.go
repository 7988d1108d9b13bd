package fence

import (
	"context"
	"database/sql"
	"fmt"
	"time"
	"unicode"

	baton "github.com/baton-dev/baton/clients/go"
)

// The outbox: an external effect (an e-mail, a webhook, a payment) is
// recorded as an intent in the transaction of the fenced write that
// decides it ([Enqueue]), then sent at most once per claim by a
// dispatcher holding a lease ([Claim], [BeginSend], [Record]), with
// receivers' confirmations ([Confirm]), cancellation ([CancelDeliveries])
// and an operator's decisions ([Resolve]). The names are the Rust kit's.

// Limits of an intent, as the SQL functions check them.
const (
	OperationLenBytesMax = 256
	RecipientLenBytesMax = 2048
	PayloadLenBytesMax   = 1 << 20
	// RetryAfterMax is the longest delay a dispatcher may ask for.
	RetryAfterMax = 24 * time.Hour
)

// ReceiverKind is what a receiver promises, which decides what is safe
// after a send whose outcome is unknown.
type ReceiverKind string

// The receiver kinds.
const (
	// Idempotent receivers take the operation id as an idempotency key: a
	// repeat is harmless.
	Idempotent ReceiverKind = "idempotent"
	// Unrepeatable receivers cannot tell a repeat: a send whose outcome is
	// unknown needs an operator.
	Unrepeatable ReceiverKind = "unrepeatable"
)

// DeliveryState is where a delivery is in its life.
type DeliveryState string

// The delivery states.
const (
	StatePending        DeliveryState = "pending"
	StateClaimed        DeliveryState = "claimed"
	StateSending        DeliveryState = "sending"
	StateAccepted       DeliveryState = "accepted"
	StateDelivered      DeliveryState = "delivered"
	StateFailed         DeliveryState = "failed"
	StateNeedsAttention DeliveryState = "needs_attention"
	StateCancelled      DeliveryState = "cancelled"
	StateAbandoned      DeliveryState = "abandoned"
)

// Final says whether no dispatcher moves a delivery out of the state (an
// operator may resolve needs_attention and failed).
func (s DeliveryState) Final() bool {
	switch s {
	case StateDelivered, StateFailed, StateNeedsAttention, StateCancelled, StateAbandoned:
		return true
	}
	return false
}

// StepOutcome is what an outbox call did.
type StepOutcome string

// The step outcomes.
const (
	StepEnqueued      StepOutcome = "enqueued"
	StepExists        StepOutcome = "exists"
	StepConflict      StepOutcome = "conflict"
	StepMissing       StepOutcome = "missing"
	StepStale         StepOutcome = "stale"
	StepCancelled     StepOutcome = "cancelled"
	StepFinal         StepOutcome = "final"
	StepNotDue        StepOutcome = "not_due"
	StepClaimed       StepOutcome = "claimed"
	StepSending       StepOutcome = "sending"
	StepRecorded      StepOutcome = "recorded"
	StepConfirmed     StepOutcome = "confirmed"
	StepIgnored       StepOutcome = "ignored"
	StepResolved      StepOutcome = "resolved"
	StepNotResolvable StepOutcome = "not_resolvable"
)

// Step is one outbox call's answer.
type Step struct {
	Outcome StepOutcome
	// ID is the delivery's (0 if none was found).
	ID int64
	// State is the delivery's after the call ("" if none).
	State DeliveryState
	// ClaimToken is the token of its latest claim (0 if none).
	ClaimToken uint64
	Attempts   int
	Detail     string
}

// Intent is what to deliver: Operation is the receiver's idempotency key
// (stable across every attempt; one delivery per id).
type Intent struct {
	Operation string
	Kind      ReceiverKind
	Recipient string
	Payload   []byte
}

// check names the rule an intent breaks, before anything is sent.
func (i Intent) check() error {
	if err := text("outbox operation id", i.Operation, OperationLenBytesMax); err != nil {
		return err
	}
	if i.Kind != Idempotent && i.Kind != Unrepeatable {
		return invalid("receiver kind %q is not one of idempotent, unrepeatable", i.Kind)
	}
	if err := text("recipient", i.Recipient, RecipientLenBytesMax); err != nil {
		return err
	}
	if len(i.Payload) > PayloadLenBytesMax {
		return invalid("payload is %d bytes; the limit is %d bytes", len(i.Payload), PayloadLenBytesMax)
	}
	return nil
}

// Report is what became of one send, recorded with the claim's token:
// [Delivered], [Accepted], [Retry], [Failed], [NeedsAttention] or
// [CancelledFirst].
type Report struct {
	label string
	after time.Duration
}

// Delivered: it arrived (the receiver said so, or its status query did).
func Delivered() Report { return Report{label: "delivered"} }

// Accepted: the receiver took it and will confirm; its status is asked
// again after checkAfter.
func Accepted(checkAfter time.Duration) Report {
	return Report{label: "accepted", after: checkAfter}
}

// Retry: it did not arrive and may be sent again, after the backoff.
func Retry(after time.Duration) Report { return Report{label: "retry", after: after} }

// Failed: refused for good, or out of attempts.
func Failed() Report { return Report{label: "failed"} }

// NeedsAttention: its outcome is unknown and it cannot be safely repeated.
func NeedsAttention() Report { return Report{label: "needs_attention"} }

// CancelledFirst: a cancellation came first; nothing was sent.
func CancelledFirst() Report { return Report{label: "cancelled"} }

// Resolution is an operator's decision on a delivery that needs attention
// or failed.
type Resolution string

// The resolutions.
const (
	// ResolveDelivered: it arrived (the operator checked).
	ResolveDelivered Resolution = "delivered"
	// ResolveResend: send it again, as a new attempt.
	ResolveResend Resolution = "resend"
	// ResolveAbandon: do not send it.
	ResolveAbandon Resolution = "abandon"
)

const stepColumns = "outcome, id, state, claim_token, attempts, detail"

// Enqueue records intent, fenced: only while token is resource's
// generation, so call it in the transaction whose [Fence] or [Publish]
// applied. A replay of the same intent is [StepExists]; the same
// operation id with another intent is [StepConflict].
func Enqueue(ctx context.Context, db DB, resource string, token uint64, intent Intent) (Step, error) {
	name, err := checked(resource, token)
	if err != nil {
		return Step{}, err
	}
	if err := intent.check(); err != nil {
		return Step{}, err
	}
	if intent.Payload == nil {
		intent.Payload = []byte{}
	}
	return step(db.queryRow(ctx, "SELECT "+stepColumns+" FROM baton.outbox_enqueue($1, $2, $3, $4, $5, $6)",
		name, int64(token), intent.Operation, string(intent.Kind), intent.Recipient, intent.Payload))
}

// Claim takes delivery id for one send with token (above every earlier
// claim's: the dispatcher's lease token).
func Claim(ctx context.Context, db DB, id int64, token uint64, claimedBy string) (Step, error) {
	if err := checkToken(token); err != nil {
		return Step{}, err
	}
	if err := text("claimed_by", claimedBy, 256); err != nil {
		return Step{}, err
	}
	return step(db.queryRow(ctx, "SELECT "+stepColumns+" FROM baton.outbox_claim($1, $2, $3)", id, int64(token), claimedBy))
}

// BeginSend marks the send as begun, just before sending. Anything but
// [StepSending] means: do not send.
func BeginSend(ctx context.Context, db DB, id int64, token uint64) (Step, error) {
	if err := checkToken(token); err != nil {
		return Step{}, err
	}
	return step(db.queryRow(ctx, "SELECT "+stepColumns+" FROM baton.outbox_begin_send($1, $2)", id, int64(token)))
}

// Record records what became of the send, with the claim's token; a newer
// claim's row refuses it ([StepStale]).
func Record(ctx context.Context, db DB, id int64, token uint64, report Report, evidence string) (Step, error) {
	if err := checkToken(token); err != nil {
		return Step{}, err
	}
	if report.label == "" {
		return Step{}, invalid("a report must be made by Delivered, Accepted, Retry, Failed, NeedsAttention or CancelledFirst")
	}
	after := min(max(report.after, 0), RetryAfterMax)
	return step(db.queryRow(ctx, "SELECT "+stepColumns+" FROM baton.outbox_record($1, $2, $3, $4, $5)",
		id, int64(token), report.label, evidence, after.Milliseconds()))
}

// Confirm is a receiver's confirmation (a callback) for the delivery whose
// operation id is operation; ignored for a final delivery.
func Confirm(ctx context.Context, db DB, operation string, delivered bool, evidence string) (Step, error) {
	if err := text("outbox operation id", operation, OperationLenBytesMax); err != nil {
		return Step{}, err
	}
	return step(db.queryRow(ctx, "SELECT "+stepColumns+" FROM baton.outbox_confirm($1, $2, $3)", operation, delivered, evidence))
}

// CancelDeliveries cancels resource's deliveries that were not sent and
// returns how many; call it in the transaction that cancels the work.
func CancelDeliveries(ctx context.Context, db DB, resource, actor string) (uint64, error) {
	name, err := baton.CheckResource(resource, true)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.queryRow(ctx, "SELECT baton.outbox_cancel($1, $2)", name, actor).Scan(&n); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// Resolve records an operator's decision on a delivery that needs
// attention or failed.
func Resolve(ctx context.Context, db DB, id int64, r Resolution, actor, reason string) (Step, error) {
	if r != ResolveDelivered && r != ResolveResend && r != ResolveAbandon {
		return Step{}, invalid("resolution %q is not one of delivered, resend, abandon", r)
	}
	return step(db.queryRow(ctx, "SELECT "+stepColumns+" FROM baton.outbox_resolve($1, $2, $3, $4)", id, string(r), actor, reason))
}

// Delivery is one row of the outbox.
type Delivery struct {
	ID            int64
	Operation     string
	Resource      string
	Token         uint64
	Kind          ReceiverKind
	Recipient     string
	State         DeliveryState
	Attempts      int
	ClaimToken    uint64
	ClaimedBy     string
	Evidence      string
	CreatedAt     time.Time
	NextAttemptAt time.Time
	// SendStartedAt and ResolvedAt are zero when unset.
	SendStartedAt time.Time
	ResolvedBy    string
	ResolvedAt    time.Time
	Resolution    string
}

const deliveryColumns = "id, operation, resource, token, receiver_kind, recipient, state, attempts, claim_token, " +
	"claimed_by, evidence, created_at, next_attempt_at, send_started_at, resolved_by, resolved_at, resolution"

// Due is the deliveries a dispatcher should look at, oldest due first:
// pending and due, or in flight (claimed, sending, accepted) past their
// time, whose dispatcher may have died. At most limit (1 to 1000).
func Due(ctx context.Context, db DB, limit int) ([]Delivery, error) {
	if limit < 1 || limit > 1000 {
		return nil, invalid("limit %d: it must be between 1 and 1000", limit)
	}
	r, err := db.query(ctx, "SELECT "+deliveryColumns+" FROM baton.outbox "+
		"WHERE state IN ('pending', 'claimed', 'sending', 'accepted') AND next_attempt_at <= now() "+
		"ORDER BY next_attempt_at, id LIMIT $1", limit)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out []Delivery
	for r.Next() {
		d, err := delivery(r)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, r.Err()
}

// Get is one delivery; ok false if there is none.
func Get(ctx context.Context, db DB, id int64) (d Delivery, ok bool, err error) {
	d, err = delivery(db.queryRow(ctx, "SELECT "+deliveryColumns+" FROM baton.outbox WHERE id = $1", id))
	if noRows(err) {
		return Delivery{}, false, nil
	}
	return d, err == nil, err
}

func delivery(row scanner) (Delivery, error) {
	var d Delivery
	var kind, state string
	var token, claim int64
	var claimedBy, evidence, resolvedBy, resolution sql.NullString
	var sendStarted, resolvedAt sql.NullTime
	err := row.Scan(&d.ID, &d.Operation, &d.Resource, &token, &kind, &d.Recipient, &state, &d.Attempts, &claim,
		&claimedBy, &evidence, &d.CreatedAt, &d.NextAttemptAt, &sendStarted, &resolvedBy, &resolvedAt, &resolution)
	if err != nil {
		return Delivery{}, err
	}
	d.Token, d.ClaimToken = uint64(token), uint64(claim)
	d.Kind, d.State = ReceiverKind(kind), DeliveryState(state)
	d.ClaimedBy, d.Evidence, d.ResolvedBy, d.Resolution = claimedBy.String, evidence.String, resolvedBy.String, resolution.String
	d.SendStartedAt, d.ResolvedAt = sendStarted.Time, resolvedAt.Time
	return d, nil
}

func step(row scanner) (Step, error) {
	var s Step
	var outcome string
	var id, claim sql.NullInt64
	var state, detail sql.NullString
	var attempts sql.NullInt32
	if err := row.Scan(&outcome, &id, &state, &claim, &attempts, &detail); err != nil {
		return Step{}, err
	}
	s.Outcome, s.ID, s.State = StepOutcome(outcome), id.Int64, DeliveryState(state.String)
	s.ClaimToken, s.Attempts, s.Detail = uint64(claim.Int64), int(attempts.Int32), detail.String
	return s, nil
}

// text names the rule a required text field breaks: empty, too long, or
// holding a control character.
func text(field, raw string, lenBytesMax int) error {
	switch {
	case raw == "":
		return invalid("%s is empty; it must be 1 to %d bytes", field, lenBytesMax)
	case len(raw) > lenBytesMax:
		return invalid("%s is %d bytes; it must be 1 to %d bytes", field, len(raw), lenBytesMax)
	}
	for at, c := range raw {
		if unicode.IsControl(c) {
			return invalid("%s holds a control character at byte %d", field, at)
		}
	}
	return nil
}

func checkToken(token uint64) error {
	if token == 0 || token >= 1<<63 {
		return invalid("token %d: it must be an integer in 1..2^63-1", token)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return &baton.Error{Kind: baton.ErrInvalid, Message: fmt.Sprintf(format, args...)}
}

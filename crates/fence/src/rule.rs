//! The fencing rule as a pure function: given what the resource recorded and
//! a request, decide the outcome and the next recorded state.
//!
//! The SQLite backend runs this function inside its transaction; the
//! PostgreSQL backend runs the same rule as the SQL function `baton.fence`
//! (in force: `sql/functions/fence_full.sql`). One test suite runs against both.

use crate::shared::{self, ExclusiveFloor};
use crate::{FenceRequest, FencingToken, Fingerprint, Outcome, Policy, Sequence, Side};

/// What a resource has recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceState {
    /// The policy the resource was created with.
    pub policy: Policy,
    /// The highest accepted token (or cancel or recreate point): the floor.
    pub generation: FencingToken,
    /// The last applied sequence within `generation` (ordered policy).
    pub seq: Sequence,
    /// The operation applied at `generation`, if any.
    pub last_operation: Option<String>,
    /// Writes with a token at or below this are cancelled.
    pub cancelled_at: Option<FencingToken>,
    /// A tombstone: the resource was deleted.
    pub deleted: bool,
    /// Counts recreations after deletion.
    pub incarnation: i64,
    /// What a write under a shared lease is judged against.
    pub exclusive: ExclusiveFloor,
}

/// A saved operation: what a replay returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRecord {
    /// The token the operation was applied with.
    pub token: FencingToken,
    /// The request's fingerprint: the same id with another is a conflict.
    pub fingerprint: Fingerprint,
    /// The saved result, returned on replay.
    pub result: Vec<u8>,
}

/// What `decide` concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Record `next`, save the operation, and let the caller's effect happen.
    Apply {
        /// The outcome to report (`applied`).
        outcome: Outcome,
        /// The resource's state after the write.
        next: ResourceState,
    },
    /// Change nothing.
    Refuse(Outcome),
}

/// A request whose policy differs from the resource's: a programming error, not an outcome.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("resource {resource} uses the {recorded:?} policy; the request asked for {requested:?}")]
pub struct PolicyMismatch {
    /// The resource.
    pub resource: String,
    /// The policy the resource was created with.
    pub recorded: Policy,
    /// The policy the request asked for.
    pub requested: Policy,
}

/// The fencing rule: judges `req` against what the resource recorded and the operation record with its id, if any. `Refuse` is a normal outcome; `Err` only for a policy mismatch.
pub fn decide(
    state: Option<&ResourceState>,
    existing: Option<&OperationRecord>,
    req: &FenceRequest,
) -> Result<Decision, PolicyMismatch> {
    // Replays are found by operation id before any token comparison, so a
    // retry after a lost answer gets its saved result.
    if let Some(op) = existing {
        return Ok(Decision::Refuse(replay_or_conflict(op, req)));
    }
    let Some(state) = state else {
        return Ok(create(req));
    };
    if state.policy != req.policy {
        return Err(PolicyMismatch {
            resource: req.resource.to_string(),
            recorded: state.policy,
            requested: req.policy,
        });
    }
    if req.side == Side::Shared {
        return Ok(shared::decide(state, req));
    }
    if let Some(refusal) = refusal(state, req.token, Some(state.generation)) {
        return Ok(Decision::Refuse(refusal));
    }
    Ok(same_or_newer_generation(state, req))
}

fn replay_or_conflict(op: &OperationRecord, req: &FenceRequest) -> Outcome {
    if op.fingerprint == req.fingerprint {
        Outcome::Replayed {
            token: op.token,
            result: op.result.clone(),
        }
    } else {
        Outcome::Conflict {
            operation: req.operation.clone(),
            token: op.token,
        }
    }
}

/// No row yet: first creation, unless the request says it must exist. A
/// reader's write creates the row with no exclusive write recorded.
fn create(req: &FenceRequest) -> Decision {
    if req.must_exist {
        return Decision::Refuse(Outcome::Missing);
    }
    let exclusive = req.side == Side::Exclusive;
    let next = ResourceState {
        policy: req.policy,
        generation: req.token,
        seq: if exclusive {
            req.seq
        } else {
            Sequence::default()
        },
        last_operation: exclusive.then(|| req.operation.as_str().to_string()),
        cancelled_at: None,
        deleted: false,
        incarnation: 1,
        exclusive: if exclusive {
            ExclusiveFloor::Generation
        } else {
            ExclusiveFloor::None
        },
    };
    Decision::Apply {
        outcome: Outcome::Applied {
            token: req.token,
            created: true,
        },
        next,
    }
}

/// A tombstone, a cancellation at or above the token, or a token below
/// `floor` (the generation for an exclusive write; for a shared one, the
/// last exclusive write's token, if any).
pub(crate) fn refusal(
    state: &ResourceState,
    presented: FencingToken,
    floor: Option<FencingToken>,
) -> Option<Outcome> {
    if state.deleted {
        return Some(Outcome::Deleted {
            presented,
            floor: state.generation,
        });
    }
    let cancels = |c: &FencingToken| {
        if baton_core::bad::on(baton_core::bad::Variant::CancelBelowOnly) {
            presented < *c
        } else {
            presented <= *c
        }
    };
    if let Some(cancelled_at) = state.cancelled_at.filter(cancels) {
        return Some(Outcome::Cancelled {
            presented,
            cancelled_at,
        });
    }
    floor
        .filter(|floor| presented < *floor)
        .map(|current| Outcome::Stale { presented, current })
}

/// A newer generation applies; the same generation is the policy's call. A
/// generation opened by `recreate` has no operation yet: its owner's first
/// write is that one.
fn same_or_newer_generation(state: &ResourceState, req: &FenceRequest) -> Decision {
    let presented = req.token;
    let apply = || Decision::Apply {
        outcome: Outcome::Applied {
            token: presented,
            created: false,
        },
        next: ResourceState {
            generation: presented,
            seq: req.seq,
            last_operation: Some(req.operation.as_str().to_string()),
            exclusive: ExclusiveFloor::Generation,
            ..state.clone()
        },
    };
    // A generation a reader's write raised has no exclusive operation yet.
    if presented > state.generation || state.exclusive != ExclusiveFloor::Generation {
        return apply();
    }
    match state.policy {
        Policy::OnePerGeneration if state.last_operation.is_none() => apply(),
        Policy::OnePerGeneration => Decision::Refuse(Outcome::GenerationUsed {
            token: presented,
            by_operation: state.last_operation.clone().unwrap_or_default(),
        }),
        Policy::Ordered if req.seq > state.seq => apply(),
        Policy::Ordered => Decision::Refuse(Outcome::OutOfOrder {
            token: presented,
            presented_seq: req.seq,
            current_seq: state.seq,
        }),
        Policy::Session => apply(),
    }
}

/// Durable cancellation: every token at or below `at` is refused from now on,
/// and the generation floor rises to `at`. Cancelling a resource that has no
/// row yet creates it, cancelled. Never lowers anything.
pub fn cancel(state: Option<&ResourceState>, policy: Policy, at: FencingToken) -> ResourceState {
    match state {
        Some(s) => ResourceState {
            generation: s.generation.max(at),
            cancelled_at: Some(s.cancelled_at.map_or(at, |c| c.max(at))),
            ..s.clone()
        },
        None => ResourceState {
            policy,
            generation: at,
            seq: Sequence::default(),
            last_operation: None,
            cancelled_at: Some(at),
            deleted: false,
            incarnation: 1,
            exclusive: ExclusiveFloor::Generation,
        },
    }
}

/// Outcome of an explicit new incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // variants are documented in docs/fence-kit.md's outcome table; fields name the tokens compared
pub enum Recreate {
    /// A new incarnation whose floor is the presented token.
    Recreated {
        incarnation: i64,
        token: FencingToken,
    },
    /// Only a deleted resource can be recreated.
    NotDeleted,
    /// The new incarnation's token must be above the tombstone's floor.
    Stale {
        presented: FencingToken,
        floor: FencingToken,
    },
}

/// Recreates a deleted resource at `token`, which must be above its floor.
pub fn recreate(state: &ResourceState, token: FencingToken) -> (Recreate, Option<ResourceState>) {
    if !state.deleted {
        return (Recreate::NotDeleted, None);
    }
    if token <= state.generation {
        return (
            Recreate::Stale {
                presented: token,
                floor: state.generation,
            },
            None,
        );
    }
    let next = ResourceState {
        generation: token,
        seq: Sequence::default(),
        last_operation: None,
        cancelled_at: None,
        deleted: false,
        incarnation: state.incarnation + 1,
        policy: state.policy,
        exclusive: ExclusiveFloor::Generation,
    };
    (
        Recreate::Recreated {
            incarnation: next.incarnation,
            token,
        },
        Some(next),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OperationId;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn req(token: u64, op: &str, fp: u8, policy: Policy, seq: u64) -> FenceRequest {
        FenceRequest::new(
            "r",
            FencingToken::of(token).unwrap(),
            op,
            &[fp],
            op.as_bytes(),
        )
        .unwrap()
        .with_policy(policy)
        .with_seq(seq)
        .unwrap()
    }

    fn t(n: u64) -> FencingToken {
        FencingToken::of(n).unwrap()
    }

    /// Applies a decision to a one-resource store, as a backend would.
    #[derive(Default)]
    struct Store {
        state: Option<ResourceState>,
        ops: HashMap<String, OperationRecord>,
    }

    impl Store {
        fn write(&mut self, r: &FenceRequest) -> Outcome {
            match decide(self.state.as_ref(), self.ops.get(r.operation.as_str()), r).unwrap() {
                Decision::Apply { outcome, next } => {
                    self.state = Some(next);
                    let record = OperationRecord {
                        token: r.token,
                        fingerprint: r.fingerprint.clone(),
                        result: r.result.clone(),
                    };
                    self.ops.insert(r.operation.as_str().to_string(), record);
                    outcome
                }
                Decision::Refuse(o) => o,
            }
        }
    }

    #[test]
    fn seed_scenarios_as_data() {
        let mut s = Store::default();
        let p = Policy::OnePerGeneration;
        assert_eq!(
            s.write(&req(108, "bob", 1, p, 0)),
            Outcome::Applied {
                token: t(108),
                created: true
            }
        );
        assert_eq!(
            s.write(&req(107, "alice", 2, p, 0)),
            Outcome::Stale {
                presented: t(107),
                current: t(108)
            }
        );
        assert_eq!(
            s.write(&req(108, "bob", 1, p, 0)),
            Outcome::Replayed {
                token: t(108),
                result: b"bob".to_vec()
            }
        );
        assert_eq!(
            s.write(&req(108, "bob", 9, p, 0)),
            Outcome::Conflict {
                operation: OperationId::new("bob").unwrap(),
                token: t(108)
            }
        );
        assert_eq!(
            s.write(&req(108, "carol", 3, p, 0)),
            Outcome::GenerationUsed {
                token: t(108),
                by_operation: "bob".into()
            }
        );
        s.state = Some(cancel(s.state.as_ref(), p, t(110)));
        assert_eq!(
            s.write(&req(109, "dave", 4, p, 0)),
            Outcome::Cancelled {
                presented: t(109),
                cancelled_at: t(110)
            }
        );
        assert!(
            s.write(&req(111, "erin", 5, p, 0)).is_applied(),
            "a later owner may proceed"
        );
    }

    #[test]
    fn ordered_policy_rejects_a_late_earlier_mutation() {
        let mut s = Store::default();
        let p = Policy::Ordered;
        assert!(s.write(&req(5, "m1", 1, p, 1)).is_applied());
        assert!(s.write(&req(5, "m3", 1, p, 3)).is_applied());
        assert_eq!(
            s.write(&req(5, "m2", 1, p, 2)),
            Outcome::OutOfOrder {
                token: t(5),
                presented_seq: Sequence::new(2).unwrap(),
                current_seq: Sequence::new(3).unwrap()
            }
        );
        assert!(
            s.write(&req(6, "n1", 1, p, 0)).is_applied(),
            "a new generation starts its own sequence"
        );
    }

    #[test]
    fn tombstone_keeps_the_floor_and_recreation_is_explicit() {
        let mut s = Store::default();
        s.write(&req(10, "a", 1, Policy::OnePerGeneration, 0));
        s.state.as_mut().unwrap().deleted = true;
        assert_eq!(
            s.write(&req(11, "b", 1, Policy::OnePerGeneration, 0)),
            Outcome::Deleted {
                presented: t(11),
                floor: t(10)
            }
        );
        let state = s.state.clone().unwrap();
        assert_eq!(
            recreate(&state, t(10)).0,
            Recreate::Stale {
                presented: t(10),
                floor: t(10)
            }
        );
        let (out, next) = recreate(&state, t(20));
        assert_eq!(
            out,
            Recreate::Recreated {
                incarnation: 2,
                token: t(20)
            }
        );
        s.state = next;
        assert_eq!(
            s.write(&req(15, "late", 1, Policy::OnePerGeneration, 0)),
            Outcome::Stale {
                presented: t(15),
                current: t(20)
            }
        );
        assert!(s
            .write(&req(21, "new", 1, Policy::OnePerGeneration, 0))
            .is_applied());
    }

    #[test]
    fn must_exist_and_policy_mismatch() {
        let mut s = Store::default();
        assert_eq!(
            s.write(&req(1, "a", 1, Policy::Session, 0).must_exist()),
            Outcome::Missing
        );
        s.write(&req(1, "a", 1, Policy::Session, 0));
        assert!(decide(s.state.as_ref(), None, &req(2, "b", 1, Policy::Ordered, 0)).is_err());
    }

    #[derive(Clone, Debug)]
    enum Step {
        Write {
            token: u64,
            op: u8,
            fp: u8,
            seq: u64,
        },
        Cancel {
            at: u64,
        },
        Delete,
        Recreate {
            token: u64,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (1..30u64, 0..12u8, 0..2u8, 0..4u64).prop_map(|(token, op, fp, seq)| Step::Write { token, op, fp, seq }),
            1 => (1..30u64).prop_map(|at| Step::Cancel { at }),
            1 => Just(Step::Delete),
            1 => (1..30u64).prop_map(|token| Step::Recreate { token }),
        ]
    }

    fn policy() -> impl Strategy<Value = Policy> {
        prop_oneof![
            Just(Policy::OnePerGeneration),
            Just(Policy::Ordered),
            Just(Policy::Session)
        ]
    }

    proptest! {
        /// Against a model of what must hold: applied tokens never go below
        /// the floor, an operation applies at most once and replays return its
        /// first result, cancelled and deleted resources refuse, and the
        /// recorded generation never decreases.
        #[test]
        fn rule_keeps_its_invariants(policy in policy(), steps in proptest::collection::vec(step(), 1..60)) {
            let mut s = Store::default();
            let mut floor = 0i64;
            let mut applied_ops: HashMap<String, (FencingToken, Vec<u8>, Vec<u8>)> = HashMap::new();
            let mut last_applied: Option<(FencingToken, Sequence)> = None;
            for st in steps {
                let before = s.state.as_ref().map(|x| x.generation.bigint()).unwrap_or(0);
                match st {
                    Step::Write { token, op, fp, seq } => {
                        let op = format!("op{op}");
                        let r = req(token, &op, fp, policy, seq);
                        let was_deleted = s.state.as_ref().is_some_and(|x| x.deleted);
                        let cancelled_at = s.state.as_ref().and_then(|x| x.cancelled_at);
                        let out = s.write(&r);
                        match &out {
                            Outcome::Applied { token, .. } => {
                                prop_assert!(token.bigint() >= floor, "applied {token} below floor {floor}");
                                prop_assert!(!applied_ops.contains_key(&op), "operation {op} applied twice");
                                prop_assert!(!was_deleted);
                                prop_assert!(cancelled_at.is_none_or(|c| *token > c));
                                if let Some((prev, prev_seq)) = last_applied {
                                    match policy {
                                        Policy::OnePerGeneration => prop_assert!(*token > prev || floor > prev.bigint()),
                                        Policy::Ordered => prop_assert!(*token > prev || r.seq > prev_seq || floor > prev.bigint()),
                                        Policy::Session => prop_assert!(*token >= prev || floor > prev.bigint()),
                                    }
                                }
                                applied_ops.insert(op.clone(), (*token, r.fingerprint.as_bytes().to_vec(), r.result.clone()));
                                last_applied = Some((*token, r.seq));
                                floor = floor.max(token.bigint());
                            }
                            Outcome::Replayed { token, result } => {
                                let (t0, fp0, res0) = &applied_ops[&op];
                                prop_assert_eq!(token, t0);
                                prop_assert_eq!(fp0.as_slice(), r.fingerprint.as_bytes());
                                prop_assert_eq!(result, res0);
                            }
                            Outcome::Conflict { .. } => {
                                prop_assert!(applied_ops.get(&op).is_some_and(|(_, fp0, _)| fp0.as_slice() != r.fingerprint.as_bytes()));
                            }
                            Outcome::Stale { presented, current } => prop_assert!(presented < current),
                            Outcome::Cancelled { presented, cancelled_at } => prop_assert!(presented <= cancelled_at),
                            Outcome::Deleted { .. } => prop_assert!(was_deleted),
                            Outcome::Missing => prop_assert!(false, "must_exist was not set"),
                            Outcome::GenerationUsed { .. } => prop_assert_eq!(policy, Policy::OnePerGeneration),
                            Outcome::OutOfOrder { .. } => prop_assert_eq!(policy, Policy::Ordered),
                        }
                    }
                    Step::Cancel { at } => {
                        s.state = Some(cancel(s.state.as_ref(), policy, t(at)));
                        floor = floor.max(at as i64);
                    }
                    Step::Delete => {
                        if let Some(x) = s.state.as_mut() { x.deleted = true; }
                    }
                    Step::Recreate { token } => {
                        if let Some(x) = s.state.clone() {
                            if let (Recreate::Recreated { .. }, Some(next)) = recreate(&x, t(token)) {
                                prop_assert!(token as i64 > floor.max(x.generation.bigint()) || token as i64 > x.generation.bigint());
                                floor = floor.max(token as i64);
                                last_applied = None;
                                s.state = Some(next);
                            }
                        }
                    }
                }
                let after = s.state.as_ref().map(|x| x.generation.bigint()).unwrap_or(0);
                prop_assert!(after >= before, "generation went down from {before} to {after}");
            }
        }
    }
}

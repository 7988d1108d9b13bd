//! The rule for a write made under a shared lease (`baton acquire NAME
//! --shared`): many readers hold the resource at once, each with its own
//! token, and each may write what it derived from the data (a report, a
//! cache entry, an index). A reader's write must not land after a writer
//! changed the data since the reader's grant, and no reader's write may
//! refuse another's.
//!
//! So a shared write is judged against the last exclusive write only:
//! refused when that write's token is above its own (stale), when the
//! resource is deleted, or when it is cancelled at or above its token. It
//! raises `generation` to its token but not the exclusive floor, so every
//! other reader is judged as before, while an exclusive write below a
//! recorded reader's token is stale: Baton grants a reader only after every
//! earlier writer's lease ended. The PostgreSQL kit runs the same rule as
//! `baton.fence_shared`: `baton.fence_full` with `p_shared`
//! (`sql/functions/fence_full.sql`).

use crate::rule::{refusal, Decision, ResourceState};
use crate::{FenceError, FenceRequest, FencingToken, Outcome};

/// What a shared write is judged against: the `exclusive_token` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExclusiveFloor {
    /// `generation` is the last exclusive write's token (or a cancel's or
    /// recreate's floor): no shared write raised it since. Stored as NULL.
    #[default]
    Generation,
    /// A shared write raised `generation` above the last exclusive write,
    /// whose token this is.
    Below(FencingToken),
    /// A shared write created the resource and no exclusive write has been
    /// recorded since. Stored as 0.
    None,
}

impl ExclusiveFloor {
    /// The value stored in the `exclusive_token` column.
    pub fn code(self) -> Option<i64> {
        match self {
            ExclusiveFloor::Generation => None,
            ExclusiveFloor::Below(token) => Some(token.bigint()),
            ExclusiveFloor::None => Some(0),
        }
    }

    /// The floor a stored `exclusive_token` names.
    pub fn from_code(code: Option<i64>) -> Result<Self, FenceError> {
        match code {
            None => Ok(ExclusiveFloor::Generation),
            Some(0) => Ok(ExclusiveFloor::None),
            Some(token) => crate::error::stored_token(token).map(ExclusiveFloor::Below),
        }
    }

    /// The token a shared write must not be below, if any.
    fn token(self, generation: FencingToken) -> Option<FencingToken> {
        match self {
            ExclusiveFloor::Generation => Some(generation),
            ExclusiveFloor::Below(token) => Some(token),
            ExclusiveFloor::None => None,
        }
    }
}

/// Judges a shared write against a recorded resource whose policy matches
/// (replays and creation are judged as for any write, before this).
pub(crate) fn decide(state: &ResourceState, req: &FenceRequest) -> Decision {
    let floor = state
        .exclusive
        .token(state.generation)
        .filter(|_| !baton_core::bad::on(baton_core::bad::Variant::SharedWriteUnchecked));
    if let Some(refused) = refusal(state, req.token, floor) {
        return Decision::Refuse(refused);
    }
    let mut next = state.clone();
    if req.token > state.generation {
        next.generation = req.token;
        if state.exclusive == ExclusiveFloor::Generation {
            next.exclusive = ExclusiveFloor::Below(state.generation);
        }
    }
    Decision::Apply {
        outcome: Outcome::Applied {
            token: req.token,
            created: false,
        },
        next,
    }
}

#[cfg(test)]
mod tests {
    use crate::rule::{cancel, decide, Decision, ResourceState};
    use crate::{FenceRequest, FencingToken, Outcome, Policy};
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Step {
        Write { token: u64, shared: bool },
        Cancel { at: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            10 => (1..40u64, any::<bool>()).prop_map(|(token, shared)| Step::Write { token, shared }),
            1 => (1..40u64).prop_map(|at| Step::Cancel { at }),
        ]
    }

    proptest! {
        /// Against a model of two floors: the highest exclusive write (or
        /// cancel) and the highest write of either side. A shared write
        /// applies exactly when it is not below the first and not cancelled
        /// (other readers never refuse it); an exclusive write never applies
        /// below the second.
        #[test]
        fn shared_writes_are_judged_by_the_last_exclusive_write(
            policy in prop_oneof![Just(Policy::OnePerGeneration), Just(Policy::Ordered), Just(Policy::Session)],
            steps in proptest::collection::vec(step(), 1..60),
        ) {
            let mut state: Option<ResourceState> = None;
            let (mut exclusive_max, mut any_max, mut cancelled) = (0u64, 0u64, 0u64);
            for (i, st) in steps.into_iter().enumerate() {
                match st {
                    Step::Write { token, shared } => {
                        let t = FencingToken::of(token).unwrap();
                        let mut r = FenceRequest::new("r", t, &format!("op{i}"), b"f", b"").unwrap()
                            .with_policy(policy).with_seq(i as u64).unwrap();
                        if shared { r = r.shared(); }
                        let out = match decide(state.as_ref(), None, &r).unwrap() {
                            Decision::Apply { outcome, next } => { state = Some(next); outcome }
                            Decision::Refuse(o) => o,
                        };
                        if shared {
                            let admissible = token >= exclusive_max && token > cancelled;
                            prop_assert_eq!(out.is_applied(), admissible, "shared {} with floors {} {} cancelled {}: {:?}", token, exclusive_max, any_max, cancelled, out);
                        } else if out.is_applied() {
                            prop_assert!(token >= any_max && token > cancelled, "exclusive {token} applied below {any_max}");
                            exclusive_max = token;
                        } else if let Outcome::Stale { presented, current } = out {
                            prop_assert!(presented < current && current.bigint() as u64 <= any_max.max(cancelled));
                        }
                        if out.is_applied() { any_max = any_max.max(token); }
                    }
                    Step::Cancel { at } => {
                        state = Some(cancel(state.as_ref(), policy, FencingToken::of(at).unwrap()));
                        cancelled = cancelled.max(at);
                        any_max = any_max.max(at);
                    }
                }
            }
        }
    }
}

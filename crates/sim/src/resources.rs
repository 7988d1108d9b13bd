//! The fenced resources: every write is judged by the fence kit's own
//! rule (`baton_fence::decide`, the function the SQLite backend runs in
//! its transaction) under the session policy, with operation records, and
//! the operator's cancellations by `baton_fence::cancel`. A permit of the
//! semaphore writes under its slot's resource (`NAME:slot-K`), the pattern
//! docs/locks.md gives: a slot's tokens only rise. A holder of the shared
//! lock writes under the resource's own name, on the fence kit's shared
//! side when it holds a shared lease (it has a slot), on the exclusive
//! side otherwise.

use std::collections::BTreeMap;

use baton_core::FencingToken;
use baton_fence::{
    cancel, decide, Decision, FenceRequest, OperationRecord, Policy, ResourceState, Side,
};

use crate::Ctx;

/// A fenced resource: a simulated resource, or one slot of the semaphore.
pub type Key = (u8, Option<u32>);

#[derive(Default)]
pub struct Resources {
    state: BTreeMap<Key, ResourceState>,
    ops: BTreeMap<u64, OperationRecord>,
}

impl Resources {
    /// A write of operation `op` under `token`.
    pub fn write(&mut self, ctx: &mut Ctx, op: u64, (r, slot): Key, token: FencingToken) {
        let (resource, side) = match slot {
            Some(_) if r == crate::SHARED_LOCK => ((r, None), Side::Shared),
            _ => ((r, slot), Side::Exclusive),
        };
        let base = ctx.names[usize::from(resource.0)].as_str();
        let name = match resource.1 {
            Some(slot) => format!("{base}:slot-{slot}"),
            None => base.to_string(),
        };
        let op_name = format!("op-{op:x}");
        let req = FenceRequest::new(&name, token, &op_name, &op.to_le_bytes(), b"ok")
            .expect("a valid request")
            .with_policy(Policy::Session);
        let req = match side {
            Side::Shared => req.shared(),
            Side::Exclusive => req,
        };
        let decision =
            decide(self.state.get(&resource), self.ops.get(&op), &req).expect("one policy");
        match decision {
            Decision::Apply { next, .. } => {
                self.state.insert(resource, next);
                self.ops.insert(
                    op,
                    OperationRecord {
                        token,
                        fingerprint: req.fingerprint,
                        result: req.result,
                    },
                );
                ctx.check.accepted(ctx.now, resource, token, side);
            }
            Decision::Refuse(outcome) => {
                ctx.trace.record(ctx.now, &(op, 3u8), || {
                    format!("refused {token} on {name}: {}", outcome.label())
                });
                if matches!(outcome.label(), "stale" | "cancelled") {
                    ctx.check.stale_refused += 1;
                }
            }
        }
    }

    /// The operator cancels every write at or below `at`: on the
    /// semaphore, under each of its slots too.
    pub fn cancel(&mut self, ctx: &mut Ctx, resource: u8, at: FencingToken) {
        let mut keys = vec![(resource, None)];
        if resource == crate::SEMAPHORE {
            keys.extend((0..crate::SEMAPHORE_PERMITS).map(|k| (resource, Some(k))));
        }
        for key in keys {
            let next = cancel(self.state.get(&key), Policy::Session, at);
            self.state.insert(key, next);
            ctx.check.cancelled(key, at);
        }
    }
}

//! The fenced resources: every write is judged by the fence kit's own
//! rule (`baton_fence::decide`, the function the SQLite backend runs in
//! its transaction) under the session policy, with operation records, and
//! the operator's cancellations by `baton_fence::cancel`.

use std::collections::BTreeMap;

use baton_core::FencingToken;
use baton_fence::{cancel, decide, Decision, FenceRequest, OperationRecord, Policy, ResourceState};

use crate::Ctx;

#[derive(Default)]
pub struct Resources {
    state: BTreeMap<u8, ResourceState>,
    ops: BTreeMap<u64, OperationRecord>,
}

impl Resources {
    /// A write of operation `op` under `token`.
    pub fn write(&mut self, ctx: &mut Ctx, op: u64, resource: u8, token: FencingToken) {
        let name = ctx.names[usize::from(resource)].as_str().to_string();
        let op_name = format!("op-{op:x}");
        let req = FenceRequest::new(&name, token, &op_name, &op.to_le_bytes(), b"ok")
            .expect("a valid request")
            .with_policy(Policy::Session);
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
                ctx.check.accepted(ctx.now, resource, token);
            }
            Decision::Refuse(outcome) => {
                ctx.trace.record(ctx.now, &(op, 3u8), || {
                    format!("refused {token} on r{resource}: {}", outcome.label())
                });
                if matches!(outcome.label(), "stale" | "cancelled") {
                    ctx.check.stale_refused += 1;
                }
            }
        }
    }

    /// The operator cancels every write at or below `at`.
    pub fn cancel(&mut self, ctx: &mut Ctx, resource: u8, at: FencingToken) {
        let next = cancel(self.state.get(&resource), Policy::Session, at);
        self.state.insert(resource, next);
        ctx.check.cancelled(resource, at);
    }
}

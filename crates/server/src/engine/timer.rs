//! The timer thread: it steps the table at its deadlines (expiries, wait
//! timeouts, the lazy flush), and on a stop flushes and joins the
//! committer.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use baton_core::MonoMs;
use baton_store::StoreError;
use tracing::info;

use baton_core::pipeline::Job;

use super::committer::{Replies, ToCommitter};
use super::{Shared, Wake};

/// The timer thread: steps the table at its deadlines; on [`Wake::Stop`]
/// flushes the lazy writes, stops the committer and returns its outcome.
pub(super) fn run_timer(
    shared: &Shared,
    wakes: &mpsc::Receiver<Wake>,
    committer: std::thread::JoinHandle<Result<(), StoreError>>,
) -> Result<(), StoreError> {
    loop {
        let timeout = {
            let mut engine = shared.lock();
            let now = engine.now();
            let at = engine.next_wake().unwrap_or(MonoMs(now.0 + 3_600_000));
            // A caller that sets an earlier deadline from here on sends
            // `Rearm`, which ends the wait below at once.
            engine.armed = at;
            Duration::from_millis(at.0.saturating_sub(now.0))
        };
        match wakes.recv_timeout(timeout) {
            Ok(Wake::Rearm) | Err(RecvTimeoutError::Timeout) => {}
            Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => break,
        }
        let mut engine = shared.lock();
        if engine.stopped {
            break;
        }
        let now = engine.now();
        shared.finish_step(&mut engine, now, Vec::new());
    }
    // Shutting down (or a commit failed): take no more commands, flush the
    // lazy writes, then stop.
    {
        let mut engine = shared.lock();
        engine.stopped = true;
        let lazy = engine.pipeline.take_lazy();
        engine.metrics.commit_queue_writes.inc_by(lazy.len() as i64);
        let _ = engine.committer.send(ToCommitter::Job(Job {
            writes: lazy,
            sync: false,
            replies: Replies::default(),
        }));
        let _ = engine.committer.send(ToCommitter::Flush);
    }
    let outcome = match committer.join() {
        Ok(result) => result,
        Err(_) => Err(StoreError::Storage("the committer thread panicked".into())),
    };
    // Every watch ends with the engine.
    {
        let engine = shared.lock();
        engine.hub.close();
        engine.observed.history.retire(engine.recorder);
    }
    assert!(
        !shared.engine.is_poisoned(),
        "a step panicked while it held the lease table; the engine stopped"
    );
    if outcome.is_ok() {
        info!("engine stopped; lazy writes flushed");
    }
    outcome
}

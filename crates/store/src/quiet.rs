//! Containing panics from the store library at the store's boundary.
//!
//! redb answers some kinds of file damage with a panic (`unreachable!()` on a
//! zeroed page). A damaged file is an operator's problem with a recovery
//! path, not a crash with a backtrace: the panic is caught where the store
//! calls the library and becomes [`StoreError::Corrupt`] naming the file.
//! The default panic hook would still print the backtrace, so a hook that
//! stays quiet on the threads inside [`contain_panics`] (and defers to the
//! previous hook everywhere else) is installed once.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;

use crate::StoreError;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic inside it into `StoreError::Corrupt` for `path`.
pub(crate) fn contain_panics<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    install_hook();
    let was_quiet = QUIET.with(|q| q.replace(true));
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was_quiet));
    outcome.unwrap_or_else(|payload| {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "internal error".into());
        Err(StoreError::Corrupt(format!(
            "{}: the store library failed reading it ({detail})",
            path.display()
        )))
    })
}

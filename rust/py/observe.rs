//! What the core reports, handed to `fencepost._observe` (which logs it through the
//! `fencepost` logger and counts it while OpenTelemetry metrics are on).
//!
//! Queued notices ([`crate::observe`]) are flushed by every call on its way back to Python;
//! a takeover and a refused write are reported where the caller gets them (the claim built,
//! the exception raised). A failing handler never fails the call that reported: the operator's
//! view must not change the ledger's answers, so its exception is printed as unraisable.

use pyo3::call::PyCallArgs;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::observe::{self, Notice};

static HANDLERS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Call `_observe.<name>(*args)`, printing (not raising) whatever goes wrong.
fn report<'py>(py: Python<'py>, name: &str, args: impl PyCallArgs<'py>) {
    let called = HANDLERS
        .get_or_try_init(py, || {
            PyResult::Ok(py.import("fencepost._observe")?.unbind())
        })
        .and_then(|m| m.bind(py).call_method1(name, args));
    if let Err(e) = called {
        e.write_unraisable(py, None);
    }
}

/// Hand the queued notices to Python, if there are any (one atomic load otherwise).
pub fn flush(py: Python<'_>) {
    if !observe::pending() {
        return;
    }
    let mut groups: Vec<u64> = Vec::new();
    for notice in observe::take() {
        match notice {
            Notice::BusyRetries { count, waited_ms } => {
                report(py, "busy_retries", (count, waited_ms));
            }
            Notice::Reconnected { reason } => report(py, "reconnected", (reason,)),
            Notice::Migrated { from, to } => report(py, "migrated", (from, to)),
            Notice::Group { size } => groups.push(size),
            Notice::Exhausted {
                run_id,
                unit_id,
                attempts,
            } => report(py, "exhausted", (run_id, unit_id, attempts)),
        }
    }
    if !groups.is_empty() {
        report(py, "groups", (groups,));
    }
}

/// A claim that took the lease from `taken_from`, whose claim had expired.
pub fn takeover(py: Python<'_>, run_id: &str, generation: i64, owner_id: &str, taken_from: &str) {
    report(py, "takeover", (run_id, generation, owner_id, taken_from));
}

/// A fenced write the lease refused.
pub fn refused(py: Python<'_>, run_id: &str, expected: i64, actual: i64, reason: &str) {
    report(py, "refused", (run_id, expected, actual, reason));
}

/// A write that gave up on contention after `retries` retries and `waited_ms`.
pub fn gave_up(py: Python<'_>, waited_ms: u64, retries: u32) {
    report(py, "gave_up", (waited_ms, retries));
}

/// `observe_groups(on)`: queue the size of every committed group (for the
/// `fencepost.commit.group_size` histogram) from now on, or stop.
#[pyfunction]
pub fn observe_groups(on: bool) {
    observe::set_groups(on);
}

/// `notices_dropped() -> int`: notices lost because nothing drained the queue in time.
#[pyfunction]
pub fn notices_dropped() -> u64 {
    observe::dropped()
}

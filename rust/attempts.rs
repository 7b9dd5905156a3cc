//! Attempts, the dispatcher's hot path: at-least-once dispatch with a stable dedupe key, and
//! exactly one terminal result per attempt.
//!
//! Reserving either appends attempt n+1 with a fresh `dispatch_id` and a `unit.started` event,
//! or — when the latest attempt is still `running` (its dispatcher crashed or lost its lease) —
//! reclaims it in place: same number, same `dispatch_id`, reclaim count + 1, no event. A reclaim
//! is refused if the step or input changed: downstream systems dedupe on `dispatch_id`, so one
//! id must never stand for two different pieces of work. Finishing is a compare-and-set on
//! (run, unit, attempt, dispatch id, running): exactly one finish per attempt writes, every
//! other returns `false` and writes nothing. Batches run in one transaction, all or nothing.
//!
//! The rules live in [`judge`]; a call is judged over one snapshot and its rows are written
//! together (see `crate::plan`), the same way alone, in a batch and in a commit group.

use crate::canonical::Value;
use crate::errors::Result;
use crate::ids::new_dispatch_id;
use crate::leases::Fence;
use crate::model::Reservation;
use crate::plan::{Judgment, Keys};
use crate::status::AttemptStatus;
use crate::store::{Store, Tx};

pub(crate) mod judge;
mod read;
mod retries;
mod spec;
pub use read::{
    accounting, attempts, orphans, unit, unit_attempts, unit_counts, units, UnitFilter,
};
pub use retries::{cancel_units, due_units, exhausted_units, retry_units, DueCursor, UnitCursor};
pub use spec::{FinishSpec, UnitSpec};

/// Reserve (or reclaim) attempts for `units` of one run, in one transaction.
pub fn reserve_attempts(
    store: &mut dyn Store,
    run_id: &str,
    units: &[UnitSpec],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<Reservation>> {
    for u in units {
        u.check()?;
    }
    // Random ids are drawn before BEGIN so the write lock covers only SQL.
    let dispatch_ids: Vec<String> = units.iter().map(|_| new_dispatch_id()).collect();
    store.write("reserving attempts", |tx| {
        reserve_in(tx, run_id, units, &dispatch_ids, fence, now_ms)
    })
}

/// The body of [`reserve_attempts`] inside the caller's transaction, with the dispatch ids
/// drawn beforehand (one per unit), so running it again reuses them: a judgment of one call.
pub(crate) fn reserve_in(
    tx: &dyn Tx,
    run_id: &str,
    units: &[UnitSpec],
    dispatch_ids: &[String],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<Reservation>> {
    let mut keys = Keys::default();
    keys.reserve(run_id, units);
    let mut judgment = Judgment::read(tx, keys)?;
    let out = judgment.reserve(run_id, units, dispatch_ids, fence, now_ms)?;
    judgment.write(tx)?;
    Ok(out)
}

/// The `unit.started` payload of a new attempt.
pub(crate) fn started_payload(
    run_id: &str,
    u: &UnitSpec,
    attempt: i64,
    dispatch_id: &str,
) -> Value {
    Value::Object(vec![
        ("attempt".into(), Value::Int(attempt)),
        ("dispatch_id".into(), Value::Str(dispatch_id.to_owned())),
        ("phase".into(), Value::Str(u.phase.clone())),
        ("run_id".into(), Value::Str(run_id.to_owned())),
        (
            "status".into(),
            Value::Str(AttemptStatus::Running.as_str().into()),
        ),
        ("step_id".into(), Value::Str(u.step_id.clone())),
        ("unit_id".into(), Value::Str(u.unit_id.clone())),
    ])
}

/// Finish attempts in one transaction; one `bool` per finish.
pub fn finish_attempts(
    store: &mut dyn Store,
    finishes: &[FinishSpec],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<bool>> {
    for f in finishes {
        f.check()?;
    }
    store.write("finishing attempts", |tx| {
        finish_in(tx, finishes, fence, now_ms)
    })
}

/// The body of [`finish_attempts`] inside the caller's transaction: a judgment of one call
/// (which locks its runs in sorted order, so two batches over the same runs cannot deadlock).
pub(crate) fn finish_in(
    tx: &dyn Tx,
    finishes: &[FinishSpec],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<bool>> {
    let mut keys = Keys::default();
    keys.finish(finishes, fence.is_some());
    let mut judgment = Judgment::read(tx, keys)?;
    let out = judgment.finish(finishes, fence, now_ms)?;
    judgment.write(tx)?;
    Ok(out)
}

/// The `unit.finished` payload: the reason only when there is one, tokens only when known.
/// Results and session ids stay out of the log: the attempt row holds them, and the log, which
/// every watcher of the run reads, stays small and carries no agent's session.
pub(crate) fn finished_payload(f: &FinishSpec, step_id: Option<String>, phase: String) -> Value {
    let mut payload = vec![
        ("attempt".into(), Value::Int(f.attempt)),
        ("dispatch_id".into(), Value::Str(f.dispatch_id.clone())),
        ("phase".into(), Value::Str(phase)),
        ("run_id".into(), Value::Str(f.run_id.clone())),
        ("status".into(), Value::Str(f.status.clone())),
        ("step_id".into(), step_id.map_or(Value::Null, Value::Str)),
        ("unit_id".into(), Value::Str(f.unit_id.clone())),
    ];
    if let Some(reason) = f.failure_reason.as_ref().filter(|r| !r.is_empty()) {
        payload.push(("failure_reason".into(), Value::Str(reason.clone())));
    }
    if let Some(tokens) = f.tokens {
        payload.push(("tokens".into(), Value::Int(tokens)));
    }
    Value::Object(payload)
}

/// The `unit.exhausted` payload: the attempt that used up the unit's retry policy.
pub(crate) fn exhausted_payload(f: &FinishSpec, step_id: Option<&str>, phase: &str) -> Value {
    Value::Object(vec![
        ("attempts".into(), Value::Int(f.attempt)),
        ("phase".into(), Value::Str(phase.to_owned())),
        ("run_id".into(), Value::Str(f.run_id.clone())),
        ("status".into(), Value::Str(f.status.clone())),
        (
            "step_id".into(),
            step_id.map_or(Value::Null, |s| Value::Str(s.to_owned())),
        ),
        ("unit_id".into(), Value::Str(f.unit_id.clone())),
    ])
}

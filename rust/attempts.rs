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

use crate::params;

use crate::canonical::{into_text, to_vec, Value};
use crate::errors::{LedgerError, Result};
use crate::events::{self, Actor};
use crate::ids::new_dispatch_id;
use crate::leases::{self, Fence};
use crate::model::{Reservation, ReservationKind};
use crate::status::{run_state, AttemptStatus};
use crate::store::{sql, BatchStatements, Store, Tx};

pub(crate) mod judge;
mod read;
mod spec;
use judge::{LatestAttempt, ReserveVerdict};
pub use read::{accounting, attempts, orphans, unit, unit_counts, units, UnitFilter};
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
/// drawn beforehand (one per unit), so running it again reuses them.
pub(crate) fn reserve_in(
    tx: &dyn Tx,
    run_id: &str,
    units: &[UnitSpec],
    dispatch_ids: &[String],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<Reservation>> {
    tx.lock_run(run_id)?;
    let actor = leases::check(tx, run_id, fence, now_ms)?;
    run_state(tx, run_id)?.require_active(run_id)?;
    // One unit keeps the one-by-one statements: measured, the set-based statement's generic
    // plan for a single JSON row cost more than the two round trips it saves.
    if let Some(batch) = tx
        .batch_statements()
        .filter(|_| units.len() > 1 && distinct(units))
    {
        return reserve_set(tx, batch, run_id, units, dispatch_ids, &actor, now_ms);
    }
    units
        .iter()
        .zip(dispatch_ids)
        .map(|(u, d)| reserve_one(tx, run_id, u, d, &actor, now_ms))
        .collect()
}

/// Whether every unit id of a batch is distinct (a repeated unit reclaims its own new attempt:
/// the one-by-one path keeps that order).
fn distinct(units: &[UnitSpec]) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(units.len());
    units.iter().all(|u| seen.insert(u.unit_id.as_str()))
}

/// A row's place in a set-based batch statement, from 1 (revisions follow it).
fn ord(index: usize) -> i64 {
    i64::try_from(index).map_or(i64::MAX, |i| i + 1)
}

fn opt_str(v: Option<&String>) -> Value {
    v.map_or(Value::Null, |s| Value::Str(s.clone()))
}

/// The batch path of a store that offers batch statements (one where each statement is a
/// round trip): the latest attempts of
/// all units in one read, reclaims one by one (rare), and every new attempt — unit projection,
/// attempt row and `unit.started` event — in one set-based statement. Same rows, same events,
/// same order as [`reserve_one`] per unit; the run's row lock (held) keeps the read valid.
fn reserve_set(
    tx: &dyn Tx,
    batch: &BatchStatements,
    run_id: &str,
    units: &[UnitSpec],
    dispatch_ids: &[String],
    actor: &Actor<'_>,
    now_ms: i64,
) -> Result<Vec<Reservation>> {
    let ids = events::json_array(&units.iter().map(|u| u.unit_id.clone()).collect::<Vec<_>>());
    let latest: std::collections::HashMap<String, LatestAttempt> = tx
        .rows(&batch.latest_attempts, params![run_id, ids], |r| {
            Ok((r.get::<String>(0)?, LatestAttempt::from_row(r, 1)?))
        })?
        .into_iter()
        .collect();
    let mut out = Vec::with_capacity(units.len());
    let mut rows = Vec::new();
    for (u, dispatch_id) in units.iter().zip(dispatch_ids) {
        match judge::reserve(latest.get(&u.unit_id), u)? {
            ReserveVerdict::Reclaim(l) => out.push(reclaim(tx, run_id, u, l, actor.generation)?),
            ReserveVerdict::New { attempt } => out.push(new_attempt(
                &mut rows,
                run_id,
                u,
                attempt,
                dispatch_id,
                actor,
                now_ms,
            )),
        }
    }
    write_rows(tx, &batch.reserve_group, rows)?;
    Ok(out)
}

/// The columns of a batch row that say who wrote it and when (each row of a group has its own).
fn actor_columns(actor: &Actor<'_>, now_ms: i64) -> [(String, Value); 4] {
    [
        (
            "actor_id".into(),
            actor.id.clone().map_or(Value::Null, Value::Str),
        ),
        (
            "actor_type".into(),
            actor
                .actor_type
                .map_or(Value::Null, |t| Value::Str(t.into())),
        ),
        (
            "generation".into(),
            actor.generation.map_or(Value::Null, Value::Int),
        ),
        ("ts".into(), Value::Int(now_ms)),
    ]
}

/// A new attempt for the set-based reserve statement: its row goes at the end of `rows` (its
/// place is its `ord`), and the caller gets the reservation the row makes.
pub(crate) fn new_attempt(
    rows: &mut Vec<Value>,
    run_id: &str,
    u: &UnitSpec,
    attempt: i64,
    dispatch_id: &str,
    actor: &Actor<'_>,
    now_ms: i64,
) -> Reservation {
    rows.push(new_attempt_row(
        run_id,
        u,
        attempt,
        dispatch_id,
        actor,
        now_ms,
        rows.len(),
    ));
    reserved(run_id, u, attempt, dispatch_id, actor)
}

/// The reservation of a new attempt.
fn reserved(
    run_id: &str,
    u: &UnitSpec,
    attempt: i64,
    dispatch_id: &str,
    actor: &Actor<'_>,
) -> Reservation {
    Reservation {
        run_id: run_id.to_owned(),
        unit_id: u.unit_id.clone(),
        kind: ReservationKind::Reserved,
        attempt,
        dispatch_id: dispatch_id.to_owned(),
        reclaims: 0,
        lease_generation: actor.generation,
    }
}

/// A new attempt's row for the set-based reservation statement, the `index`-th of its batch.
fn new_attempt_row(
    run_id: &str,
    u: &UnitSpec,
    attempt: i64,
    dispatch_id: &str,
    actor: &Actor<'_>,
    now_ms: i64,
    index: usize,
) -> Value {
    let payload = started_payload(run_id, u, attempt, dispatch_id);
    let mut row = vec![
        ("attempt".into(), Value::Int(attempt)),
        ("dispatch_id".into(), Value::Str(dispatch_id.to_owned())),
        ("engine".into(), opt_str(u.engine.as_ref())),
        ("holder".into(), opt_str(u.holder.as_ref())),
        ("input_hash".into(), opt_str(u.input_hash.as_ref())),
        ("model".into(), opt_str(u.model.as_ref())),
        ("node_id".into(), opt_str(u.node_id.as_ref())),
        ("ord".into(), Value::Int(ord(index))),
        ("parent_unit_id".into(), opt_str(u.parent_unit_id.as_ref())),
        ("payload".into(), Value::Str(into_text(to_vec(&payload)))),
        ("phase".into(), Value::Str(u.phase.clone())),
        ("run_id".into(), Value::Str(run_id.to_owned())),
        ("runner".into(), opt_str(u.runner.as_ref())),
        ("step_id".into(), Value::Str(u.step_id.clone())),
        ("trace_context".into(), opt_str(u.trace_context.as_ref())),
        ("unit_id".into(), Value::Str(u.unit_id.clone())),
        ("worktree_path".into(), opt_str(u.worktree_path.as_ref())),
    ];
    row.extend(actor_columns(actor, now_ms));
    row.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Object(row)
}

/// A winning finish's row for the set-based finish statement, the `index`-th of its batch.
pub(crate) fn finish_row(
    f: &FinishSpec,
    won: judge::RunningAttempt,
    actor: &Actor<'_>,
    now_ms: i64,
    index: usize,
) -> Value {
    let payload = finished_payload(f, won.step_id, won.phase);
    let mut row = vec![
        ("attempt".into(), Value::Int(f.attempt)),
        ("dispatch_id".into(), Value::Str(f.dispatch_id.clone())),
        ("failure_reason".into(), opt_str(f.failure_reason.as_ref())),
        ("ord".into(), Value::Int(ord(index))),
        ("payload".into(), Value::Str(into_text(to_vec(&payload)))),
        ("result".into(), opt_str(f.result.as_ref())),
        ("run_id".into(), Value::Str(f.run_id.clone())),
        ("session_id".into(), opt_str(f.session_id.as_ref())),
        ("status".into(), Value::Str(f.status.clone())),
        ("tokens".into(), f.tokens.map_or(Value::Null, Value::Int)),
        ("unit_id".into(), Value::Str(f.unit_id.clone())),
    ];
    row.extend(actor_columns(actor, now_ms));
    row.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Object(row)
}

/// Queue a set-based batch statement on `rows`; anything but one row per part per row fails
/// the transaction (nothing kept).
pub(crate) fn write_rows(tx: &dyn Tx, sql: &crate::store::Sql, rows: Vec<Value>) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let json = into_text(to_vec(&Value::Array(rows)));
    // The statement checks its own counts (it fails the transaction otherwise), so it needs no
    // answer: it is sent with the next statement that waits, at the latest the commit.
    tx.exec_later(sql, params![json, n])
}

/// The `unit.started` payload of a new attempt.
fn started_payload(run_id: &str, u: &UnitSpec, attempt: i64, dispatch_id: &str) -> Value {
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

fn reserve_one(
    tx: &dyn Tx,
    run_id: &str,
    u: &UnitSpec,
    dispatch_id: &str,
    actor: &Actor<'_>,
    now_ms: i64,
) -> Result<Reservation> {
    let latest = tx.row(&sql::LATEST_ATTEMPT_SQL, params![run_id, u.unit_id], |r| {
        LatestAttempt::from_row(r, 0)
    })?;
    let attempt = match judge::reserve(latest.as_ref(), u)? {
        ReserveVerdict::Reclaim(l) => return reclaim(tx, run_id, u, l, actor.generation),
        ReserveVerdict::New { attempt } => attempt,
    };
    tx.exec_later(
        &sql::RESERVE_ATTEMPT_UNIT_SQL,
        params![
            run_id,
            u.unit_id,
            u.step_id,
            u.node_id,
            u.parent_unit_id,
            u.phase,
            u.runner,
            u.engine,
            u.model,
            u.input_hash,
            u.worktree_path,
            u.holder,
            attempt,
            now_ms
        ],
    )?;
    tx.exec_later(
        &sql::RESERVE_ATTEMPT_INSERT_SQL,
        params![
            run_id,
            u.unit_id,
            attempt,
            dispatch_id,
            u.step_id,
            u.node_id,
            u.phase,
            u.input_hash,
            u.holder,
            actor.generation,
            now_ms,
            u.trace_context
        ],
    )?;
    let payload = started_payload(run_id, u, attempt, dispatch_id);
    events::append(tx, run_id, "unit.started", &payload, actor, now_ms)?;
    Ok(reserved(run_id, u, attempt, dispatch_id, actor))
}

/// Hand a still-running attempt back in place (the judge has checked it is the same work):
/// same number and dispatch id, one more reclaim, no event (the attempt started once; a second
/// `unit.started` would count it twice).
fn reclaim(
    tx: &dyn Tx,
    run_id: &str,
    u: &UnitSpec,
    latest: &LatestAttempt,
    generation: Option<i64>,
) -> Result<Reservation> {
    let (reclaims, lease_generation) = tx
        .row(
            &sql::RECLAIM_ATTEMPT_SQL,
            params![
                run_id,
                u.unit_id,
                latest.attempt,
                u.holder,
                generation,
                u.trace_context
            ],
            |r| Ok((r.get::<i64>(0)?, r.get::<Option<i64>>(1)?)),
        )?
        .unwrap_or((0, generation));
    tx.exec_later(&sql::RECLAIM_UNIT_SQL, params![run_id, u.unit_id, u.holder])?;
    Ok(Reservation {
        run_id: run_id.to_owned(),
        unit_id: u.unit_id.clone(),
        kind: ReservationKind::Reclaimed,
        attempt: latest.attempt,
        dispatch_id: latest.dispatch_id.clone(),
        reclaims,
        lease_generation,
    })
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

/// The body of [`finish_attempts`] inside the caller's transaction.
pub(crate) fn finish_in(
    tx: &dyn Tx,
    finishes: &[FinishSpec],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<bool>> {
    if let Some(batch) = tx.batch_statements().filter(|_| finishes.len() > 1) {
        return finish_set(tx, batch, finishes, fence, now_ms);
    }
    let mut checked: Option<(&str, Actor<'_>)> = None;
    let mut out = Vec::with_capacity(finishes.len());
    for f in finishes {
        tx.lock_run(&f.run_id)?;
        // The fence is checked once per run in the batch (a claim names one run).
        let actor = match &checked {
            Some((run, actor)) if *run == f.run_id => actor.clone(),
            _ if fence.is_none() => Actor::default(),
            _ => {
                let actor = leases::check(tx, &f.run_id, fence, now_ms)?;
                checked = Some((&f.run_id, actor.clone()));
                actor
            }
        };
        out.push(finish_one(tx, f, &actor, now_ms)?);
    }
    Ok(out)
}

impl FinishSpec {
    /// The attempt this finish names, as a row of the running-attempts statement's argument.
    pub(crate) fn key_row(&self) -> Value {
        Value::Object(vec![
            ("attempt".into(), Value::Int(self.attempt)),
            ("dispatch_id".into(), Value::Str(self.dispatch_id.clone())),
            ("run_id".into(), Value::Str(self.run_id.clone())),
            ("unit_id".into(), Value::Str(self.unit_id.clone())),
        ])
    }
}

/// The batch path of a store that offers batch statements: the runs locked in sorted order (two batches over the same
/// runs cannot deadlock), the fence checked per run, the still-running attempts among the
/// finishes read in one statement, and every winning finish — attempt, unit projection and
/// `unit.finished` event — written by one set-based statement. The first of two identical
/// finishes in a batch wins and the second gets `false`, as one by one.
fn finish_set(
    tx: &dyn Tx,
    batch: &BatchStatements,
    finishes: &[FinishSpec],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Vec<bool>> {
    let mut runs: Vec<&str> = finishes.iter().map(|f| f.run_id.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    let mut actor = Actor::default();
    for run in &runs {
        tx.lock_run(run)?;
    }
    if fence.is_some() {
        // In batch order, as one by one: the first run the claim does not name is refused.
        let mut seen = std::collections::HashSet::new();
        for f in finishes {
            if seen.insert(f.run_id.as_str()) {
                actor = leases::check(tx, &f.run_id, fence, now_ms)?;
            }
        }
    }
    let keys = Value::Array(finishes.iter().map(FinishSpec::key_row).collect());
    let mut running = tx
        .rows(
            &batch.running_attempts,
            params![into_text(to_vec(&keys))],
            judge::running_row,
        )?
        .into_iter()
        .collect();
    let mut out = Vec::with_capacity(finishes.len());
    let mut rows = Vec::new();
    for f in finishes {
        // A second identical finish in the batch finds nothing, like a late one.
        let Some(won) = judge::finish(&mut running, f) else {
            out.push(false);
            continue;
        };
        rows.push(finish_row(f, won, &actor, now_ms, rows.len()));
        out.push(true);
    }
    write_rows(tx, &batch.finish_group, rows)?;
    Ok(out)
}

/// The `unit.finished` payload: the reason only when there is one, tokens only when known.
/// Results and session ids stay out of the log: the attempt row holds them, and the log, which
/// every watcher of the run reads, stays small and carries no agent's session.
fn finished_payload(f: &FinishSpec, step_id: Option<String>, phase: String) -> Value {
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

fn finish_one(tx: &dyn Tx, f: &FinishSpec, actor: &Actor<'_>, now_ms: i64) -> Result<bool> {
    let Some((step_id, phase)) = tx.row(
        &sql::FINISH_ATTEMPT_SQL,
        params![
            f.run_id,
            f.unit_id,
            f.attempt,
            f.dispatch_id,
            f.status,
            f.result,
            f.tokens,
            f.failure_reason,
            f.session_id,
            now_ms
        ],
        |r| Ok((r.get::<Option<String>>(0)?, r.get::<String>(1)?)),
    )?
    else {
        // A duplicate, late or unknown finish: nothing matched, nothing is written.
        return Ok(false);
    };
    let projected = tx.exec(
        &sql::FINISH_ATTEMPT_UNIT_SQL,
        params![
            f.run_id,
            f.unit_id,
            f.attempt,
            f.status,
            f.result,
            f.tokens,
            f.failure_reason,
            f.session_id,
            now_ms
        ],
    )?;
    if projected != 1 {
        // Unreachable while reservations keep the projection in step; refuse rather than
        // commit an attempt whose unit disagrees (the transaction rolls back).
        return Err(LedgerError::StoreError {
            operation: "finishing an attempt".into(),
            message: format!(
                "unit {:?} of run {:?} does not show attempt {} as running; run `fencepost doctor`",
                f.unit_id, f.run_id, f.attempt
            ),
        });
    }
    let payload = finished_payload(f, step_id, phase);
    events::append(tx, &f.run_id, "unit.finished", &payload, actor, now_ms)?;
    Ok(true)
}

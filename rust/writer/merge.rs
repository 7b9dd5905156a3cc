//! A group's reservations, finishes and heartbeats on PostgreSQL, validated in memory and
//! written with one statement per kind, so a group costs the same few round trips whatever
//! its size.
//!
//! Where every statement is a round trip, a call under its own savepoint pays about three of
//! them (the fence, the run's state, the latest attempt or the compare-and-set). Here the whole
//! group reads once — its runs with their leases, the latest attempts its reservations name,
//! the running attempts its finishes name, in one pipeline — and each call is judged in Rust
//! against that snapshot, as it would be alone. The snapshot is an overlay: each accepted call
//! updates it (a renewed expiry, a finished attempt, a new attempt), so a later call sees the
//! earlier ones exactly as it would one by one. The order is the kinds' order — heartbeats,
//! then finishes, then reservations — and arrival within a kind.
//!
//! A refused call (a lost lease, a run that is not active, a claim for another run) gets its
//! own error and contributes no row, so it needs no savepoint. A call this path cannot answer
//! from the snapshot (a reclaim, a unit reserved earlier in the group or twice in one call,
//! another kind of call) is declined: the group runs it afterwards on its savepoint path,
//! reading afresh. The writes are one statement per kind; a statement that writes other than
//! the rows it was given is a store error, which ends the group (it then falls back to running
//! each call alone).

use std::collections::HashMap;

use crate::attempts::judge::{self, AttemptKey, LatestAttempt, ReserveVerdict, RunningAttempt};
use crate::attempts::{finish_row, new_attempt, write_rows, FinishSpec, UnitSpec};
use crate::canonical::{into_text, to_vec, Value};
use crate::errors::{LedgerError, Result};
use crate::events::Actor;
use crate::leases::{self, Fence, FenceRow};
use crate::params;
use crate::status::{AttemptStatus, RunState};
use crate::store::{BatchStatements, DbResult, Row, Tx};
use crate::writer::op::{Op, Output};

/// What the merge made of a group: per call, its result, or `None` when declined; and the
/// calls it answered, in the order it applied them.
pub(crate) struct Merged {
    pub outs: Vec<Option<Result<Output>>>,
    pub order: Vec<usize>,
}

/// Everything the group read, kept up to date as calls are accepted.
#[derive(Default)]
struct Overlay {
    runs: HashMap<String, (RunState, Option<FenceRow>)>,
    latest: HashMap<(String, String), LatestAttempt>,
    running: HashMap<AttemptKey, RunningAttempt>,
}

/// The rows each kind's statement writes.
#[derive(Default)]
struct Writes {
    heartbeats: Vec<(String, Value)>,
    finishes: Vec<Value>,
    reserves: Vec<Value>,
}

/// Answer what can be answered of `ops` (run locks held).
// The wildcard arms decline every other kind of call, including kinds added later.
#[allow(clippy::match_wildcard_for_single_variants)]
pub(crate) fn apply(tx: &dyn Tx, batch: &BatchStatements, ops: &[&Op]) -> Result<Merged> {
    let mut merged = Merged {
        outs: ops.iter().map(|_| None).collect(),
        order: Vec::new(),
    };
    let rank = |op: &Op| match op {
        Op::Heartbeat { .. } => Some(0),
        Op::Finish { .. } => Some(1),
        Op::Reserve { .. } => Some(2),
        // Every other kind is declined: it runs on the savepoint path.
        #[allow(unreachable_patterns)]
        _ => None,
    };
    let mut plan: Vec<(u8, usize)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| rank(op).map(|r| (r, i)))
        .collect();
    if plan.is_empty() {
        return Ok(merged);
    }
    plan.sort_unstable();
    let mut overlay = read(tx, batch, ops)?;
    let mut writes = Writes::default();
    for (_, i) in plan {
        let answer = match ops[i] {
            Op::Heartbeat {
                fence,
                token,
                lease_ms,
                now_ms,
            } => Some(heartbeat(
                &mut overlay,
                &mut writes,
                fence,
                token,
                *lease_ms,
                *now_ms,
            )),
            Op::Finish {
                finishes,
                fence,
                now_ms,
            } => Some(finish(
                &mut overlay,
                &mut writes,
                finishes,
                fence.as_ref(),
                *now_ms,
            )),
            Op::Reserve {
                run_id,
                units,
                dispatch_ids,
                fence,
                now_ms,
            } => reserve(
                &mut overlay,
                &mut writes,
                run_id,
                units,
                dispatch_ids,
                fence.as_ref(),
                *now_ms,
            ),
            #[allow(unreachable_patterns)]
            _ => None,
        };
        if let Some(answer) = answer {
            merged.outs[i] = Some(answer);
            merged.order.push(i);
        }
    }
    write(tx, batch, writes)?;
    Ok(merged)
}

/// The group's one read: runs and leases, latest attempts, running attempts, in one round trip.
#[allow(clippy::match_wildcard_for_single_variants)]
fn read(tx: &dyn Tx, batch: &BatchStatements, ops: &[&Op]) -> Result<Overlay> {
    let mut runs: Vec<&str> = Vec::new();
    let mut units: Vec<Value> = Vec::new();
    let mut keys: Vec<Value> = Vec::new();
    for op in ops {
        match op {
            Op::Heartbeat { fence, .. } => runs.push(&fence.run_id),
            Op::Finish { finishes, .. } => {
                for f in finishes {
                    runs.push(&f.run_id);
                    keys.push(f.key_row());
                }
            }
            Op::Reserve {
                run_id, units: us, ..
            } => {
                runs.push(run_id);
                for u in us {
                    units.push(Value::Object(vec![
                        ("run_id".into(), Value::Str(run_id.clone())),
                        ("unit_id".into(), Value::Str(u.unit_id.clone())),
                    ]));
                }
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
    runs.sort_unstable();
    runs.dedup();
    let runs = into_text(to_vec(&Value::Array(
        runs.into_iter().map(|r| Value::Str(r.to_owned())).collect(),
    )));
    let units = into_text(to_vec(&Value::Array(units)));
    let keys = into_text(to_vec(&Value::Array(keys)));
    let mut overlay = Overlay::default();
    let mut each = |query: usize, r: &dyn Row| -> DbResult<()> {
        match query {
            0 => {
                let state = RunState {
                    status: r.get(1)?,
                    current_step_id: r.get(2)?,
                    scope_key: r.get(3)?,
                    workflow_ref: r.get(4)?,
                };
                let lease = match r.get::<Option<i64>>(5)? {
                    Some(generation) => Some(FenceRow {
                        generation,
                        token_hash: r.get(6)?,
                        expires_at: r.get(7)?,
                        owner_type: r.get(8)?,
                        owner_id: r.get(9)?,
                    }),
                    None => None,
                };
                overlay.runs.insert(r.get(0)?, (state, lease));
            }
            1 => {
                let latest = LatestAttempt::from_row(r, 2)?;
                overlay.latest.insert((r.get(0)?, r.get(1)?), latest);
            }
            _ => {
                let (key, attempt) = judge::running_row(r)?;
                overlay.running.insert(key, attempt);
            }
        }
        Ok(())
    };
    tx.query_many(
        &[
            (&batch.group_runs, params![runs]),
            (&batch.latest_attempts_group, params![units]),
            (&batch.running_attempts, params![keys]),
        ],
        &mut each,
    )
    .map_err(|e| tx.fail(&e))?;
    Ok(overlay)
}

/// The fence check of a call on `run_id`, against the overlay's lease.
fn check_fence(
    overlay: &Overlay,
    run_id: &str,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Actor<'static>> {
    leases::check_against(run_id, fence, now_ms, || {
        Ok(overlay.runs.get(run_id).and_then(|(_, l)| l.clone()))
    })
}

fn heartbeat(
    overlay: &mut Overlay,
    writes: &mut Writes,
    fence: &Fence,
    token: &str,
    lease_ms: i64,
    now_ms: i64,
) -> Result<Output> {
    let actor = check_fence(overlay, &fence.run_id, Some(fence), now_ms)?;
    let claim = leases::renewed(fence, token, actor, lease_ms, now_ms);
    if let Some(lease) = overlay
        .runs
        .get_mut(&fence.run_id)
        .and_then(|(_, l)| l.as_mut())
    {
        lease.expires_at = Some(claim.expires_at);
    }
    // One row per run: the last heartbeat's, which is what one by one leaves behind.
    writes.heartbeats.retain(|(run, _)| *run != fence.run_id);
    writes.heartbeats.push((
        fence.run_id.clone(),
        Value::Object(vec![
            ("expires_at".into(), Value::Int(claim.expires_at)),
            ("generation".into(), Value::Int(fence.generation)),
            ("heartbeat_at".into(), Value::Int(now_ms)),
            ("run_id".into(), Value::Str(fence.run_id.clone())),
            ("token_hash".into(), Value::Str(fence.token_hash.clone())),
        ]),
    ));
    Ok(Output::Claim(claim))
}

fn finish(
    overlay: &mut Overlay,
    writes: &mut Writes,
    finishes: &[FinishSpec],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Output> {
    // Every run's fence first, in the call's order, before any compare-and-set: a refused
    // call writes nothing. A claim names one run, so every finish has the same actor.
    let mut actor = Actor::default();
    for f in finishes {
        actor = check_fence(overlay, &f.run_id, fence, now_ms)?;
    }
    let mut out = Vec::with_capacity(finishes.len());
    for f in finishes {
        // A second finish of the attempt, in this call or a later one, loses.
        let Some(won) = judge::finish(&mut overlay.running, f) else {
            out.push(false);
            continue;
        };
        if let Some(l) = overlay
            .latest
            .get_mut(&(f.run_id.clone(), f.unit_id.clone()))
            .filter(|l| l.attempt == f.attempt)
        {
            l.status = AttemptStatus::parse(&f.status).unwrap_or(AttemptStatus::Completed);
        }
        let index = writes.finishes.len();
        writes
            .finishes
            .push(finish_row(f, won, &actor, now_ms, index));
        out.push(true);
    }
    Ok(Output::Finished(out))
}

/// `None`: declined (a reclaim, or a unit this path cannot number from the snapshot).
#[allow(clippy::too_many_arguments)]
fn reserve(
    overlay: &mut Overlay,
    writes: &mut Writes,
    run_id: &str,
    units: &[UnitSpec],
    dispatch_ids: &[String],
    fence: Option<&Fence>,
    now_ms: i64,
) -> Option<Result<Output>> {
    let actor = match check_fence(overlay, run_id, fence, now_ms) {
        Ok(actor) => actor,
        Err(e) => return Some(Err(e)),
    };
    let Some((state, _)) = overlay.runs.get(run_id) else {
        return Some(Err(LedgerError::RunNotFound {
            run_id: run_id.to_owned(),
        }));
    };
    if let Err(e) = state.require_active(run_id) {
        return Some(Err(e));
    }
    // Judged unit by unit as one by one would, each seeing the ones before it: a reclaim (or a
    // refused one) is declined, as the snapshot holds no reclaim count; the call then runs
    // alone on its savepoint, reading afresh.
    let mut planned = Vec::with_capacity(units.len());
    let mut mine: HashMap<&str, LatestAttempt> = HashMap::new();
    for (u, dispatch_id) in units.iter().zip(dispatch_ids) {
        let latest = mine
            .get(u.unit_id.as_str())
            .or_else(|| overlay.latest.get(&(run_id.to_owned(), u.unit_id.clone())));
        let Ok(ReserveVerdict::New { attempt }) = judge::reserve(latest, u) else {
            return None;
        };
        mine.insert(&u.unit_id, LatestAttempt::started(attempt, dispatch_id, u));
        planned.push((u, dispatch_id, attempt));
    }
    let mut out = Vec::with_capacity(units.len());
    for (u, dispatch_id, attempt) in planned {
        out.push(new_attempt(
            &mut writes.reserves,
            run_id,
            u,
            attempt,
            dispatch_id,
            &actor,
            now_ms,
        ));
    }
    for (unit_id, latest) in mine {
        overlay
            .latest
            .insert((run_id.to_owned(), unit_id.to_owned()), latest);
    }
    Some(Ok(Output::Reservations(out)))
}

/// One statement per kind, in the kinds' order; each must write exactly its rows. All are
/// queued: they go out with the commit, which fails if any count differs.
fn write(tx: &dyn Tx, batch: &BatchStatements, writes: Writes) -> Result<()> {
    let heartbeats = writes.heartbeats.into_iter().map(|(_, v)| v).collect();
    write_rows(tx, &batch.heartbeat_group, heartbeats)?;
    write_rows(tx, &batch.finish_group, writes.finishes)?;
    write_rows(tx, &batch.reserve_group, writes.reserves)?;
    Ok(())
}

//! A run's progress: completing steps, every move of its status, and its outputs.
//!
//! Every status change goes through [`transition`], which checks the move against the
//! lifecycle ([`RunStatus::check_move`]), bumps the revision and appends `run.status`; terminal
//! runs are never revived. Each operation refuses the moves it does not make with its own error
//! first (`RunNotActive` for `block_run` and `resume_run`), so only `set_status`, which offers
//! every move, reports the lifecycle's refusal.

use crate::params;

use crate::attempts::FinishSpec;
use crate::blobs;
use crate::canonical::{Json, Value};
use crate::errors::{LedgerError, Result};
use crate::events::{self, json_array, Actor};
use crate::ids::check_prose;
use crate::leases::{self, Fence};
use crate::model::Run;
use crate::runs::create::guard_error;
use crate::runs::read::must_read_run;
use crate::status::{run_state, AttemptStatus, RunState, RunStatus, StepStatus};
use crate::store::{sql, Store, Tx};

/// Change a run's status, bump its revision and append `run.status`: the one path every plain
/// status change takes. The move is checked against the lifecycle first; a move into `active`
/// that would break the scope guard fails at the guard's index.
pub(crate) fn transition(
    tx: &dyn Tx,
    run_id: &str,
    state: &RunState,
    to: RunStatus,
    current_step: Option<&str>,
    actor: &Actor<'_>,
    now_ms: i64,
) -> Result<()> {
    transition_because(tx, run_id, state, to, current_step, None, actor, now_ms)
}

/// [`transition`] with a `reason` in its `run.status` event.
#[allow(clippy::too_many_arguments)]
fn transition_because(
    tx: &dyn Tx,
    run_id: &str,
    state: &RunState,
    to: RunStatus,
    current_step: Option<&str>,
    reason: Option<&str>,
    actor: &Actor<'_>,
    now_ms: i64,
) -> Result<()> {
    state.status.check_move(to)?;
    let args = params![run_id, to, current_step, now_ms];
    if to == RunStatus::Active && state.status != RunStatus::Active && state.scope_key.is_some() {
        // Only a run with a scope entering `active` can meet the scope guard
        // (`runs_scope_guard` holds active runs by scope and ref, and a unique index never
        // finds two NULL scopes equal): its answer is waited for, to name the occupant.
        if let Err(e) = tx.exec_raw(&sql::SET_RUN_STATUS_SQL, args) {
            return Err(guard_error(
                tx,
                &e,
                state.scope_key.as_deref(),
                &state.workflow_ref,
            ));
        }
    } else {
        // Any other move cannot fail on it: sent with what follows.
        tx.exec_later(&sql::SET_RUN_STATUS_SQL, args)?;
    }
    let mut fields = vec![("from".into(), Value::Str(state.status.as_str().into()))];
    if let Some(reason) = reason {
        fields.push(("reason".into(), Value::Str(reason.to_owned())));
    }
    fields.push(("run_id".into(), Value::Str(run_id.to_owned())));
    fields.push(("to".into(), Value::Str(to.as_str().into())));
    events::append(
        tx,
        run_id,
        "run.status",
        &Value::Object(fields),
        actor,
        now_ms,
    )?;
    Ok(())
}

/// `complete_step`'s arguments.
#[derive(Debug, Clone, Default)]
pub struct StepResult {
    /// `completed`, `skipped`, `blocked` or `failed`.
    pub status: String,
    /// Notes.
    pub notes: Option<String>,
    /// Canonical JSON evidence.
    pub evidence: Option<String>,
    /// Summary.
    pub summary: Option<String>,
}

/// Finish the run's current step and advance (or block, or complete the run).
pub fn complete_step(
    store: &mut dyn Store,
    run_id: &str,
    step_id: &str,
    result: &StepResult,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Run> {
    let status = StepStatus::parse_result(&result.status)?;
    store.write("completing a step", |tx| {
        complete_step_in(tx, run_id, step_id, status, result, fence, now_ms)
    })
}

/// The body of [`complete_step`] inside the caller's transaction, `result.status` parsed as
/// `status`: it locks `run_id` and no other run.
pub(crate) fn complete_step_in(
    tx: &dyn Tx,
    run_id: &str,
    step_id: &str,
    status: StepStatus,
    result: &StepResult,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Run> {
    let (actor, state) = fenced_state(tx, run_id, fence, now_ms)?;
    state.require_active(run_id)?;
    let seq: i64 = tx
        .row(&sql::STEP_STATUS_SQL, params![run_id, step_id], |r| {
            r.get(1)
        })?
        .ok_or_else(|| LedgerError::NotFound {
            kind: "step",
            key: step_id.to_owned(),
        })?;
    if state.current_step_id.as_deref() != Some(step_id) {
        return Err(LedgerError::invalid(
            "step_id",
            format!(
                "{step_id:?} is not the current step of run {run_id:?}; the current step is \
                 {:?}",
                state.current_step_id.as_deref().unwrap_or("none")
            ),
        ));
    }
    let completed_at = (status != StepStatus::Blocked).then_some(now_ms);
    tx.exec_later(
        &sql::COMPLETE_STEP_SQL,
        params![
            run_id,
            step_id,
            status,
            result.notes,
            result.evidence,
            result.summary,
            completed_at
        ],
    )?;
    let payload = Value::Object(vec![
        ("run_id".into(), Value::Str(run_id.to_owned())),
        ("status".into(), Value::Str(status.as_str().into())),
        ("step_id".into(), Value::Str(step_id.to_owned())),
    ]);
    events::append(tx, run_id, "step.completed", &payload, &actor, now_ms)?;
    if !status.advances() {
        let to = RunStatus::Blocked;
        transition(tx, run_id, &state, to, Some(step_id), &actor, now_ms)?;
        return must_read_run(tx, run_id);
    }
    let next: Option<String> = tx.row(&sql::NEXT_STEP_SQL, params![run_id, seq], |r| r.get(0))?;
    if let Some(next) = next {
        // The run stays `active` on its next step: no status change, so no `run.status`
        // (the `step.completed` above is the event of this revision).
        tx.exec_later(&sql::ACTIVATE_STEP_SQL, params![run_id, next])?;
        tx.exec_later(
            &sql::SET_RUN_STATUS_SQL,
            params![run_id, RunStatus::Active, next, now_ms],
        )?;
    } else {
        transition(
            tx,
            run_id,
            &state,
            RunStatus::Completed,
            None,
            &actor,
            now_ms,
        )?;
    }
    must_read_run(tx, run_id)
}

/// `active` -> `blocked`, marking the current step blocked; any other status is
/// `RunNotActive`.
pub fn block_run(
    store: &mut dyn Store,
    run_id: &str,
    notes: Option<&str>,
    now_ms: i64,
) -> Result<Run> {
    store.write("blocking a run", |tx| {
        tx.lock_run(run_id)?;
        let state = run_state(tx, run_id)?;
        state.require_active(run_id)?;
        let current = state.current_step_id.as_deref();
        if let Some(step) = current {
            tx.exec_later(&sql::BLOCK_STEP_SQL, params![run_id, step, notes])?;
        }
        let actor = Actor::default();
        transition(
            tx,
            run_id,
            &state,
            RunStatus::Blocked,
            current,
            &actor,
            now_ms,
        )?;
        must_read_run(tx, run_id)
    })
}

/// `blocked` -> `active`, reopening the current step; an active run is returned unchanged, any
/// other status is `RunNotActive`.
pub fn resume_run(store: &mut dyn Store, run_id: &str, now_ms: i64) -> Result<Run> {
    store.write("resuming a run", |tx| {
        tx.lock_run(run_id)?;
        let state = run_state(tx, run_id)?;
        match state.status {
            RunStatus::Active => return must_read_run(tx, run_id),
            RunStatus::Blocked => {}
            other => {
                return Err(LedgerError::RunNotActive {
                    run_id: run_id.to_owned(),
                    status: other.as_str().to_owned(),
                })
            }
        }
        let current = state.current_step_id.as_deref();
        if let Some(step) = current {
            tx.exec_later(&sql::REOPEN_STEP_SQL, params![run_id, step])?;
        }
        let actor = Actor::default();
        transition(
            tx,
            run_id,
            &state,
            RunStatus::Active,
            current,
            &actor,
            now_ms,
        )?;
        must_read_run(tx, run_id)
    })
}

/// Cancel a non-terminal run; `false` when it was terminal already. Its running attempts are
/// finished as `cancelled` (each with its `unit.finished` event), and with `cascade` so is every
/// live run below it, children first, all in one transaction: a crash leaves the whole tree
/// cancelled or none of it. `reason` goes into each `run.status` event.
pub fn abandon_run(
    store: &mut dyn Store,
    run_id: &str,
    reason: Option<&str>,
    cascade: bool,
    now_ms: i64,
) -> Result<bool> {
    if let Some(reason) = reason {
        check_prose("reason", reason)?;
    }
    store.write("abandoning a run", |tx| {
        tx.lock_run(run_id)?;
        let state = run_state(tx, run_id)?;
        if state.status.is_terminal() {
            return Ok(false);
        }
        let tree = if cascade {
            lock_tree(tx, run_id)?
        } else {
            vec![run_id.to_owned()]
        };
        // Deepest last in the tree's order; cancel in reverse, so that a parent is never
        // cancelled while a child of it still runs.
        for id in tree.iter().rev() {
            let state = run_state(tx, id)?;
            if state.status.is_terminal() {
                continue;
            }
            cancel_running_attempts(tx, id, reason, now_ms)?;
            let current = state.current_step_id.as_deref();
            transition_because(
                tx,
                id,
                &state,
                RunStatus::Cancelled,
                current,
                reason,
                &Actor::default(),
                now_ms,
            )?;
        }
        Ok(true)
    })
}

/// The run and every run below it, each locked, parents before children. The runs below are
/// read again once they are locked, until no new one appears: a child published while the
/// tree was read waited on its parent's lock, and is found on the next reading.
fn lock_tree(tx: &dyn Tx, run_id: &str) -> Result<Vec<String>> {
    let mut locked: Vec<String> = vec![run_id.to_owned()];
    loop {
        let mut tree: Vec<(String, i64)> = tx.rows(
            &crate::retention::sql::TREE_SQL,
            params![json_array(&[run_id.to_owned()])],
            |r| Ok((r.get(1)?, r.get(2)?)),
        )?;
        tree.sort_by_key(|(_, depth)| *depth);
        let tree: Vec<String> = tree.into_iter().map(|(id, _)| id).collect();
        let new: Vec<&String> = tree.iter().filter(|id| !locked.contains(id)).collect();
        if new.is_empty() {
            return Ok(tree);
        }
        for id in new {
            tx.lock_run(id)?;
            locked.push(id.clone());
        }
    }
}

/// Finish every running attempt of `run_id` as `cancelled`, through the finish itself (its
/// compare-and-set, unit projection and `unit.finished` event).
fn cancel_running_attempts(
    tx: &dyn Tx,
    run_id: &str,
    reason: Option<&str>,
    now_ms: i64,
) -> Result<()> {
    let running = tx.rows(&sql::RUNNING_ATTEMPTS_SQL, params![run_id], |r| {
        Ok(FinishSpec {
            run_id: run_id.to_owned(),
            unit_id: r.get(0)?,
            attempt: r.get(1)?,
            dispatch_id: r.get(2)?,
            status: AttemptStatus::Cancelled.as_str().to_owned(),
            failure_reason: Some(reason.unwrap_or("the run was abandoned").to_owned()),
            ..FinishSpec::default()
        })
    })?;
    if running.is_empty() {
        return Ok(());
    }
    crate::attempts::finish_in(tx, &running, None, now_ms).map(|_| ())
}

/// Move a claimed run along its lifecycle, fenced by the claim: the controller's status change,
/// and the one operation that offers every move of the lifecycle.
pub fn set_status(
    store: &mut dyn Store,
    run_id: &str,
    status: &str,
    fence: &Fence,
    now_ms: i64,
) -> Result<Run> {
    let to = RunStatus::parse_argument("status", status)?;
    store.write("changing a run's status", |tx| {
        set_status_in(tx, run_id, to, fence, now_ms)
    })
}

/// The body of [`set_status`] inside the caller's transaction: it locks `run_id` and no other
/// run (a move changes only its own run; nothing cascades to a parent or a child).
pub(crate) fn set_status_in(
    tx: &dyn Tx,
    run_id: &str,
    to: RunStatus,
    fence: &Fence,
    now_ms: i64,
) -> Result<Run> {
    let (actor, state) = fenced_state(tx, run_id, Some(fence), now_ms)?;
    let current = state.current_step_id.as_deref();
    transition(tx, run_id, &state, to, current, &actor, now_ms)?;
    must_read_run(tx, run_id)
}

/// Lock `run_id`, then check `fence` against its lease ([`leases::check`]) and read its state
/// ([`run_state`]): both reads in one round trip (on PostgreSQL sent with the lock, after it,
/// so both see what the run's last writer committed). The fence is judged first, as alone.
pub(crate) fn fenced_state(
    tx: &dyn Tx,
    run_id: &str,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<(crate::events::Actor<'static>, RunState)> {
    tx.lock_run(run_id)?;
    if fence.is_none() {
        return Ok((crate::events::Actor::default(), run_state(tx, run_id)?));
    }
    let mut lease = None;
    let mut state = None;
    let reads: [(&crate::store::Sql, &[&dyn crate::store::ToSql]); 2] = [
        (&sql::FENCE_SQL, params![run_id]),
        (&sql::RUN_STATUS_SQL, params![run_id]),
    ];
    tx.query_many(&reads, &mut |i, r| {
        if i == 0 {
            lease = Some(leases::fence_row(r)?);
        } else {
            state = Some(crate::status::run_state_row(r)?);
        }
        Ok(())
    })
    .map_err(|e| tx.fail(&e))?;
    let actor = leases::check_against(run_id, fence, now_ms, || Ok(lease))?;
    let state = state.ok_or_else(|| LedgerError::RunNotFound {
        run_id: run_id.to_owned(),
    })?;
    Ok((actor, state))
}

/// Record the run's outputs.
pub fn set_outputs(
    store: &mut dyn Store,
    run_id: &str,
    outputs: &Json,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<()> {
    store.write("setting outputs", |tx| {
        tx.lock_run(run_id)?;
        leases::check(tx, run_id, fence, now_ms)?;
        run_state(tx, run_id)?;
        blobs::put_digested(tx, &outputs.digest, outputs.text.as_bytes(), now_ms)?;
        tx.exec_later(
            &sql::SET_OUTPUTS_SQL,
            params![run_id, outputs.digest, now_ms],
        )?;
        Ok(())
    })
}

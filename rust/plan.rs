//! One judgment of reservations, finishes and heartbeats: what the calls need is read once
//! (a snapshot of their runs with their leases, the latest attempts their reservations name,
//! the running attempts their finishes name), each call is judged in turn against it by the
//! pure rules of `attempts::judge` and `leases`, and the rows every accepted call writes are
//! written together at the end (`store::rows`: the store picks their statements).
//!
//! A call alone, a batch and a commit group all go through here, so each rule exists once:
//! a lone call is a judgment of one call; a group judges all its calls over one snapshot.
//!
//! The snapshot is kept up to date as calls are accepted (a renewed expiry, a finished
//! attempt, a new or reclaimed attempt), so a later call sees the earlier ones exactly as it
//! would one by one. A refused call (a lost lease, a run that is not active, a reclaim that
//! would change the work) gets its error and leaves neither rows nor changes behind: each call
//! is judged whole before anything of it is kept.
//!
//! The judgment takes the lock of every run its calls name through
//! [`Tx::lock_run_at_write`]: on SQLite (one writer) and on a retry that is the run's lock
//! from before the read to the commit, so the snapshot stays true until the rows are written.
//! PostgreSQL's first try takes the locks only with the rows, and the write checks first that
//! what the rows depend on of each run (its status, its lease: [`RunRead`]) is still as read,
//! so a run's lock is held for the write alone and not across the read's round trip and the
//! judging. A run that changed in between fails the try, and the store judges again under the
//! locks.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::attempts::judge::{self, AttemptKey, LatestAttempt, ReserveVerdict, RunningAttempt};
use crate::attempts::{exhausted_payload, finished_payload, started_payload, FinishSpec, UnitSpec};
use crate::canonical::{into_text, to_vec};
use crate::errors::{LedgerError, Result};
use crate::events::Actor;
use crate::leases::{self, Fence, FenceRow};
use crate::model::{Claim, Reservation, ReservationKind};
use crate::retry::AfterFailure;
use crate::status::{AttemptStatus, RunState, RunStatus, UnitStatus};
use crate::store::rows::{
    AttemptRef, FenceRead, FinishRow, HeartbeatRow, Part, ReclaimRow, ReserveRow, RunRead,
    SnapshotKeys, Stamp, UnitRef, Writes,
};
use crate::store::{DbResult, Row, Tx};

/// A run as the snapshot holds it.
struct RunSnapshot {
    state: RunState,
    lease: Option<FenceRow>,
}

/// What the judgment read, kept up to date as calls are accepted.
#[derive(Default)]
struct Snapshot {
    runs: HashMap<String, RunSnapshot>,
    latest: HashMap<(String, String), LatestAttempt>,
    running: HashMap<AttemptKey, RunningAttempt>,
}

/// The keys a set of calls needs read, and the runs whose locks they need; add each call,
/// then [`Judgment::read`].
#[derive(Default)]
pub(crate) struct Keys<'a> {
    keys: SnapshotKeys<'a>,
    /// Every run a call names (a finish without a fence reads no run, but writes to it).
    locks: Vec<&'a str>,
}

impl<'a> Keys<'a> {
    /// A reservation of `units` on `run_id`: the run and each unit's latest attempt.
    pub(crate) fn reserve(&mut self, run_id: &'a str, units: &'a [UnitSpec]) {
        self.locks.push(run_id);
        self.keys.runs.push(run_id);
        self.keys.units.extend(units.iter().map(|u| UnitRef {
            run_id,
            unit_id: &u.unit_id,
        }));
    }

    /// Finishes: the attempts they name, and their runs' leases when fenced.
    pub(crate) fn finish(&mut self, finishes: &'a [FinishSpec], fenced: bool) {
        for f in finishes {
            self.locks.push(&f.run_id);
            if fenced {
                self.keys.runs.push(&f.run_id);
            }
            self.keys.attempts.push(AttemptRef {
                run_id: &f.run_id,
                unit_id: &f.unit_id,
                attempt: f.attempt,
                dispatch_id: &f.dispatch_id,
                failing: f.fails(),
            });
        }
    }

    /// A heartbeat: its run's lease.
    pub(crate) fn heartbeat(&mut self, fence: &'a Fence) {
        self.locks.push(&fence.run_id);
        self.keys.runs.push(&fence.run_id);
    }
}

/// A judgment in progress: the snapshot and the rows of the calls accepted so far.
pub(crate) struct Judgment<'a> {
    snapshot: Snapshot,
    writes: Writes<'a>,
    /// Where each reclaimed attempt's row is in `writes.reclaims`, to fold later reclaims in.
    reclaimed: HashMap<(&'a str, &'a str, i64), usize>,
    /// Some run's lock waits for the write, which then needs what the rows depend on as read.
    late: bool,
}

impl<'a> Judgment<'a> {
    /// Lock the runs of `keys` (in sorted order, so two judgments cannot deadlock; see
    /// [`Tx::lock_run_at_write`] for when) and read what their calls need.
    pub(crate) fn read(tx: &dyn Tx, keys: Keys<'a>) -> Result<Self> {
        let Keys {
            mut keys,
            mut locks,
        } = keys;
        locks.sort_unstable();
        locks.dedup();
        let mut late = false;
        for run in locks {
            late |= tx.lock_run_at_write(run)?;
        }
        keys.settle();
        let mut snapshot = Snapshot::default();
        let mut each = |part: Part, r: &dyn Row| -> DbResult<()> {
            match part {
                Part::Run => {
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
                    let state = RunState {
                        status: r.get(1)?,
                        current_step_id: r.get(2)?,
                        scope_key: r.get(3)?,
                        workflow_ref: r.get(4)?,
                    };
                    snapshot
                        .runs
                        .insert(r.get(0)?, RunSnapshot { state, lease });
                }
                Part::Latest => {
                    let latest = LatestAttempt::from_row(r, 2)?;
                    snapshot.latest.insert((r.get(0)?, r.get(1)?), latest);
                }
                Part::Running => {
                    // An attempt two finishes name is read twice, its policy only for the one
                    // that fails it: keep the policy whichever row comes last.
                    let (key, attempt) = judge::running_row(r)?;
                    match snapshot.running.entry(key) {
                        Entry::Vacant(e) => {
                            e.insert(attempt);
                        }
                        Entry::Occupied(mut e) => {
                            if attempt.retry_policy.is_some() {
                                e.get_mut().retry_policy = attempt.retry_policy;
                            }
                        }
                    }
                }
            }
            Ok(())
        };
        tx.read_snapshot(&keys, &mut each)
            .map_err(|e| tx.fail(&e))?;
        Ok(Self {
            snapshot,
            writes: Writes::default(),
            reclaimed: HashMap::new(),
            late,
        })
    }

    /// Write the rows of every accepted call, with what they depend on of their runs as read
    /// (for a write that checks it first; see [`Tx::lock_run_at_write`]).
    pub(crate) fn write(self, tx: &dyn Tx) -> Result<()> {
        let Self {
            snapshot,
            writes,
            late,
            ..
        } = self;
        if writes.is_empty() {
            return Ok(());
        }
        // Reported once the transaction commits (see `observe::hold`).
        for f in writes.finishes.iter().filter(|f| f.exhausted.is_some()) {
            crate::observe::hold(crate::observe::Notice::Exhausted {
                run_id: f.run_id.to_owned(),
                unit_id: f.unit_id.to_owned(),
                attempts: f.attempt,
            });
        }
        let mut writes: Writes<'_> = writes;
        if !late {
            return tx.write_rows(&writes).map_err(|e| tx.fail(&e));
        }
        writes.read = depends(&writes)
            .into_iter()
            .map(|(run_id, (active, fenced))| RunRead {
                run_id,
                status: active.then_some(RunStatus::Active.as_str()),
                fence: snapshot
                    .runs
                    .get(run_id)
                    .and_then(|r| r.lease.as_ref())
                    .filter(|_| fenced)
                    .and_then(|l| {
                        Some(FenceRead {
                            generation: l.generation,
                            token_hash: l.token_hash.as_deref()?,
                        })
                    }),
            })
            .collect();
        tx.write_rows(&writes).map_err(|e| tx.fail(&e))
    }

    /// The fence check of a call on `run_id`, against the snapshot's lease.
    fn check_fence(
        &self,
        run_id: &str,
        fence: Option<&Fence>,
        now_ms: i64,
    ) -> Result<Actor<'static>> {
        leases::check_against(run_id, fence, now_ms, || {
            Ok(self.snapshot.runs.get(run_id).and_then(|r| r.lease.clone()))
        })
    }

    /// Renew a claim: the fence must hold; the lease's row is the last heartbeat's.
    pub(crate) fn heartbeat(
        &mut self,
        fence: &'a Fence,
        token: &str,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Claim> {
        let actor = self.check_fence(&fence.run_id, Some(fence), now_ms)?;
        let claim = leases::renewed(fence, token, actor, lease_ms, now_ms);
        if let Some(lease) = self
            .snapshot
            .runs
            .get_mut(&fence.run_id)
            .and_then(|r| r.lease.as_mut())
        {
            lease.expires_at = Some(claim.expires_at);
        }
        // One row per run: the last heartbeat's, which is what one by one leaves behind.
        self.writes.heartbeats.retain(|h| h.run_id != fence.run_id);
        self.writes.heartbeats.push(HeartbeatRow {
            run_id: &fence.run_id,
            generation: fence.generation,
            token_hash: &fence.token_hash,
            heartbeat_at: now_ms,
            expires_at: claim.expires_at,
        });
        Ok(claim)
    }

    /// Finish attempts: each wins exactly when the attempt it names still runs.
    pub(crate) fn finish(
        &mut self,
        finishes: &'a [FinishSpec],
        fence: Option<&Fence>,
        now_ms: i64,
    ) -> Result<Vec<bool>> {
        // Every run's fence first, in the call's order, before any finish is judged: a
        // refused call writes nothing. A claim names one run, so every finish has the same
        // actor.
        let mut actor = Actor::default();
        if fence.is_some() {
            for f in finishes {
                actor = self.check_fence(&f.run_id, fence, now_ms)?;
            }
        }
        let stamp = stamp(&actor, now_ms);
        let mut out = Vec::with_capacity(finishes.len());
        for f in finishes {
            // A second finish of the attempt, in this call or a later one, loses.
            let Some(won) = judge::finish(&mut self.snapshot.running, f) else {
                out.push(false);
                continue;
            };
            let after = judge::after_finish(f, won.retry_policy.as_deref(), now_ms);
            let exhausted = after == Some(AfterFailure::Exhausted);
            let retry_at = match after {
                Some(AfterFailure::RetryAt(at)) => Some(at),
                _ => None,
            };
            if let Some(l) = self
                .snapshot
                .latest
                .get_mut(&(f.run_id.clone(), f.unit_id.clone()))
                .filter(|l| l.attempt == f.attempt)
            {
                l.status = AttemptStatus::parse(&f.status).unwrap_or(AttemptStatus::Completed);
                l.exhausted = exhausted;
                l.retry_at = retry_at;
            }
            let exhausted = exhausted.then(|| {
                into_text(to_vec(&exhausted_payload(
                    f,
                    won.step_id.as_deref(),
                    &won.phase,
                )))
            });
            self.writes.finishes.push(FinishRow {
                run_id: &f.run_id,
                unit_id: &f.unit_id,
                attempt: f.attempt,
                dispatch_id: &f.dispatch_id,
                status: &f.status,
                result: f.result.as_deref(),
                tokens: f.tokens,
                failure_reason: f.failure_reason.as_deref(),
                session_id: f.session_id.as_deref(),
                unit_status: if exhausted.is_some() {
                    UnitStatus::Exhausted.as_str()
                } else {
                    &f.status
                },
                retry_at,
                exhausted,
                payload: into_text(to_vec(&finished_payload(f, won.step_id, won.phase))),
                stamp: stamp.clone(),
            });
            out.push(true);
        }
        Ok(out)
    }

    /// Reserve `units` of `run_id`: each starts its next attempt, or reclaims its running one
    /// in place (same number and dispatch id, one more reclaim, no event). Judged unit by
    /// unit, each seeing the ones before it; the call is kept only if every unit is accepted.
    pub(crate) fn reserve(
        &mut self,
        run_id: &'a str,
        units: &'a [UnitSpec],
        dispatch_ids: &'a [String],
        fence: Option<&Fence>,
        now_ms: i64,
    ) -> Result<Vec<Reservation>> {
        let actor = self.check_fence(run_id, fence, now_ms)?;
        let Some(run) = self.snapshot.runs.get(run_id) else {
            return Err(LedgerError::RunNotFound {
                run_id: run_id.to_owned(),
            });
        };
        run.state.require_active(run_id)?;
        let stamp = stamp(&actor, now_ms);
        let mut mine: HashMap<&'a str, LatestAttempt> = HashMap::new();
        let mut reserves = Vec::new();
        let mut reclaims: Vec<ReclaimRow<'a>> = Vec::new();
        let mut out = Vec::with_capacity(units.len());
        for (u, dispatch_id) in units.iter().zip(dispatch_ids) {
            let latest = mine.get(u.unit_id.as_str()).or_else(|| {
                self.snapshot
                    .latest
                    .get(&(run_id.to_owned(), u.unit_id.clone()))
            });
            let next = match judge::reserve(run_id, latest, u, now_ms)? {
                ReserveVerdict::New { attempt } => {
                    reserves.push(reserve_row(run_id, u, attempt, dispatch_id, &stamp));
                    out.push(Reservation {
                        run_id: run_id.to_owned(),
                        unit_id: u.unit_id.clone(),
                        kind: ReservationKind::Reserved,
                        attempt,
                        dispatch_id: dispatch_id.clone(),
                        reclaims: 0,
                        lease_generation: actor.generation,
                    });
                    LatestAttempt::started(attempt, dispatch_id, u, actor.generation)
                }
                ReserveVerdict::Reclaim(l) => {
                    let mut next = l.clone();
                    next.reclaims += 1;
                    next.lease_generation = actor.generation.or(l.lease_generation);
                    reclaims.push(ReclaimRow {
                        run_id,
                        unit_id: &u.unit_id,
                        attempt: l.attempt,
                        reclaims: l.reclaims,
                        times: 1,
                        holder: u.holder.as_deref(),
                        generation: actor.generation,
                        trace_context: u.trace_context.as_deref(),
                    });
                    out.push(Reservation {
                        run_id: run_id.to_owned(),
                        unit_id: u.unit_id.clone(),
                        kind: ReservationKind::Reclaimed,
                        attempt: l.attempt,
                        dispatch_id: l.dispatch_id.clone(),
                        reclaims: next.reclaims,
                        lease_generation: next.lease_generation,
                    });
                    next
                }
            };
            mine.insert(&u.unit_id, next);
        }
        // Accepted: keep its rows and what it changed.
        self.writes.reserves.extend(reserves);
        for r in reclaims {
            self.fold_reclaim(r);
        }
        for (unit_id, latest) in mine {
            self.snapshot
                .latest
                .insert((run_id.to_owned(), unit_id.to_owned()), latest);
        }
        Ok(out)
    }

    /// Add a reclaim, folded into an earlier reclaim of the same attempt in this judgment:
    /// one row per attempt, as a set statement can update a row only once.
    fn fold_reclaim(&mut self, r: ReclaimRow<'a>) {
        let key = (r.run_id, r.unit_id, r.attempt);
        if let Some(&i) = self.reclaimed.get(&key) {
            let row = &mut self.writes.reclaims[i];
            row.times += r.times;
            row.holder = r.holder.or(row.holder);
            row.generation = r.generation.or(row.generation);
            row.trace_context = r.trace_context.or(row.trace_context);
        } else {
            self.reclaimed.insert(key, self.writes.reclaims.len());
            self.writes.reclaims.push(r);
        }
    }
}

/// Of each run the rows write to, what they depend on: whether the run was active (a new or
/// reclaimed attempt needs it) and whether its lease was (a row written under a fence), by run.
fn depends<'w>(writes: &Writes<'w>) -> std::collections::BTreeMap<&'w str, (bool, bool)> {
    let mut on: std::collections::BTreeMap<&str, (bool, bool)> = std::collections::BTreeMap::new();
    let mut add = |run: &'w str, active: bool, fenced: bool| {
        let e = on.entry(run).or_default();
        e.0 |= active;
        e.1 |= fenced;
    };
    for h in &writes.heartbeats {
        add(h.run_id, false, true);
    }
    for f in &writes.finishes {
        add(f.run_id, false, f.stamp.generation.is_some());
    }
    for r in &writes.reserves {
        add(r.run_id, true, r.stamp.generation.is_some());
    }
    for r in &writes.reclaims {
        add(r.run_id, true, r.generation.is_some());
    }
    on
}

/// Who a call's rows say wrote them.
fn stamp(actor: &Actor<'static>, now_ms: i64) -> Stamp {
    Stamp {
        actor_type: actor.actor_type,
        actor_id: actor.id.clone(),
        generation: actor.generation,
        ts: now_ms,
    }
}

/// The rows of a new attempt.
fn reserve_row<'a>(
    run_id: &'a str,
    u: &'a UnitSpec,
    attempt: i64,
    dispatch_id: &'a str,
    stamp: &Stamp,
) -> ReserveRow<'a> {
    ReserveRow {
        run_id,
        unit_id: &u.unit_id,
        step_id: &u.step_id,
        node_id: u.node_id.as_deref(),
        parent_unit_id: u.parent_unit_id.as_deref(),
        phase: &u.phase,
        runner: u.runner.as_deref(),
        engine: u.engine.as_deref(),
        model: u.model.as_deref(),
        input_hash: u.input_hash.as_deref(),
        worktree_path: u.worktree_path.as_deref(),
        holder: u.holder.as_deref(),
        trace_context: u.trace_context.as_deref(),
        attempt,
        dispatch_id,
        payload: into_text(to_vec(&started_payload(run_id, u, attempt, dispatch_id))),
        stamp: stamp.clone(),
    }
}

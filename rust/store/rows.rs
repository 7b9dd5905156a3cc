//! The rows of the judged write path, as plain data: what a set of reservations, finishes and
//! heartbeats must know before it is judged (a [`Snapshot`] of runs, latest attempts and
//! running attempts, read by key), and the rows the judgment writes ([`Writes`]).
//!
//! The judge (`crate::plan`) never sees SQL and the store never sees a rule: the store reads
//! the keys it is given and writes the rows it is given. Each backend picks its own shape for
//! both. The ones here are the row-at-a-time ones — one statement per key and per row, from
//! [`crate::store::sql`] — which is what SQLite runs (a statement is an in-process call, and a
//! cached one costs a few microseconds); PostgreSQL, where every statement is a round trip,
//! sends a whole set as one JSON array per kind (`store::postgres::rows`).
//!
//! Every write checks how many rows it changed, and fails the transaction rather than commit
//! half a judgment. Under the runs' locks since the read, a row that does not change is a
//! broken invariant; written without them (PostgreSQL's first try, `Tx::lock_run_at_write`),
//! it means another writer changed the row after the read, and the call is judged again.

use crate::params;
use crate::store::{sql, DbError, DbErrorKind, DbResult, Row, Sql, ToSql, Tx};

/// A unit of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitRef<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The unit.
    pub unit_id: &'a str,
}

/// One attempt, named as a finish names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptRef<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The unit.
    pub unit_id: &'a str,
    /// The attempt's number.
    pub attempt: i64,
    /// Its dispatch id.
    pub dispatch_id: &'a str,
    /// The finish fails it: read the retry policy it applies too.
    pub failing: bool,
}

/// What to read before judging: each run's state and lease, each unit's latest attempt, and
/// which of the named attempts still run.
#[derive(Debug, Default)]
pub struct SnapshotKeys<'a> {
    /// Runs, sorted and without repeats.
    pub runs: Vec<&'a str>,
    /// Units whose latest attempt a reservation needs.
    pub units: Vec<UnitRef<'a>>,
    /// Attempts a finish names.
    pub attempts: Vec<AttemptRef<'a>>,
}

impl SnapshotKeys<'_> {
    /// Sort and de-duplicate the runs (every reader of a run list expects one row per run).
    pub fn settle(&mut self) {
        self.runs.sort_unstable();
        self.runs.dedup();
    }
}

/// Which part of the snapshot a row belongs to, and the columns it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `run_id, status, current_step_id, scope_key, workflow_ref, generation, token_hash,
    /// expires_at, owner_type, owner_id` (the lease columns NULL for a run never claimed). A
    /// run that does not exist has no row.
    Run,
    /// `run_id, unit_id, attempt, dispatch_id, status, step_id, input_hash, reclaims,
    /// lease_generation` of the unit's latest attempt, then the unit's `status, retry_at`. A
    /// unit never reserved has no row.
    Latest,
    /// `run_id, unit_id, attempt, dispatch_id, step_id, phase, retry_policy` of a named
    /// attempt that is still running (the policy NULL unless the finish fails it). Any other
    /// has no row.
    Running,
}

/// Who wrote an event row and when (each call of a group has its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamp {
    /// `host` or `session`, when fenced.
    pub actor_type: Option<&'static str>,
    /// The claim's owner, when fenced.
    pub actor_id: Option<String>,
    /// The claim's generation, when fenced.
    pub generation: Option<i64>,
    /// The ledger's clock.
    pub ts: i64,
}

/// A new attempt: its unit's projection, the attempt row and its `unit.started` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRow<'a> {
    pub run_id: &'a str,
    pub unit_id: &'a str,
    pub step_id: &'a str,
    pub node_id: Option<&'a str>,
    pub parent_unit_id: Option<&'a str>,
    pub phase: &'a str,
    pub runner: Option<&'a str>,
    pub engine: Option<&'a str>,
    pub model: Option<&'a str>,
    pub input_hash: Option<&'a str>,
    pub worktree_path: Option<&'a str>,
    pub holder: Option<&'a str>,
    pub trace_context: Option<&'a str>,
    pub attempt: i64,
    pub dispatch_id: &'a str,
    /// The event's payload, canonical JSON.
    pub payload: String,
    pub stamp: Stamp,
}

/// The reclaims of one still-running attempt, folded: `times` more reclaims, and the last
/// holder, generation and trace context any of them named (each reclaim keeps the previous
/// value where it names none, so the last one named is what reclaiming one by one leaves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimRow<'a> {
    pub run_id: &'a str,
    pub unit_id: &'a str,
    pub attempt: i64,
    /// The attempt's reclaims as the judgment read them: the write changes the row only if
    /// they are still that many, so a reclaim answered from a stale read is never kept.
    pub reclaims: i64,
    pub times: i64,
    pub holder: Option<&'a str>,
    pub generation: Option<i64>,
    pub trace_context: Option<&'a str>,
}

/// A winning finish: the attempt, its unit's projection and its `unit.finished` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishRow<'a> {
    pub run_id: &'a str,
    pub unit_id: &'a str,
    pub attempt: i64,
    pub dispatch_id: &'a str,
    pub status: &'a str,
    pub result: Option<&'a str>,
    pub tokens: Option<i64>,
    pub failure_reason: Option<&'a str>,
    pub session_id: Option<&'a str>,
    /// The event's payload, canonical JSON.
    pub payload: String,
    pub stamp: Stamp,
    /// The unit's status: the attempt's, or `exhausted`.
    pub unit_status: &'a str,
    /// When the failed unit may be tried again, under its retry policy.
    pub retry_at: Option<i64>,
    /// The `unit.exhausted` event's payload, when the finish exhausts the unit.
    pub exhausted: Option<String>,
}

/// A renewed lease: one row per run, the last heartbeat's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRow<'a> {
    pub run_id: &'a str,
    pub generation: i64,
    pub token_hash: &'a str,
    pub heartbeat_at: i64,
    pub expires_at: i64,
}

/// A claim decided on the lease as read: the lease's compare-and-set from `previous` to
/// `generation`, a queued run moved to `starting`, and the `lease.claimed` event (its stamp is
/// the new owner at the new generation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRow<'a> {
    pub run_id: &'a str,
    pub previous: i64,
    pub generation: i64,
    pub owner_type: &'static str,
    pub owner_id: &'a str,
    pub token_hash: &'a str,
    pub expires_at: i64,
    /// The run is `queued` and moves to `starting`.
    pub queued: bool,
    /// The event's payload, canonical JSON.
    pub payload: String,
    pub stamp: Stamp,
}

/// What the rows written on a run were judged on, as read: a store that writes them without
/// having held the run's lock since the read checks these first (see `Tx::lock_run_at_write`).
/// Only what an accepted call's rows depend on: a refused call, or one that writes nothing,
/// was answered from the read and is not judged again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRead<'a> {
    pub run_id: &'a str,
    /// The run's status, when a new or reclaimed attempt depends on it (the run was active).
    pub status: Option<&'static str>,
    /// The lease, when a fenced row depends on it.
    pub fence: Option<FenceRead<'a>>,
}

/// The lease a fenced row was judged on. A release clears the token, a claim moves the
/// generation; the expiry is not compared, as only a heartbeat moves it, and only later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceRead<'a> {
    pub generation: i64,
    pub token_hash: &'a str,
}

/// Everything one judgment writes, in the order it is written: claims, heartbeats, finishes, new
/// attempts, reclaims (a reclaim may name an attempt started in the same judgment). Within a
/// kind, rows keep the order they were judged in, which is the order their events take.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Writes<'a> {
    /// What the rows depend on of their runs, as read (not rows to write).
    pub read: Vec<RunRead<'a>>,
    pub claims: Vec<ClaimRow<'a>>,
    pub heartbeats: Vec<HeartbeatRow<'a>>,
    pub finishes: Vec<FinishRow<'a>>,
    pub reserves: Vec<ReserveRow<'a>>,
    pub reclaims: Vec<ReclaimRow<'a>>,
}

impl Writes<'_> {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
            && self.heartbeats.is_empty()
            && self.finishes.is_empty()
            && self.reserves.is_empty()
            && self.reclaims.is_empty()
    }
}

/// Read the snapshot one key at a time, all through one [`Tx::query_many`] (one round trip
/// where statements are round trips).
pub fn read_each<T: Tx + ?Sized>(
    tx: &T,
    keys: &SnapshotKeys<'_>,
    each: &mut dyn FnMut(Part, &dyn Row) -> DbResult<()>,
) -> DbResult<()> {
    let mut queries: Vec<(&Sql, Vec<&dyn ToSql>)> =
        Vec::with_capacity(keys.runs.len() + keys.units.len() + keys.attempts.len());
    let mut parts = Vec::with_capacity(queries.capacity());
    for run in &keys.runs {
        queries.push((&sql::SNAPSHOT_RUN_SQL, vec![run as &dyn ToSql]));
        parts.push(Part::Run);
    }
    for u in &keys.units {
        queries.push((
            &sql::SNAPSHOT_LATEST_SQL,
            vec![&u.run_id as &dyn ToSql, &u.unit_id],
        ));
        parts.push(Part::Latest);
    }
    for a in &keys.attempts {
        queries.push((
            if a.failing {
                &sql::SNAPSHOT_RUNNING_POLICY_SQL
            } else {
                &sql::SNAPSHOT_RUNNING_SQL
            },
            vec![
                &a.run_id as &dyn ToSql,
                &a.unit_id,
                &a.attempt,
                &a.dispatch_id,
            ],
        ));
        parts.push(Part::Running);
    }
    let queries: Vec<(&Sql, &[&dyn ToSql])> =
        queries.iter().map(|(s, p)| (*s, p.as_slice())).collect();
    tx.query_many(&queries, &mut |i, r| each(parts[i], r))
}

/// A write that changed another number of rows than the judgment expected.
fn miscount(what: &str, run_id: &str, unit_id: &str, changed: usize) -> DbError {
    let of = if unit_id.is_empty() {
        format!("run {run_id:?}")
    } else {
        format!("unit {unit_id:?} of run {run_id:?}")
    };
    DbError::new(
        DbErrorKind::Other,
        format!(
            "{what} of {of} changed {changed} rows, not 1; nothing of the transaction was kept \
             (run `fencepost doctor`)"
        ),
    )
}

/// How a row's statement that must change exactly one row is checked.
#[derive(Clone, Copy)]
pub enum Check {
    /// Run it now and compare the count it reports (SQLite: a statement is an in-process
    /// call).
    Now,
    /// Queue the statement this function makes of it, which fails the transaction itself
    /// when the count differs, so it needs no answer (PostgreSQL: it rides with the commit).
    InStatement(fn(&Sql) -> &'static Sql),
}

/// Run `sql`, which must change exactly one row.
fn one<T: Tx + ?Sized>(
    tx: &T,
    check: Check,
    what: &str,
    (run_id, unit_id): (&str, &str),
    sql: &Sql,
    params: &[&dyn ToSql],
) -> DbResult<()> {
    match check {
        Check::InStatement(checked) => tx.defer(checked(sql), params),
        Check::Now => match tx.execute(sql, params, false)? {
            1 => Ok(()),
            n => Err(miscount(what, run_id, unit_id, n)),
        },
    }
}

/// Write every row with one statement per row, in the judged order.
pub fn write_each<T: Tx + ?Sized>(tx: &T, writes: &Writes<'_>, check: Check) -> DbResult<()> {
    write_claims(tx, check, &writes.claims)?;
    write_heartbeats(tx, check, &writes.heartbeats)?;
    write_finishes(tx, check, &writes.finishes)?;
    write_reserves(tx, check, &writes.reserves)?;
    write_reclaims(tx, check, &writes.reclaims)
}

/// The claims of a judgment, one statement per row.
pub fn write_claims<T: Tx + ?Sized>(tx: &T, check: Check, rows: &[ClaimRow<'_>]) -> DbResult<()> {
    for c in rows {
        let key = (c.run_id, "");
        one(
            tx,
            check,
            "claiming the lease",
            key,
            &sql::CLAIM_SQL,
            params![
                c.run_id,
                c.previous,
                c.owner_type,
                c.owner_id,
                c.token_hash,
                c.stamp.ts,
                c.expires_at
            ],
        )?;
        if c.queued {
            one(
                tx,
                check,
                "starting the run",
                key,
                &sql::CLAIM_STARTING_SQL,
                params![c.run_id, c.stamp.ts],
            )?;
        }
        event(tx, c.run_id, "lease.claimed", &c.payload, &c.stamp)?;
    }
    Ok(())
}

/// The heartbeats of a judgment, one statement per row.
pub fn write_heartbeats<T: Tx + ?Sized>(
    tx: &T,
    check: Check,
    rows: &[HeartbeatRow<'_>],
) -> DbResult<()> {
    for h in rows {
        one(
            tx,
            check,
            "renewing the lease",
            (h.run_id, ""),
            &sql::HEARTBEAT_SQL,
            params![
                h.run_id,
                h.heartbeat_at,
                h.expires_at,
                h.generation,
                h.token_hash
            ],
        )?;
    }
    Ok(())
}

/// The finishes of a judgment, one statement per row.
pub fn write_finishes<T: Tx + ?Sized>(
    tx: &T,
    check: Check,
    rows: &[FinishRow<'_>],
) -> DbResult<()> {
    for f in rows {
        let key = (f.run_id, f.unit_id);
        one(
            tx,
            check,
            "finishing the attempt",
            key,
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
                f.stamp.ts
            ],
        )?;
        one(
            tx,
            check,
            "projecting the finish",
            key,
            &sql::FINISH_ATTEMPT_UNIT_SQL,
            params![
                f.run_id,
                f.unit_id,
                f.attempt,
                f.unit_status,
                f.result,
                f.tokens,
                f.failure_reason,
                f.session_id,
                f.stamp.ts,
                f.retry_at
            ],
        )?;
        event(tx, f.run_id, "unit.finished", &f.payload, &f.stamp)?;
        if let Some(payload) = &f.exhausted {
            event(tx, f.run_id, "unit.exhausted", payload, &f.stamp)?;
        }
    }
    Ok(())
}

/// The new attempts of a judgment, one statement per row.
pub fn write_reserves<T: Tx + ?Sized>(
    tx: &T,
    check: Check,
    rows: &[ReserveRow<'_>],
) -> DbResult<()> {
    for s in rows {
        let key = (s.run_id, s.unit_id);
        one(
            tx,
            check,
            "projecting the new attempt",
            key,
            &sql::RESERVE_ATTEMPT_UNIT_SQL,
            params![
                s.run_id,
                s.unit_id,
                s.step_id,
                s.node_id,
                s.parent_unit_id,
                s.phase,
                s.runner,
                s.engine,
                s.model,
                s.input_hash,
                s.worktree_path,
                s.holder,
                s.attempt,
                s.stamp.ts
            ],
        )?;
        one(
            tx,
            check,
            "starting the attempt",
            key,
            &sql::RESERVE_ATTEMPT_INSERT_SQL,
            params![
                s.run_id,
                s.unit_id,
                s.attempt,
                s.dispatch_id,
                s.step_id,
                s.node_id,
                s.phase,
                s.input_hash,
                s.holder,
                s.stamp.generation,
                s.stamp.ts,
                s.trace_context
            ],
        )?;
        event(tx, s.run_id, "unit.started", &s.payload, &s.stamp)?;
    }
    Ok(())
}

/// The reclaims of a judgment, one statement per row.
pub fn write_reclaims<T: Tx + ?Sized>(
    tx: &T,
    check: Check,
    rows: &[ReclaimRow<'_>],
) -> DbResult<()> {
    for r in rows {
        one(
            tx,
            check,
            "reclaiming the attempt",
            (r.run_id, r.unit_id),
            &sql::RECLAIM_ATTEMPT_SQL,
            params![
                r.run_id,
                r.unit_id,
                r.attempt,
                r.holder,
                r.generation,
                r.trace_context,
                r.times,
                r.reclaims
            ],
        )?;
        // Changes nothing when the holder stays (see the statement): no count to check.
        tx.defer(
            &sql::RECLAIM_UNIT_SQL,
            params![r.run_id, r.unit_id, r.holder],
        )?;
    }
    Ok(())
}

/// One event row, numbered after the run's newest.
fn event<T: Tx + ?Sized>(
    tx: &T,
    run_id: &str,
    event_type: &str,
    payload: &str,
    stamp: &Stamp,
) -> DbResult<()> {
    tx.defer(
        &sql::INSERT_EVENT_SQL,
        params![
            run_id,
            event_type,
            stamp.actor_type,
            stamp.actor_id,
            stamp.generation,
            payload,
            Option::<&str>::None,
            stamp.ts
        ],
    )
}

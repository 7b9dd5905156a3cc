//! The judged write path's reads and writes on PostgreSQL, where every statement is a round
//! trip: a part of the snapshot with more than one key is read by one set statement over a
//! JSON array of the keys, and a kind with more than one row is written by one set statement
//! over a JSON array of the rows (see `sql`; one row goes by its one-row statements), so a
//! judgment costs the same few round trips whatever its size. The writes check their own
//! counts and need no answer: they go out with the commit.

use crate::canonical::{into_text, to_vec, Value};
use crate::params;
use crate::store::rows::{
    self, Check, ClaimRow, FinishRow, HeartbeatRow, Part, ReclaimRow, ReserveRow, SnapshotKeys,
    Stamp, Writes,
};
use crate::store::{DbResult, Row, Sql, ToSql, Tx};

use super::sql;

/// A JSON object of `fields` (sorted by name, as canonical JSON orders them).
fn object(mut fields: Vec<(&str, Value)>) -> Value {
    fields.sort_by(|a, b| a.0.cmp(b.0));
    Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn text(v: &str) -> Value {
    Value::Str(v.to_owned())
}

fn opt(v: Option<&str>) -> Value {
    v.map_or(Value::Null, text)
}

fn int(v: Option<i64>) -> Value {
    v.map_or(Value::Null, Value::Int)
}

/// A row's place in its statement, from 1 (events' revisions follow it).
fn ord(index: usize) -> Value {
    Value::Int(i64::try_from(index).map_or(i64::MAX, |i| i + 1))
}

/// The columns of a row that say who wrote it and when.
fn stamp(s: &Stamp) -> [(&'static str, Value); 4] {
    [
        ("actor_id", opt(s.actor_id.as_deref())),
        ("actor_type", opt(s.actor_type)),
        ("generation", int(s.generation)),
        ("ts", Value::Int(s.ts)),
    ]
}

fn json(rows: Vec<Value>) -> String {
    into_text(to_vec(&Value::Array(rows)))
}

/// Read the snapshot: a part with one key by its one-key statement, a part with more by its
/// set statement; every part in one round trip.
pub(super) fn read(
    tx: &dyn Tx,
    keys: &SnapshotKeys<'_>,
    each: &mut dyn FnMut(Part, &dyn Row) -> DbResult<()>,
) -> DbResult<()> {
    if keys.runs.len() <= 1 && keys.units.len() <= 1 && keys.attempts.len() <= 1 {
        return rows::read_each(tx, keys, each);
    }
    let runs = json(keys.runs.iter().map(|r| text(r)).collect());
    let units = json(
        keys.units
            .iter()
            .map(|u| {
                object(vec![
                    ("run_id", text(u.run_id)),
                    ("unit_id", text(u.unit_id)),
                ])
            })
            .collect(),
    );
    let attempts = json(
        keys.attempts
            .iter()
            .map(|a| {
                object(vec![
                    ("attempt", Value::Int(a.attempt)),
                    ("dispatch_id", text(a.dispatch_id)),
                    ("failing", Value::Bool(a.failing)),
                    ("run_id", text(a.run_id)),
                    ("unit_id", text(a.unit_id)),
                ])
            })
            .collect(),
    );
    let runs: [&dyn ToSql; 1] = [&runs];
    let units: [&dyn ToSql; 1] = [&units];
    let attempts: [&dyn ToSql; 1] = [&attempts];
    let mut queries: Vec<(&Sql, &[&dyn ToSql])> = Vec::with_capacity(3);
    let mut parts = Vec::with_capacity(3);
    if !keys.runs.is_empty() {
        queries.push((&sql::SNAPSHOT_RUNS, &runs));
        parts.push(Part::Run);
    }
    if !keys.units.is_empty() {
        queries.push((&sql::SNAPSHOT_LATEST, &units));
        parts.push(Part::Latest);
    }
    if !keys.attempts.is_empty() {
        queries.push((&sql::SNAPSHOT_RUNNING, &attempts));
        parts.push(Part::Running);
    }
    tx.query_many(&queries, &mut |i, r| each(parts[i], r))
}

fn claim(i: usize, c: &ClaimRow<'_>) -> Value {
    object(vec![
        ("actor_id", text(c.owner_id)),
        ("actor_type", text(c.owner_type)),
        ("expires_at", Value::Int(c.expires_at)),
        ("generation", Value::Int(c.generation)),
        ("ord", ord(i)),
        ("payload", text(&c.payload)),
        ("previous", Value::Int(c.previous)),
        ("queued", Value::Bool(c.queued)),
        ("run_id", text(c.run_id)),
        ("token_hash", text(c.token_hash)),
        ("ts", Value::Int(c.stamp.ts)),
    ])
}

fn heartbeat(h: &HeartbeatRow<'_>) -> Value {
    object(vec![
        ("expires_at", Value::Int(h.expires_at)),
        ("generation", Value::Int(h.generation)),
        ("heartbeat_at", Value::Int(h.heartbeat_at)),
        ("run_id", text(h.run_id)),
        ("token_hash", text(h.token_hash)),
    ])
}

fn finish(i: usize, f: &FinishRow<'_>) -> Value {
    let mut row = vec![
        ("attempt", Value::Int(f.attempt)),
        ("dispatch_id", text(f.dispatch_id)),
        ("exhausted", opt(f.exhausted.as_deref())),
        ("failure_reason", opt(f.failure_reason)),
        ("ord", ord(i)),
        ("payload", text(&f.payload)),
        ("result", opt(f.result)),
        ("retry_at", int(f.retry_at)),
        ("run_id", text(f.run_id)),
        ("session_id", opt(f.session_id)),
        ("status", text(f.status)),
        ("tokens", int(f.tokens)),
        ("unit_id", text(f.unit_id)),
        ("unit_status", text(f.unit_status)),
    ];
    row.extend(stamp(&f.stamp));
    object(row)
}

fn reserve(i: usize, r: &ReserveRow<'_>) -> Value {
    let mut row = vec![
        ("attempt", Value::Int(r.attempt)),
        ("dispatch_id", text(r.dispatch_id)),
        ("engine", opt(r.engine)),
        ("holder", opt(r.holder)),
        ("input_hash", opt(r.input_hash)),
        ("model", opt(r.model)),
        ("node_id", opt(r.node_id)),
        ("ord", ord(i)),
        ("parent_unit_id", opt(r.parent_unit_id)),
        ("payload", text(&r.payload)),
        ("phase", text(r.phase)),
        ("run_id", text(r.run_id)),
        ("runner", opt(r.runner)),
        ("step_id", text(r.step_id)),
        ("trace_context", opt(r.trace_context)),
        ("unit_id", text(r.unit_id)),
        ("worktree_path", opt(r.worktree_path)),
    ];
    row.extend(stamp(&r.stamp));
    object(row)
}

fn reclaim(r: &ReclaimRow<'_>) -> Value {
    object(vec![
        ("attempt", Value::Int(r.attempt)),
        ("generation", int(r.generation)),
        ("holder", opt(r.holder)),
        ("reclaims", Value::Int(r.reclaims)),
        ("run_id", text(r.run_id)),
        ("times", Value::Int(r.times)),
        ("trace_context", opt(r.trace_context)),
        ("unit_id", text(r.unit_id)),
    ])
}

/// Queue one set statement over `rows` (nothing when there are none): it checks its own
/// counts against `?2` and fails the transaction otherwise, so it needs no answer and goes
/// out with the next statement that waits, at the latest the commit.
fn queue(tx: &dyn Tx, statement: &Sql, rows: Vec<Value>) -> DbResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    tx.defer(statement, params![json(rows), n])
}

/// Lock the runs of `late` (sorted), read by the judgment without their locks, and check that
/// each run it read is as it read it: one statement, queued ahead of the rows, so it goes out in
/// the write's round trip and fails the transaction when a run changed
/// (`sql::LOCK_RUNS_AS_READ_SQL`; one run by its one-run form).
pub(super) fn lock_as_read(tx: &dyn Tx, writes: &Writes<'_>, late: &[String]) -> DbResult<()> {
    let read = |run: &str| writes.read.iter().find(|r| r.run_id == run);
    if let [run] = late {
        let r = read(run);
        let status = r.and_then(|r| r.status);
        let fence = r.and_then(|r| r.fence);
        return tx.defer(
            &sql::LOCK_RUN_AS_READ,
            params![
                run,
                status,
                fence.map(|f| f.generation),
                fence.map(|f| f.token_hash)
            ],
        );
    }
    let runs = late
        .iter()
        .map(|run| {
            let r = read(run);
            let fence = r.and_then(|r| r.fence);
            object(vec![
                ("generation", int(fence.map(|f| f.generation))),
                ("run_id", text(run)),
                ("status", opt(r.and_then(|r| r.status))),
                ("token_hash", opt(fence.map(|f| f.token_hash))),
            ])
        })
        .collect();
    queue(tx, &sql::LOCK_RUNS_AS_READ, runs)
}

/// Write a judgment, kind by kind in the kinds' order: a kind with one row by its one-row
/// statements, queued with their counts checked in the statement (a set statement over one
/// JSON row costs more to run than the plain statements it stands for: measured, a lone
/// reserve + finish took ~35% longer), a kind with more by its set statement.
pub(super) fn write(tx: &dyn Tx, writes: &Writes<'_>) -> DbResult<()> {
    let w = writes;
    kind(
        tx,
        &w.claims,
        |c| rows::write_claims(tx, c, &w.claims),
        &sql::CLAIM_GROUP,
        claim,
    )?;
    kind(
        tx,
        &w.heartbeats,
        |c| rows::write_heartbeats(tx, c, &w.heartbeats),
        &sql::HEARTBEAT_GROUP,
        |_, h| heartbeat(h),
    )?;
    kind(
        tx,
        &w.finishes,
        |c| rows::write_finishes(tx, c, &w.finishes),
        &sql::FINISH_GROUP,
        finish,
    )?;
    kind(
        tx,
        &w.reserves,
        |c| rows::write_reserves(tx, c, &w.reserves),
        &sql::RESERVE_GROUP,
        reserve,
    )?;
    kind(
        tx,
        &w.reclaims,
        |c| rows::write_reclaims(tx, c, &w.reclaims),
        &sql::RECLAIM_GROUP,
        |_, r| reclaim(r),
    )
}

/// One kind of row: a single row by its one-row statements (`one`, given how to check its
/// count), several by the set statement `set` over their JSON (`encode` gets each row's place
/// in it).
fn kind<R>(
    tx: &dyn Tx,
    rows: &[R],
    one: impl FnOnce(Check) -> DbResult<()>,
    set: &Sql,
    encode: impl Fn(usize, &R) -> Value,
) -> DbResult<()> {
    if rows.len() == 1 {
        return one(Check::InStatement(checked));
    }
    let json = rows.iter().enumerate().map(|(i, r)| encode(i, r));
    queue(tx, set, json.collect())
}

/// `statement` (an UPDATE or INSERT of one row) wrapped so that it fails the transaction when
/// it changes another number of rows than one: the same check as `counts_or_fail`, so it
/// needs no answer either. Made once per statement and kept for the process.
fn checked(statement: &Sql) -> &'static Sql {
    static MADE: std::sync::Mutex<Vec<(usize, &'static Sql)>> = std::sync::Mutex::new(Vec::new());
    let key = statement.postgres.as_ptr() as usize;
    let mut made = MADE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, sql)) = made.iter().find(|(k, _)| *k == key) {
        return sql;
    }
    let text: &'static str = Box::leak(
        format!(
            "WITH w AS ({} RETURNING 1) SELECT CAST(CASE WHEN (SELECT count(*) FROM w) = 1 \
             THEN '0' ELSE 'fencepost: a statement wrote another number of rows than the \
             judgment named; nothing of the transaction was kept' END AS INTEGER)",
            statement.postgres
        )
        .into_boxed_str(),
    );
    let sql: &'static Sql = Box::leak(Box::new(Sql::native(text)));
    made.push((key, sql));
    sql
}

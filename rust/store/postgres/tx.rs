//! A PostgreSQL transaction behind the store's [`Tx`](crate::store::Tx): statements prepared
//! once per connection, the writes whose results the operation does not read pipelined (see
//! `pipeline`), the run's row lock, and savepoints for the statements whose failure the
//! operation interprets.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use tokio::runtime::Runtime;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Error as PgError};

use super::errors::classify;
use super::pipeline::{Failed, Pipeline, Prepared, Queued, Req, Resp};
use super::sql;
use super::target::Target;
use crate::errors::{LedgerError, Result};
use crate::store::{
    ledger_error, DbError, DbErrorKind, DbResult, FailureScope, Row, Savepoint, Sql, SqlValue,
    ToSql,
};

/// Why a statement's failure asks for the whole transaction to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RetryKind {
    /// Contention: a deadlock, a serialization failure or a `lock_timeout`.
    Busy,
    /// A write made without its runs' locks since the read (the first try, see
    /// [`crate::store::Tx::lock_run_at_write`]) found a run or a row changed: judge again
    /// under the locks.
    Stale,
    /// A UNIQUE violation that a racing insert caused: re-running finds the winner's row.
    Race,
    /// The session died, or its server is read-only (a standby, or a primary a failover
    /// demoted), before the `COMMIT` went out: nothing was written, so the transaction may run
    /// again on a new session, which a multi-host URL takes to the writable server.
    Reconnect,
}

/// An open transaction on the connection.
///
/// Statements whose results the operation does not read (the run's row lock, the writes after
/// the last read: [`crate::store::Tx::defer`]) are queued, not sent: they go out in one
/// pipeline with the next statement the operation waits for, or with the `COMMIT`.
pub(super) struct Tx<'a> {
    pipe: Pipeline<'a>,
    statements: RefCell<&'a mut HashMap<&'static str, Prepared>>,
    target: &'a Target,
    op: Cell<&'a str>,
    /// Set when a statement failed in a way that re-running the transaction can cure.
    retry: Cell<Option<RetryKind>>,
    /// Runs whose row lock this transaction holds (or has queued).
    locked: RefCell<Vec<String>>,
    /// Whether a judgment's runs are locked with its writes, not before its read (the first
    /// try of a write).
    optimistic: bool,
    /// Runs a judgment read without their locks, to lock and check with its writes.
    late: RefCell<Vec<String>>,
    /// Savepoints taken (for statements whose failure the caller interprets).
    savepoint: Cell<u32>,
    /// A statement met a dead session.
    lost: Cell<bool>,
    /// The `COMMIT` has gone out: a session lost from here on leaves the outcome unknown.
    committing: Cell<bool>,
    /// How many run locks were held when the current call's savepoint began: undoing it
    /// releases the locks taken after.
    call_locks: Cell<usize>,
}

impl<'a> Tx<'a> {
    /// Whether the transaction already holds `run_id`'s lock. When it holds none yet, the
    /// lock about to be taken is its first: every write that appends events locks a run first,
    /// so the first run lock also puts down the transaction's floor for the global event cursor,
    /// before any `seq` is allocated (see `sql::EVENT_FLOOR_LOCK_SQL`). Queued, so it costs no
    /// round trip.
    fn held(&self, run_id: &str) -> DbResult<bool> {
        if self.locked.borrow().iter().any(|r| r == run_id) {
            return Ok(true);
        }
        self.floor()?;
        Ok(false)
    }

    /// Before the transaction's first run lock, the floor under the event cursor (see
    /// [`Tx::held`]).
    fn floor(&self) -> DbResult<()> {
        if self.locked.borrow().is_empty() {
            self.defer_text(sql::EVENT_FLOOR_LOCK_SQL, crate::params![])?;
        }
        Ok(())
    }

    /// Queue `run_id`'s lock unless it is held (see [`crate::store::Tx::lock_run`]).
    fn lock(&self, run_id: &str) -> DbResult<()> {
        if !self.held(run_id)? {
            self.defer_text(sql::LOCK_RUN_SQL, crate::params![run_id])?;
            self.locked.borrow_mut().push(run_id.to_owned());
        }
        Ok(())
    }

    /// A transaction of operation `op` that begins with `begin` (queued, not sent yet).
    pub(super) fn new(
        runtime: &'a Runtime,
        client: &'a Client,
        statements: &'a mut HashMap<&'static str, Prepared>,
        target: &'a Target,
        op: &'a str,
        begin: Cow<'static, str>,
    ) -> Self {
        Self {
            pipe: Pipeline::new(runtime, client, begin),
            statements: RefCell::new(statements),
            target,
            op: Cell::new(op),
            retry: Cell::new(None),
            locked: RefCell::new(Vec::new()),
            optimistic: false,
            late: RefCell::new(Vec::new()),
            savepoint: Cell::new(0),
            lost: Cell::new(false),
            committing: Cell::new(false),
            call_locks: Cell::new(0),
        }
    }

    /// With `yes`, a judgment locks its runs with its writes, not before its read (see
    /// [`crate::store::Tx::lock_run_at_write`]).
    pub(super) fn optimistic(mut self, yes: bool) -> Self {
        self.optimistic = yes;
        self
    }

    /// End the transaction after its body returned `out`: a successful write commits, sending
    /// the writes still queued with the `COMMIT` in one round trip (if one of them fails, the
    /// server answers the `COMMIT` with a rollback: nothing is written). A read, or a refused
    /// write, rolls back. The transaction's outcome.
    ///
    /// A commit of a transaction that locked a run also sends a `NOTIFY` on the schema's
    /// channel, in the same round trip, which wakes `wait_events` waiters (see `listen`). Those
    /// are the transactions that append events, and the only ones that put down a floor under
    /// the event cursor (`sql::EVENT_FLOOR_LOCK_SQL`), so also the only ones whose end can let a
    /// reader see events it was held back from. PostgreSQL serializes the commits of notifying
    /// transactions on one lock, held until the commit is done, flush included. So where the
    /// commit waits for no flush (durability `normal`) the `NOTIFY` is part of the transaction
    /// and the lock is held while its commit record is written; where it waits (`full`) the
    /// `NOTIFY` goes right after the `COMMIT`, a transaction of its own that wrote nothing else
    /// and so commits without waiting for a flush, and its failure is not the write's: the
    /// commit's answer alone is the outcome. Either way listeners hear of it after the commit.
    pub(super) fn end(&self, out: Result<()>, commit: bool) -> Result<()> {
        if out.is_ok() && commit && self.pipe.begun() {
            self.committing.set(true);
            let notify = !self.locked.borrow().is_empty();
            if !notify || self.target.notify_in_commit {
                if notify {
                    self.pipe
                        .push(Queued::Simple(self.target.notify.clone().into()));
                }
                return self
                    .send(Some(Req::Simple("COMMIT")), false)
                    .map(|_| ())
                    .map_err(|e| crate::store::Tx::fail(self, &e));
            }
            let sent = self.pipe.send_each(vec![
                Req::Simple("COMMIT"),
                Req::Simple(&self.target.notify),
            ]);
            let committed = match sent {
                Ok(mut answers) => answers.swap_remove(0).map_err(Failed::Waited),
                Err(failed) => Err(failed),
            };
            committed.map(|_| ()).map_err(|failed| {
                let e = match failed {
                    Failed::Queued(e) | Failed::Waited(e) => self.classify(&e, false),
                };
                crate::store::Tx::fail(self, &e)
            })
        } else {
            // A failed ROLLBACK means the connection is gone, which the next call repairs.
            self.roll_back();
            out
        }
    }

    /// Whether re-running the transaction may cure its failure, and why.
    pub(super) fn retry(&self) -> Option<RetryKind> {
        self.retry.get()
    }

    /// Whether a statement met a dead session (the store reconnects before its next call).
    pub(super) fn lost(&self) -> bool {
        self.lost.get()
    }

    fn classify(&self, e: &PgError, interpret: bool) -> DbError {
        let err = classify(self.target, e);
        if self.optimistic && is_raised(e) {
            self.retry.set(Some(RetryKind::Stale));
            return err;
        }
        match &err.kind {
            DbErrorKind::Busy => self.retry.set(Some(RetryKind::Busy)),
            DbErrorKind::Unique { .. } if !interpret => self.retry.set(Some(RetryKind::Race)),
            DbErrorKind::Unavailable => {
                self.lost.set(true);
                if self.committing.get() {
                    return commit_unknown(self.target);
                }
                self.retry.set(Some(RetryKind::Reconnect));
            }
            _ => {}
        }
        err
    }

    /// `text` as this session sends it: prepared at its first use (a round trip of its own),
    /// or behind a transaction-mode pooler its rewritten text, sent unnamed each time.
    fn statement(&self, text: &'static str, interpret: bool) -> DbResult<Prepared> {
        if let Some(s) = self.statements.borrow().get(text) {
            return Ok(s.clone());
        }
        let prepared = if self.target.pooled {
            Prepared::Unnamed(placeholders(text).into())
        } else {
            self.pipe
                .prepare(&placeholders(text))
                .map(Prepared::Named)
                .map_err(|e| self.classify(&e, interpret))?
        };
        self.statements.borrow_mut().insert(text, prepared.clone());
        Ok(prepared)
    }

    /// Send the queued requests and `last` in one round trip; `last`'s answer. A queued
    /// request's failure is reported first (what followed it failed because of it).
    fn send(&self, last: Option<Req<'_>>, interpret: bool) -> DbResult<Option<Resp>> {
        self.pipe.send(last).map_err(|failed| match failed {
            Failed::Queued(e) => self.classify(&e, false),
            Failed::Waited(e) => self.classify(&e, interpret),
        })
    }

    /// Queue `text` (a statement of this backend's own) to go out with the next request.
    fn defer_text(&self, text: &'static str, params: &[&dyn ToSql]) -> DbResult<()> {
        let statement = self.statement(text, false)?;
        if self.pipe.push(Queued::exec(statement, params)) {
            self.send(None, false)?;
        }
        Ok(())
    }

    /// End a transaction that must not commit: whatever is still queued is dropped unsent.
    fn roll_back(&self) {
        self.pipe.clear();
        if self.pipe.sent() {
            let _ = self.send(Some(Req::Simple("ROLLBACK")), false);
        }
    }
}

/// Whether `e` is one of the ledger's own statements failing the transaction on purpose (a
/// count or a run that is not as judged: see `sql::counts_or_fail`): plain SQL raises by a
/// failing cast of a text that begins `fencepost: `.
fn is_raised(e: &PgError) -> bool {
    e.as_db_error().is_some_and(|d| {
        *d.code() == tokio_postgres::error::SqlState::INVALID_TEXT_REPRESENTATION
            && d.message().contains("\"fencepost: ")
    })
}

/// Rewrite `?N` placeholders to PostgreSQL's `$N`. The ledger's SQL has no `?` anywhere else
/// (no string literal holds one).
pub(crate) fn placeholders(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// A driver row behind the neutral [`Row`].
struct PgRow<'a>(&'a tokio_postgres::Row);

impl Row for PgRow<'_> {
    fn value(&self, index: usize) -> DbResult<SqlValue<'_>> {
        let type_error = |e: PgError| DbError::new(DbErrorKind::Type, e.to_string());
        let column = self
            .0
            .columns()
            .get(index)
            .ok_or_else(|| DbError::new(DbErrorKind::Type, format!("no column {index}")))?;
        let ty = column.type_().clone();
        let v = match ty {
            Type::INT8 => self
                .0
                .try_get::<_, Option<i64>>(index)
                .map_err(type_error)?
                .map(SqlValue::Int),
            Type::INT4 => self
                .0
                .try_get::<_, Option<i32>>(index)
                .map_err(type_error)?
                .map(|v| SqlValue::Int(i64::from(v))),
            Type::INT2 => self
                .0
                .try_get::<_, Option<i16>>(index)
                .map_err(type_error)?
                .map(|v| SqlValue::Int(i64::from(v))),
            Type::BOOL => self
                .0
                .try_get::<_, Option<bool>>(index)
                .map_err(type_error)?
                .map(|v| SqlValue::Int(i64::from(v))),
            Type::BYTEA => self
                .0
                .try_get::<_, Option<&[u8]>>(index)
                .map_err(type_error)?
                .map(SqlValue::Blob),
            _ => self
                .0
                .try_get::<_, Option<&str>>(index)
                .map_err(type_error)?
                .map(SqlValue::Text),
        };
        Ok(v.unwrap_or(SqlValue::Null))
    }
}

impl crate::store::Tx for Tx<'_> {
    fn execute(&self, sql: &Sql, params: &[&dyn ToSql], interpret: bool) -> DbResult<usize> {
        let statement = self.statement(sql.postgres, interpret)?;
        let count = |r: Option<Resp>| match r {
            Some(Resp::Count(n)) => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        };
        if !interpret {
            return self
                .send(Some(Req::exec(&statement, params)), false)
                .map(count);
        }
        // PostgreSQL aborts the whole transaction on a failed statement; a savepoint keeps it
        // usable so the caller can act on the failure (the scope guard names its occupant).
        let n = self.savepoint.get() + 1;
        self.savepoint.set(n);
        self.pipe
            .push(Queued::Simple(format!("SAVEPOINT fp_{n}").into()));
        match self.send(Some(Req::exec(&statement, params)), true) {
            Ok(r) => {
                self.pipe
                    .push(Queued::Simple(format!("RELEASE SAVEPOINT fp_{n}").into()));
                Ok(count(r))
            }
            Err(err) => {
                let undo = format!("ROLLBACK TO SAVEPOINT fp_{n}");
                self.send(Some(Req::Simple(&undo)), true)?;
                Err(err)
            }
        }
    }

    fn query(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        each: &mut dyn FnMut(&dyn Row) -> DbResult<bool>,
    ) -> DbResult<()> {
        let statement = self.statement(sql.postgres, false)?;
        if let Some(Resp::Rows(rows)) = self.send(Some(Req::query(&statement, params)), false)? {
            for row in &rows {
                if !each(&PgRow(row))? {
                    break;
                }
            }
        }
        Ok(())
    }

    fn defer(&self, sql: &Sql, params: &[&dyn ToSql]) -> DbResult<()> {
        self.defer_text(sql.postgres, params)
    }

    /// Sent at once, with whatever is queued ahead of it: its failure fails the transaction.
    fn execute_script(&self, text: &str) -> DbResult<()> {
        self.send(Some(Req::Simple(text)), false).map(|_| ())
    }

    fn fail(&self, err: &DbError) -> LedgerError {
        ledger_error(self.op.get(), &self.target.label, err)
    }

    /// Queued, not sent: the setting goes out with the next statement, in its round trip (in
    /// the `BEGIN`'s message if it leads the transaction). It is the transaction's own (`SET
    /// LOCAL`), so the session's other statements keep theirs.
    fn plan_generic(&self) -> Result<()> {
        if self.pipe.push_simple(sql::PLAN_GENERIC_SQL) {
            self.send(None, false).map_err(|e| self.fail(&e))?;
        }
        Ok(())
    }

    /// Queued, not sent: the lock goes out with the operation's first read, in the same round
    /// trip and ahead of it (so that read sees the previous writer's commit).
    fn lock_run(&self, run_id: &str) -> Result<()> {
        self.lock(run_id)
            .map_err(|e| crate::store::Tx::fail(self, &e))
    }

    fn mark_run_locked(&self, run_id: &str) -> Result<()> {
        let held = self
            .held(run_id)
            .map_err(|e| crate::store::Tx::fail(self, &e))?;
        if !held {
            self.locked.borrow_mut().push(run_id.to_owned());
        }
        Ok(())
    }

    /// On the first try, only noted: [`Tx::write_rows`] takes the lock. Otherwise, and for a
    /// run already locked, [`Tx::lock_run`].
    fn lock_run_at_write(&self, run_id: &str) -> Result<bool> {
        if !self.optimistic {
            return crate::store::Tx::lock_run(self, run_id).map(|()| false);
        }
        if self.locked.borrow().iter().any(|r| r == run_id) {
            return Ok(false);
        }
        let mut late = self.late.borrow_mut();
        if !late.iter().any(|r| r == run_id) {
            late.push(run_id.to_owned());
        }
        Ok(true)
    }

    /// A part with several keys is read by one set statement; all parts in one round trip.
    fn read_snapshot(
        &self,
        keys: &crate::store::rows::SnapshotKeys<'_>,
        each: &mut dyn FnMut(crate::store::rows::Part, &dyn Row) -> DbResult<()>,
    ) -> DbResult<()> {
        super::rows::read(self, keys, each)
    }

    /// One set statement per kind, queued to go out with the commit. Runs the judgment read
    /// without their locks are locked first, in sorted order, by a statement that also checks
    /// that they are as read (`rows::lock_as_read`), in the same round trip as the rows.
    fn write_rows(&self, writes: &crate::store::rows::Writes<'_>) -> DbResult<()> {
        let mut late = self.late.take();
        if !late.is_empty() {
            late.sort_unstable();
            self.floor()?;
            super::rows::lock_as_read(self, writes, &late)?;
            self.locked.borrow_mut().extend(late);
        }
        super::rows::write(self, writes)
    }

    /// Queued like a deferred write: `SAVEPOINT` goes out with the call's first read, and
    /// `RELEASE` or `ROLLBACK TO` with the next call's (`ROLLBACK TO` is legal in an aborted
    /// transaction). A queued failure surfaces at a later call's statement as a store error,
    /// which ends the whole group, so it is never charged to the wrong caller.
    fn savepoint(&self, step: Savepoint) -> Result<()> {
        let queue = |text: &'static str| {
            if self.pipe.push(Queued::Simple(text.into())) {
                self.send(None, false)
                    .map_err(|e| crate::store::Tx::fail(self, &e))?;
            }
            Ok(())
        };
        match step {
            Savepoint::Begin => self.call_locks.set(self.locked.borrow().len()),
            // Locks taken inside the savepoint are gone after `ROLLBACK TO`.
            Savepoint::Undo => self.locked.borrow_mut().truncate(self.call_locks.get()),
            Savepoint::Release => {}
        }
        step.statements().iter().try_for_each(|text| queue(text))
    }

    /// One round trip for all of them, behind whatever is queued.
    fn query_many(
        &self,
        queries: &[(&Sql, &[&dyn ToSql])],
        each: &mut dyn FnMut(usize, &dyn Row) -> DbResult<()>,
    ) -> DbResult<()> {
        let statements = queries
            .iter()
            .map(|(sql, _)| self.statement(sql.postgres, false))
            .collect::<DbResult<Vec<_>>>()?;
        let reqs = statements
            .iter()
            .zip(queries)
            .map(|(statement, (_, params))| Req::query(statement, params))
            .collect();
        let answers = self.pipe.send_many(reqs).map_err(|failed| match failed {
            Failed::Queued(e) | Failed::Waited(e) => self.classify(&e, false),
        })?;
        for (i, answer) in answers.iter().enumerate() {
            if let Resp::Rows(rows) = answer {
                for row in rows {
                    each(i, &PgRow(row))?;
                }
            }
        }
        Ok(())
    }

    #[cfg(test)]
    fn round_trips(&self) -> u64 {
        super::pipeline::ROUND_TRIPS.with(std::cell::Cell::get)
    }

    fn set_operation(&self, op: &'static str) {
        self.op.set(op);
    }

    fn failure_scope(&self) -> FailureScope {
        if self.lost.get() {
            FailureScope::Connection
        } else if self.retry.get().is_some() {
            FailureScope::Transaction
        } else {
            FailureScope::Call
        }
    }
}

/// A session lost once the `COMMIT` went out: the server may have committed before it went
/// away (or before a failover), and nothing can tell the client. The write is never run again
/// by itself; the message says how to find out, by the calls that are safe to repeat.
fn commit_unknown(target: &Target) -> DbError {
    DbError::new(
        DbErrorKind::Unavailable,
        format!(
            "lost the connection to PostgreSQL at {} after COMMIT was sent: the write may have \
             committed, and fencepost does not run it again. Check before writing anew: read it \
             back, or repeat it (reserve_attempt again reclaims a reserved attempt in place, \
             finish_attempt again answers False for a finished one, a claim's generation shows \
             whether it was taken); fencepost reconnects on the next call",
            target.server
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten() {
        assert_eq!(
            placeholders("a = ?1 AND b IN (?12, ?3) AND c = '?'"),
            "a = $1 AND b IN ($12, $3) AND c = '?'"
        );
    }
}

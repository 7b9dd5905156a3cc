//! A SQLite transaction behind the store's [`Tx`](crate::store::Tx): every statement through
//! the connection's prepared-statement cache, parameters bound without copying, and a busy
//! lock noted so the store runs the whole write again.

use std::cell::Cell;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use super::errors::classify;
use crate::errors::{LedgerError, Result};
use crate::store::{
    ledger_error, DbError, DbErrorKind, DbResult, FailureScope, Row, Savepoint, Sql, SqlValue,
    ToSql,
};

/// An open transaction, with the operation and database named for error messages. Every
/// statement goes through the connection's prepared-statement cache.
pub(super) struct Tx<'a> {
    inner: &'a Connection,
    label: &'a str,
    op: Cell<&'a str>,
    /// Set when a statement failed on a busy lock: the write is retried as a whole.
    retry: Cell<bool>,
}

impl<'a> Tx<'a> {
    /// A transaction of operation `op` on `conn` (named `label` in messages); its `BEGIN` is
    /// the caller's, through [`Tx::control`].
    pub(super) fn new(conn: &'a Connection, label: &'a str, op: &'a str) -> Self {
        Self {
            inner: conn,
            label,
            op: Cell::new(op),
            retry: Cell::new(false),
        }
    }

    /// Whether a statement failed on a busy lock (the write is retried as a whole).
    pub(super) fn busy(&self) -> bool {
        self.retry.get()
    }

    /// Run a transaction control statement (`BEGIN`, `COMMIT`). These go through the statement
    /// cache too: preparing them afresh for every transaction (as rusqlite's `Transaction`
    /// does) costs as much as a small write.
    pub(super) fn control(&self, sql: &str) -> rusqlite::Result<()> {
        self.inner.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    /// End the transaction without keeping anything. Only fails if none is open, which is the
    /// state wanted.
    pub(super) fn rollback(&self) {
        if !self.inner.is_autocommit() {
            let _ = self.control("ROLLBACK");
        }
    }

    fn classify(&self, err: &rusqlite::Error) -> DbError {
        let e = classify(self.label, err);
        if e.kind == DbErrorKind::Busy {
            self.retry.set(true);
        }
        e
    }

    fn bind(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
    ) -> rusqlite::Result<rusqlite::CachedStatement<'_>> {
        let mut stmt = self.inner.prepare_cached(sql.sqlite)?;
        for (i, p) in params.iter().enumerate() {
            stmt.raw_bind_parameter(i + 1, Bind(p.to_sql()))?;
        }
        Ok(stmt)
    }
}

/// A parameter as rusqlite binds it: borrowed, no copy.
struct Bind<'a>(SqlValue<'a>);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            SqlValue::Null => ValueRef::Null,
            SqlValue::Int(v) => ValueRef::Integer(v),
            SqlValue::Text(s) => ValueRef::Text(s.as_bytes()),
            SqlValue::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// A rusqlite row behind the neutral [`Row`].
struct SqliteRow<'a, 'b>(&'a rusqlite::Row<'b>);

impl Row for SqliteRow<'_, '_> {
    fn value(&self, index: usize) -> DbResult<SqlValue<'_>> {
        let v = self
            .0
            .get_ref(index)
            .map_err(|e| DbError::new(DbErrorKind::Type, e.to_string()))?;
        Ok(match v {
            ValueRef::Null => SqlValue::Null,
            ValueRef::Integer(i) => SqlValue::Int(i),
            ValueRef::Text(t) => SqlValue::Text(
                std::str::from_utf8(t)
                    .map_err(|e| DbError::new(DbErrorKind::Type, e.to_string()))?,
            ),
            ValueRef::Blob(b) => SqlValue::Blob(b),
            ValueRef::Real(r) => {
                return Err(DbError::new(
                    DbErrorKind::Type,
                    format!("column {index} holds a float ({r})"),
                ))
            }
        })
    }
}

impl crate::store::Tx for Tx<'_> {
    fn execute(&self, sql: &Sql, params: &[&dyn ToSql], _interpret: bool) -> DbResult<usize> {
        let run = || self.bind(sql, params)?.raw_execute();
        run().map_err(|e| self.classify(&e))
    }

    fn query(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        each: &mut dyn FnMut(&dyn Row) -> DbResult<bool>,
    ) -> DbResult<()> {
        let mut stmt = self.bind(sql, params).map_err(|e| self.classify(&e))?;
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next().map_err(|e| self.classify(&e))? {
            if !each(&SqliteRow(row))? {
                break;
            }
        }
        Ok(())
    }

    /// In-process: nothing to save by waiting, so it runs now.
    fn defer(&self, sql: &Sql, params: &[&dyn ToSql]) -> DbResult<()> {
        self.execute(sql, params, false).map(|_| ())
    }

    fn execute_script(&self, text: &str) -> DbResult<()> {
        self.inner
            .execute_batch(text)
            .map_err(|e| self.classify(&e))
    }

    fn fail(&self, err: &DbError) -> LedgerError {
        ledger_error(self.op.get(), self.label, err)
    }

    /// The IMMEDIATE transaction already holds the database's one write lock.
    fn lock_run(&self, _run_id: &str) -> Result<()> {
        Ok(())
    }

    fn mark_run_locked(&self, _run_id: &str) -> Result<()> {
        Ok(())
    }

    /// One fixed name, so each statement stays in the prepared-statement cache.
    fn savepoint(&self, step: Savepoint) -> Result<()> {
        let run = |sql: &str| {
            self.control(sql).map_err(|e| {
                let e = self.classify(&e);
                crate::store::Tx::fail(self, &e)
            })
        };
        step.statements().iter().try_for_each(|text| run(text))
    }

    fn set_operation(&self, op: &'static str) {
        self.op.set(op);
    }

    fn failure_scope(&self) -> FailureScope {
        if self.retry.get() {
            FailureScope::Transaction
        } else {
            FailureScope::Call
        }
    }
}

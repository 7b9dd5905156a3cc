//! Storage: opening a database, its settings, forward-only migrations, transactions with
//! bounded busy retry, and the mapping of every database error onto [`LedgerError`].
//!
//! [`Store`] and [`Tx`] are the only seam between the operations and SQL (River's driver
//! idea, kept internal): the operations in `runs`, `attempts`, `queue`, `leases`, `events` and
//! `blobs` are written once against `&dyn Tx`; `sqlite` (rusqlite, `bundled`) and `postgres`
//! (`tokio-postgres` driven synchronously, behind the `postgres` feature) implement it. The
//! statements both dialects run live in [`sql`], one text per dialect where they differ; a
//! statement only one backend runs lives in that backend. [`migrate`] is the one migration
//! runner, over the same seam.

use crate::errors::{LedgerError, Result};

pub mod migrate;
#[cfg(all(test, feature = "postgres"))]
mod parity;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod rows;
pub mod sql;
pub mod sqlite;
#[cfg(test)]
pub mod testing;

/// Open a ledger store: PostgreSQL when `url` is given, else the SQLite file `path` (`None` =
/// a private in-memory database).
pub fn open(
    path: Option<&str>,
    url: Option<&str>,
    schema: Option<&str>,
    opts: &OpenOptions,
    now_ms: i64,
) -> Result<Box<dyn Store>> {
    match url {
        #[cfg(feature = "postgres")]
        Some(url) => Ok(Box::new(postgres::PgStore::open(
            url, schema, opts, now_ms,
        )?)),
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err(LedgerError::invalid(
            "target",
            "this build of fencepost has no PostgreSQL backend; install the wheel from PyPI",
        )),
        None => {
            if schema.is_some() {
                return Err(LedgerError::invalid(
                    "schema",
                    "only a PostgreSQL target has schemas; drop schema= for a SQLite file",
                ));
            }
            Ok(Box::new(sqlite::SqliteStore::open(path, opts, now_ms)?))
        }
    }
}

/// How hard each commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=NORMAL` in WAL mode: crash-safe and consistent; a power loss may drop the
    /// last commits.
    Normal,
    /// `synchronous=FULL`: every commit is fsynced before it returns.
    Full,
}

impl Durability {
    /// The `synchronous` pragma value.
    #[must_use]
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Normal => "NORMAL",
            Self::Full => "FULL",
        }
    }
}

/// Options for [`open`], the same for both backends.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Commit durability.
    pub durability: Durability,
    /// How long a write waits for a lock (SQLite's database lock, a PostgreSQL row lock), in
    /// total, before `StoreBusy`.
    pub busy_timeout_ms: u64,
    /// Make the ledger if there is none: the file on SQLite, the schema and its tables on
    /// PostgreSQL. Read-only tools pass `false`, so looking never creates anything.
    pub create: bool,
    /// PostgreSQL: `wait_events` is woken by `LISTEN`/`NOTIFY` on a connection of its own.
    /// Off, it polls instead (behind a pooler in transaction mode, which cannot keep a
    /// `LISTEN`). Commits always `NOTIFY`, so other processes may listen either way.
    pub listen: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Normal,
            busy_timeout_ms: 5000,
            create: true,
            listen: true,
        }
    }
}

/// A counter that a background thread moves when something may have changed, and that waiters
/// block on (see [`Store::signal`]). While it is not `live` (its source is reconnecting) its
/// moves cannot be trusted to come, and waiters poll instead; it moves again once live, since
/// whatever happened in between went unannounced.
#[derive(Debug, Default)]
pub struct Signal {
    state: std::sync::Mutex<(u64, bool)>,
    moved: std::sync::Condvar,
}

impl Signal {
    fn state(&self) -> std::sync::MutexGuard<'_, (u64, bool)> {
        // A waiter that panicked holding the lock left a counter, nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Move the counter and wake every waiter.
    pub fn bump(&self) {
        self.state().0 += 1;
        self.moved.notify_all();
    }

    /// Say whether moves can be trusted from now on; becoming live also moves the counter.
    pub fn set_live(&self, live: bool) {
        let mut state = self.state();
        if live && !state.1 {
            state.0 += 1;
        }
        state.1 = live;
        drop(state);
        self.moved.notify_all();
    }

    /// The counter, if the signal is live.
    pub fn mark(&self) -> Option<u64> {
        let state = self.state();
        state.1.then_some(state.0)
    }

    /// Block until the counter is no longer `seen`, the signal stops being live, or `until`;
    /// the counter then, if live.
    pub fn wait_past(&self, seen: u64, until: std::time::Instant) -> Option<u64> {
        let mut state = self.state();
        while state.1 && state.0 == seen {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .moved
                .wait_timeout(state, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        state.1.then_some(state.0)
    }
}

// ------------------------------------------------------------------ the seam

/// One statement in each backend's dialect. Most statements are written once and shared
/// (`?N` placeholders; the PostgreSQL store rewrites them to `$N` when it prepares them); the
/// few that need a dialect's own feature (JSON lists, type casts, aggregates over booleans)
/// carry two texts.
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    /// The SQLite text.
    pub sqlite: &'static str,
    /// The PostgreSQL text (`?N` placeholders too).
    pub postgres: &'static str,
}

impl Sql {
    /// One text for both backends.
    pub const fn same(text: &'static str) -> Self {
        Self {
            sqlite: text,
            postgres: text,
        }
    }

    /// A text per backend. Both must be statements: a backend that has nothing to run keeps
    /// the statement to itself instead of running an empty one.
    ///
    /// # Panics
    ///
    /// When either text is empty; every `Sql` is a constant, so that fails the build.
    pub const fn split(sqlite: &'static str, postgres: &'static str) -> Self {
        assert!(
            !sqlite.is_empty() && !postgres.is_empty(),
            "a shared statement has a text for each backend"
        );
        Self { sqlite, postgres }
    }

    /// A statement in the dialect of the one backend that runs it (its own reads and writes
    /// of [`rows`]); no other backend's transaction ever sees it.
    pub const fn native(text: &'static str) -> Self {
        Self::same(text)
    }
}

/// A bound parameter or a read column, in the four shapes the ledger stores: every integer is
/// 64-bit, every string UTF-8 text, JSON is canonical text, blobs are bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlValue<'a> {
    /// NULL.
    Null,
    /// An integer (booleans are 0/1).
    Int(i64),
    /// UTF-8 text.
    Text(&'a str),
    /// Bytes.
    Blob(&'a [u8]),
}

/// A value that can be bound as a statement parameter.
pub trait ToSql {
    /// The value to bind.
    fn to_sql(&self) -> SqlValue<'_>;
}

impl ToSql for i64 {
    fn to_sql(&self) -> SqlValue<'_> {
        SqlValue::Int(*self)
    }
}
impl ToSql for bool {
    fn to_sql(&self) -> SqlValue<'_> {
        SqlValue::Int(i64::from(*self))
    }
}
impl ToSql for str {
    fn to_sql(&self) -> SqlValue<'_> {
        SqlValue::Text(self)
    }
}
impl ToSql for String {
    fn to_sql(&self) -> SqlValue<'_> {
        SqlValue::Text(self)
    }
}
impl ToSql for [u8] {
    fn to_sql(&self) -> SqlValue<'_> {
        SqlValue::Blob(self)
    }
}
impl ToSql for Vec<u8> {
    fn to_sql(&self) -> SqlValue<'_> {
        SqlValue::Blob(self)
    }
}
impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> SqlValue<'_> {
        (**self).to_sql()
    }
}
impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> SqlValue<'_> {
        self.as_ref().map_or(SqlValue::Null, ToSql::to_sql)
    }
}

/// Statement parameters: `params![a, b, c]` borrows each as `&dyn ToSql`.
#[macro_export]
macro_rules! params {
    () => { &[] as &[&dyn $crate::store::ToSql] };
    ($($p:expr),+ $(,)?) => { &[$(&$p as &dyn $crate::store::ToSql),+] as &[&dyn $crate::store::ToSql] };
}

/// A database error, classified for the operations; the backend's own error never leaves the
/// store (it is rendered into `message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbError {
    /// What kind of failure.
    pub kind: DbErrorKind,
    /// The backend's description, for the `Store` error's message.
    pub message: String,
}

/// The failures an operation may react to; everything else is `Other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbErrorKind {
    /// Lock contention, a serialization failure or a deadlock: the transaction may be retried.
    Busy,
    /// A UNIQUE constraint: `target` names it (PostgreSQL: the index name; SQLite: the
    /// `table.column, ...` list it reports).
    Unique {
        /// The index or columns.
        target: String,
    },
    /// A column's value had another type than the operation asked for.
    Type,
    /// The store cannot reach or read the database; the message says what to check.
    Unavailable,
    /// Anything else.
    Other,
}

impl DbError {
    /// An error of `kind` described by `message`.
    pub fn new(kind: DbErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Whether this is a UNIQUE violation of the index named `index` (PostgreSQL) or over the
    /// columns `columns` (SQLite reports columns, not the index).
    pub fn is_unique(&self, index: &str, columns: &str) -> bool {
        matches!(&self.kind, DbErrorKind::Unique { target } if target == index || target.contains(columns))
    }
}

/// A result of the store's statement layer.
pub type DbResult<T> = std::result::Result<T, DbError>;

/// A column type the operations read.
pub trait FromSql: Sized {
    /// Convert a column value.
    fn from_sql(value: SqlValue<'_>) -> DbResult<Self>;
}

fn type_error(want: &str, got: SqlValue<'_>) -> DbError {
    DbError::new(
        DbErrorKind::Type,
        format!("expected a column of type {want}, read {got:?}"),
    )
}

impl FromSql for i64 {
    fn from_sql(value: SqlValue<'_>) -> DbResult<Self> {
        match value {
            SqlValue::Int(v) => Ok(v),
            other => Err(type_error("integer", other)),
        }
    }
}
impl FromSql for bool {
    fn from_sql(value: SqlValue<'_>) -> DbResult<Self> {
        i64::from_sql(value).map(|v| v != 0)
    }
}
impl FromSql for String {
    fn from_sql(value: SqlValue<'_>) -> DbResult<Self> {
        match value {
            SqlValue::Text(s) => Ok(s.to_owned()),
            other => Err(type_error("text", other)),
        }
    }
}
impl FromSql for Vec<u8> {
    fn from_sql(value: SqlValue<'_>) -> DbResult<Self> {
        match value {
            SqlValue::Blob(b) => Ok(b.to_vec()),
            SqlValue::Text(s) => Ok(s.as_bytes().to_vec()),
            other => Err(type_error("bytes", other)),
        }
    }
}
impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(value: SqlValue<'_>) -> DbResult<Self> {
        match value {
            SqlValue::Null => Ok(None),
            other => T::from_sql(other).map(Some),
        }
    }
}

/// One result row.
pub trait Row {
    /// Column `index` (0-based).
    fn value(&self, index: usize) -> DbResult<SqlValue<'_>>;
}

impl dyn Row + '_ {
    /// Column `index` as `T`.
    pub fn get<T: FromSql>(&self, index: usize) -> DbResult<T> {
        T::from_sql(self.value(index)?)
    }
}

/// An open transaction: the only way operations reach SQL. Object-safe, so operation code
/// is written once against `&dyn Tx` for every backend.
pub trait Tx {
    /// Execute a statement; the number of rows changed. Errors are returned classified, so
    /// the caller can interpret a constraint (PostgreSQL keeps the transaction usable: the
    /// statement runs under a savepoint when `interpret` is set).
    fn execute(&self, sql: &Sql, params: &[&dyn ToSql], interpret: bool) -> DbResult<usize>;
    /// Run a query and hand each row to `each` until it returns `false`.
    fn query(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        each: &mut dyn FnMut(&dyn Row) -> DbResult<bool>,
    ) -> DbResult<()>;
    /// Execute a statement whose outcome the operation does not read; its failure still fails
    /// the transaction. SQLite runs it at once. PostgreSQL queues it to go out with the next
    /// statement the operation waits for, or with the `COMMIT`, in the same round trip
    /// (pipelining): the error, if any, surfaces there.
    fn defer(&self, sql: &Sql, params: &[&dyn ToSql]) -> DbResult<()>;
    /// Run a script of statements without parameters, as written and in order (a migration
    /// file). It runs now: a script changes what the statements after it may refer to.
    fn execute_script(&self, text: &str) -> DbResult<()>;
    /// The ledger error for a failed statement of this transaction's operation.
    fn fail(&self, err: &DbError) -> LedgerError;
    /// Take the run's row lock for the rest of the transaction: every write on a run begins
    /// here, so writes on one run are serialized and writes on different runs never wait for
    /// each other. SQLite's IMMEDIATE transaction already holds the one write lock: a no-op.
    fn lock_run(&self, run_id: &str) -> Result<()>;
    /// Take the run's lock for a judgment (`crate::plan`) whose only writes are the rows it
    /// hands to [`Tx::write_rows`], which then get the runs as read ([`rows::RunRead`]). By
    /// default this is [`Tx::lock_run`]: the lock is held from before the read to the commit.
    /// PostgreSQL, on a transaction's first try, takes it with those writes instead, checking
    /// in the same round trip that every run is as read and every row still as judged: a run's
    /// lock is then held for the write alone, and a write that finds a change fails the try,
    /// which runs again with the locks taken here. Whether the lock waits for the write (so
    /// the write needs the runs as read).
    fn lock_run_at_write(&self, run_id: &str) -> Result<bool> {
        self.lock_run(run_id).map(|()| false)
    }
    /// Plan the statements this transaction sends from here on without their parameters'
    /// values: once for the session (until a table they read is analyzed), not again for the
    /// values of each call. For a read whose plan must not depend on its values anyway (a
    /// range of one index in that index's order, a page of it): PostgreSQL plans a prepared
    /// statement for its values while that is estimated cheaper, and with a `LIMIT` it cannot
    /// see (it takes a tenth of the rows) on a large table it always is, so such a read would
    /// be planned on every call. SQLite plans a prepared statement once: a no-op.
    fn plan_generic(&self) -> Result<()> {
        Ok(())
    }
    /// Record the run's row lock as held: a statement of this transaction already took it (a
    /// `FOR UPDATE` read), so [`Tx::lock_run`] need not send another. Whatever else the first
    /// lock of a transaction brings with it is still done. A no-op on SQLite.
    fn mark_run_locked(&self, run_id: &str) -> Result<()>;
    /// Read what a judgment needs to know of `keys` (see [`rows`]), handing each row to `each`
    /// with the part it belongs to, in any order. By default one statement per key, all in
    /// one [`Tx::query_many`].
    fn read_snapshot(
        &self,
        keys: &rows::SnapshotKeys<'_>,
        each: &mut dyn FnMut(rows::Part, &dyn Row) -> DbResult<()>,
    ) -> DbResult<()> {
        rows::read_each(self, keys, each)
    }
    /// Write a judgment's rows, each kind in order; a row that does not change exactly what it
    /// names fails the transaction (by the commit at the latest). By default one statement
    /// per row.
    fn write_rows(&self, writes: &rows::Writes<'_>) -> DbResult<()> {
        rows::write_each(self, writes, rows::Check::Now)
    }
    /// Take, keep or undo the savepoint around one call of a grouped transaction (one level:
    /// the calls of a group run one after another). SQLite runs it now; PostgreSQL queues it.
    fn savepoint(&self, step: Savepoint) -> Result<()>;
    /// Name the operation the statements from here on belong to, for error messages (a grouped
    /// transaction runs the calls of several operations).
    fn set_operation(&self, op: &'static str);
    /// How far the last failed statement's harm reaches: only its call, the transaction (run
    /// it again), or the connection (the commit's outcome is unknown).
    fn failure_scope(&self) -> FailureScope;
    /// Run several queries and hand each row to `each` with the index of its query. PostgreSQL
    /// sends them together, in one round trip; elsewhere they run one after another.
    fn query_many(
        &self,
        queries: &[(&Sql, &[&dyn ToSql])],
        each: &mut dyn FnMut(usize, &dyn Row) -> DbResult<()>,
    ) -> DbResult<()> {
        for (i, (sql, params)) in queries.iter().enumerate() {
            self.query(sql, params, &mut |r| each(i, r).map(|()| true))?;
        }
        Ok(())
    }
    /// How many round trips this thread's transactions have waited for so far (0 where a
    /// statement is an in-process call).
    #[cfg(test)]
    fn round_trips(&self) -> u64 {
        0
    }
}

/// A step of the savepoint around one call of a grouped transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Savepoint {
    /// `SAVEPOINT`: the call begins.
    Begin,
    /// `RELEASE`: the call succeeded; its writes join the transaction.
    Release,
    /// `ROLLBACK TO` then `RELEASE`: the call refused; nothing of it stays.
    Undo,
}

impl Savepoint {
    /// The statements of this step, the same text in both dialects. One fixed name: calls in
    /// a group never nest, and a fixed text stays in each backend's statement cache.
    pub const fn statements(self) -> &'static [&'static str] {
        match self {
            Self::Begin => &["SAVEPOINT fp_call"],
            Self::Release => &["RELEASE SAVEPOINT fp_call"],
            Self::Undo => &["ROLLBACK TO SAVEPOINT fp_call", "RELEASE SAVEPOINT fp_call"],
        }
    }
}

/// How far a failure reaches (see [`Tx::failure_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// The call's own refusal: its neighbours may go on.
    Call,
    /// Contention or a race: the transaction runs again as a whole.
    Transaction,
    /// The session is gone: whether the commit landed is unknown.
    Connection,
}

impl dyn Tx + '_ {
    /// Execute a statement; the number of rows changed.
    pub fn exec(&self, sql: &Sql, params: &[&dyn ToSql]) -> Result<usize> {
        self.execute(sql, params, false).map_err(|e| self.fail(&e))
    }

    /// [`Tx::defer`] a statement: executed by the time the transaction commits.
    pub fn exec_later(&self, sql: &Sql, params: &[&dyn ToSql]) -> Result<()> {
        self.defer(sql, params).map_err(|e| self.fail(&e))
    }

    /// Execute a statement whose failure the caller interprets (a constraint that means
    /// something to the operation).
    pub fn exec_raw(&self, sql: &Sql, params: &[&dyn ToSql]) -> DbResult<usize> {
        self.execute(sql, params, true)
    }

    /// The first row, if any.
    pub fn row<T>(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        map: impl FnOnce(&dyn Row) -> DbResult<T>,
    ) -> Result<Option<T>> {
        let mut map = Some(map);
        let mut out = None;
        self.query(sql, params, &mut |r| {
            if let Some(f) = map.take() {
                out = Some(f(r)?);
            }
            Ok(false)
        })
        .map_err(|e| self.fail(&e))?;
        Ok(out)
    }

    /// Every row.
    pub fn rows<T>(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        mut map: impl FnMut(&dyn Row) -> DbResult<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        self.query(sql, params, &mut |r| {
            out.push(map(r)?);
            Ok(true)
        })
        .map_err(|e| self.fail(&e))?;
        Ok(out)
    }
}

/// What a store reports about its settings (`Ledger.pragmas()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pragmas {
    /// `wal` for SQLite files, `memory` for `:memory:`, `postgresql` on PostgreSQL.
    pub journal_mode: String,
    /// `normal` or `full` (PostgreSQL: `synchronous_commit` off/local = normal, else full).
    pub synchronous: String,
    /// Milliseconds.
    pub busy_timeout: i64,
    /// Always true.
    pub foreign_keys: bool,
    /// The schema version after migrations.
    pub schema_version: i64,
    /// PostgreSQL: the TLS version of the connection (`TLSv1.3`), or `off`; SQLite: `None`.
    pub tls: Option<String>,
}

/// A ledger database: transactions, settings, checks. Operations take `&mut dyn Store`.
pub trait Store: Send {
    /// The database's name in messages (a path, or a PostgreSQL URL without its password).
    fn label(&self) -> &str;
    /// Run `body` in one write transaction, committed if it returns `Ok` and rolled back (nothing
    /// written) if it returns `Err`. Contention is retried with jitter within the busy budget,
    /// re-running `body`, then reported as `StoreBusy`.
    fn write_dyn(&mut self, op: &str, body: &mut dyn FnMut(&dyn Tx) -> Result<()>) -> Result<()>;
    /// Run `body` in one read transaction (one consistent snapshot).
    fn read_dyn(&mut self, op: &str, body: &mut dyn FnMut(&dyn Tx) -> Result<()>) -> Result<()>;
    /// The settings as the database reports them now.
    fn pragmas(&mut self) -> Result<Pragmas>;
    /// The database's own consistency check: `["ok"]` when sound. `quick` skips what grows
    /// with the data beyond one pass (on SQLite, `quick_check`: no index-to-table matching),
    /// so a routine check of a large ledger takes seconds, not minutes.
    fn integrity_check(&mut self, quick: bool) -> Result<Vec<String>>;
    /// A mark that moves whenever a transaction that may have appended events has committed,
    /// by this connection or any other, read without touching a table: a waiter for events
    /// compares marks and runs its query only when the mark moved. SQLite: the database's
    /// `data_version` (other connections' commits) and this connection's own change count;
    /// PostgreSQL: the events' sequence, which moves when an event is appended (before that
    /// transaction commits: a waiter keeps querying for a short while after a move).
    fn change_mark(&mut self) -> Result<(i64, i64)>;
    /// A signal that moves whenever a transaction that may have appended events has committed,
    /// pushed to this process instead of read (PostgreSQL: `LISTEN` on a connection of its own;
    /// see `postgres::listen`), or `None` where there is none: SQLite, or a PostgreSQL ledger
    /// opened with `listen` off. Started on the first call, kept until the store is dropped;
    /// waiting on it touches neither the store nor the database.
    fn signal(&mut self) -> Result<Option<std::sync::Arc<Signal>>> {
        Ok(None)
    }
    /// For a reader of every run's events (`events(None, ...)`): the lowest `seq` that a
    /// transaction still in flight may yet commit, read *before* the reader's snapshot, or
    /// `None` when every `seq` below the newest visible one is settled. SQLite commits one
    /// writer at a time in `seq` order, so it has no horizon; see the PostgreSQL store.
    fn event_horizon(&mut self) -> Result<Option<i64>> {
        Ok(None)
    }
    /// Give the pages freed by deletes back to the file system, at most `max_pages` in this
    /// call (one short write transaction); the bytes given back. SQLite files made by this
    /// library use incremental auto-vacuum, so a prune can shrink them step by step; a file
    /// made without it (see [`Store::vacuum`]) and PostgreSQL, whose autovacuum makes the room
    /// reusable in place, give back nothing here.
    fn reclaim(&mut self, _max_pages: u32) -> Result<u64> {
        Ok(0)
    }
    /// Rewrite the whole database compactly (SQLite: `VACUUM`, switching the file to
    /// incremental auto-vacuum on the way; PostgreSQL: `VACUUM (ANALYZE)` of the ledger's
    /// tables). Takes the database's write lock for as long as it runs: a maintenance step, not
    /// something to run beside dispatchers.
    fn vacuum(&mut self) -> Result<()>;
    /// Whether the last transaction lost its connection: a failed `COMMIT` may then have
    /// landed, so nothing of it may be run again. SQLite is in-process: never.
    fn lost(&self) -> bool {
        false
    }
}

impl dyn Store + '_ {
    /// [`Store::write_dyn`] returning the body's value.
    /// What the body held for the operator (`observe::hold`) is reported once it commits.
    pub fn write<T>(&mut self, op: &str, mut body: impl FnMut(&dyn Tx) -> Result<T>) -> Result<T> {
        let mut out = None;
        let done = self.write_dyn(op, &mut |tx| {
            crate::observe::forget_held();
            out = Some(body(tx)?);
            Ok(())
        });
        crate::observe::settle_held(done.is_ok());
        done?;
        out.ok_or_else(|| unreachable_store(op))
    }

    /// [`Store::read_dyn`] returning the body's value. The body may run more than once (a read
    /// whose session was lost runs again on a new one), so it is `FnMut`.
    pub fn read<T>(&mut self, op: &str, mut body: impl FnMut(&dyn Tx) -> Result<T>) -> Result<T> {
        let mut out = None;
        self.read_dyn(op, &mut |tx| {
            out = Some(body(tx)?);
            Ok(())
        })?;
        out.ok_or_else(|| unreachable_store(op))
    }
}

/// The ledger error for a failed statement of operation `op` on database `label`: conditions
/// with an explanation keep it; anything else is named as unexpected, with the backend's text.
pub fn ledger_error(op: &str, label: &str, err: &DbError) -> LedgerError {
    let message = match err.kind {
        DbErrorKind::Unavailable | DbErrorKind::Busy => err.message.clone(),
        _ => format!(
            "unexpected database error while {op} on {label}: {}",
            err.message
        ),
    };
    LedgerError::StoreError {
        operation: op.to_owned(),
        message,
    }
}

fn unreachable_store(op: &str) -> LedgerError {
    LedgerError::StoreError {
        operation: op.to_owned(),
        message: "the store ended a transaction without running it".into(),
    }
}

/// The bounded retry of a contended write, shared by both backends: exponential jitter
/// (1 ms up to 64 ms) while the busy budget and the retry count last, then `StoreBusy` with
/// how long it waited and how often it retried.
pub(crate) struct Backoff {
    started: std::time::Instant,
    budget: std::time::Duration,
    max_retries: u32,
    retries: u32,
    seed: u64,
}

impl Backoff {
    pub(crate) fn new(busy_timeout_ms: u64, max_retries: u32) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::from(d.subsec_nanos()));
        Self {
            started: std::time::Instant::now(),
            budget: std::time::Duration::from_millis(busy_timeout_ms),
            max_retries,
            retries: 0,
            // Seeded by time and pid, so processes that collided do not retry in step.
            seed: (nanos | 1) ^ (u64::from(std::process::id()) << 32),
        }
    }

    /// Sleep before the next attempt, or `StoreBusy` once the budget is spent.
    pub(crate) fn wait(&mut self) -> Result<()> {
        let waited = self.started.elapsed();
        if self.retries >= self.max_retries || waited >= self.budget {
            return Err(LedgerError::StoreBusy {
                waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                retries: self.retries,
            });
        }
        self.retries += 1;
        crate::observe::busy_retry(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX));
        // A small xorshift: no dependency for jitter.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let cap = 1u64 << self.retries.min(6);
        std::thread::sleep(std::time::Duration::from_millis(1 + self.seed % cap));
        Ok(())
    }
}

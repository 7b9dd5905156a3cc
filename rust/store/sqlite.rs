//! The SQLite backend: opening a file (or memory), its pragmas set *and read back*, migrations
//! at open, IMMEDIATE write transactions with bounded busy retry, and the one place where a
//! `rusqlite::Error` becomes a [`LedgerError`].

mod busy;
mod checkpoint;

use std::cell::Cell;
use std::sync::Arc;

use rusqlite::config::DbConfig;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::errors::{LedgerError, Result};
use crate::store::{
    ledger_error, migrate, Backend, Backoff, DbError, DbErrorKind, DbResult, OpenOptions, Pragmas,
    Row, Sql, SqlValue, Store, ToSql,
};
use checkpoint::Checkpointer;

/// Prepared statements kept per connection: every hot statement stays compiled.
const STATEMENT_CACHE: usize = 128;

/// Retries of a busy `BEGIN IMMEDIATE`/`COMMIT` after SQLite's own busy handler gave up, while
/// time remains in the busy budget.
const MAX_BUSY_RETRIES: u32 = 8;

/// One SQLite connection with its settings checked.
pub struct SqliteStore {
    /// Declared before `conn` so it is dropped (its thread stopped) first.
    checkpointer: Option<Checkpointer>,
    conn: Connection,
    /// The path (or `:memory:`), named in error messages.
    label: String,
    busy_timeout_ms: u64,
    /// The busy handler's budget (see `busy`), shared with the checkpointer.
    busy: Arc<busy::Budget>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Map a rusqlite error onto the ledger's errors: busy/locked are retryable and become
/// [`LedgerError::StoreBusy`] once retries run out (the caller decides); everything else is a
/// [`LedgerError::Store`] that names the operation and the database.
pub fn store_error(operation: &str, label: &str, err: &rusqlite::Error) -> LedgerError {
    ledger_error(operation, label, &classify(label, err))
}

/// Classify a rusqlite error; the conditions a user can act on get their explanation here.
pub fn classify(label: &str, err: &rusqlite::Error) -> DbError {
    if let rusqlite::Error::SqliteFailure(f, Some(msg)) = err {
        if f.code == ErrorCode::ConstraintViolation && msg.contains("UNIQUE") {
            return DbError::new(
                DbErrorKind::Unique {
                    target: msg.clone(),
                },
                msg.clone(),
            );
        }
    }
    if matches!(
        err,
        rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..)
    ) {
        return DbError::new(DbErrorKind::Type, err.to_string());
    }
    let (kind, message) = match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => (
            DbErrorKind::Unavailable,
            format!(
                "{label} is not a fencepost database (not SQLite); point fencepost at a new file"
            ),
        ),
        Some(ErrorCode::CannotOpen) => (
            DbErrorKind::Unavailable,
            format!("cannot open {label}: check that its directory exists and is writable"),
        ),
        Some(ErrorCode::DatabaseCorrupt) => (
            DbErrorKind::Unavailable,
            format!("{label} is corrupt; run `fencepost doctor` and restore it from a backup"),
        ),
        Some(ErrorCode::DiskFull) => (
            DbErrorKind::Unavailable,
            format!("the disk holding {label} is full"),
        ),
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => (
            DbErrorKind::Unavailable,
            format!("{label} is read-only here; check the file's permissions"),
        ),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => (
            DbErrorKind::Busy,
            format!("{label} stayed locked by another writer"),
        ),
        _ => (DbErrorKind::Other, err.to_string()),
    };
    DbError::new(kind, message)
}

/// Process-wide SQLite settings, applied once before the first connection (they are refused
/// after SQLite initializes). Memory statistics off: with them on, every allocation SQLite
/// makes takes a global mutex, about 5% of a batch reservation measured with perf, and
/// fencepost never reads those statistics. This SQLite is private to the extension (bundled,
/// statically linked), so no other user in the process depends on the setting.
fn configure_process() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is documented as callable before sqlite3_initialize, from one
        // thread; `Once` gives both. A refusal (already initialized) leaves the defaults.
        unsafe {
            let _ = rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                std::ffi::c_int::from(0u8),
            );
        }
    });
}

impl SqliteStore {
    /// Open `path` (`None` = a private in-memory database), set and verify the pragmas, and
    /// migrate the schema.
    pub fn open(path: Option<&str>, opts: &OpenOptions, now_ms: i64) -> Result<Self> {
        let label = path.unwrap_or(":memory:").to_owned();
        let op = "opening the database";
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        if opts.create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        configure_process();
        let conn = match path {
            Some(p) => Connection::open_with_flags(p, flags),
            None => Connection::open_in_memory(),
        }
        .map_err(|e| store_error(op, &label, &e))?;
        // Refuse a foreign or newer database before `configure` writes to it (WAL mode is
        // recorded in the file's header): a refused file must stay byte for byte as it was.
        let mut conn = conn;
        let busy = busy::install(&mut conn, opts.busy_timeout_ms)
            .map_err(|e| store_error(op, &label, &e))?;
        migrate::vet(&conn, &label)?;
        let mut store = Self {
            checkpointer: None,
            conn,
            label,
            busy_timeout_ms: opts.busy_timeout_ms,
            busy,
        };
        store.configure(path.is_some(), opts)?;
        migrate::migrate(&mut store.conn, &store.label, now_ms)?;
        if let Some(p) = path {
            // A restarted log truncates its file back to this size (see `checkpoint`).
            store
                .conn
                .execute_batch(&format!(
                    "PRAGMA journal_size_limit = {}",
                    checkpoint::JOURNAL_SIZE_LIMIT
                ))
                .map_err(|e| store_error(op, &store.label, &e))?;
            store.checkpointer = Checkpointer::start(
                &mut store.conn,
                p,
                opts.durability.pragma(),
                Arc::clone(&store.busy),
            );
        }
        Ok(store)
    }

    fn configure(&mut self, is_file: bool, opts: &OpenOptions) -> Result<()> {
        let op = "configuring the database";
        let label = self.label.clone();
        let err = |e: rusqlite::Error| store_error(op, &label, &e);
        self.conn
            .set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // The query planner stability guarantee. Without it SQLite marks a bound parameter
        // that the planner compared against a partial index's literal (the scope guard's
        // `status = 'active'`, the events' `idempotency_key IS NOT NULL`) and re-prepares the
        // cached statement whenever that parameter's value changes: a full SQL parse on every
        // reserve and finish. Every partial index a statement needs is named by literals in
        // its own SQL, so a plan that ignores bound values loses nothing.
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(err)?;
        // Only takes effect on a new, empty file. Every page a commit touches is one WAL frame
        // written, and the hot-path rows are 100-300 bytes: 1 KiB pages write a quarter of the
        // bytes of the 4 KiB default for the same frames (reserve 50 -> 41 us, finish 36 -> 29 us
        // measured without checkpoints). Large blobs just take more overflow pages.
        self.conn
            .execute_batch("PRAGMA page_size = 1024")
            .map_err(err)?;
        // journal_mode answers with the mode in force: WAL could be refused (e.g. a network
        // file system), and then concurrent readers would block writers. Fail loudly instead.
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(err)?;
        if is_file && !mode.eq_ignore_ascii_case("wal") {
            return Err(LedgerError::Store {
                operation: op.into(),
                message: format!(
                    "could not enable WAL on {label} (journal_mode is {mode}); put the database \
                     on a local file system"
                ),
            });
        }
        let sync = opts.durability.pragma();
        self.conn
            .execute_batch(&format!("PRAGMA synchronous = {sync}"))
            .map_err(err)?;
        self.conn
            .execute_batch("PRAGMA foreign_keys = ON")
            .map_err(err)?;
        let pragmas = self.pragmas_unchecked().map_err(err)?;
        let want_sync = sync.to_ascii_lowercase();
        if pragmas.synchronous != want_sync || !pragmas.foreign_keys {
            return Err(LedgerError::Store {
                operation: op.into(),
                message: format!(
                    "{label} did not accept its settings (synchronous={}, foreign_keys={})",
                    pragmas.synchronous, pragmas.foreign_keys
                ),
            });
        }
        Ok(())
    }

    fn pragmas_unchecked(&self) -> rusqlite::Result<Pragmas> {
        let journal_mode: String = self
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        let sync: i64 = self
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))?;
        // The budget of fencepost's busy handler (`PRAGMA busy_timeout` reads back only SQLite's
        // own handler's).
        let busy_timeout = i64::try_from(self.busy.get()).unwrap_or(i64::MAX);
        let fk: i64 = self
            .conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
        let has_ledger: i64 = self.conn.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'schema_migrations'",
            [],
            |r| r.get(0),
        )?;
        let schema_version: i64 = if has_ledger == 0 {
            0
        } else {
            self.conn.query_row(
                "SELECT coalesce(max(version), 0) FROM schema_migrations",
                [],
                |r| r.get(0),
            )?
        };
        let synchronous = match sync {
            0 => "off",
            1 => "normal",
            2 => "full",
            3 => "extra",
            _ => "unknown",
        };
        Ok(Pragmas {
            journal_mode: journal_mode.to_ascii_lowercase(),
            synchronous: synchronous.to_owned(),
            busy_timeout,
            foreign_keys: fk == 1,
            schema_version,
            tls: None,
        })
    }

    /// The settings as the database reports them now.
    pub fn pragmas(&self) -> Result<Pragmas> {
        self.pragmas_unchecked()
            .map_err(|e| store_error("reading pragmas", &self.label, &e))
    }

    /// `PRAGMA integrity_check`: `["ok"]` when the file is sound.
    pub fn integrity_check(&self) -> Result<Vec<String>> {
        let run = || -> rusqlite::Result<Vec<String>> {
            let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect()
        };
        run().map_err(|e| store_error("checking integrity", &self.label, &e))
    }

    fn try_write(
        &mut self,
        op: &str,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> std::result::Result<(), Attempt> {
        let tx = Tx {
            inner: &self.conn,
            label: &self.label,
            op,
            retry: Cell::new(false),
        };
        // BEGIN/COMMIT go through the statement cache too: preparing them afresh for every
        // transaction (as rusqlite's `Transaction` does) costs as much as a small write.
        tx.control("BEGIN IMMEDIATE")
            .map_err(|e| Attempt::from_sqlite(op, &self.label, &e))?;
        match body(&tx) {
            Ok(()) => match tx.control("COMMIT") {
                Ok(()) => Ok(()),
                Err(e) => {
                    tx.rollback();
                    Err(Attempt::from_sqlite(op, &self.label, &e))
                }
            },
            // A refused operation rolls back: nothing it wrote before refusing survives.
            Err(e) => {
                tx.rollback();
                if tx.retry.get() {
                    Err(Attempt::Busy)
                } else {
                    Err(Attempt::Failed(e))
                }
            }
        }
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn label(&self) -> &str {
        &self.label
    }

    /// One `BEGIN IMMEDIATE` transaction. A busy `BEGIN` or `COMMIT` is retried with jitter
    /// while the busy budget lasts, then reported as `StoreBusy`.
    fn write_dyn(
        &mut self,
        op: &str,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> Result<()> {
        let mut backoff = Backoff::new(self.busy_timeout_ms, MAX_BUSY_RETRIES);
        loop {
            match self.try_write(op, body) {
                Err(Attempt::Busy) => {
                    backoff.wait()?;
                }
                Err(Attempt::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }

    /// A deferred (read) transaction: one consistent WAL snapshot.
    fn read_dyn(
        &mut self,
        op: &str,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> Result<()> {
        let tx = Tx {
            inner: &self.conn,
            label: &self.label,
            op,
            retry: Cell::new(false),
        };
        tx.control("BEGIN")
            .map_err(|e| store_error(op, &self.label, &e))?;
        let out = body(&tx);
        // A read transaction has nothing to keep; ending it releases the snapshot either way.
        tx.rollback();
        out
    }

    fn pragmas(&mut self) -> Result<Pragmas> {
        SqliteStore::pragmas(self)
    }

    fn integrity_check(&mut self) -> Result<Vec<String>> {
        SqliteStore::integrity_check(self)
    }
}

/// An open transaction, with the operation and database named for error messages. Every
/// statement goes through the connection's prepared-statement cache.
pub struct Tx<'a> {
    inner: &'a Connection,
    label: &'a str,
    op: &'a str,
    /// Set when a statement failed on a busy lock: the write is retried as a whole.
    retry: Cell<bool>,
}

impl Tx<'_> {
    fn control(&self, sql: &str) -> rusqlite::Result<()> {
        self.inner.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    /// End the transaction without keeping anything. Only fails if none is open, which is the
    /// state wanted.
    fn rollback(&self) {
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
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

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
        if sql.sqlite.is_empty() {
            return Ok(());
        }
        self.execute(sql, params, false).map(|_| ())
    }

    fn fail(&self, err: &DbError) -> LedgerError {
        ledger_error(self.op, self.label, err)
    }

    fn lock_run(&self, _run_id: &str) -> Result<()> {
        Ok(())
    }
}

/// Why one transaction attempt ended.
enum Attempt {
    /// The lock was busy: retry.
    Busy,
    /// Anything else: give up with this error.
    Failed(LedgerError),
}

impl Attempt {
    fn from_sqlite(op: &str, label: &str, err: &rusqlite::Error) -> Self {
        let e = classify(label, err);
        if e.kind == DbErrorKind::Busy {
            Self::Busy
        } else {
            Self::Failed(ledger_error(op, label, &e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params;
    use crate::store::{Durability, Sql, Store};

    fn temp_path(name: &str) -> String {
        let dir = std::env::temp_dir().join(format!(
            "fencepost-test-{}-{}-{name}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("ledger.db").to_string_lossy().into_owned()
    }

    #[test]
    fn file_database_is_wal_and_settings_read_back() {
        let path = temp_path("wal");
        let opts = OpenOptions {
            durability: Durability::Full,
            busy_timeout_ms: 1234,
            create: true,
        };
        let store = SqliteStore::open(Some(&path), &opts, 5).unwrap();
        let p = store.pragmas().unwrap();
        assert_eq!(p.journal_mode, "wal");
        assert_eq!(p.synchronous, "full");
        assert_eq!(p.busy_timeout, 1234);
        assert!(p.foreign_keys);
        assert_eq!(p.schema_version, migrate::SCHEMA_VERSION);
        assert_eq!(store.integrity_check().unwrap(), vec!["ok".to_owned()]);
        drop(store);
        let again = SqliteStore::open(Some(&path), &OpenOptions::default(), 6).unwrap();
        assert_eq!(again.pragmas().unwrap().synchronous, "normal");
    }

    #[test]
    fn text_file_is_refused_clearly() {
        let path = temp_path("text");
        std::fs::write(&path, "definitely not sqlite\n".repeat(200)).unwrap();
        let err = SqliteStore::open(Some(&path), &OpenOptions::default(), 0).unwrap_err();
        match err {
            LedgerError::Store { message, .. } => {
                assert!(message.contains("not a fencepost database"), "{message}");
                assert!(message.contains(&path));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn missing_file_without_create() {
        let path = temp_path("absent").replace("ledger.db", "absent.db");
        let opts = OpenOptions {
            create: false,
            ..OpenOptions::default()
        };
        let err = SqliteStore::open(Some(&path), &opts, 0).unwrap_err();
        assert!(
            matches!(err, LedgerError::Store { ref message, .. } if message.contains("cannot open"))
        );
        assert!(!std::path::Path::new(&path).exists());
    }

    #[test]
    fn refused_body_rolls_back() {
        let mut opened = SqliteStore::open(None, &OpenOptions::default(), 0).unwrap();
        let store: &mut dyn Store = &mut opened;
        let err = store
            .write("testing", |tx| {
                tx.exec(
                    &Sql::same(
                        "INSERT INTO blobs(digest, bytes, created_at) VALUES (?1, x'00', 0)",
                    ),
                    params![format!("sha256:{}", "0".repeat(64))],
                )
                .unwrap();
                Err::<(), _>(LedgerError::invalid("x", "refused"))
            })
            .unwrap_err();
        assert_eq!(err, LedgerError::invalid("x", "refused"));
        let n: Option<i64> = store
            .read("counting", |tx| {
                tx.row(&Sql::same("SELECT count(*) FROM blobs"), params![], |r| {
                    r.get(0)
                })
            })
            .unwrap();
        assert_eq!(n, Some(0));
    }

    #[test]
    fn check_constraints_hold() {
        let mut opened = SqliteStore::open(None, &OpenOptions::default(), 0).unwrap();
        let store: &mut dyn Store = &mut opened;
        let r = store.write("testing", |tx| {
            tx.exec(
                &Sql::same(
                    "INSERT INTO runs(run_id, workflow_ref, workflow_name, status, created_at, \
                     updated_at) VALUES ('r', 'w', 'w', 'exploded', 0, 0)",
                ),
                params![],
            )
        });
        assert!(matches!(r, Err(LedgerError::Store { .. })));
    }

    #[test]
    fn busy_lock_becomes_store_busy_after_retries() {
        let path = temp_path("busy");
        let opts = OpenOptions {
            busy_timeout_ms: 50,
            ..OpenOptions::default()
        };
        let mut opened = SqliteStore::open(Some(&path), &opts, 0).unwrap();
        let store: &mut dyn Store = &mut opened;
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let err = store.write("testing", |_| Ok(())).unwrap_err();
        match err {
            LedgerError::StoreBusy { waited_ms, retries } => {
                assert!(waited_ms >= 50, "{waited_ms}");
                assert!(retries <= MAX_BUSY_RETRIES);
            }
            other => panic!("unexpected {other:?}"),
        }
        other.execute_batch("COMMIT").unwrap();
        store.write("testing", |_| Ok(())).unwrap();
    }
}

//! The SQLite backend: opening a file (or memory), its pragmas set *and read back*, migrations
//! at open, IMMEDIATE write transactions with bounded busy retry, and the one place where a
//! `rusqlite::Error` becomes a [`LedgerError`].

mod checkpoint;
pub mod sql;

use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, Params, Row};

use crate::errors::{LedgerError, Result};
use crate::store::{migrate, OpenOptions};
use checkpoint::Checkpointer;

/// Prepared statements kept per connection: every hot statement stays compiled.
const STATEMENT_CACHE: usize = 128;

/// Retries of a busy `BEGIN IMMEDIATE`/`COMMIT` after SQLite's own busy handler gave up, while
/// time remains in the busy budget.
const MAX_BUSY_RETRIES: u32 = 8;

/// What the connection's settings read back as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pragmas {
    /// `wal` for files, `memory` for `:memory:`.
    pub journal_mode: String,
    /// `normal` or `full`.
    pub synchronous: String,
    /// Milliseconds.
    pub busy_timeout: i64,
    /// Always true.
    pub foreign_keys: bool,
    /// The schema version after migrations.
    pub schema_version: i64,
}

/// One SQLite connection with its settings checked.
pub struct SqliteStore {
    /// Declared before `conn` so it is dropped (its thread stopped) first.
    checkpointer: Option<Checkpointer>,
    conn: Connection,
    /// The path (or `:memory:`), named in error messages.
    label: String,
    busy_timeout_ms: u64,
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
    let message = match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => format!(
            "{label} is not a fencepost database (not SQLite); point fencepost at a new file"
        ),
        Some(ErrorCode::CannotOpen) => {
            format!("cannot open {label}: check that its directory exists and is writable")
        }
        Some(ErrorCode::DatabaseCorrupt) => {
            format!("{label} is corrupt; run `fencepost doctor` and restore it from a backup")
        }
        Some(ErrorCode::DiskFull) => format!("the disk holding {label} is full"),
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => {
            format!("{label} is read-only here; check the file's permissions")
        }
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            format!("{label} stayed locked by another writer")
        }
        _ => format!("unexpected database error while {operation} on {label}: {err}"),
    };
    LedgerError::Store {
        operation: operation.to_owned(),
        message,
    }
}

fn is_busy(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// A small xorshift for retry jitter: no dependency, seeded per call from the clock.
fn jitter_ms(seed: &mut u64, max: u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    1 + *seed % max.max(1)
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
        let mut store = Self {
            checkpointer: None,
            conn,
            label,
            busy_timeout_ms: opts.busy_timeout_ms,
        };
        store.configure(path.is_some(), opts)?;
        migrate::migrate(&mut store.conn, &store.label, now_ms)?;
        if let Some(p) = path {
            store.checkpointer = Checkpointer::start(&mut store.conn, p, opts.durability.pragma());
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
        self.conn
            .busy_timeout(Duration::from_millis(opts.busy_timeout_ms))
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
        let busy_timeout: i64 = self
            .conn
            .query_row("PRAGMA busy_timeout", [], |r| r.get(0))?;
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

    /// The database's name in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Run `body` in one `BEGIN IMMEDIATE` transaction: committed if it returns `Ok`, rolled
    /// back (nothing written) if it returns `Err`. A busy `BEGIN` or `COMMIT` is retried with
    /// jitter while the busy budget lasts, then reported as `StoreBusy`. `op` names the
    /// operation in error messages.
    pub fn write<T>(&mut self, op: &str, mut body: impl FnMut(&Tx<'_>) -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let budget = Duration::from_millis(self.busy_timeout_ms);
        let mut retries = 0u32;
        let mut seed = u64::from(started.elapsed().subsec_nanos()) | 1;
        seed ^= u64::from(std::process::id()) << 32;
        loop {
            match self.try_write(op, &mut body) {
                Err(Attempt::Busy) => {
                    let waited = started.elapsed();
                    if retries >= MAX_BUSY_RETRIES || waited >= budget {
                        return Err(LedgerError::StoreBusy {
                            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                            retries,
                        });
                    }
                    retries += 1;
                    let cap = 1u64 << retries.min(6);
                    std::thread::sleep(Duration::from_millis(jitter_ms(&mut seed, cap)));
                }
                Err(Attempt::Failed(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    fn try_write<T>(
        &mut self,
        op: &str,
        body: &mut impl FnMut(&Tx<'_>) -> Result<T>,
    ) -> Result<T, Attempt> {
        let tx = Tx {
            inner: &self.conn,
            label: &self.label,
            op,
        };
        // BEGIN/COMMIT go through the statement cache too: preparing them afresh for every
        // transaction (as rusqlite's `Transaction` does) costs as much as a small write.
        tx.control("BEGIN IMMEDIATE")
            .map_err(|e| Attempt::from_sqlite(op, &self.label, &e))?;
        match body(&tx) {
            Ok(value) => match tx.control("COMMIT") {
                Ok(()) => Ok(value),
                Err(e) => {
                    tx.rollback();
                    Err(Attempt::from_sqlite(op, &self.label, &e))
                }
            },
            // A refused operation rolls back: nothing it wrote before refusing survives.
            Err(e) => {
                tx.rollback();
                Err(Attempt::Failed(e))
            }
        }
    }

    /// Run `body` in a deferred (read) transaction: one consistent WAL snapshot.
    pub fn read<T>(&mut self, op: &str, body: impl FnOnce(&Tx<'_>) -> Result<T>) -> Result<T> {
        let tx = Tx {
            inner: &self.conn,
            label: &self.label,
            op,
        };
        tx.control("BEGIN").map_err(|e| tx.fail(&e))?;
        let out = body(&tx);
        // A read transaction has nothing to keep; ending it releases the snapshot either way.
        tx.rollback();
        out
    }
}

/// An open transaction, with the operation and database named for error messages. Every
/// statement goes through the connection's prepared-statement cache.
pub struct Tx<'a> {
    inner: &'a Connection,
    label: &'a str,
    op: &'a str,
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

    /// The error for a failed statement of this operation.
    pub fn fail(&self, err: &rusqlite::Error) -> LedgerError {
        store_error(self.op, self.label, err)
    }

    /// Execute a statement; the number of rows changed.
    pub fn exec(&self, sql: &str, params: impl Params) -> Result<usize> {
        self.exec_raw(sql, params).map_err(|e| self.fail(&e))
    }

    /// Execute a statement, leaving constraint violations for the caller to interpret.
    pub fn exec_raw(&self, sql: &str, params: impl Params) -> rusqlite::Result<usize> {
        self.inner.prepare_cached(sql)?.execute(params)
    }

    /// The first row, if any.
    pub fn row<T>(
        &self,
        sql: &str,
        params: impl Params,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<T>> {
        let run = || -> rusqlite::Result<Option<T>> {
            let mut stmt = self.inner.prepare_cached(sql)?;
            let mut rows = stmt.query(params)?;
            match rows.next()? {
                Some(row) => map(row).map(Some),
                None => Ok(None),
            }
        };
        run().map_err(|e| self.fail(&e))
    }

    /// Every row.
    pub fn rows<T>(
        &self,
        sql: &str,
        params: impl Params,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let run = || -> rusqlite::Result<Vec<T>> {
            let mut stmt = self.inner.prepare_cached(sql)?;
            let rows = stmt.query_map(params, map)?;
            rows.collect()
        };
        run().map_err(|e| self.fail(&e))
    }
}

/// Whether `err` is a UNIQUE violation naming `index` (SQLite reports the index's columns, so
/// callers pass a column list such as `"runs.scope_key, runs.workflow_ref"`).
pub fn is_unique_violation(err: &rusqlite::Error, columns: &str) -> bool {
    matches!(err, rusqlite::Error::SqliteFailure(f, Some(msg))
        if f.code == ErrorCode::ConstraintViolation && msg.contains("UNIQUE") && msg.contains(columns))
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
        if is_busy(err) {
            Self::Busy
        } else {
            Self::Failed(store_error(op, label, err))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Durability;

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
        let mut store = SqliteStore::open(None, &OpenOptions::default(), 0).unwrap();
        let err = store
            .write("testing", |tx| {
                tx.exec(
                    "INSERT INTO blobs(digest, bytes, created_at) VALUES (?1, x'00', 0)",
                    [format!("sha256:{}", "0".repeat(64))],
                )
                .unwrap();
                Err::<(), _>(LedgerError::invalid("x", "refused"))
            })
            .unwrap_err();
        assert_eq!(err, LedgerError::invalid("x", "refused"));
        let n: Option<i64> = store
            .read("counting", |tx| {
                tx.row("SELECT count(*) FROM blobs", [], |r| r.get(0))
            })
            .unwrap();
        assert_eq!(n, Some(0));
    }

    #[test]
    fn check_constraints_hold() {
        let mut store = SqliteStore::open(None, &OpenOptions::default(), 0).unwrap();
        let r = store.write("testing", |tx| {
            tx.exec(
                "INSERT INTO runs(run_id, workflow_ref, workflow_name, status, created_at, \
                 updated_at) VALUES ('r', 'w', 'w', 'exploded', 0, 0)",
                [],
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
        let mut store = SqliteStore::open(Some(&path), &opts, 0).unwrap();
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

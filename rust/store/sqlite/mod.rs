//! The SQLite backend: opening a file (or memory), its pragmas set *and read back*, migrations
//! at open, and IMMEDIATE write transactions with bounded busy retry. `tx` is the transaction
//! behind the seam, `errors` the one place where a `rusqlite::Error` becomes a ledger error,
//! `busy` the busy handler and `checkpoint` the bound on the write-ahead log.

mod busy;
mod checkpoint;
mod errors;
mod pcache;
mod tx;
mod vfs;

use std::sync::Arc;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};

use crate::errors::{LedgerError, Result};
use crate::store::migrate::{self, Dialect};
use crate::store::{ledger_error, Backoff, DbErrorKind, OpenOptions, Pragmas, Store};
use checkpoint::Checkpointer;
use errors::{classify, store_error};
use tx::Tx;

/// Prepared statements kept per connection: every hot statement stays compiled.
const STATEMENT_CACHE: usize = 128;

/// Retries of a busy `BEGIN IMMEDIATE`/`COMMIT` after SQLite's own busy handler gave up, while
/// time remains in the busy budget.
const MAX_BUSY_RETRIES: u32 = 8;

/// The migration ledger.
const CREATE_LEDGER_SQL: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT";

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

/// SQLite's part of migrating (see [`migrate`]). No migration lock: the IMMEDIATE transaction
/// holds the database's one write lock. Never refused for a missing ledger: `create=False`
/// refuses a missing *file* when it is opened, and a file that exists is the caller's to
/// migrate.
fn dialect(label: &str) -> Dialect {
    Dialect {
        migrations: migrate::SQLITE_MIGRATIONS,
        lock: None,
        create_ledger: CREATE_LEDGER_SQL.to_owned(),
        foreign: format!(
            "{label} is not a fencepost database (it holds other tables and no \
             schema_migrations); point fencepost at a new file"
        ),
        missing: None,
    }
}

/// Process-wide SQLite settings, applied once before the first connection (they are refused
/// after SQLite initializes). Memory statistics off: with them on, every allocation SQLite
/// makes takes a global mutex, about 5% of a batch reservation measured with perf, and
/// fencepost never reads those statistics. The page cache keeps a balance's parked page off
/// its largest page number (`pcache`). This SQLite is private to the extension (bundled,
/// statically linked), so no other user in the process depends on either setting.
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
        pcache::install();
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
        let mut conn = match path {
            Some(p) if vfs::register() => Connection::open_with_flags_and_vfs(p, flags, vfs::NAME),
            Some(p) => Connection::open_with_flags(p, flags),
            None => Connection::open_in_memory(),
        }
        .map_err(|e| store_error(op, &label, &e))?;
        let busy = busy::install(&mut conn, opts.busy_timeout_ms)
            .map_err(|e| store_error(op, &label, &e))?;
        let dialect = dialect(&label);
        let mut store = Self {
            checkpointer: None,
            conn,
            label: label.clone(),
            busy_timeout_ms: opts.busy_timeout_ms,
            busy,
        };
        // Refuse a foreign or newer database before `configure` writes to it (WAL mode is
        // recorded in the file's header): a refused file must stay byte for byte as it was.
        // A read transaction writes nothing.
        (&mut store as &mut dyn Store).read("applying schema migrations", |tx| {
            migrate::vet(tx, &dialect, &label)
        })?;
        store.configure(path.is_some(), opts)?;
        migrate::migrate(&mut store, &dialect, now_ms)?;
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
        // Also only on a new file: pages freed by `prune` can then be handed back to the file
        // system a few at a time (`reclaim`, inside short write transactions), so the file
        // shrinks without the whole-file rewrite and exclusive lock of a VACUUM. Unlike FULL,
        // INCREMENTAL costs no commit anything: pages move only when `reclaim` asks.
        self.conn
            .execute_batch("PRAGMA auto_vacuum = INCREMENTAL")
            .map_err(err)?;
        // journal_mode answers with the mode in force: WAL could be refused (e.g. a network
        // file system), and then concurrent readers would block writers. Fail loudly instead.
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(err)?;
        if is_file && !mode.eq_ignore_ascii_case("wal") {
            return Err(LedgerError::StoreError {
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
        // 8 MiB of page cache (SQLite's default is 2 MiB): a ledger's hot pages (the indexes'
        // upper levels, the newest attempts and events) stay in memory as the file grows.
        // Not more: 32 MiB made reserve + finish no faster on a ledger of 200 000 units, one
        // call at a time or in batches. (Without `pcache`, every commit after a balance that
        // renumbered pages would walk the whole cache, so its size would cost writes too.)
        // Memory is taken as pages are read, up to this.
        self.conn
            .execute_batch("PRAGMA cache_size = -8192")
            .map_err(err)?;
        let pragmas = self.pragmas_unchecked().map_err(err)?;
        let want_sync = sync.to_ascii_lowercase();
        if pragmas.synchronous != want_sync || !pragmas.foreign_keys {
            return Err(LedgerError::StoreError {
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

    /// `PRAGMA integrity_check` (or `quick_check`, which skips checking that every index
    /// matches its table): `["ok"]` when the file is sound.
    pub fn integrity_check(&self, quick: bool) -> Result<Vec<String>> {
        let pragma = if quick {
            "PRAGMA quick_check"
        } else {
            "PRAGMA integrity_check"
        };
        let run = || -> rusqlite::Result<Vec<String>> {
            let mut stmt = self.conn.prepare(pragma)?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect()
        };
        run().map_err(|e| store_error("checking integrity", &self.label, &e))
    }

    fn try_write(
        &mut self,
        op: &str,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> std::result::Result<(), Failure> {
        let tx = Tx::new(&self.conn, &self.label, op);
        tx.control("BEGIN IMMEDIATE")
            .map_err(|e| failure(op, &self.label, &e))?;
        match body(&tx) {
            Ok(()) => match tx.control("COMMIT") {
                Ok(()) => Ok(()),
                Err(e) => {
                    tx.rollback();
                    Err(failure(op, &self.label, &e))
                }
            },
            // A refused operation rolls back: nothing it wrote before refusing survives.
            Err(e) => {
                tx.rollback();
                if tx.busy() {
                    Err(Failure::Busy)
                } else {
                    Err(Failure::Fatal(e))
                }
            }
        }
    }
}

impl Store for SqliteStore {
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
                Err(Failure::Busy) => {
                    backoff.wait()?;
                }
                Err(Failure::Fatal(e)) => return Err(e),
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
        let tx = Tx::new(&self.conn, &self.label, op);
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

    fn integrity_check(&mut self, quick: bool) -> Result<Vec<String>> {
        SqliteStore::integrity_check(self, quick)
    }

    fn reclaim(&mut self, max_pages: u32) -> Result<u64> {
        let op = "reclaiming free pages";
        let label = self.label.clone();
        let read = |conn: &Connection, pragma: &str| -> Result<i64> {
            conn.query_row(pragma, [], |r| r.get(0))
                .map_err(|e| store_error(op, &label, &e))
        };
        // 2 = incremental; a file made before this library set it has 0 and keeps its free
        // pages for reuse (`fencepost doctor --vacuum` converts it).
        if read(&self.conn, "PRAGMA auto_vacuum")? != 2 {
            return Ok(0);
        }
        let page = read(&self.conn, "PRAGMA page_size")?;
        let before = read(&self.conn, "PRAGMA freelist_count")?;
        if before == 0 {
            return Ok(0);
        }
        // The pragma frees one page per step (each step answers an empty row), so it is read
        // to its end; executed as a script it would stop after the first page.
        let pragma = incremental_vacuum(max_pages);
        (self as &mut dyn Store).write(op, |tx| {
            tx.rows(pragma, crate::params![], |_| Ok(())).map(|_| ())
        })?;
        let after = read(&self.conn, "PRAGMA freelist_count")?;
        Ok(u64::try_from((before - after) * page).unwrap_or(0))
    }

    fn change_mark(&mut self) -> Result<(i64, i64)> {
        let version: i64 = self
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(|e| store_error("waiting for events", &self.label, &e))?;
        let own = i64::try_from(self.conn.total_changes()).unwrap_or(i64::MAX);
        Ok((version, own))
    }

    fn vacuum(&mut self) -> Result<()> {
        // auto_vacuum changes only with the rewrite that follows it.
        self.conn
            .execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM")
            .map_err(|e| store_error("vacuuming the database", &self.label, &e))
    }
}

/// `PRAGMA incremental_vacuum(2^k)` for k in 0..=16. The pragma takes no bound parameter, so
/// each size a reclaim asks for is one of these statements, made once.
fn incremental_vacuum(max_pages: u32) -> &'static crate::store::Sql {
    static PRAGMAS: std::sync::OnceLock<Vec<crate::store::Sql>> = std::sync::OnceLock::new();
    let pragmas = PRAGMAS.get_or_init(|| {
        (0..=16)
            .map(|k| {
                let text = format!("PRAGMA incremental_vacuum({})", 1_u32 << k);
                crate::store::Sql::same(Box::leak(text.into_boxed_str()))
            })
            .collect()
    });
    &pragmas[max_pages.max(1).ilog2().min(16) as usize]
}

/// Why one run of a write transaction failed.
enum Failure {
    /// The lock was busy: run it again after the backoff.
    Busy,
    /// Anything else: give up with this error.
    Fatal(LedgerError),
}

/// How a failed `BEGIN` or `COMMIT` ends the run: again if the lock was busy.
fn failure(op: &str, label: &str, err: &rusqlite::Error) -> Failure {
    let e = classify(label, err);
    if e.kind == DbErrorKind::Busy {
        Failure::Busy
    } else {
        Failure::Fatal(ledger_error(op, label, &e))
    }
}

#[cfg(test)]
mod tests;

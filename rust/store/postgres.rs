//! The PostgreSQL backend (DESIGN §6): the same operations over one connection to a server.
//!
//! Every operation is one transaction at READ COMMITTED. Writes on a run serialize on that run's
//! row lock (`SELECT ... FOR UPDATE`, [`Tx::lock_run`](crate::store::Tx::lock_run)), taken before
//! anything of the run is read, so the statements after it see the previous writer's commit;
//! writes on different runs never wait for each other. There is no table lock and no global
//! advisory lock on the operation path; migrations at open take one advisory lock so several
//! processes can open a fresh database at once.
//!
//! Contention is retried as a whole transaction, with jitter, inside the busy budget: a
//! deadlock or serialization failure, a `lock_timeout`, and a UNIQUE violation that a racing
//! insert caused (two processes reserving the same new run: the loser re-runs and finds the
//! winner's row). What is left surfaces as `StoreBusy`. A lost connection is reported naming the
//! host, and the next operation reconnects.
//!
//! Time: expiry is judged by the ledger's clock (the client's, injectable), exactly as on
//! SQLite. Hosts sharing a database must keep their clocks in sync (NTP); a lease should be far
//! longer than the skew between them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::time::Duration;

use bytes::BytesMut;
use postgres::error::SqlState;
use postgres::types::{to_sql_checked, IsNull, ToSql as PgToSql, Type};
use postgres::{Client, Config, NoTls, Statement};

use crate::errors::{LedgerError, Result};
use crate::store::{
    ledger_error, migrate, sql, Backend, Backoff, DbError, DbErrorKind, DbResult, Durability,
    OpenOptions, Pragmas, Row, Sql, SqlValue, Store, ToSql,
};

/// Whole-transaction retries of contention while time remains in the busy budget.
const MAX_BUSY_RETRIES: u32 = 12;
/// Re-runs after a UNIQUE race; a violation that survives them is not a race.
const MAX_UNIQUE_RETRIES: u32 = 3;
/// The advisory lock key migrations take (`fencepost` in ASCII, as a number).
const MIGRATION_LOCK: i64 = 0x6665_6e63_6570_6f73;
/// How long opening waits for the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to connect, parsed from the URL.
#[derive(Clone)]
struct Target {
    config: Config,
    schema: String,
    /// The URL without its password, for messages.
    label: String,
    /// `host:port`, for connection messages.
    server: String,
}

/// A schema name fencepost accepts: a plain lowercase SQL identifier, so it never needs
/// quoting rules beyond double quotes.
fn check_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "schema",
            format!(
                "{schema:?} is not a schema fencepost can use; use 1-63 lowercase letters, digits \
                 and underscores, starting with a letter or underscore (not pg_)"
            ),
        ))
    }
}

impl Target {
    /// Parse `postgresql://user[:password]@host[:port]/db[?schema=name&...]`; `schema` (the
    /// keyword) must agree with the URL's if both are given.
    fn parse(url: &str, schema: Option<&str>) -> Result<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut url_schema = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", v)) => url_schema = Some(v.to_owned()),
                _ => rest.push(pair),
            }
        }
        let schema = match (schema, url_schema.as_deref()) {
            (Some(k), Some(u)) if k != u => {
                return Err(LedgerError::invalid(
                    "schema",
                    format!("the keyword says {k:?} but the URL says {u:?}; give one"),
                ))
            }
            (Some(k), _) => k.to_owned(),
            (None, Some(u)) => u.to_owned(),
            (None, None) => "public".to_owned(),
        };
        check_schema(&schema)?;
        let conninfo = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        let mut config: Config = conninfo.parse().map_err(|e: postgres::Error| {
            LedgerError::invalid(
                "target",
                format!(
                    "is not a PostgreSQL URL fencepost can use ({}); write \
                     postgresql://user@host:port/database",
                    scrub(&e.to_string(), None)
                ),
            )
        })?;
        config
            .application_name("fencepost")
            .connect_timeout(CONNECT_TIMEOUT);
        let host = config.get_hosts().first().map_or_else(
            || "localhost".to_owned(),
            |h| match h {
                postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                postgres::config::Host::Unix(path) => path.display().to_string(),
            },
        );
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().unwrap_or("postgres").to_owned();
        let db = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(Self {
            label: format!("postgresql://{user}@{host}:{port}/{db}?schema={schema}"),
            server: format!("{host}:{port}"),
            config,
            schema,
        })
    }

    fn connect(&self) -> Result<Client> {
        self.config.connect(NoTls).map_err(|e| {
            let password = self.config.get_password();
            LedgerError::Store {
                operation: "connecting to PostgreSQL".into(),
                message: format!(
                    "cannot connect to PostgreSQL at {} ({}); check that the server is running \
                     and reachable, and the URL's user, database and credentials",
                    self.server,
                    scrub(&error_text(&e), password)
                ),
            }
        })
    }
}

/// Remove a password from a message, in case a driver ever echoes it.
fn scrub(text: &str, password: Option<&[u8]>) -> String {
    match password.and_then(|p| std::str::from_utf8(p).ok()) {
        Some(p) if !p.is_empty() => text.replace(p, "***"),
        _ => text.to_owned(),
    }
}

/// The most useful text of a driver error: the server's message (and detail) if it sent one.
fn error_text(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return match db.detail() {
            Some(detail) => format!("{}: {detail}", db.message()),
            None => db.message().to_owned(),
        };
    }
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Classify a driver error.
fn classify(target: &Target, e: &postgres::Error) -> DbError {
    if let Some(code) = e.code() {
        if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::LOCK_NOT_AVAILABLE
        {
            return DbError::new(
                DbErrorKind::Busy,
                format!(
                    "{} stayed locked by another writer ({})",
                    target.label,
                    error_text(e)
                ),
            );
        }
        if *code == SqlState::UNIQUE_VIOLATION {
            let constraint = e
                .as_db_error()
                .and_then(|d| d.constraint())
                .unwrap_or_default()
                .to_owned();
            return DbError::new(DbErrorKind::Unique { target: constraint }, error_text(e));
        }
        if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
        {
            return unavailable(target, e);
        }
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return DbError::new(
                DbErrorKind::Unavailable,
                format!(
                    "the PostgreSQL user of {} may not do this ({}); grant it rights on schema {}",
                    target.label,
                    error_text(e),
                    target.schema
                ),
            );
        }
        return DbError::new(DbErrorKind::Other, error_text(e));
    }
    // Only a closed session or a failed socket means the connection is gone (and is rebuilt
    // on the next call); a value the driver could not bind or decode is an ordinary error.
    let io = e
        .source()
        .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some());
    if e.is_closed() || io {
        return unavailable(target, e);
    }
    DbError::new(DbErrorKind::Other, error_text(e))
}

fn unavailable(target: &Target, e: &postgres::Error) -> DbError {
    DbError::new(
        DbErrorKind::Unavailable,
        format!(
            "lost the connection to PostgreSQL at {} ({}); check that the server is running, \
             then retry (fencepost reconnects on the next call)",
            target.server,
            scrub(&error_text(e), target.config.get_password())
        ),
    )
}

/// Rewrite `?N` placeholders to PostgreSQL's `$N`. The ledger's SQL has no `?` anywhere else
/// (no string literal holds one).
fn placeholders(text: &str) -> String {
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

/// One PostgreSQL connection with its settings checked and its statements cached.
pub struct PgStore {
    client: Client,
    target: Target,
    opts: OpenOptions,
    /// Prepared statements by their SQL text (each `Sql` is a `'static` constant).
    statements: HashMap<&'static str, Statement>,
    /// A call met a dead session: reconnect before the next one, even if the driver has not
    /// noticed the socket closing yet.
    broken: bool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("label", &self.target.label)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connect to `url`, choose the schema (`?schema=` or `schema`), apply the session settings
    /// and migrate.
    pub fn open(url: &str, schema: Option<&str>, opts: &OpenOptions, now_ms: i64) -> Result<Self> {
        let target = Target::parse(url, schema)?;
        let client = target.connect()?;
        let mut store = Self {
            client,
            target,
            opts: opts.clone(),
            statements: HashMap::new(),
            broken: false,
        };
        store.configure()?;
        store.migrate(now_ms)?;
        Ok(store)
    }

    fn fail(&self, op: &str, e: &postgres::Error) -> LedgerError {
        ledger_error(op, &self.target.label, &classify(&self.target, e))
    }

    /// Session settings: the schema, the busy budget as `lock_timeout` (a writer waiting on a
    /// run's row lock gives up and retries, then reports `StoreBusy`), and durability.
    /// `normal` is `synchronous_commit = off`: the analogue of SQLite's WAL + NORMAL, a crash
    /// may lose the last commits but never consistency; `full` waits for the WAL flush.
    fn configure(&mut self) -> Result<()> {
        let sync = match self.opts.durability {
            Durability::Normal => "off",
            Durability::Full => "on",
        };
        let settings = format!(
            "SET search_path TO \"{}\"; SET lock_timeout = {}; SET synchronous_commit = {sync}; \
             SET default_transaction_isolation = 'read committed'",
            self.target.schema,
            self.opts.busy_timeout_ms.max(1)
        );
        self.client
            .batch_execute(&settings)
            .map_err(|e| self.fail("configuring the database", &e))
    }

    /// Apply pending migrations under an advisory lock: concurrent openers of a fresh database
    /// wait for the first, then find nothing to do.
    fn migrate(&mut self, now_ms: i64) -> Result<()> {
        let op = "applying schema migrations";
        // Borrowed field by field: the transaction holds the client, messages read the target.
        let target = &self.target;
        let (schema, label) = (&target.schema, &target.label);
        let fail = |e: postgres::Error| ledger_error(op, label, &classify(target, &e));
        let mut tx = self.client.transaction().map_err(fail)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .map_err(fail)?;
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .map_err(fail)?;
        let has_ledger: i64 = tx
            .query_one(
                "SELECT count(*) FROM information_schema.tables
                 WHERE table_schema = $1 AND table_name = 'schema_migrations'",
                &[schema],
            )
            .map_err(fail)?
            .get(0);
        if has_ledger == 0 {
            // A schema with tables but no migration ledger belongs to someone else.
            let foreign: i64 = tx
                .query_one(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
                    &[schema],
                )
                .map_err(fail)?
                .get(0);
            if foreign > 0 {
                return Err(LedgerError::Store {
                    operation: op.into(),
                    message: format!(
                        "schema {schema} of {label} holds other tables and no schema_migrations; \
                         it is not a fencepost ledger: choose another schema (?schema=)"
                    ),
                });
            }
            tx.batch_execute(
                "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY,
                 name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
            )
            .map_err(fail)?;
        }
        let applied: Vec<(i64, String)> = tx
            .query(
                "SELECT version, name FROM schema_migrations ORDER BY version",
                &[],
            )
            .map_err(fail)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        for m in migrate::pending(&applied, migrate::POSTGRES_MIGRATIONS, label)? {
            let step = format!("applying schema migration {} ({})", m.version, m.name);
            let fail_step = |e: postgres::Error| ledger_error(&step, label, &classify(target, &e));
            tx.batch_execute(m.sql).map_err(fail_step)?;
            tx.execute(
                "INSERT INTO schema_migrations(version, name, applied_at) VALUES ($1, $2, $3)",
                &[&m.version, &m.name, &now_ms],
            )
            .map_err(fail_step)?;
        }
        tx.commit().map_err(fail)
    }

    /// Reconnect after the server dropped the connection (a restart, a failover, an idle
    /// timeout): a new session with the same settings and an empty statement cache.
    fn ensure_connected(&mut self) -> Result<()> {
        if !self.broken && !self.client.is_closed() {
            return Ok(());
        }
        self.client = self.target.connect()?;
        self.statements.clear();
        self.broken = false;
        self.configure()
    }

    fn run_once(
        &mut self,
        op: &str,
        begin: &str,
        commit: bool,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> std::result::Result<(), Attempt> {
        let target = &self.target;
        if let Err(e) = self.client.batch_execute(begin) {
            self.broken = classify(target, &e).kind == DbErrorKind::Unavailable;
            return Err(Attempt::from_pg(op, target, &e));
        }
        let tx = Tx {
            client: RefCell::new(&mut self.client),
            statements: RefCell::new(&mut self.statements),
            target,
            op,
            retry: Cell::new(None),
            locked: RefCell::new(Vec::new()),
            savepoint: Cell::new(0),
            lost: Cell::new(false),
        };
        let out = body(&tx);
        let retry = tx.retry.get();
        self.broken = tx.lost.get();
        drop(tx);
        match out {
            Ok(()) if commit => self.client.batch_execute("COMMIT").map_err(|e| {
                self.broken = classify(target, &e).kind == DbErrorKind::Unavailable;
                Attempt::from_pg(op, target, &e)
            }),
            Ok(()) => {
                let _ = self.client.batch_execute("ROLLBACK");
                Ok(())
            }
            Err(e) => {
                // Nothing the refused operation wrote survives. A failed ROLLBACK means the
                // connection is gone, which the next call repairs.
                let _ = self.client.batch_execute("ROLLBACK");
                match retry {
                    Some(kind) => Err(Attempt::Retry(kind, e)),
                    None => Err(Attempt::Failed(e)),
                }
            }
        }
    }
}

/// Why one transaction attempt ended.
enum Attempt {
    /// Contention or a race: re-run the whole transaction. The error is what to report if the
    /// retries run out on a race.
    Retry(RetryKind, LedgerError),
    /// Anything else: give up with this error.
    Failed(LedgerError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryKind {
    Busy,
    Unique,
}

impl Attempt {
    fn from_pg(op: &str, target: &Target, e: &postgres::Error) -> Self {
        let err = classify(target, e);
        let ledger = ledger_error(op, &target.label, &err);
        match err.kind {
            DbErrorKind::Busy => Self::Retry(RetryKind::Busy, ledger),
            _ => Self::Failed(ledger),
        }
    }
}

impl Store for PgStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn label(&self) -> &str {
        &self.target.label
    }

    fn write_dyn(
        &mut self,
        op: &str,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> Result<()> {
        self.ensure_connected()?;
        let mut backoff = Backoff::new(self.opts.busy_timeout_ms, MAX_BUSY_RETRIES);
        let mut unique_retries = 0u32;
        loop {
            match self.run_once(op, "BEGIN", true, body) {
                Ok(()) => return Ok(()),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Retry(RetryKind::Unique, e)) => {
                    // The race's winner has committed: re-running sees its row at once.
                    unique_retries += 1;
                    if unique_retries > MAX_UNIQUE_RETRIES {
                        return Err(e);
                    }
                }
                Err(Attempt::Retry(RetryKind::Busy, _)) => {
                    backoff.wait()?;
                }
            }
        }
    }

    /// REPEATABLE READ, read only: one snapshot for every statement of the read, as SQLite's
    /// read transaction gives.
    fn read_dyn(
        &mut self,
        op: &str,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> Result<()> {
        self.ensure_connected()?;
        match self.run_once(
            op,
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            false,
            body,
        ) {
            Ok(()) => Ok(()),
            Err(Attempt::Failed(e) | Attempt::Retry(_, e)) => Err(e),
        }
    }

    fn pragmas(&mut self) -> Result<Pragmas> {
        self.ensure_connected()?;
        let op = "reading settings";
        let row = self
            .client
            .query_one(
                "SELECT current_setting('synchronous_commit'), current_setting('lock_timeout'),
                   (SELECT coalesce(max(version), 0) FROM schema_migrations)",
                &[],
            )
            .map_err(|e| self.fail(op, &e))?;
        let sync: String = row.get(0);
        let lock_timeout: String = row.get(1);
        Ok(Pragmas {
            journal_mode: "postgresql".into(),
            synchronous: if sync == "off" || sync == "local" {
                "normal".into()
            } else {
                "full".into()
            },
            busy_timeout: parse_ms(&lock_timeout),
            foreign_keys: true,
            schema_version: row.get(2),
        })
    }

    /// PostgreSQL checks its own pages; this checks the ledger's side: the schema is at this
    /// library's version and every table the operations use answers.
    fn integrity_check(&mut self) -> Result<Vec<String>> {
        let version = self.pragmas()?.schema_version;
        if version != migrate::SCHEMA_VERSION {
            return Ok(vec![format!(
                "schema version {version}, expected {}",
                migrate::SCHEMA_VERSION
            )]);
        }
        let op = "checking integrity";
        for table in [
            "blobs",
            "definitions",
            "runs",
            "steps",
            "units",
            "attempts",
            "leases",
            "events",
        ] {
            self.client
                .batch_execute(&format!("SELECT 1 FROM {table} LIMIT 1"))
                .map_err(|e| self.fail(op, &e))?;
        }
        Ok(vec!["ok".into()])
    }
}

/// `lock_timeout` as PostgreSQL shows it (`5s`, `250ms`, `1min`, `0`) in milliseconds.
fn parse_ms(setting: &str) -> i64 {
    let digits: String = setting.chars().take_while(char::is_ascii_digit).collect();
    let n: i64 = digits.parse().unwrap_or(0);
    match &setting[digits.len()..] {
        "s" => n * 1000,
        "min" => n * 60_000,
        "h" => n * 3_600_000,
        _ => n,
    }
}

/// An open transaction on the connection.
pub struct Tx<'a> {
    client: RefCell<&'a mut Client>,
    statements: RefCell<&'a mut HashMap<&'static str, Statement>>,
    target: &'a Target,
    op: &'a str,
    /// Set when a statement failed in a way that re-running the transaction can cure.
    retry: Cell<Option<RetryKind>>,
    /// Runs whose row lock this transaction holds.
    locked: RefCell<Vec<String>>,
    /// Savepoints taken (for statements whose failure the caller interprets).
    savepoint: Cell<u32>,
    /// A statement met a dead session.
    lost: Cell<bool>,
}

impl Tx<'_> {
    fn classify(&self, e: &postgres::Error, interpret: bool) -> DbError {
        let err = classify(self.target, e);
        match &err.kind {
            DbErrorKind::Busy => self.retry.set(Some(RetryKind::Busy)),
            DbErrorKind::Unique { .. } if !interpret => self.retry.set(Some(RetryKind::Unique)),
            DbErrorKind::Unavailable => self.lost.set(true),
            _ => {}
        }
        err
    }

    fn statement(&self, text: &'static str) -> std::result::Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.borrow().get(text) {
            return Ok(s.clone());
        }
        let prepared = self.client.borrow_mut().prepare(&placeholders(text))?;
        self.statements.borrow_mut().insert(text, prepared.clone());
        Ok(prepared)
    }

    fn run<T>(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        interpret: bool,
        f: impl FnOnce(
            &mut Client,
            &Statement,
            &[&(dyn postgres::types::ToSql + Sync)],
        ) -> std::result::Result<T, postgres::Error>,
    ) -> DbResult<T> {
        let stmt = self
            .statement(sql.postgres)
            .map_err(|e| self.classify(&e, interpret))?;
        let values: Vec<Bind<'_>> = params.iter().map(|p| Bind(p.to_sql())).collect();
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn postgres::types::ToSql + Sync))
            .collect();
        if !interpret {
            let mut client = self.client.borrow_mut();
            return f(&mut client, &stmt, &refs).map_err(|e| self.classify(&e, false));
        }
        // PostgreSQL aborts the whole transaction on a failed statement; a savepoint keeps it
        // usable so the caller can act on the failure (the scope guard names its occupant).
        let n = self.savepoint.get() + 1;
        self.savepoint.set(n);
        let mut client = self.client.borrow_mut();
        client
            .batch_execute(&format!("SAVEPOINT fp_{n}"))
            .map_err(|e| self.classify(&e, true))?;
        match f(&mut client, &stmt, &refs) {
            Ok(v) => {
                client
                    .batch_execute(&format!("RELEASE SAVEPOINT fp_{n}"))
                    .map_err(|e| self.classify(&e, true))?;
                Ok(v)
            }
            Err(e) => {
                let err = self.classify(&e, true);
                client
                    .batch_execute(&format!("ROLLBACK TO SAVEPOINT fp_{n}"))
                    .map_err(|e| self.classify(&e, true))?;
                Err(err)
            }
        }
    }
}

/// A parameter bound to whatever type PostgreSQL inferred for its placeholder: integers fit
/// `BIGINT`, `INTEGER` (a literal such as `?1 = 1` infers one), `SMALLINT` or `BOOLEAN`.
#[derive(Debug)]
struct Bind<'a>(SqlValue<'a>);

impl postgres::types::ToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self.0 {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Int(v) => match *ty {
                Type::INT8 => PgToSql::to_sql(&v, ty, out),
                Type::INT4 => PgToSql::to_sql(&i32::try_from(v)?, ty, out),
                Type::INT2 => PgToSql::to_sql(&i16::try_from(v)?, ty, out),
                Type::BOOL => PgToSql::to_sql(&(v != 0), ty, out),
                _ => Err(format!("cannot bind an integer to a {ty} parameter").into()),
            },
            SqlValue::Text(s) => PgToSql::to_sql(&s, ty, out),
            SqlValue::Blob(b) => PgToSql::to_sql(&b, ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A driver row behind the neutral [`Row`].
struct PgRow<'a>(&'a postgres::Row);

impl Row for PgRow<'_> {
    fn value(&self, index: usize) -> DbResult<SqlValue<'_>> {
        let type_error = |e: postgres::Error| DbError::new(DbErrorKind::Type, e.to_string());
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
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn execute(&self, sql: &Sql, params: &[&dyn ToSql], interpret: bool) -> DbResult<usize> {
        if sql.postgres.is_empty() {
            return Ok(0);
        }
        let n = self.run(sql, params, interpret, |c, s, p| c.execute(s, p))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn query(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        each: &mut dyn FnMut(&dyn Row) -> DbResult<bool>,
    ) -> DbResult<()> {
        if sql.postgres.is_empty() {
            return Ok(());
        }
        let rows = self.run(sql, params, false, |c, s, p| c.query(s, p))?;
        for row in &rows {
            if !each(&PgRow(row))? {
                break;
            }
        }
        Ok(())
    }

    fn fail(&self, err: &DbError) -> LedgerError {
        ledger_error(self.op, &self.target.label, err)
    }

    fn lock_run(&self, run_id: &str) -> Result<()> {
        if self.locked.borrow().iter().any(|r| r == run_id) {
            return Ok(());
        }
        let mut found = false;
        crate::store::Tx::query(
            self,
            &sql::LOCK_RUN_SQL,
            crate::params![run_id],
            &mut |_| {
                found = true;
                Ok(false)
            },
        )
        .map_err(|e| crate::store::Tx::fail(self, &e))?;
        if !found {
            crate::store::Tx::query(
                self,
                &sql::LOCK_NEW_RUN_SQL,
                crate::params![run_id],
                &mut |_| Ok(false),
            )
            .map_err(|e| crate::store::Tx::fail(self, &e))?;
        }
        self.locked.borrow_mut().push(run_id.to_owned());
        Ok(())
    }
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

    #[test]
    fn targets_parse_and_hide_the_password() {
        let t = Target::parse(
            "postgresql://alice:s3cret@db.example:6543/app?schema=t1",
            None,
        )
        .unwrap();
        assert_eq!(t.schema, "t1");
        assert_eq!(t.server, "db.example:6543");
        assert!(!t.label.contains("s3cret"), "{}", t.label);
        let t = Target::parse("postgresql://bob@h/d", Some("tenant_a")).unwrap();
        assert_eq!(t.schema, "tenant_a");
        assert!(Target::parse("postgresql://bob@h/d?schema=a", Some("b")).is_err());
        assert!(Target::parse("postgresql://bob@h/d?schema=Bad-Name", None).is_err());
        assert!(Target::parse("postgresql://bob@h/d?schema=pg_catalog", None).is_err());
        assert_eq!(
            Target::parse("postgresql://bob@h/d", None).unwrap().schema,
            "public"
        );
    }

    #[test]
    fn lock_timeout_settings_parse() {
        assert_eq!(parse_ms("5s"), 5000);
        assert_eq!(parse_ms("250ms"), 250);
        assert_eq!(parse_ms("1min"), 60_000);
        assert_eq!(parse_ms("0"), 0);
    }

    #[test]
    fn a_refused_connection_names_the_server_not_the_password() {
        // Port 1 on loopback: nothing listens there.
        let err = PgStore::open(
            "postgresql://u:hunter2@127.0.0.1:1/x",
            None,
            &OpenOptions::default(),
            0,
        )
        .unwrap_err();
        let text = format!("{err:?}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}

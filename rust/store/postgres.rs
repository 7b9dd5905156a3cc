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

mod tls;

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql as PgToSql, Type};
use tokio_postgres::{Client, Config, Error as PgError, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

type PgResult<T> = std::result::Result<T, PgError>;

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
    /// TLS as `sslmode`/`sslrootcert` ask (see `tls`); the driver's own `ssl_mode` is set to
    /// match in `config`.
    tls: MakeRustlsConnect,
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
        let (mut url_sslmode, mut sslrootcert) = (None, None);
        let mut rest = Vec::new();
        // fencepost reads these itself: the driver knows neither `schema` nor `sslrootcert`,
        // nor the `verify-*` modes.
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", v)) => url_schema = Some(v.to_owned()),
                Some(("sslmode", v)) => url_sslmode = Some(v.to_owned()),
                Some(("sslrootcert", v)) => sslrootcert = Some(percent_decode(v)),
                _ => rest.push(pair),
            }
        }
        let ssl_mode = tls::SslMode::parse(url_sslmode.as_deref())?;
        let tls = tls::connector(ssl_mode, sslrootcert.as_deref())?;
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
        let mut config: Config = conninfo.parse().map_err(|e: PgError| {
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
            .connect_timeout(CONNECT_TIMEOUT)
            .ssl_mode(ssl_mode.driver());
        let host = config.get_hosts().first().map_or_else(
            || "localhost".to_owned(),
            |h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            },
        );
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().unwrap_or("postgres").to_owned();
        let db = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(Self {
            label: format!("postgresql://{user}@{host}:{port}/{db}?schema={schema}"),
            server: format!("{host}:{port}"),
            config,
            tls,
            schema,
        })
    }

    /// Connect on `runtime`; the connection's task is spawned there and runs whenever the
    /// store waits on a request.
    fn connect(&self, runtime: &Runtime) -> Result<(Client, JoinHandle<()>)> {
        let connecting = self.config.connect(self.tls.clone());
        let (client, connection) = runtime.block_on(connecting).map_err(|e| {
            let password = self.config.get_password();
            let text = scrub(&error_text(&e), password);
            let check = if text.contains("certificate") || text.contains("TLS") {
                "check the URL's sslmode and sslrootcert (README \"PostgreSQL\": TLS)"
            } else {
                "check that the server is running and reachable, and the URL's user, database \
                 and credentials"
            };
            LedgerError::Store {
                operation: "connecting to PostgreSQL".into(),
                message: format!(
                    "cannot connect to PostgreSQL at {} ({text}); {check}",
                    self.server
                ),
            }
        })?;
        // The task's own error (the socket closing) reaches the client's next request.
        let task = runtime.spawn(async move {
            let _ = connection.await;
        });
        Ok((client, task))
    }
}

/// `%XX` escapes of a URL query value decoded (a path may need them); anything malformed is
/// kept as written.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Remove a password from a message, in case a driver ever echoes it.
fn scrub(text: &str, password: Option<&[u8]>) -> String {
    match password.and_then(|p| std::str::from_utf8(p).ok()) {
        Some(p) if !p.is_empty() => text.replace(p, "***"),
        _ => text.to_owned(),
    }
}

/// The most useful text of a driver error: the server's message (and detail) if it sent one.
fn error_text(e: &PgError) -> String {
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
fn classify(target: &Target, e: &PgError) -> DbError {
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

fn unavailable(target: &Target, e: &PgError) -> DbError {
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

/// Drop `schema` of the database at `url` with everything in it (the tests' fresh schemas).
#[cfg(test)]
pub(crate) fn drop_schema(url: &str, schema: &str) -> Result<()> {
    let target = Target::parse(url, Some(schema))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LedgerError::Store {
            operation: "dropping a test schema".into(),
            message: e.to_string(),
        })?;
    let (client, task) = target.connect(&runtime)?;
    let text = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", target.schema);
    let out = runtime.block_on(client.batch_execute(&text)).map_err(|e| {
        ledger_error(
            "dropping a test schema",
            &target.label,
            &classify(&target, &e),
        )
    });
    drop(client);
    let _ = runtime.block_on(task);
    out
}

/// One PostgreSQL connection with its settings checked and its statements cached.
///
/// The driver is `tokio-postgres` on a private single-thread runtime, driven synchronously
/// (`block_on`, with the GIL released by the caller), because only the asynchronous client
/// pipelines: a transaction sends the statements whose results it does not read together with
/// the next one it does read, or with the `COMMIT` (see [`Tx`]). On this loopback a round trip
/// costs more than executing any ledger statement, so round trips are the unit of cost here.
pub struct PgStore {
    /// Runs the connection task and every request of this ledger, one at a time.
    runtime: Runtime,
    /// `None` only while being dropped.
    client: Option<Client>,
    /// The connection task: it ends when the client is dropped or the server goes away.
    task: Option<JoinHandle<()>>,
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

impl Drop for PgStore {
    /// Close politely: dropping the client makes the connection task send Terminate and end;
    /// wait (briefly) for it so the server does not log an abandoned session.
    fn drop(&mut self) {
        drop(self.client.take());
        if let Some(task) = self.task.take() {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(1), task).await });
        }
    }
}

impl PgStore {
    /// Connect to `url`, choose the schema (`?schema=` or `schema`), apply the session settings
    /// and migrate.
    pub fn open(url: &str, schema: Option<&str>, opts: &OpenOptions, now_ms: i64) -> Result<Self> {
        let target = Target::parse(url, schema)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LedgerError::Store {
                operation: "connecting to PostgreSQL".into(),
                message: format!("cannot start the connection's I/O driver ({e})"),
            })?;
        let (client, task) = target.connect(&runtime)?;
        let mut store = Self {
            runtime,
            client: Some(client),
            task: Some(task),
            target,
            opts: opts.clone(),
            statements: HashMap::new(),
            broken: false,
        };
        store.configure()?;
        store.migrate(now_ms)?;
        Ok(store)
    }

    fn client(&self) -> Result<&Client> {
        self.client.as_ref().ok_or_else(|| LedgerError::Store {
            operation: "using the connection".into(),
            message: format!("the connection to {} is closed", self.target.label),
        })
    }

    /// Run one request to completion.
    fn block<'s, T, F: Future<Output = PgResult<T>>>(
        &'s self,
        op: &str,
        request: impl FnOnce(&'s Client) -> F,
    ) -> Result<T> {
        let client = self.client()?;
        self.runtime
            .block_on(request(client))
            .map_err(|e| self.fail(op, &e))
    }

    fn fail(&self, op: &str, e: &PgError) -> LedgerError {
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
        self.block("configuring the database", |c| c.batch_execute(&settings))
    }

    /// Apply pending migrations under an advisory lock: concurrent openers of a fresh database
    /// wait for the first, then find nothing to do.
    fn migrate(&mut self, now_ms: i64) -> Result<()> {
        let op = "applying schema migrations";
        let target = &self.target;
        let (schema, label) = (&target.schema, &target.label);
        let create = self.opts.create;
        let fail = |e: PgError| ledger_error(op, label, &classify(target, &e));
        let client = self.client.as_mut().ok_or_else(|| LedgerError::Store {
            operation: op.into(),
            message: format!("the connection to {label} is closed"),
        })?;
        self.runtime.block_on(async {
            let tx = client.transaction().await.map_err(fail)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(fail)?;
            let has_ledger: i64 = tx
                .query_one(
                    "SELECT count(*) FROM information_schema.tables
                     WHERE table_schema = $1 AND table_name = 'schema_migrations'",
                    &[schema],
                )
                .await
                .map_err(fail)?
                .get(0);
            if has_ledger == 0 {
                // A schema with tables but no migration ledger belongs to someone else.
                let foreign: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
                        &[schema],
                    )
                    .await
                    .map_err(fail)?
                    .get(0);
                if foreign > 0 {
                    return Err(LedgerError::Store {
                        operation: op.into(),
                        message: format!(
                            "schema {schema} of {label} holds other tables and no \
                             schema_migrations; it is not a fencepost ledger: choose another \
                             schema (?schema=)"
                        ),
                    });
                }
                // `create=False` (inspection tools): a missing ledger is an error, and the
                // schema is not created on the way to reporting it.
                if !create {
                    return Err(LedgerError::Store {
                        operation: "opening the database".into(),
                        message: format!(
                            "there is no fencepost ledger in schema {schema} of {label}; check \
                             the URL's database and ?schema= (opening with create=False never \
                             makes one)"
                        ),
                    });
                }
                tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                    .await
                    .map_err(fail)?;
                tx.batch_execute(
                    "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY,
                     name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
                )
                .await
                .map_err(fail)?;
            }
            let applied: Vec<(i64, String)> = tx
                .query(
                    "SELECT version, name FROM schema_migrations ORDER BY version",
                    &[],
                )
                .await
                .map_err(fail)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            for m in migrate::pending(&applied, migrate::POSTGRES_MIGRATIONS, label)? {
                let step = format!("applying schema migration {} ({})", m.version, m.name);
                let fail_step = |e: PgError| ledger_error(&step, label, &classify(target, &e));
                tx.batch_execute(m.sql).await.map_err(fail_step)?;
                tx.execute(
                    "INSERT INTO schema_migrations(version, name, applied_at) VALUES ($1, $2, $3)",
                    &[&m.version, &m.name, &now_ms],
                )
                .await
                .map_err(fail_step)?;
            }
            tx.commit().await.map_err(fail)
        })
    }

    /// Reconnect after the server dropped the connection (a restart, a failover, an idle
    /// timeout): a new session with the same settings and an empty statement cache.
    fn ensure_connected(&mut self) -> Result<()> {
        if !self.broken && self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        drop(self.client.take());
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let (client, task) = self.target.connect(&self.runtime)?;
        self.client = Some(client);
        self.task = Some(task);
        self.statements.clear();
        self.broken = false;
        self.configure()
    }

    /// One attempt at a transaction. `BEGIN` is not sent on its own: it is queued, and goes out
    /// with the body's first statement (a body that sends nothing costs no round trip at all).
    fn run_once(
        &mut self,
        op: &str,
        begin: &'static str,
        commit: bool,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> std::result::Result<(), Attempt> {
        let target = &self.target;
        let Some(client) = self.client.as_ref() else {
            return Err(Attempt::Failed(LedgerError::Store {
                operation: op.into(),
                message: format!("the connection to {} is closed", target.label),
            }));
        };
        let tx = Tx {
            runtime: &self.runtime,
            client,
            statements: RefCell::new(&mut self.statements),
            target,
            op,
            queued: RefCell::new(vec![Queued::Simple(begin.into())]),
            sent: Cell::new(false),
            retry: Cell::new(None),
            locked: RefCell::new(Vec::new()),
            savepoint: Cell::new(0),
            lost: Cell::new(false),
        };
        let mut out = body(&tx);
        if out.is_ok() && commit && (tx.sent.get() || tx.queued.borrow().len() > 1) {
            // The writes the body left queued go out with the COMMIT, in one round trip. If one
            // of them fails, the server answers the COMMIT with a rollback: nothing is written.
            out = tx
                .send(Some(Req::Simple("COMMIT")), false)
                .map(|_| ())
                .map_err(|e| crate::store::Tx::fail(&tx, &e));
        } else {
            // A read, or a refused write: end the transaction (a failed ROLLBACK means the
            // connection is gone, which the next call repairs).
            tx.roll_back();
        }
        let (retry, lost) = (tx.retry.get(), tx.lost.get());
        drop(tx);
        self.broken = lost;
        match out {
            Ok(()) => Ok(()),
            // After a failed COMMIT pipeline the transaction is over too: the server answered
            // the COMMIT of an aborted transaction with a rollback.
            Err(e) => match retry {
                Some(kind) => Err(Attempt::Retry(kind, e)),
                None => Err(Attempt::Failed(e)),
            },
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

    /// One autocommit statement, before the reader's transaction takes its snapshot.
    fn event_horizon(&mut self) -> Result<Option<i64>> {
        self.ensure_connected()?;
        let row = self.block("reading events", |c| {
            c.query_one(sql::EVENT_HORIZON_SQL, &[])
        })?;
        Ok(row.get(0))
    }

    fn pragmas(&mut self) -> Result<Pragmas> {
        self.ensure_connected()?;
        let row = self.block("reading settings", |c| {
            c.query_one(
                "SELECT current_setting('synchronous_commit'), current_setting('lock_timeout'),
                   (SELECT coalesce(max(version), 0) FROM schema_migrations),
                   coalesce((SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl),
                            'off')",
                &[],
            )
        })?;
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
            tls: Some(row.get(3)),
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
            let text = format!("SELECT 1 FROM {table} LIMIT 1");
            self.block("checking integrity", |c| c.batch_execute(&text))?;
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

/// The most requests a transaction queues before it sends them (a long one-by-one batch).
const MAX_QUEUED: usize = 64;

/// A request queued to go out with the next one the transaction waits for.
enum Queued {
    /// A command without parameters (`BEGIN`, `RELEASE SAVEPOINT ...`).
    Simple(Cow<'static, str>),
    /// A prepared statement and its parameters, owned until sent.
    Exec(Statement, Vec<Owned>),
}

impl Queued {
    fn req(&self) -> Req<'_> {
        match self {
            Self::Simple(text) => Req::Simple(text),
            Self::Exec(statement, values) => {
                Req::Exec(statement, values.iter().map(|v| Bind(v.value())).collect())
            }
        }
    }
}

/// A parameter value owned by a queued statement.
enum Owned {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
}

impl Owned {
    fn of(value: SqlValue<'_>) -> Self {
        match value {
            SqlValue::Null => Self::Null,
            SqlValue::Int(v) => Self::Int(v),
            SqlValue::Text(s) => Self::Text(s.to_owned()),
            SqlValue::Blob(b) => Self::Blob(b.to_vec()),
        }
    }

    fn value(&self) -> SqlValue<'_> {
        match self {
            Self::Null => SqlValue::Null,
            Self::Int(v) => SqlValue::Int(*v),
            Self::Text(s) => SqlValue::Text(s),
            Self::Blob(b) => SqlValue::Blob(b),
        }
    }
}

/// One request of a pipeline.
enum Req<'r> {
    Simple(&'r str),
    Exec(&'r Statement, Vec<Bind<'r>>),
    Query(&'r Statement, Vec<Bind<'r>>),
}

/// Its answer.
enum Resp {
    Done,
    Count(u64),
    Rows(Vec<tokio_postgres::Row>),
}

type Pending<'f, T> = Pin<Box<dyn Future<Output = T> + 'f>>;

fn request<'f>(client: &'f Client, req: &'f Req<'f>) -> Pending<'f, PgResult<Resp>> {
    fn refs<'b>(binds: &'b [Bind<'_>]) -> Vec<&'b (dyn PgToSql + Sync)> {
        binds.iter().map(|b| b as &(dyn PgToSql + Sync)).collect()
    }
    match req {
        Req::Simple(text) => {
            Box::pin(async move { client.batch_execute(text).await.map(|()| Resp::Done) })
        }
        Req::Exec(statement, binds) => Box::pin(async move {
            client
                .execute(*statement, &refs(binds))
                .await
                .map(Resp::Count)
        }),
        Req::Query(statement, binds) => {
            Box::pin(async move { client.query(*statement, &refs(binds)).await.map(Resp::Rows) })
        }
    }
}

/// Poll `futures` in order until all are done: each one's first poll sends its request, so
/// the requests leave in order, back to back, before the first answer is awaited.
async fn in_order<T>(mut futures: Vec<Pending<'_, T>>) -> Vec<T> {
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// An open transaction on the connection.
///
/// Statements whose results the operation does not read (the run's row lock, the writes after
/// the last read: [`crate::store::Tx::defer`]) are queued, not sent: they go out in one
/// pipeline with the next statement the operation waits for, or with the `COMMIT`. The server
/// runs them in order, each after the previous one finished, so the transaction means exactly
/// what the one-by-one statements meant; a failure among them fails the statement waited for
/// (the first error is reported) and turns the `COMMIT` into a rollback.
pub struct Tx<'a> {
    runtime: &'a Runtime,
    client: &'a Client,
    statements: RefCell<&'a mut HashMap<&'static str, Statement>>,
    target: &'a Target,
    op: &'a str,
    /// Requests not sent yet; the first is the transaction's `BEGIN`.
    queued: RefCell<Vec<Queued>>,
    /// Whether anything (so the `BEGIN`) has gone out: only then is there a transaction to end.
    sent: Cell<bool>,
    /// Set when a statement failed in a way that re-running the transaction can cure.
    retry: Cell<Option<RetryKind>>,
    /// Runs whose row lock this transaction holds (or has queued).
    locked: RefCell<Vec<String>>,
    /// Savepoints taken (for statements whose failure the caller interprets).
    savepoint: Cell<u32>,
    /// A statement met a dead session.
    lost: Cell<bool>,
}

impl Tx<'_> {
    fn classify(&self, e: &PgError, interpret: bool) -> DbError {
        let err = classify(self.target, e);
        match &err.kind {
            DbErrorKind::Busy => self.retry.set(Some(RetryKind::Busy)),
            DbErrorKind::Unique { .. } if !interpret => self.retry.set(Some(RetryKind::Unique)),
            DbErrorKind::Unavailable => self.lost.set(true),
            _ => {}
        }
        err
    }

    fn statement(&self, text: &'static str, interpret: bool) -> DbResult<Statement> {
        if let Some(s) = self.statements.borrow().get(text) {
            return Ok(s.clone());
        }
        let prepared = self
            .runtime
            .block_on(self.client.prepare(&placeholders(text)))
            .map_err(|e| self.classify(&e, interpret))?;
        self.statements.borrow_mut().insert(text, prepared.clone());
        Ok(prepared)
    }

    /// Send the queued requests and `last` in one round trip; `last`'s answer. A queued
    /// request's failure is reported first (what followed it failed because of it).
    fn send(&self, last: Option<Req<'_>>, interpret: bool) -> DbResult<Option<Resp>> {
        let queued = std::mem::take(&mut *self.queued.borrow_mut());
        let mut reqs: Vec<Req<'_>> = queued.iter().map(Queued::req).collect();
        let waited = last.is_some();
        reqs.extend(last);
        if reqs.is_empty() {
            return Ok(None);
        }
        self.sent.set(true);
        let futures = reqs.iter().map(|r| request(self.client, r)).collect();
        let mut answers = self.runtime.block_on(in_order(futures));
        let answer = if waited { answers.pop() } else { None };
        if let Some(e) = answers.into_iter().find_map(std::result::Result::err) {
            return Err(self.classify(&e, false));
        }
        answer.transpose().map_err(|e| self.classify(&e, interpret))
    }

    /// End a transaction that must not commit: whatever is still queued is dropped unsent.
    fn roll_back(&self) {
        self.queued.borrow_mut().clear();
        if self.sent.get() {
            let _ = self.send(Some(Req::Simple("ROLLBACK")), false);
        }
    }
}

fn binds<'p>(params: &'p [&dyn ToSql]) -> Vec<Bind<'p>> {
    params.iter().map(|p| Bind(p.to_sql())).collect()
}

/// A parameter bound to whatever type PostgreSQL inferred for its placeholder: integers fit
/// `BIGINT`, `INTEGER` (a literal such as `?1 = 1` infers one), `SMALLINT` or `BOOLEAN`.
#[derive(Debug)]
struct Bind<'a>(SqlValue<'a>);

impl PgToSql for Bind<'_> {
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
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn execute(&self, sql: &Sql, params: &[&dyn ToSql], interpret: bool) -> DbResult<usize> {
        if sql.postgres.is_empty() {
            return Ok(0);
        }
        let statement = self.statement(sql.postgres, interpret)?;
        let count = |r: Option<Resp>| match r {
            Some(Resp::Count(n)) => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        };
        if !interpret {
            return self
                .send(Some(Req::Exec(&statement, binds(params))), false)
                .map(count);
        }
        // PostgreSQL aborts the whole transaction on a failed statement; a savepoint keeps it
        // usable so the caller can act on the failure (the scope guard names its occupant).
        let n = self.savepoint.get() + 1;
        self.savepoint.set(n);
        self.queued
            .borrow_mut()
            .push(Queued::Simple(format!("SAVEPOINT fp_{n}").into()));
        match self.send(Some(Req::Exec(&statement, binds(params))), true) {
            Ok(r) => {
                self.queued
                    .borrow_mut()
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
        if sql.postgres.is_empty() {
            return Ok(());
        }
        let statement = self.statement(sql.postgres, false)?;
        if let Some(Resp::Rows(rows)) =
            self.send(Some(Req::Query(&statement, binds(params))), false)?
        {
            for row in &rows {
                if !each(&PgRow(row))? {
                    break;
                }
            }
        }
        Ok(())
    }

    fn defer(&self, sql: &Sql, params: &[&dyn ToSql]) -> DbResult<()> {
        if sql.postgres.is_empty() {
            return Ok(());
        }
        let statement = self.statement(sql.postgres, false)?;
        let values = params.iter().map(|p| Owned::of(p.to_sql())).collect();
        let full = {
            let mut queued = self.queued.borrow_mut();
            queued.push(Queued::Exec(statement, values));
            queued.len() >= MAX_QUEUED
        };
        if full {
            self.send(None, false)?;
        }
        Ok(())
    }

    fn fail(&self, err: &DbError) -> LedgerError {
        ledger_error(self.op, &self.target.label, err)
    }

    /// Queued, not sent: the lock goes out with the operation's first read, in the same round
    /// trip and ahead of it (so that read sees the previous writer's commit).
    fn lock_run(&self, run_id: &str) -> Result<()> {
        if self.locked.borrow().iter().any(|r| r == run_id) {
            return Ok(());
        }
        // Every write that appends events locks a run first, so the first run lock of a
        // transaction also puts down its floor for the global event cursor — before any `seq`
        // is allocated (see `sql::EVENT_FLOOR_LOCK_SQL`). Queued, so it costs no round trip.
        if self.locked.borrow().is_empty() {
            crate::store::Tx::defer(self, &sql::EVENT_FLOOR_LOCK_SQL, crate::params![])
                .map_err(|e| crate::store::Tx::fail(self, &e))?;
        }
        crate::store::Tx::defer(self, &sql::LOCK_RUN_SQL, crate::params![run_id])
            .map_err(|e| crate::store::Tx::fail(self, &e))?;
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

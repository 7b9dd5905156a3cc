//! The PostgreSQL backend: the same operations over one connection to a server.
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
//!
//! Here: [`PgStore`] (opening, session settings, reconnecting, the retry loop). `target` parses
//! the URL, `tls` makes its TLS connector, `errors` classifies the driver's errors, `tx` is the
//! transaction behind the seam, `pipeline` sends its requests back to back, and `sql` holds
//! the statements only PostgreSQL runs.

mod errors;
mod listen;
mod pipeline;
#[cfg(test)]
mod plan_tests;
mod rows;
#[cfg(test)]
mod savepoint_tests;
mod sql;
mod target;
mod tls;
mod tx;

/// The conformance tests prepare a statement by hand, as a session sends it.
#[cfg(test)]
pub(crate) use tx::placeholders;

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Error as PgError, SimpleQueryMessage};

use crate::errors::{LedgerError, Result};
use crate::store::migrate::{self, Dialect};
use crate::store::{ledger_error, Backoff, Durability, OpenOptions, Pragmas, Store};
use errors::{classify, error_text, scrub};
use pipeline::Prepared;
use target::Target;
use tx::{RetryKind, Tx};

/// Whole-transaction retries of contention while time remains in the busy budget.
const MAX_BUSY_RETRIES: u32 = 12;
/// Re-runs after a UNIQUE race; a violation that survives them is not a race.
const MAX_UNIQUE_RETRIES: u32 = 3;
/// The session's first `DISCARD PLANS` comes with its 64th transaction; each next one after
/// twice as many (see [`PgStore::replan_at`]).
const FIRST_REPLAN: u64 = 64;

/// One PostgreSQL connection with its settings checked and its statements cached.
///
/// The driver is `tokio-postgres` on a private single-thread runtime, driven synchronously
/// (`block_on`, with the GIL released by the caller), because only the asynchronous client
/// pipelines: a transaction sends the statements whose results it does not read together with
/// the next one it does read, or with the `COMMIT` (see `tx::Tx`). On this loopback a round trip
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
    /// Statements as this session sends them, by their SQL text (each `Sql` is a `'static`
    /// constant): prepared, or behind a transaction-mode pooler their rewritten text.
    statements: HashMap<&'static str, Prepared>,
    /// A call met a dead session: reconnect before the next one, even if the driver has not
    /// noticed the socket closing yet.
    broken: bool,
    /// Transactions this session has begun.
    transactions: u64,
    /// The transaction that begins with `DISCARD PLANS`, doubling each time. A cached plan
    /// stays as it was made until a table it reads is analyzed: one made while a fresh
    /// schema's tables were nearly empty, where every plan looks as cheap as any other, keeps
    /// walking an index that filters (`units_first_started` for a unit's row, in the foreign
    /// key check of every new attempt too) long after the primary key is the only sane
    /// choice, and autovacuum may analyze late or never. Discarding the plans at doubling
    /// intervals has every statement planned again on tables at least half their present
    /// size, for one extra command in the `BEGIN`'s message, ever rarer.
    replan_at: u64,
    /// The `LISTEN`ing connection, once a waiter asked for it (see `listen`).
    listener: Option<listen::Listener>,
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
        drop(self.listener.take());
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
        let mut target = Target::parse(url, schema)?;
        // Without a flush to wait for, a NOTIFY inside the transaction holds PostgreSQL's
        // notify lock only while the commit record is written; with one (`full`) it goes after
        // the commit, in a transaction of its own (see `tx::Tx::end`).
        target.notify_in_commit = opts.durability == Durability::Normal;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LedgerError::StoreError {
                operation: "connecting to PostgreSQL".into(),
                message: format!("cannot start the connection's I/O driver ({e})"),
            })?;
        let (client, task) = connect(&target, &runtime)?;
        let mut store = Self {
            runtime,
            client: Some(client),
            task: Some(task),
            target,
            opts: opts.clone(),
            statements: HashMap::new(),
            broken: false,
            transactions: 0,
            replan_at: FIRST_REPLAN,
            listener: None,
        };
        store.configure()?;
        let dialect = store.dialect();
        migrate::migrate(&mut store, &dialect, now_ms)?;
        Ok(store)
    }

    fn client(&self) -> Result<&Client> {
        self.client.as_ref().ok_or_else(|| LedgerError::StoreError {
            operation: "using the connection".into(),
            message: format!("the connection to {} is closed", self.target.label),
        })
    }

    /// Run one request to completion.
    fn block<'s, T, F: Future<Output = std::result::Result<T, PgError>>>(
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
    /// JIT compilation is off: every statement of the ledger is a few index probes and row
    /// writes, and PostgreSQL compiles a plan whose estimated cost is high, which an estimate
    /// over a skewed backlog can be, at some 15 ms for a statement that runs in a tenth of one.
    /// Behind a transaction-mode pooler the session is not this ledger's to set: each
    /// transaction sets them for itself (see [`PgStore::begin`]).
    fn configure(&mut self) -> Result<()> {
        if self.target.pooled {
            return Ok(());
        }
        let settings = format!(
            "{}; SET default_transaction_isolation = 'read committed'",
            self.settings("SET")
        );
        self.block("configuring the database", |c| c.batch_execute(&settings))
    }

    /// The settings of [`PgStore::configure`], each a `set` command (`SET`, or `SET LOCAL`).
    fn settings(&self, set: &str) -> String {
        let sync = match self.opts.durability {
            Durability::Normal => "off",
            Durability::Full => "on",
        };
        format!(
            "{set} search_path TO \"{}\"; {set} lock_timeout = {}; \
             {set} synchronous_commit = {sync}; {set} jit = off",
            self.target.schema,
            self.opts.busy_timeout_ms.max(1)
        )
    }

    /// The message that begins a transaction with `begin`. With `replan` it also discards the
    /// session's cached plans (`DISCARD PLANS`: prepared statements stay, each is planned
    /// again at its next use). Behind a transaction-mode pooler it sets the session's settings
    /// for this transaction alone (`SET LOCAL`), and names the isolation level, since the
    /// server session's default is not this ledger's; there are no cached plans to discard.
    fn begin(&self, begin: &'static str, replan: bool) -> Cow<'static, str> {
        if self.target.pooled {
            let begin = if begin == "BEGIN" {
                "BEGIN ISOLATION LEVEL READ COMMITTED"
            } else {
                begin
            };
            Cow::Owned(format!("{begin}; {}", self.settings("SET LOCAL")))
        } else if replan {
            Cow::Owned(format!("{begin}; DISCARD PLANS"))
        } else {
            Cow::Borrowed(begin)
        }
    }

    /// Statements outside the operations' transactions (the event horizon, the settings, the
    /// change mark, the integrity check), by the simple protocol: one round trip, no statement
    /// left on the server, values in text. Behind a transaction-mode pooler they run in a
    /// read-only transaction that sets the ledger's settings first.
    fn session_rows(&self, text: &str) -> std::result::Result<Vec<Vec<Option<String>>>, PgError> {
        let text = if self.target.pooled {
            Cow::Owned(format!(
                "BEGIN READ ONLY; {}; {text}; COMMIT",
                self.settings("SET LOCAL")
            ))
        } else {
            Cow::Borrowed(text)
        };
        let Some(client) = self.client.as_ref() else {
            return Ok(Vec::new());
        };
        let answered = self.runtime.block_on(client.simple_query(&text));
        if answered.is_err() && self.target.pooled && !client.is_closed() {
            // A failed statement leaves its transaction open and aborted, and the pooler keeps
            // the server session with this client until it ends: end it here, or the next
            // transaction would be refused. If this fails too, the session is gone anyway.
            let _ = self.runtime.block_on(client.batch_execute("ROLLBACK"));
        }
        let messages = answered?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    }

    /// [`PgStore::session_rows`] as a read: on a session found lost, read again once on a new
    /// one (see [`PgStore::read_again_once`]). A failure is reported as `op`'s.
    fn session_read(&mut self, op: &str, text: &str) -> Result<Vec<Vec<Option<String>>>> {
        self.read_again_once(|store| {
            store.session_rows(text).map_err(|e| {
                let err = classify(&store.target, &e);
                let lost = matches!(err.kind, crate::store::DbErrorKind::Unavailable);
                let e = ledger_error(op, &store.target.label, &err);
                if lost {
                    store.broken = true;
                    Failure::Reconnect(e)
                } else {
                    Failure::Fatal(e)
                }
            })
        })
    }

    /// The one row of [`PgStore::session_read`].
    fn session_row(&mut self, op: &str, text: &str) -> Result<Vec<Option<String>>> {
        self.session_read(op, text)?
            .into_iter()
            .next()
            .ok_or_else(|| LedgerError::StoreError {
                operation: op.into(),
                message: format!("{} answered no row", self.target.label),
            })
    }

    /// Run `attempt`, which writes nothing, and if it found the session lost, once more on a
    /// new session: a failover leaves every session's next call this way, and a read is simply
    /// read again.
    fn read_again_once<T>(
        &mut self,
        mut attempt: impl FnMut(&mut Self) -> std::result::Result<T, Failure>,
    ) -> Result<T> {
        self.ensure_connected()?;
        let once = match attempt(self) {
            Err(Failure::Reconnect(_)) => {
                self.ensure_connected()?;
                attempt(self)
            }
            once => once,
        };
        once.map_err(Failure::into_error)
    }

    /// PostgreSQL's part of migrating (see [`migrate`]): the advisory lock that lets several
    /// processes open a fresh database at once, the schema made along with the ledger, and
    /// `create=False` refusing a schema without a ledger (it is not created on the way to
    /// reporting that).
    fn dialect(&self) -> Dialect {
        let (schema, label) = (&self.target.schema, &self.target.label);
        Dialect {
            migrations: migrate::POSTGRES_MIGRATIONS,
            lock: Some(format!(
                "SELECT pg_advisory_xact_lock({})",
                sql::MIGRATION_LOCK
            )),
            create_ledger: format!(
                "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; {}",
                sql::CREATE_LEDGER_SQL
            ),
            foreign: format!(
                "schema {schema} of {label} holds other tables and no schema_migrations; it is \
                 not a fencepost ledger: choose another schema (?schema=)"
            ),
            missing: (!self.opts.create).then(|| {
                format!(
                    "there is no fencepost ledger in schema {schema} of {label}; check the URL's \
                     database and ?schema= (opening with create=False never makes one)"
                )
            }),
        }
    }

    /// Reconnect after the server dropped the connection (a restart, a failover, an idle
    /// timeout): a new session with the same settings and an empty statement cache.
    fn ensure_connected(&mut self) -> Result<()> {
        if !self.broken && self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        let reason = if self.broken {
            "a call met a dead session"
        } else {
            "the server closed the session"
        };
        drop(self.client.take());
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let (client, task) = connect(&self.target, &self.runtime)?;
        self.client = Some(client);
        self.task = Some(task);
        self.statements.clear();
        self.broken = false;
        self.configure()?;
        crate::observe::push(crate::observe::Notice::Reconnected {
            reason: reason.into(),
        });
        Ok(())
    }

    /// One run of a transaction. `BEGIN` is not sent on its own: it is queued, and goes out
    /// with the body's first statement (a body that sends nothing costs no round trip at all).
    /// `optimistic`: a judgment locks its runs with its writes (see
    /// [`crate::store::Tx::lock_run_at_write`]).
    fn run_once(
        &mut self,
        op: &str,
        begin: &'static str,
        commit: bool,
        optimistic: bool,
        body: &mut dyn FnMut(&dyn crate::store::Tx) -> Result<()>,
    ) -> std::result::Result<(), Failure> {
        self.transactions += 1;
        let replan = self.transactions == self.replan_at;
        if replan {
            self.replan_at = self.replan_at.saturating_mul(2);
        }
        let target = &self.target;
        let Some(client) = self.client.as_ref() else {
            return Err(Failure::Fatal(LedgerError::StoreError {
                operation: op.into(),
                message: format!("the connection to {} is closed", target.label),
            }));
        };
        let begin = self.begin(begin, replan);
        let tx = Tx::new(
            &self.runtime,
            client,
            &mut self.statements,
            target,
            op,
            begin,
        )
        .optimistic(optimistic);
        let out = body(&tx);
        let out = tx.end(out, commit);
        let (retry, lost) = (tx.retry(), tx.lost());
        drop(tx);
        self.broken = lost;
        // After a failed COMMIT pipeline the transaction is over too: the server answered the
        // COMMIT of an aborted transaction with a rollback.
        out.map_err(|e| match retry {
            Some(RetryKind::Busy) => Failure::Busy(e),
            Some(RetryKind::Race) => Failure::Race(e),
            Some(RetryKind::Stale) => Failure::Stale(e),
            Some(RetryKind::Reconnect) => Failure::Reconnect(e),
            None => Failure::Fatal(e),
        })
    }
}

impl Store for PgStore {
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
        let mut reconnected = false;
        // The first try reads without the runs' locks and takes them with the writes, which
        // check first that what was read still holds: a run's lock is held for the write
        // alone. Every try after a failure takes them before the read, so it cannot fail for
        // a change made meanwhile.
        let mut optimistic = true;
        loop {
            let once = self.run_once(op, "BEGIN", true, optimistic, body);
            optimistic = false;
            match once {
                Ok(()) => return Ok(()),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Stale(_)) => {}
                Err(Failure::Race(e)) => {
                    // The race's winner has committed: re-running sees its row at once.
                    unique_retries += 1;
                    if unique_retries > MAX_UNIQUE_RETRIES {
                        return Err(e);
                    }
                }
                Err(Failure::Busy(_)) => {
                    backoff.wait()?;
                }
                Err(Failure::Reconnect(e)) => {
                    if std::mem::replace(&mut reconnected, true) {
                        return Err(e);
                    }
                    self.ensure_connected()?;
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
        let begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
        self.read_again_once(|store| store.run_once(op, begin, false, false, body))
    }

    /// One autocommit statement, before the reader's transaction takes its snapshot.
    fn event_horizon(&mut self) -> Result<Option<i64>> {
        let op = "reading events";
        let row = self.session_row(op, sql::EVENT_HORIZON_SQL)?;
        row.into_iter()
            .next()
            .flatten()
            .map(|v| int(op, &v))
            .transpose()
    }

    fn lost(&self) -> bool {
        self.broken
    }

    fn pragmas(&mut self) -> Result<Pragmas> {
        let op = "reading settings";
        let row = self.session_row(op, sql::PRAGMAS_SQL)?;
        let text = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let (sync, lock_timeout) = (text(0), text(1));
        Ok(Pragmas {
            journal_mode: "postgresql".into(),
            synchronous: if sync == "off" || sync == "local" {
                "normal".into()
            } else {
                "full".into()
            },
            busy_timeout: parse_ms(&lock_timeout),
            foreign_keys: true,
            schema_version: int(op, &text(2))?,
            tls: Some(text(3)),
        })
    }

    /// PostgreSQL checks its own pages; this checks the ledger's side: the schema is at this
    /// library's version and every table the operations use answers. Quick either way.
    fn integrity_check(&mut self, _quick: bool) -> Result<Vec<String>> {
        let version = self.pragmas()?.schema_version;
        if version != migrate::SCHEMA_VERSION {
            return Ok(vec![format!(
                "schema version {version}, expected {}",
                migrate::SCHEMA_VERSION
            )]);
        }
        let probes: Vec<String> = sql::TABLES
            .iter()
            .map(|table| format!("SELECT 1 FROM {table} LIMIT 1"))
            .collect();
        self.session_read("checking integrity", &probes.join("; "))?;
        Ok(vec!["ok".into()])
    }

    fn change_mark(&mut self) -> Result<(i64, i64)> {
        let op = "waiting for events";
        let row = self.session_row(op, sql::CHANGE_MARK_SQL)?;
        let value = row.first().cloned().flatten().unwrap_or_default();
        let called = row.get(1).cloned().flatten();
        Ok((int(op, &value)?, i64::from(called.as_deref() == Some("t"))))
    }

    /// Behind a transaction-mode pooler there is no session to `LISTEN` on: `wait_events`
    /// polls, as with `listen=False`.
    fn signal(&mut self) -> Result<Option<std::sync::Arc<crate::store::Signal>>> {
        if !self.opts.listen || self.target.pooled {
            return Ok(None);
        }
        if self.listener.is_none() {
            self.listener = Some(listen::Listener::start(&self.target)?);
        }
        Ok(self.listener.as_ref().map(listen::Listener::signal))
    }

    /// Autovacuum normally keeps up; after a large prune this reclaims the dead rows and
    /// refreshes the planner's statistics at once. Outside any transaction, as VACUUM must be,
    /// so the tables are named with their schema (behind a pooler the session's `search_path`
    /// is not the ledger's).
    fn vacuum(&mut self) -> Result<()> {
        let schema = &self.target.schema;
        let tables: Vec<String> = sql::TABLES
            .iter()
            .map(|table| format!("\"{schema}\".{table}"))
            .collect();
        let text = format!("VACUUM (ANALYZE) {}", tables.join(", "));
        self.block("vacuuming the database", |c| c.batch_execute(&text))
    }
}

/// Why one run of a transaction failed.
enum Failure {
    /// Contention (a deadlock, a serialization failure, a `lock_timeout`): run a write again
    /// after the backoff. The error is what a read, which is not run again, reports.
    Busy(LedgerError),
    /// A UNIQUE violation that a racing insert caused (two processes reserving the same new
    /// run): run it again at once, and the winner's row is there. The error is what to report
    /// if the violation persists.
    Race(LedgerError),
    /// A judgment's write, made without its runs' locks since its read, found a run or a row
    /// changed: run it again at once, with the locks taken before the read. The error cannot
    /// surface: the next try takes the locks first, so it never fails this way.
    Stale(LedgerError),
    /// The session died, or its server would not write, before the `COMMIT` went out: run it
    /// again once on a new session. The error is what to report if that fails too.
    Reconnect(LedgerError),
    /// Anything else: give up with this error.
    Fatal(LedgerError),
}

impl Failure {
    /// The error to report when nothing more is tried.
    fn into_error(self) -> LedgerError {
        match self {
            Self::Busy(e)
            | Self::Race(e)
            | Self::Stale(e)
            | Self::Reconnect(e)
            | Self::Fatal(e) => e,
        }
    }
}

/// An integer the server answered in text.
fn int(op: &str, text: &str) -> Result<i64> {
    text.parse().map_err(|_| LedgerError::StoreError {
        operation: op.into(),
        message: format!("the server answered {text:?} where a number was expected"),
    })
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

/// Connect to `target` on `runtime`; the connection's task is spawned there and runs whenever
/// the store waits on a request.
fn connect(target: &Target, runtime: &Runtime) -> Result<(Client, JoinHandle<()>)> {
    let connecting = target.config.connect(target.tls.clone());
    let (client, connection) = runtime.block_on(connecting).map_err(|e| {
        let text = scrub(&error_text(&e), target.password());
        let check = if text.contains("certificate") || text.contains("TLS") {
            "check the URL's sslmode and sslrootcert (README \"PostgreSQL\": TLS)"
        } else {
            "check that the server is running and reachable, and the URL's user, database \
             and credentials"
        };
        LedgerError::StoreError {
            operation: "connecting to PostgreSQL".into(),
            message: format!(
                "cannot connect to PostgreSQL at {} ({text}); {check}",
                target.server
            ),
        }
    })?;
    // The task's own error (the socket closing) reaches the client's next request.
    let task = runtime.spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// Drop `schema` of the database at `url` with everything in it (the tests' fresh schemas).
#[cfg(test)]
pub(crate) fn drop_schema(url: &str, schema: &str) -> Result<()> {
    let target = Target::parse(url, Some(schema))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LedgerError::StoreError {
            operation: "dropping a test schema".into(),
            message: e.to_string(),
        })?;
    let (client, task) = connect(&target, &runtime)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[test]
    fn sessions_compile_no_plan() {
        let (mut store, _dropper) = testing::postgres_fresh();
        let jit = crate::store::Sql::same("SELECT current_setting('jit')");
        let setting = store
            .read("reading a setting", |tx| {
                tx.row(&jit, crate::params![], |r| r.get::<String>(0))
            })
            .expect("read");
        assert_eq!(setting.as_deref(), Some("off"));
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

    /// Run `text` in a write transaction of `store`.
    fn run(store: &mut dyn Store, text: &'static str, params: &[&dyn crate::store::ToSql]) {
        store
            .write("testing", |tx| {
                tx.exec(&crate::store::Sql::native(text), params)
            })
            .unwrap();
    }

    fn open_schema(schema: &str, create: bool) -> Result<PgStore> {
        let opts = OpenOptions {
            create,
            ..OpenOptions::default()
        };
        PgStore::open(&testing::postgres_url(), Some(schema), &opts, 9)
    }

    #[test]
    fn migrating_again_is_a_noop_and_a_newer_schema_is_refused() {
        let (mut store, dropper) = testing::postgres_fresh();
        let again = open_schema(dropper.schema(), true).unwrap();
        drop(again);
        let ledger = store
            .read("testing", |tx| {
                tx.rows(
                    &crate::store::Sql::native(
                        "SELECT version, applied_at FROM schema_migrations ORDER BY version",
                    ),
                    crate::params![],
                    |r| Ok((r.get::<i64>(0)?, r.get::<i64>(1)?)),
                )
            })
            .unwrap();
        let expected: Vec<(i64, i64)> = (1..=migrate::SCHEMA_VERSION).map(|v| (v, 0)).collect();
        assert_eq!(ledger, expected, "re-running is a no-op");
        run(
            &mut *store,
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?1, 'future', 0)",
            crate::params![migrate::SCHEMA_VERSION + 41],
        );
        let err = open_schema(dropper.schema(), true).unwrap_err();
        assert_eq!(
            err,
            LedgerError::SchemaError {
                database_version: migrate::SCHEMA_VERSION + 41,
                library_version: migrate::SCHEMA_VERSION
            }
        );
    }

    #[test]
    fn a_schema_of_other_tables_is_refused() {
        let (mut store, dropper) = testing::postgres_fresh();
        run(
            &mut *store,
            "DROP TABLE schema_migrations",
            crate::params![],
        );
        let err = open_schema(dropper.schema(), true).unwrap_err();
        assert!(
            matches!(&err, LedgerError::StoreError { message, .. } if message.contains("not a fencepost ledger")),
            "{err:?}"
        );
    }

    #[test]
    fn create_false_refuses_a_missing_ledger_and_makes_no_schema() {
        let (mut store, dropper) = testing::postgres_fresh();
        let schema = format!("{}_absent", dropper.schema());
        let err = open_schema(&schema, false).unwrap_err();
        assert!(
            matches!(&err, LedgerError::StoreError { operation, message }
                if operation == "opening the database" && message.contains("no fencepost ledger")),
            "{err:?}"
        );
        let made = store
            .read("testing", |tx| {
                tx.row(
                    &crate::store::Sql::native(
                        "SELECT count(*) FROM pg_namespace WHERE nspname = ?1",
                    ),
                    crate::params![schema],
                    |r| r.get::<i64>(0),
                )
            })
            .unwrap();
        assert_eq!(made, Some(0));
    }

    #[test]
    fn the_migration_lock_key_spells_fencepost() {
        assert_eq!(sql::MIGRATION_LOCK.to_be_bytes(), *b"fencepos");
    }
}

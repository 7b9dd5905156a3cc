//! `wait_events` for the Python class: the events query runs when something may have changed,
//! not on every tick. Between checks the thread waits detached, holding neither the GIL nor the
//! store, and Ctrl-C ends the wait.
//!
//! What says "something may have changed":
//! - PostgreSQL (opened with `listen`, the default): the store's [`Signal`], moved by a
//!   `LISTEN`ing connection of its own at each commit's `NOTIFY`. An idle waiter sends the
//!   database nothing; a notification costs one query, and a burst of them while a query runs
//!   costs one more. The `NOTIFY` comes after its commit, so the query that follows sees it.
//! - Otherwise (SQLite; PostgreSQL with `listen=False`, or while its listening connection is
//!   reconnecting) the store's change mark, read every [`TICK`] without touching a table
//!   (SQLite: a pragma on the open connection; PostgreSQL: one row of the events' sequence),
//!   and the query once per [`IDLE_QUERY`] as a safety net for a move the mark cannot see.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyAny;

use super::PyLedger;
use crate::errors::LedgerError;
use crate::events;
use crate::model::Event;
use crate::py::errors::to_pyerr;
use crate::store::Signal;

/// How often the change mark is read, and the least time between two queries of one waiter:
/// the wake-up latency's bound when polling, and what a burst of notifications is spaced to.
const TICK: Duration = Duration::from_millis(5);
/// After the change mark moves, the query runs on every tick for this long: PostgreSQL's
/// sequence moves when an event is appended, before its transaction commits, so the first
/// query after a move may come too early to see it.
const HOT: Duration = Duration::from_millis(250);
/// The longest a polling waiter goes without running its query.
const IDLE_QUERY: Duration = Duration::from_secs(2);
/// How often a waiter blocked on the signal looks up for Ctrl-C (no database work).
const CHECK_INTERRUPT: Duration = Duration::from_millis(100);

/// What `wait_events` waits for.
pub(super) struct Wait {
    pub run_id: Option<String>,
    pub after_seq: i64,
    pub timeout: Duration,
    pub types: Option<Vec<String>>,
    pub limit: i64,
}

/// What waiting has cost a ledger so far.
#[derive(Debug, Default)]
pub(super) struct Counts {
    queries: AtomicU64,
    checks: AtomicU64,
    wakeups: AtomicU64,
}

impl Counts {
    pub(super) fn snapshot(&self) -> [(&'static str, u64); 3] {
        [
            ("queries", self.queries.load(Ordering::Relaxed)),
            ("checks", self.checks.load(Ordering::Relaxed)),
            ("wakeups", self.wakeups.load(Ordering::Relaxed)),
        ]
    }
}

/// Where the latest "something may have changed" came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Signal(u64),
    Store(i64, i64),
}

impl PyLedger {
    /// Events after `after_seq` as soon as one is committed, or none after `timeout`.
    pub(super) fn wait_events_in(&self, py: Python<'_>, w: &Wait) -> PyResult<Vec<Event>> {
        let started = Instant::now();
        let deadline = started + w.timeout;
        let signal: Option<Arc<Signal>> = py
            .detach(|| self.writer()?.with_store(|s| s.signal()))
            .map_err(|e| to_pyerr(py, e))?;
        let mut mark = None;
        let mut hot_until = started;
        let mut queried: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let seen = if let Some(count) = signal.as_deref().and_then(Signal::mark) {
                Mark::Signal(count)
            } else {
                let (a, b) = py
                    .detach(|| self.writer()?.with_store(|s| s.change_mark()))
                    .map_err(|e| to_pyerr(py, e))?;
                self.waits.checks.fetch_add(1, Ordering::Relaxed);
                Mark::Store(a, b)
            };
            // The first mark is where the wait starts (the first query runs anyway); every
            // later move is news.
            let moved = mark.is_some_and(|m| m != seen);
            if moved {
                hot_until = now + HOT;
                if matches!(seen, Mark::Signal(_)) {
                    self.waits.wakeups.fetch_add(1, Ordering::Relaxed);
                }
            }
            mark = Some(seen);
            let due = match (queried, seen) {
                (None, _) => true,
                (Some(_), Mark::Signal(_)) => moved,
                (Some(q), Mark::Store(..)) => {
                    now < hot_until || now.duration_since(q) >= IDLE_QUERY
                }
            };
            if due {
                let got = self.run(py, |s, _| {
                    events::read(
                        s,
                        w.run_id.as_deref(),
                        w.after_seq,
                        w.limit,
                        w.types.as_deref(),
                    )
                })?;
                self.waits.queries.fetch_add(1, Ordering::Relaxed);
                queried = Some(now);
                if !got.is_empty() {
                    return Ok(got);
                }
            }
            if now >= deadline {
                return Ok(Vec::new());
            }
            py.check_signals()?;
            if let (Mark::Signal(count), Some(signal)) = (seen, signal.as_deref()) {
                let until = deadline.min(Instant::now() + CHECK_INTERRUPT);
                py.detach(|| {
                    signal.wait_past(count, until);
                    // Space the queries of a burst of notifications by a tick.
                    let next = queried.map_or(now, |q| q + TICK);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                });
            } else {
                let nap = TICK.min(deadline.saturating_duration_since(now));
                py.detach(|| std::thread::sleep(nap));
            }
        }
    }
}

/// `timeout_s` as a duration: a finite number of seconds (int or float), 0 or more.
pub(super) fn timeout(obj: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let py = obj.py();
    let refuse = |shown: String| {
        to_pyerr(
            py,
            LedgerError::invalid(
                "timeout_s",
                format!("must be a finite number of seconds, 0 or more, not {shown}"),
            ),
        )
    };
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(refuse(format!("{obj}")));
    }
    let seconds: f64 = obj
        .extract()
        .map_err(|_| refuse(crate::py::args::type_name(obj)))?;
    Duration::try_from_secs_f64(seconds).map_err(|_| refuse(format!("{seconds}")))
}

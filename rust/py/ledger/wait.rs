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

/// Paces one waiter's queries: [`Pacer::due`] blocks until the events may have changed since
/// the last query (or a deadline passes). The mark is read before each query it allows, so a
/// commit that lands while the query runs moves the mark again and is not missed.
pub(super) struct Pacer {
    signal: Option<Arc<Signal>>,
    mark: Mark,
    hot_until: Instant,
    queried: Instant,
}

impl Pacer {
    /// A pacer whose waiter queries right after this returns (on PostgreSQL this starts the
    /// ledger's listening connection, once).
    pub(super) fn new(ledger: &PyLedger, py: Python<'_>) -> PyResult<Self> {
        ledger.check_process(py)?;
        let signal: Option<Arc<Signal>> = py
            .detach(|| ledger.writer()?.with_store(|s| s.signal()))
            .map_err(|e| to_pyerr(py, e))?;
        let mark = Self::read(signal.as_deref(), ledger, py)?;
        let now = Instant::now();
        Ok(Self {
            signal,
            mark,
            hot_until: now,
            queried: now,
        })
    }

    /// The signal's count while it is live, else the store's change mark.
    fn read(signal: Option<&Signal>, ledger: &PyLedger, py: Python<'_>) -> PyResult<Mark> {
        if let Some(count) = signal.and_then(Signal::mark) {
            return Ok(Mark::Signal(count));
        }
        let (a, b) = py
            .detach(|| ledger.writer()?.with_store(|s| s.change_mark()))
            .map_err(|e| to_pyerr(py, e))?;
        ledger.waits.checks.fetch_add(1, Ordering::Relaxed);
        Ok(Mark::Store(a, b))
    }

    /// Block until a query is due (`true`: the caller queries at once) or `deadline` passes
    /// (`false`). Ctrl-C raises `KeyboardInterrupt` (on the main thread).
    pub(super) fn due(
        &mut self,
        ledger: &PyLedger,
        py: Python<'_>,
        deadline: Instant,
    ) -> PyResult<bool> {
        // A `Watch` may be inherited by a forked child too.
        ledger.check_process(py)?;
        loop {
            let now = Instant::now();
            let seen = Self::read(self.signal.as_deref(), ledger, py)?;
            let moved = seen != self.mark;
            self.mark = seen;
            if moved {
                self.hot_until = now + HOT;
                if matches!(seen, Mark::Signal(_)) {
                    ledger.waits.wakeups.fetch_add(1, Ordering::Relaxed);
                }
            }
            let due = match seen {
                Mark::Signal(_) => moved,
                Mark::Store(..) => {
                    now < self.hot_until || now.duration_since(self.queried) >= IDLE_QUERY
                }
            };
            if due {
                // Space the queries of a burst of notifications by a tick (polling already
                // sleeps a tick between reads).
                let next = self.queried + TICK;
                py.detach(|| std::thread::sleep(next.saturating_duration_since(Instant::now())));
                self.queried = Instant::now();
                return Ok(true);
            }
            if now >= deadline {
                return Ok(false);
            }
            py.check_signals()?;
            if let (Mark::Signal(count), Some(signal)) = (seen, self.signal.as_deref()) {
                let until = deadline.min(now + CHECK_INTERRUPT);
                py.detach(|| signal.wait_past(count, until));
            } else {
                let nap = TICK.min(deadline.saturating_duration_since(now));
                py.detach(|| std::thread::sleep(nap));
            }
        }
    }
}

impl PyLedger {
    /// Events after `after_seq` as soon as one is committed, or none after `timeout`.
    pub(super) fn wait_events_in(&self, py: Python<'_>, w: &Wait) -> PyResult<Vec<Event>> {
        let deadline = Instant::now() + w.timeout;
        // A wait of 0 is one query: nothing to pace.
        let mut pacer = if w.timeout.is_zero() {
            None
        } else {
            Some(Pacer::new(self, py)?)
        };
        loop {
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
            if !got.is_empty() {
                return Ok(got);
            }
            let Some(p) = pacer.as_mut() else {
                return Ok(Vec::new());
            };
            if !p.due(self, py, deadline)? {
                return Ok(Vec::new());
            }
        }
    }
}

/// A pacer for many waiters at once: `AsyncLedger` keeps one per event loop, in a thread of its
/// own, and wakes every coroutine in `wait_events` when [`PyWatch::next`] says the events may
/// have changed, so waiting coroutines hold no thread each. One thread at a time may wait on it.
#[pyclass(frozen, module = "fencepost._core", name = "Watch")]
pub struct PyWatch {
    ledger: Py<PyLedger>,
    pacer: std::sync::Mutex<Pacer>,
}

#[pymethods]
impl PyWatch {
    /// Block, without the GIL, until the events may have changed (`True`: query now) or
    /// `timeout_s` passes (`False`).
    fn next(&self, py: Python<'_>, timeout_s: &Bound<'_, PyAny>) -> PyResult<bool> {
        let deadline = Instant::now() + timeout(timeout_s)?;
        // Never blocks with the GIL held: a second thread is refused instead (the first may be
        // waiting for the GIL to come back from its wait).
        let Ok(mut pacer) = self.pacer.try_lock() else {
            return Err(to_pyerr(
                py,
                LedgerError::invalid(
                    "watch",
                    "is being waited on by another thread; make one watch per thread",
                ),
            ));
        };
        pacer.due(self.ledger.get(), py, deadline)
    }
}

impl PyWatch {
    pub(super) fn new(ledger: Bound<'_, PyLedger>) -> PyResult<Self> {
        let pacer = Pacer::new(ledger.get(), ledger.py())?;
        Ok(Self {
            ledger: ledger.unbind(),
            pacer: std::sync::Mutex::new(pacer),
        })
    }
}

/// `timeout_s` checked as `wait_events` checks it, in seconds (`AsyncLedger.wait_events` checks
/// its argument before it waits in its own way).
#[pyfunction]
pub fn wait_timeout(timeout_s: &Bound<'_, PyAny>) -> PyResult<f64> {
    timeout(timeout_s).map(|d| d.as_secs_f64())
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

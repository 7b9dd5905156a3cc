//! `wait_events` for the Python class: the events query runs when the store's change mark
//! moves (a commit somewhere may have appended events), not on every tick. Between checks the
//! thread sleeps detached, holding neither the GIL nor the store, and Ctrl-C ends the wait.
//!
//! Costs while idle: a change mark per tick (SQLite: a pragma on the open connection, no table
//! read; PostgreSQL: one row of the events' sequence) and one events query per
//! [`IDLE_QUERY`], a safety net for a move the mark cannot see.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyAny;

use super::PyLedger;
use crate::errors::LedgerError;
use crate::events;
use crate::model::Event;
use crate::py::errors::to_pyerr;

/// How often the change mark is read: the wake-up latency's bound.
const TICK: Duration = Duration::from_millis(5);
/// After the mark moves, the query runs on every tick for this long: PostgreSQL's sequence
/// moves when an event is appended, before its transaction commits, so the first query after a
/// move may come too early to see it.
const HOT: Duration = Duration::from_millis(250);
/// The longest an idle waiter goes without running its query.
const IDLE_QUERY: Duration = Duration::from_secs(2);

/// What `wait_events` waits for.
pub(super) struct Wait {
    pub run_id: Option<String>,
    pub after_seq: i64,
    pub timeout: Duration,
    pub types: Option<Vec<String>>,
    pub limit: i64,
}

impl PyLedger {
    /// Events after `after_seq` as soon as one is committed, or none after `timeout`.
    pub(super) fn wait_events_in(&self, py: Python<'_>, w: &Wait) -> PyResult<Vec<Event>> {
        let started = Instant::now();
        let deadline = started + w.timeout;
        let mut mark = None;
        let mut hot_until = started;
        let mut queried: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let seen = py
                .detach(|| self.writer()?.with_store(|s| s.change_mark()))
                .map_err(|e| to_pyerr(py, e))?;
            if mark != Some(seen) {
                mark = Some(seen);
                hot_until = now + HOT;
            }
            let due = match queried {
                None => true,
                Some(q) => now < hot_until || now.duration_since(q) >= IDLE_QUERY,
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
                queried = Some(now);
                if !got.is_empty() {
                    return Ok(got);
                }
            }
            if now >= deadline {
                return Ok(Vec::new());
            }
            py.check_signals()?;
            let nap = TICK.min(deadline.saturating_duration_since(now));
            py.detach(|| std::thread::sleep(nap));
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

//! `fencepost._core.Ledger`: the compiled half of `fencepost.Ledger`.
//!
//! Every method follows one order: read the Python arguments into owned Rust values and read
//! the clock (it may be a Python callable) while attached; detach, so other Python threads run
//! while this one waits on the database; canonicalize and hash JSON arguments, lock the store
//! and run one transaction; re-attach and build the result or the exception. Hashing and
//! serializing detached keep the write lock (and the GIL) held only as long as needed. A
//! closed ledger raises `StoreError`.
//!
//! A ledger belongs to the process that opened it. In a forked child every method but
//! `target` raises `StoreError` before it takes a lock or sends anything, and `close` or the
//! ledger's end there lets go of it without closing anything: the connection is the parent's
//! (a PostgreSQL Terminate from the child would end the parent's session), and the threads
//! that would be stopped and joined were not copied by the fork.
//!
//! The calls the writer groups also take `future=` (an `asyncio.Future`): then the method
//! checks its arguments, queues the call and returns `None` at once, and the future gets the
//! result or the exception after the commit (see `aio`).
//!
//! Arguments are read by `args`, results built by `records`; a method with many keywords
//! takes them as one dict, read by one reader per keyword set.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::canonical::Json;
use crate::leases::ClaimSpec;
use crate::py::args::{
    self, claim_arg, fence_arg, flag, int, opt_int, opt_prose, opt_text, read_doc, str_list, text,
    ChildRunArgs, FinishArgs, QueuedRunArgs, StartRunArgs, StepResultArgs,
};
use crate::py::errors::to_pyerr;
use crate::py::records;
use crate::runs;
use crate::store::{Durability, OpenOptions};
use crate::writer::{Config, Op, Writer};

mod call;
mod retention;
mod wait;
use crate::attempts::UnitFilter;
use crate::{attempts, blobs, events, leases, messages, queue, schedules};
pub use wait::{wait_timeout, PyWatch};

/// The ledger handle: one connection behind the group-commit writer, shared safely between
/// threads. Reserves, finishes, heartbeats, claims, status moves and step completions queue
/// there (concurrent ones share a transaction); every other call locks the store directly.
#[pyclass(frozen, module = "fencepost._core", name = "Ledger")]
pub struct PyLedger {
    /// `None` only while `__new__` opens the store.
    writer: Option<Arc<Writer>>,
    clock: Option<Py<PyAny>>,
    /// The store's password-free label, kept for `repr` after `close`.
    target: String,
    /// What `wait_events` has cost so far (see `wait_stats`).
    waits: wait::Counts,
    /// The process that opened the ledger, the only one that may use it (see `check_process`).
    pid: u32,
}

#[pymethods]
impl PyLedger {
    /// `path` (`None`: in memory) or `url` (PostgreSQL) names the store; `path`, `url` and
    /// `schema` are free text, named as the facade's `target` and `schema`.
    #[new]
    #[pyo3(signature = (
        path, url, schema, *, durability, busy_timeout_ms, clock, create, group_commit=true,
        listen=true
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        path: &Bound<'_, PyAny>,
        url: &Bound<'_, PyAny>,
        schema: &Bound<'_, PyAny>,
        durability: &str,
        busy_timeout_ms: u64,
        clock: Option<Py<PyAny>>,
        create: bool,
        group_commit: bool,
        listen: bool,
    ) -> PyResult<Self> {
        let py = path.py();
        let path = opt_prose(path, "target")?;
        let url = opt_prose(url, "target")?;
        let schema = opt_prose(schema, "schema")?;
        let opts = OpenOptions {
            durability: if durability == "full" {
                Durability::Full
            } else {
                Durability::Normal
            },
            busy_timeout_ms,
            create,
            listen,
        };
        let mut this = Self {
            writer: None,
            clock,
            target: String::new(),
            waits: wait::Counts::default(),
            pid: std::process::id(),
        };
        let now = this.now(py)?;
        let store = py
            .detach(|| {
                crate::store::open(
                    path.as_deref(),
                    url.as_deref(),
                    schema.as_deref(),
                    &opts,
                    now,
                )
            })
            .map_err(|e| to_pyerr(py, e))?;
        crate::py::observe::flush(py);
        store.label().clone_into(&mut this.target);
        let mut cfg = Config::new(group_commit, busy_timeout_ms, url.is_some());
        cfg.fill = url.is_some() || opts.durability == crate::store::Durability::Full;
        this.writer = Some(Arc::new(Writer::new(store, cfg)));
        Ok(this)
    }

    /// The store's label: the path, `:memory:`, or the PostgreSQL URL without its password.
    /// Readable after `close` (a closed ledger still says what it was).
    fn target(&self) -> String {
        self.target.clone()
    }

    /// Refuse new calls, let the queued ones finish (or fail them, futures included), close
    /// the store. In a forked child, nothing: what it would close is the parent's.
    fn close(&self, py: Python<'_>) {
        if self.inherited() {
            return;
        }
        if let Some(writer) = &self.writer {
            py.detach(|| writer.close());
        }
    }

    /// Raise `StoreError` in a process the ledger was not opened in (a forked child). Every
    /// method but `target` and `close` checks this first; `AsyncLedger` calls it before it
    /// touches its threads.
    #[pyo3(name = "check_process")]
    fn py_check_process(&self, py: Python<'_>) -> PyResult<()> {
        self.check_process(py)
    }

    /// The writer's counts since open: `groups`, `calls`, `max_group`, `fallbacks`,
    /// `helper_groups` (groups led by the writer's thread), and the
    /// time groups spent in their transaction (on PostgreSQL including waits for run locks
    /// other sessions hold), `hold_us_total` and `hold_us_max`.
    fn group_stats(
        &self,
        py: Python<'_>,
    ) -> PyResult<std::collections::HashMap<&'static str, u64>> {
        self.check_process(py)?;
        Ok(self
            .writer
            .as_ref()
            .map(|w| w.stats().into_iter().collect())
            .unwrap_or_default())
    }

    /// What `wait_events` has cost since open: `queries` (events queries it ran), `checks`
    /// (reads of the store's change mark while polling) and `wakeups` (moves of the listening
    /// connection's signal it saw). An idle waiter on PostgreSQL adds to none of them.
    fn wait_stats(&self, py: Python<'_>) -> PyResult<std::collections::HashMap<&'static str, u64>> {
        self.check_process(py)?;
        Ok(self.waits.snapshot().into_iter().collect())
    }

    /// A pacer for the waiters of one thread (`AsyncLedger.wait_events`): see `wait::PyWatch`.
    fn watch(slf: Bound<'_, Self>) -> PyResult<wait::PyWatch> {
        wait::PyWatch::new(slf)
    }

    fn pragmas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.run(py, |s, _| s.pragmas())?;
        let d = PyDict::new(py);
        d.set_item("journal_mode", p.journal_mode)?;
        d.set_item("synchronous", p.synchronous)?;
        d.set_item("busy_timeout", p.busy_timeout)?;
        d.set_item("foreign_keys", p.foreign_keys)?;
        d.set_item("schema_version", p.schema_version)?;
        d.set_item("tls", p.tls)?;
        Ok(d)
    }

    #[pyo3(signature = (*, quick=false))]
    fn integrity_check(&self, py: Python<'_>, quick: bool) -> PyResult<Vec<String>> {
        self.run(py, move |s, _| s.integrity_check(quick))
    }

    fn orphan_attempts(&self, py: Python<'_>) -> PyResult<Vec<(String, String, i64, String)>> {
        self.run(py, |s, _| attempts::orphans(s))
    }

    // ------------------------------------------------------------------ blobs

    fn put_json(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
        let doc = read_doc(py, value, "value")?;
        self.run(py, move |s, now| {
            blobs::put_json(s, &Json::new(doc.to_vec()), now)
        })
    }

    fn get_json<'py>(
        &self,
        py: Python<'py>,
        digest: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let digest = text(digest, "digest")?;
        let bytes = self.run(py, move |s, _| blobs::get_json(s, &digest))?;
        Ok(PyBytes::new(py, &bytes))
    }

    // ------------------------------------------------------------------ runs and steps

    fn start_run<'py>(
        &self,
        py: Python<'py>,
        run: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = StartRunArgs::read(run)?;
        let run = self.run(py, move |s, now| {
            runs::start_run(s, &args.into_request(), now)
        })?;
        records::run(py, run)
    }

    fn publish_child_run<'py>(
        &self,
        py: Python<'py>,
        child: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = ChildRunArgs::read(child)?;
        let run = self.run(py, move |s, now| {
            runs::publish_child_run(s, &args.into_request(), now)
        })?;
        records::run(py, run)
    }

    fn get_run<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let run = self.run(py, move |s, _| runs::get_run(s, &run_id))?;
        records::opt_run(py, run)
    }

    fn resolve_run_id(&self, py: Python<'_>, prefix: &Bound<'_, PyAny>) -> PyResult<String> {
        let prefix = text(prefix, "prefix")?;
        self.run(py, move |s, _| runs::resolve_run_id(s, &prefix))
    }

    fn list_runs<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyDict>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let filter = args::run_filter(query)?;
        let runs = self.run(py, move |s, _| runs::list_runs(s, &filter))?;
        records::runs(py, runs)
    }

    fn find_active_run<'py>(
        &self,
        py: Python<'py>,
        workflow_refs: &Bound<'py, PyAny>,
        scope_key: &Bound<'py, PyAny>,
        outside: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let refs = str_list(workflow_refs, "workflow_refs")?.unwrap_or_default();
        let scope = text(scope_key, "scope_key")?;
        let run = self.run(py, move |s, _| {
            runs::find_active_run(s, &refs, &scope, outside)
        })?;
        records::opt_run(py, run)
    }

    fn find_scope_occupant<'py>(
        &self,
        py: Python<'py>,
        scope_key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let scope = text(scope_key, "scope_key")?;
        let run = self.run(py, move |s, _| runs::find_scope_occupant(s, &scope))?;
        records::opt_run(py, run)
    }

    fn child_runs<'py>(
        &self,
        py: Python<'py>,
        parent_run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let parent = text(parent_run_id, "parent_run_id")?;
        let runs = self.run(py, move |s, _| runs::child_runs(s, &parent))?;
        records::runs(py, runs)
    }

    /// `(status, count)` pairs of every run, in lifecycle order, each up to `count_max`.
    fn run_counts(
        &self,
        py: Python<'_>,
        count_max: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(&'static str, i64)>> {
        let count_max = int(count_max, "count_max")?;
        let counts = self.run(py, move |s, _| runs::run_counts(s, count_max))?;
        Ok(counts.into_iter().map(|(s, n)| (s.as_str(), n)).collect())
    }

    /// `(status, count)` pairs of the parent's children, in lifecycle order.
    fn child_summary(
        &self,
        py: Python<'_>,
        parent_run_id: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(&'static str, i64)>> {
        let parent = text(parent_run_id, "parent_run_id")?;
        let counts = self.run(py, move |s, _| runs::child_summary(s, &parent))?;
        Ok(counts.into_iter().map(|(s, n)| (s.as_str(), n)).collect())
    }

    fn steps<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let steps = self.run(py, move |s, _| runs::steps(s, &run_id))?;
        steps.into_iter().map(|st| records::step(py, st)).collect()
    }

    #[pyo3(signature = (run_id, step_id, result, claim, *, future=None))]
    fn complete_step<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        step_id: &Bound<'py, PyAny>,
        result: &Bound<'py, PyDict>,
        claim: &Bound<'py, PyAny>,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let step_id = text(step_id, "step_id")?;
        let fence = fence_arg(claim)?;
        let result = StepResultArgs::read(result)?;
        self.call(
            py,
            future,
            move |now| Op::complete_step(run_id, step_id, result.into_result(), fence, now),
            built::run,
        )
    }

    fn block_run<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        notes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let notes = opt_text(notes, "notes")?;
        let run = self.run(py, move |s, now| {
            runs::block_run(s, &run_id, notes.as_deref(), now)
        })?;
        records::run(py, run)
    }

    fn resume_run<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let run = self.run(py, move |s, now| runs::resume_run(s, &run_id, now))?;
        records::run(py, run)
    }

    fn abandon_run(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        reason: &Bound<'_, PyAny>,
        cascade: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let run_id = text(run_id, "run_id")?;
        let reason = opt_prose(reason, "reason")?;
        let cascade = flag(cascade, "cascade")?;
        self.run(py, move |s, now| {
            runs::abandon_run(s, &run_id, reason.as_deref(), cascade, now)
        })
    }

    fn set_outputs(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        outputs: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let run_id = text(run_id, "run_id")?;
        let doc = read_doc(py, outputs, "outputs")?;
        let fence = fence_arg(claim)?;
        self.run(py, move |s, now| {
            runs::set_outputs(s, &run_id, &Json::new(doc.to_vec()), fence.as_ref(), now)
        })
    }

    // ------------------------------------------------------------------ attempts

    #[pyo3(signature = (run_id, unit, claim, *, future=None))]
    fn reserve_attempt<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        unit: &Bound<'py, PyDict>,
        claim: &Bound<'py, PyAny>,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let unit = vec![args::unit_arg(unit)?];
        let fence = fence_arg(claim)?;
        self.call(
            py,
            future,
            move |now| Op::reserve(run_id, unit, fence, now),
            built::reservation,
        )
    }

    #[pyo3(signature = (run_id, units, claim, *, force=false, future=None))]
    fn reserve_attempts<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        units: &Bound<'py, PyAny>,
        claim: &Bound<'py, PyAny>,
        force: bool,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let mut units = args::units_arg(units)?;
        for u in &mut units {
            u.force |= force;
        }
        let fence = fence_arg(claim)?;
        self.call(
            py,
            future,
            move |now| Op::reserve(run_id, units, fence, now),
            built::reservations,
        )
    }

    #[pyo3(signature = (finish, claim, *, future=None))]
    fn finish_attempt<'py>(
        &self,
        py: Python<'py>,
        finish: &Bound<'py, PyDict>,
        claim: &Bound<'py, PyAny>,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let finish = FinishArgs::one(finish)?;
        let fence = fence_arg(claim)?;
        self.call(
            py,
            future,
            move |now| Op::finish(vec![finish.into_spec()], fence, now),
            built::finished,
        )
    }

    #[pyo3(signature = (finishes, claim, *, future=None))]
    fn finish_attempts<'py>(
        &self,
        py: Python<'py>,
        finishes: &Bound<'py, PyAny>,
        claim: &Bound<'py, PyAny>,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let finishes = FinishArgs::many(finishes)?;
        let fence = fence_arg(claim)?;
        self.call(
            py,
            future,
            move |now| {
                let specs = finishes.into_iter().map(FinishArgs::into_spec).collect();
                Op::finish(specs, fence, now)
            },
            built::all_finished,
        )
    }

    fn attempts<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        unit_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let unit_id = text(unit_id, "unit_id")?;
        let rows = self.run(py, move |s, _| attempts::attempts(s, &run_id, &unit_id))?;
        rows.into_iter().map(|a| records::attempt(py, a)).collect()
    }

    /// The newest `latest` attempts of each named unit, by unit and attempt.
    fn unit_attempts<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        unit_ids: &Bound<'py, PyAny>,
        latest: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let unit_ids = str_list(unit_ids, "unit_ids")?.unwrap_or_default();
        let latest = int(latest, "latest")?;
        let rows = self.run(py, move |s, _| {
            attempts::unit_attempts(s, &run_id, &unit_ids, latest)
        })?;
        rows.into_iter().map(|a| records::attempt(py, a)).collect()
    }

    #[pyo3(signature = (run_id, step_id, *, status, limit, after))]
    fn units<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        step_id: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        after: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let filter = UnitFilter {
            run_id: text(run_id, "run_id")?,
            step_id: opt_text(step_id, "step_id")?,
            status: opt_text(status, "status")?,
            limit: opt_int(limit, "limit")?,
            after: opt_text(after, "after")?,
        };
        let rows = self.run(py, move |s, _| attempts::units(s, &filter))?;
        rows.into_iter().map(|u| records::unit(py, u)).collect()
    }

    /// A page of the due units; the cursor is the last unit of the page before, as (retry time
    /// in ms, run, unit).
    fn due_units<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        after: Option<(i64, String, String)>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = opt_text(run_id, "run_id")?;
        let limit = int(limit, "limit")?;
        let after = after.map(|(retry_at, run_id, unit_id)| attempts::DueCursor {
            retry_at,
            run_id,
            unit_id,
        });
        let units = self.run(py, move |s, now| {
            attempts::due_units(s, run_id.as_deref(), limit, after.as_ref(), now)
        })?;
        units.into_iter().map(|u| records::unit(py, u)).collect()
    }

    /// A page of the exhausted units; the cursor is the last unit of the page before, as
    /// (run, unit).
    fn exhausted_units<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        after: Option<(String, String)>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = opt_text(run_id, "run_id")?;
        let limit = int(limit, "limit")?;
        let after = after.map(|(run_id, unit_id)| attempts::UnitCursor { run_id, unit_id });
        let units = self.run(py, move |s, _| {
            attempts::exhausted_units(s, run_id.as_deref(), limit, after.as_ref())
        })?;
        units.into_iter().map(|u| records::unit(py, u)).collect()
    }

    fn retry_units(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        unit_ids: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let run_id = text(run_id, "run_id")?;
        let unit_ids = str_list(unit_ids, "unit_ids")?;
        let fence = fence_arg(claim)?;
        self.run(py, move |s, now| {
            attempts::retry_units(s, &run_id, unit_ids.as_deref(), fence.as_ref(), now)
        })
    }

    fn cancel_units(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        unit_ids: &Bound<'_, PyAny>,
        reason: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let run_id = text(run_id, "run_id")?;
        let unit_ids = str_list(unit_ids, "unit_ids")?;
        let reason = opt_prose(reason, "reason")?;
        let fence = fence_arg(claim)?;
        self.run(py, move |s, now| {
            attempts::cancel_units(
                s,
                &run_id,
                unit_ids.as_deref(),
                reason.as_deref(),
                fence.as_ref(),
                now,
            )
        })
    }

    // ------------------------------------------------------------------ messages

    fn send<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        topic: &Bound<'py, PyAny>,
        payload: &Bound<'py, PyAny>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let topic = text(topic, "topic")?;
        let key = opt_text(key, "key")?;
        let doc = read_doc(py, payload, "payload")?;
        let message = self.run(py, move |s, now| {
            let msg = messages::NewMessage {
                run_id,
                topic,
                key,
                payload: Json::new(doc.to_vec()),
            };
            messages::send(s, &msg, now)
        })?;
        records::message(py, message)
    }

    fn receive<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        topic: &Bound<'py, PyAny>,
        claim: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let topic = text(topic, "topic")?;
        let (fence, _) = claim_arg(claim)?;
        let limit = int(limit, "limit")?;
        let taken = self.run(py, move |s, now| {
            messages::receive(s, &run_id, &topic, &fence, limit, now)
        })?;
        taken.into_iter().map(|m| records::message(py, m)).collect()
    }

    fn messages<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        topic: &Bound<'py, PyAny>,
        after_seq: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let topic = opt_text(topic, "topic")?;
        let after_seq = int(after_seq, "after_seq")?;
        let limit = int(limit, "limit")?;
        let listed = self.run(py, move |s, _| {
            messages::messages(s, &run_id, topic.as_deref(), after_seq, limit)
        })?;
        listed
            .into_iter()
            .map(|m| records::message(py, m))
            .collect()
    }

    // ------------------------------------------------------------------ schedules

    /// `run` is `reserve_run`'s keywords as the facade builds them from the template (its run
    /// id a placeholder: each fire names its own).
    #[allow(clippy::too_many_arguments)]
    fn put_schedule<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        cron: &Bound<'py, PyAny>,
        timezone: &Bound<'py, PyAny>,
        overlap: &Bound<'py, PyAny>,
        catch_up: &Bound<'py, PyAny>,
        run: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = text(name, "name")?;
        let cron = text(cron, "cron")?;
        let timezone = text(timezone, "timezone")?;
        let overlap = text(overlap, "overlap")?;
        let catch_up = int(catch_up, "catch_up")?;
        let run = QueuedRunArgs::read(run)?;
        let put = self.run(py, move |s, now| {
            let new = schedules::NewSchedule {
                name,
                cron,
                timezone,
                overlap: schedules::Overlap::parse(&overlap)?,
                catch_up,
                run: run.into_request(),
            };
            schedules::put_schedule(s, &new, now)
        })?;
        records::schedule(py, put)
    }

    fn schedules<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let all = self.run(py, |s, _| schedules::schedules(s))?;
        all.into_iter().map(|x| records::schedule(py, x)).collect()
    }

    fn pause_schedule(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = text(name, "name")?;
        self.run(py, move |s, now| {
            schedules::pause_schedule(s, &name, true, now)
        })
    }

    fn resume_schedule(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = text(name, "name")?;
        self.run(py, move |s, now| {
            schedules::pause_schedule(s, &name, false, now)
        })
    }

    fn delete_schedule(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = text(name, "name")?;
        self.run(py, move |s, _| schedules::delete_schedule(s, &name))
    }

    fn tick_schedules<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let fired = self.run(py, schedules::tick_schedules)?;
        fired.into_iter().map(|r| records::run(py, r)).collect()
    }

    /// `(status, count)` pairs, in lifecycle order.
    fn unit_counts(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(&'static str, i64)>> {
        let run_id = text(run_id, "run_id")?;
        let counts = self.run(py, move |s, _| attempts::unit_counts(s, &run_id))?;
        Ok(counts.into_iter().map(|(s, n)| (s.as_str(), n)).collect())
    }

    fn unit<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        unit_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let unit_id = text(unit_id, "unit_id")?;
        let unit = self.run(py, move |s, _| attempts::unit(s, &run_id, &unit_id))?;
        unit.map(|u| records::unit(py, u)).transpose()
    }

    fn accounting<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let a = self.run(py, move |s, _| attempts::accounting(s, &run_id))?;
        records::accounting(py, a)
    }

    // ------------------------------------------------------------------ queue and claims

    fn reserve_run<'py>(
        &self,
        py: Python<'py>,
        run: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = QueuedRunArgs::read(run)?;
        let run = self.run(py, move |s, now| {
            queue::reserve_run(s, &args.into_request(), now)
        })?;
        records::run(py, run)
    }

    fn prepare_or_adopt<'py>(
        &self,
        py: Python<'py>,
        run: &Bound<'py, PyDict>,
        lease_ms: &Bound<'py, PyAny>,
        claim_token: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = QueuedRunArgs::read(run)?;
        let lease_ms = int(lease_ms, "lease_ms")?;
        let token = opt_text(claim_token, "claim_token")?;
        let runner = args.runner_id.clone();
        let prepared = self.run(py, move |s, now| {
            let spec = ClaimSpec::new(runner, lease_ms, token, "claim_token")?;
            queue::prepare_or_adopt(s, &args.into_request(), &spec, now)
        })?;
        records::preparation(py, prepared)
    }

    fn claim<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        runner_id: &Bound<'py, PyAny>,
        lease_ms: &Bound<'py, PyAny>,
        token: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let runner_id = text(runner_id, "runner_id")?;
        let lease_ms = int(lease_ms, "lease_ms")?;
        let token = opt_text(token, "token")?;
        let claim = self
            .submit(py, move |now| {
                let spec = ClaimSpec::new(runner_id, lease_ms, token, "token")?;
                Ok(Op::claim(run_id, spec, now))
            })?
            .maybe_claim()
            .map_err(|e| to_pyerr(py, e))?;
        records::opt_claim(py, claim)
    }

    fn set_concurrency_limit(
        &self,
        py: Python<'_>,
        concurrency_key: &Bound<'_, PyAny>,
        limit: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let key = text(concurrency_key, "concurrency_key")?;
        let limit = opt_int(limit, "limit")?;
        self.run(py, move |s, now| {
            queue::set_concurrency_limit(s, &key, limit, now)
        })
    }

    fn concurrency_limits(&self, py: Python<'_>) -> PyResult<Vec<(String, i64)>> {
        self.run(py, |s, _| queue::concurrency_limits(s))
    }

    fn pause_workflow(&self, py: Python<'_>, workflow_name: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = text(workflow_name, "workflow_name")?;
        self.run(py, move |s, now| queue::pause_workflow(s, &name, now))
    }

    fn resume_workflow(&self, py: Python<'_>, workflow_name: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = text(workflow_name, "workflow_name")?;
        self.run(py, move |s, _| queue::resume_workflow(s, &name))
    }

    fn paused_workflows(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.run(py, |s, _| queue::paused_workflows(s))
    }

    /// A page of a lane; the cursor is the last run of the page before, as three values.
    fn queued_runs<'py>(
        &self,
        py: Python<'py>,
        lane: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        after: Option<(i64, i64, String)>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let lane = queue::Lane::parse(&text(lane, "lane")?).map_err(|e| to_pyerr(py, e))?;
        let limit = int(limit, "limit")?;
        let runs = self.run(py, move |s, _| {
            queue::queued_runs(s, lane, limit, after.as_ref())
        })?;
        records::runs(py, runs)
    }

    /// The overview as plain tuples: (due, keyed, later, keys, paused), each key (key, limit,
    /// live, queued), each paused workflow (name, paused at in ms, queued); the facade makes
    /// the records.
    #[allow(clippy::type_complexity)]
    fn queue_overview(
        &self,
        py: Python<'_>,
        count_max: &Bound<'_, PyAny>,
        limit: &Bound<'_, PyAny>,
        after_key: &Bound<'_, PyAny>,
    ) -> PyResult<(
        i64,
        i64,
        i64,
        Vec<(String, i64, i64, i64)>,
        Vec<(String, i64, i64)>,
    )> {
        let count_max = int(count_max, "count_max")?;
        let limit = int(limit, "limit")?;
        let after_key = opt_text(after_key, "after_key")?.unwrap_or_default();
        let o = self.run(py, move |s, now| {
            queue::queue_overview(s, count_max, limit, &after_key, now)
        })?;
        let keys = o
            .keys
            .into_iter()
            .map(|k| (k.concurrency_key, k.limit, k.live, k.queued))
            .collect();
        let paused = o
            .paused
            .into_iter()
            .map(|p| (p.workflow_name, p.paused_at, p.queued))
            .collect();
        Ok((o.due, o.keyed, o.later, keys, paused))
    }

    // The Python signature's own arguments, one each.
    #[allow(clippy::too_many_arguments)]
    fn claim_next<'py>(
        &self,
        py: Python<'py>,
        runner_id: &Bound<'py, PyAny>,
        lease_ms: &Bound<'py, PyAny>,
        workflow_names: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        token: &Bound<'py, PyAny>,
        rescue: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let req = queue::NextClaims {
            runner_id: text(runner_id, "runner_id")?,
            lease_ms: int(lease_ms, "lease_ms")?,
            workflow_names: str_list(workflow_names, "workflow_names")?,
            limit: int(limit, "limit")?,
            token: opt_text(token, "token")?,
            rescue: flag(rescue, "rescue")?,
        };
        let claims = self.run(py, move |s, now| queue::claim_next(s, &req, now))?;
        claims.into_iter().map(|c| records::claim(py, c)).collect()
    }

    #[pyo3(signature = (claim, lease_ms, *, future=None))]
    fn heartbeat<'py>(
        &self,
        py: Python<'py>,
        claim: &Bound<'py, PyAny>,
        lease_ms: &Bound<'py, PyAny>,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let (fence, token) = claim_arg(claim)?;
        let lease_ms = int(lease_ms, "lease_ms")?;
        self.call(
            py,
            future,
            move |now| Op::heartbeat(fence, token, lease_ms, now),
            built::claim,
        )
    }

    fn release(&self, py: Python<'_>, claim: &Bound<'_, PyAny>) -> PyResult<()> {
        let (fence, _) = claim_arg(claim)?;
        self.run(py, move |s, now| leases::release(s, &fence, now))
    }

    #[pyo3(signature = (run_id, status, claim, *, future=None))]
    fn set_status<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
        claim: &Bound<'py, PyAny>,
        future: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let run_id = text(run_id, "run_id")?;
        let status = text(status, "status")?;
        let (fence, _) = claim_arg(claim)?;
        self.call(
            py,
            future,
            move |now| Op::set_status(run_id, &status, fence, now),
            built::run,
        )
    }

    fn lease<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let lease = self.run(py, move |s, _| leases::lease(s, &run_id))?;
        records::lease(py, lease)
    }

    fn expired_leases<'py>(
        &self,
        py: Python<'py>,
        active_only: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let active_only = flag(active_only, "active_only")?;
        let leases = self.run(py, move |s, now| {
            leases::expired_leases(s, now, active_only)
        })?;
        leases.into_iter().map(|l| records::lease(py, l)).collect()
    }

    fn leases<'py>(
        &self,
        py: Python<'py>,
        owned_only: &Bound<'py, PyAny>,
        run_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let owned_only = flag(owned_only, "owned_only")?;
        let run_ids = str_list(run_ids, "run_ids")?;
        let leases = self.run(py, move |s, _| match run_ids {
            Some(ids) => leases::run_leases(s, &ids),
            None => leases::leases(s, owned_only),
        })?;
        leases.into_iter().map(|l| records::lease(py, l)).collect()
    }

    // ------------------------------------------------------------------ events

    fn events<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        after_seq: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        types: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let run_id = opt_text(run_id, "run_id")?;
        let after_seq = int(after_seq, "after_seq")?;
        let limit = int(limit, "limit")?;
        let types = str_list(types, "types")?;
        let rows = self.run(py, move |s, _| {
            events::read(s, run_id.as_deref(), after_seq, limit, types.as_deref())
        })?;
        rows.into_iter().map(|e| records::event(py, e)).collect()
    }

    /// Events per minute for `minutes` minutes from the minute of `first_ms` (by default the
    /// last `minutes` minutes, the current one included), and whether they are exact.
    fn event_counts(
        &self,
        py: Python<'_>,
        first_ms: Option<i64>,
        minutes: &Bound<'_, PyAny>,
        exact_max: &Bound<'_, PyAny>,
    ) -> PyResult<(i64, Vec<i64>, bool)> {
        let minutes = int(minutes, "minutes")?;
        let exact_max = int(exact_max, "exact_max")?;
        self.run(py, move |s, now| {
            let first = first_ms
                .unwrap_or_else(|| now.div_euclid(60_000) * 60_000 - (minutes - 1).max(0) * 60_000);
            let (counts, exact) = events::counts_per_minute(s, first, minutes, exact_max)?;
            Ok((first.div_euclid(60_000) * 60_000, counts, exact))
        })
    }

    fn newest_event_seq(&self, py: Python<'_>) -> PyResult<i64> {
        self.run(py, |s, _| events::newest_seq(s))
    }

    fn wait_events<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        after_seq: &Bound<'py, PyAny>,
        timeout_s: &Bound<'py, PyAny>,
        types: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let w = wait::Wait {
            run_id: opt_text(run_id, "run_id")?,
            after_seq: int(after_seq, "after_seq")?,
            timeout: wait::timeout(timeout_s)?,
            types: str_list(types, "types")?,
            limit: int(limit, "limit")?,
        };
        let rows = self.wait_events_in(py, &w)?;
        rows.into_iter().map(|e| records::event(py, e)).collect()
    }

    // ------------------------------------------------------------------ retention

    #[pyo3(signature = (*, cutoff_ms, age_ms, statuses, limit, dry_run, sink, progress))]
    #[allow(clippy::too_many_arguments)]
    fn prune<'py>(
        &self,
        py: Python<'py>,
        cutoff_ms: &Bound<'py, PyAny>,
        age_ms: &Bound<'py, PyAny>,
        statuses: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        dry_run: &Bound<'py, PyAny>,
        sink: Option<&Bound<'py, PyAny>>,
        progress: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let cutoff_ms = opt_int(cutoff_ms, "older_than")?;
        let age_ms = opt_int(age_ms, "older_than")?;
        let statuses = str_list(statuses, "statuses")?.unwrap_or_default();
        let limit = opt_int(limit, "limit")?;
        let dry_run = flag(dry_run, "dry_run")?;
        self.prune_in(
            py, cutoff_ms, age_ms, &statuses, limit, dry_run, sink, progress,
        )
    }

    #[pyo3(signature = (lines, *, progress))]
    fn restore(
        &self,
        py: Python<'_>,
        lines: &Bound<'_, PyAny>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.restore_in(py, lines, progress)
    }

    fn vacuum(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |s, _| s.vacuum())
    }
}

impl Drop for PyLedger {
    /// A ledger dropped unclosed stops taking calls; the writer's helper, if it was started,
    /// finishes what is queued and then stops, closing the store. Nothing waits here: the
    /// dropping thread holds the GIL, which the helper's deliveries need.
    ///
    /// Dropped in a forked child (at the latest when its interpreter exits), the writer is
    /// leaked instead: its locks may be held by parent threads the fork did not copy, and
    /// dropping the store would close the parent's connection (on PostgreSQL with a Terminate
    /// that ends the parent's session) and join threads that do not exist here.
    fn drop(&mut self) {
        if self.inherited() {
            std::mem::forget(self.writer.take());
            return;
        }
        if let Some(writer) = &self.writer {
            writer.shut();
        }
    }
}

/// The Python results of the calls the writer groups, built from their outputs (after the
/// wait, or by the delivery of an asynchronous call).
mod built {
    use pyo3::prelude::*;
    use pyo3::types::{PyBool, PyList};

    use crate::py::errors::to_pyerr;
    use crate::py::records;
    use crate::writer::Output;

    pub(super) fn reservation(py: Python<'_>, out: Output) -> PyResult<Bound<'_, PyAny>> {
        let mut out = out.reservations().map_err(|e| to_pyerr(py, e))?;
        records::reservation(py, out.remove(0))
    }

    pub(super) fn reservations(py: Python<'_>, out: Output) -> PyResult<Bound<'_, PyAny>> {
        let out = out.reservations().map_err(|e| to_pyerr(py, e))?;
        let items = out
            .into_iter()
            .map(|r| records::reservation(py, r))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, items)?.into_any())
    }

    pub(super) fn finished(py: Python<'_>, out: Output) -> PyResult<Bound<'_, PyAny>> {
        let out = out.finished().map_err(|e| to_pyerr(py, e))?;
        let won = out.first().copied().unwrap_or(false);
        Ok(PyBool::new(py, won).to_owned().into_any())
    }

    pub(super) fn all_finished(py: Python<'_>, out: Output) -> PyResult<Bound<'_, PyAny>> {
        let out = out.finished().map_err(|e| to_pyerr(py, e))?;
        Ok(PyList::new(py, out)?.into_any())
    }

    pub(super) fn claim(py: Python<'_>, out: Output) -> PyResult<Bound<'_, PyAny>> {
        let claim = out.claim().map_err(|e| to_pyerr(py, e))?;
        records::claim(py, claim)
    }

    pub(super) fn run(py: Python<'_>, out: Output) -> PyResult<Bound<'_, PyAny>> {
        let run = out.run().map_err(|e| to_pyerr(py, e))?;
        records::run(py, run)
    }
}

//! `fencepost._core.Ledger`: the compiled half of `fencepost.Ledger`.
//!
//! Every method follows one order (STYLE §6): read the Python arguments into owned Rust values
//! and read the clock (it may be a Python callable) while attached; detach; canonicalize and
//! hash JSON arguments, lock the store and run one transaction; re-attach and build the result
//! or the exception. A closed ledger raises `StoreError`.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::attempts::{self, FinishSpec, UnitSpec};
use crate::canonical::{Doc, Json};
use crate::errors::{LedgerError, Result};
use crate::leases::{self, ClaimSpec, Fence};
use crate::model::{Attempt, Claim, Event, Lease, Run, Step, Unit};
use crate::py::errors::to_pyerr;
use crate::py::read_doc;
use crate::queue::{self, NewQueuedRun};
use crate::runs::{self, ChildRun, NewRun, RunFilter, StepResult, StepSpec};
use crate::store::{Durability, OpenOptions, Store};
use crate::{blobs, events};

/// The ledger handle: one connection behind a mutex, shared safely between threads.
#[pyclass(frozen, module = "fencepost._core", name = "Ledger")]
pub struct PyLedger {
    store: Mutex<Option<Box<dyn Store>>>,
    clock: Option<Py<PyAny>>,
    /// The store's password-free label, kept for `repr` after `close`.
    target: String,
}

fn invalid(py: Python<'_>, argument: &str, message: impl Into<String>) -> PyErr {
    to_pyerr(py, LedgerError::invalid(argument, message))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// A required `str` argument, refused with `InvalidArgument` naming it. The text rules of
/// [`crate::ids::check_text`] apply (no NUL; identifiers and keys bounded).
fn text(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    let s = any_str(obj, argument)?;
    crate::ids::check_text(argument, &s).map_err(|e| to_pyerr(obj.py(), e))?;
    Ok(s)
}

/// A `str` that is free text wherever it appears (a step's title or instructions inside
/// `steps`): NUL refused, no length bound.
fn prose(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    let s = any_str(obj, argument)?;
    crate::ids::check_prose(argument, &s).map_err(|e| to_pyerr(obj.py(), e))?;
    Ok(s)
}

fn any_str(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        let message = if obj.is_instance_of::<PyString>() {
            // The only str that is not UTF-8: one holding half of a surrogate pair.
            "contains a lone surrogate (U+D800..U+DFFF), which is not valid Unicode text".to_owned()
        } else {
            format!("must be a str, not {}", type_name(obj))
        };
        invalid(obj.py(), argument, message)
    })
}

/// `None`, or what `read` makes of the argument.
fn optional<'py, T>(
    obj: &Bound<'py, PyAny>,
    argument: &str,
    read: fn(&Bound<'py, PyAny>, &str) -> PyResult<T>,
) -> PyResult<Option<T>> {
    if obj.is_none() {
        Ok(None)
    } else {
        read(obj, argument).map(Some)
    }
}

/// An optional `str` argument.
fn opt_text(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<String>> {
    optional(obj, argument, text)
}

fn opt_prose(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<String>> {
    optional(obj, argument, prose)
}

/// A `bool` flag; `0`, `1` or `None` are refused rather than guessed at.
fn flag(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<bool> {
    obj.cast::<PyBool>()
        .map(PyBoolMethods::is_true)
        .map_err(|_| {
            invalid(
                obj.py(),
                argument,
                format!("must be True or False, not {}", type_name(obj)),
            )
        })
}

/// An `int` argument (`bool` refused: `True` is not a count).
fn int(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(invalid(obj.py(), argument, "must be an int, not bool"));
    }
    obj.extract::<i64>().map_err(|_| {
        let message = if obj.is_instance_of::<PyInt>() {
            "is out of range: it must fit in a signed 64-bit integer".to_owned()
        } else {
            format!("must be an int, not {}", type_name(obj))
        };
        invalid(obj.py(), argument, message)
    })
}

fn opt_int(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<i64>> {
    optional(obj, argument, int)
}

/// An optional JSON argument, walked now and serialized later (detached).
fn opt_doc(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<Doc>> {
    if obj.is_none() {
        Ok(None)
    } else {
        read_doc(obj.py(), obj, argument).map(Some)
    }
}

fn json(doc: Option<Doc>) -> Option<Json> {
    doc.map(|d| Json::new(d.to_vec()))
}

fn json_text(doc: Option<Doc>) -> Option<String> {
    doc.map(|d| crate::canonical::into_text(d.to_vec()))
}

fn str_list(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<Vec<String>>> {
    if obj.is_none() {
        return Ok(None);
    }
    let Ok(list) = obj.cast::<PyList>() else {
        return Err(invalid(obj.py(), argument, "must be a list of str"));
    };
    list.iter()
        .map(|item| text(&item, argument))
        .collect::<PyResult<_>>()
        .map(Some)
}

/// The dicts of a list argument (`steps`, `units`, `finishes`).
fn dicts<'py>(obj: &Bound<'py, PyAny>, argument: &str) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = obj.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(invalid(
            obj.py(),
            argument,
            format!("must be a list of dicts, not {}", type_name(obj)),
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item.cast_into::<PyDict>() {
            Ok(d) => out.push(d),
            Err(e) => {
                return Err(invalid(
                    obj.py(),
                    argument,
                    format!(
                        "item {i} must be a dict, not {}",
                        type_name(&e.into_inner())
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// The items of one dict argument (`steps`, `units`, `finishes` items), read by iterating the
/// dict once: a key is never looked up, so no key's own `__eq__` or `__hash__` runs.
struct Fields<'py> {
    py: Python<'py>,
    items: Vec<(&'static str, Bound<'py, PyAny>)>,
}

impl<'py> Fields<'py> {
    /// Item `i` of `argument`; a key that is not a `str` or not one of `keys` (a typo must not
    /// be silently ignored) is refused.
    fn read(
        d: &Bound<'py, PyDict>,
        argument: &str,
        i: usize,
        keys: &[&'static str],
    ) -> PyResult<Self> {
        let py = d.py();
        let mut items = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            // Borrowed UTF-8 of the key (no copy): this runs for every field of every batch item.
            let key = k.cast::<PyString>().ok();
            let name = key.as_ref().and_then(|s| s.to_str().ok());
            let Some(known) = name.and_then(|n| keys.iter().find(|&&key| key == n)) else {
                let shown = name.map_or_else(
                    || format!("of type {}", type_name(&k)),
                    |n| format!("{n:?}"),
                );
                return Err(invalid(
                    py,
                    argument,
                    format!(
                        "item {i} has unknown key {shown}; allowed: {}",
                        keys.join(", ")
                    ),
                ));
            };
            items.push((*known, v));
        }
        Ok(Self { py, items })
    }

    /// The value under `key`, or `None` when the item leaves it out.
    fn get(&self, key: &str) -> Bound<'py, PyAny> {
        self.items
            .iter()
            .find(|(k, _)| *k == key)
            .map_or_else(|| self.py.None().into_bound(self.py), |(_, v)| v.clone())
    }
}

/// `steps`: dicts with `id` (required), `title`, `instructions`, `completion`.
fn steps_arg(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<StepSpec>, Vec<Option<Doc>>)> {
    let mut specs = Vec::new();
    let mut completions = Vec::new();
    for (i, d) in dicts(obj, "steps")?.iter().enumerate() {
        let f = Fields::read(
            d,
            "steps",
            i,
            &["id", "title", "instructions", "completion"],
        )?;
        let id = f.get("id");
        if id.is_none() {
            return Err(invalid(
                obj.py(),
                "steps",
                format!("item {i} has no \"id\""),
            ));
        }
        specs.push(StepSpec {
            id: text(&id, "steps")?,
            title: opt_prose(&f.get("title"), "steps")?.unwrap_or_default(),
            instructions: opt_prose(&f.get("instructions"), "steps")?.unwrap_or_default(),
            completion: None,
        });
        completions.push(opt_doc(&f.get("completion"), "steps")?);
    }
    Ok((specs, completions))
}

fn with_completions(mut specs: Vec<StepSpec>, completions: Vec<Option<Doc>>) -> Vec<StepSpec> {
    for (s, c) in specs.iter_mut().zip(completions) {
        s.completion = json_text(c);
    }
    specs
}

const UNIT_KEYS: &[&str] = &[
    "unit_id",
    "step_id",
    "node_id",
    "phase",
    "runner",
    "engine",
    "model",
    "input_hash",
    "worktree_path",
    "parent_unit_id",
    "holder",
];

fn unit_from_dict(d: &Bound<'_, PyDict>, i: usize) -> PyResult<UnitSpec> {
    let f = Fields::read(d, "units", i, UNIT_KEYS)?;
    let opt = |k: &str| -> PyResult<Option<String>> { opt_text(&f.get(k), k) };
    Ok(UnitSpec {
        unit_id: opt("unit_id")?.unwrap_or_default(),
        step_id: opt("step_id")?.unwrap_or_default(),
        node_id: opt("node_id")?,
        phase: opt("phase")?.unwrap_or_else(|| "unit".to_owned()),
        runner: opt("runner")?,
        engine: opt("engine")?,
        model: opt("model")?,
        input_hash: opt("input_hash")?,
        worktree_path: opt("worktree_path")?,
        parent_unit_id: opt("parent_unit_id")?,
        holder: opt("holder")?,
    })
}

const FINISH_KEYS: &[&str] = &[
    "run_id",
    "unit_id",
    "attempt",
    "dispatch_id",
    "status",
    "result",
    "tokens",
    "failure_reason",
    "session_id",
];

/// A claim (`fencepost.Claim`) as a fence: its token is hashed here, before any transaction.
fn fence_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Fence>> {
    if obj.is_none() {
        return Ok(None);
    }
    claim_arg(obj).map(|(fence, _)| Some(fence))
}

/// A `Claim` argument: the fence (token hashed now) and the plaintext token.
fn claim_arg(obj: &Bound<'_, PyAny>) -> PyResult<(Fence, String)> {
    let read = || -> PyResult<(Fence, String)> {
        let run_id: String = obj.getattr("run_id")?.extract()?;
        let generation: i64 = obj.getattr("generation")?.extract()?;
        let token: String = obj.getattr("token")?.extract()?;
        Ok((Fence::from_token(&run_id, generation, &token), token))
    };
    read().map_err(|_| {
        invalid(
            obj.py(),
            "claim",
            "must be the Claim returned by ledger.claim() or prepare_or_adopt()",
        )
    })
}

type ClaimTuple = (String, i64, String, String, i64);
type LeaseTuple = (
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

fn claim_tuple(c: Claim) -> ClaimTuple {
    (c.run_id, c.generation, c.token, c.owner_id, c.expires_at)
}

fn lease_tuple(l: Lease) -> LeaseTuple {
    (
        l.run_id,
        l.generation,
        l.owner_id,
        l.owner_type,
        l.expires_at,
        l.heartbeat_at,
    )
}

/// The keywords `reserve_run` and `prepare_or_adopt` share, read while attached.
struct QueuedArgs {
    run_id: String,
    workflow_name: String,
    workflow_ref: String,
    source: Doc,
    definition_digest: String,
    definition: Doc,
    input: Option<Doc>,
    launch_options: Option<Doc>,
    runner_id: String,
    origin_session_id: String,
    parent_run_id: Option<String>,
}

impl QueuedArgs {
    /// Serialize and hash the JSON arguments (detached).
    fn into_request(self) -> NewQueuedRun {
        let doc = |d: Doc| Json::new(d.to_vec());
        NewQueuedRun {
            run_id: self.run_id,
            workflow_name: self.workflow_name,
            workflow_ref: self.workflow_ref,
            source: doc(self.source),
            definition_digest: self.definition_digest,
            definition: doc(self.definition),
            input: self.input.map_or_else(|| Json::new(b"null".to_vec()), doc),
            launch_options: self
                .launch_options
                .map_or_else(|| Json::new(b"{}".to_vec()), doc),
            runner_id: self.runner_id,
            origin_session_id: self.origin_session_id,
            parent_run_id: self.parent_run_id,
        }
    }
}

fn bytes_or_none<'py>(py: Python<'py>, b: Option<&[u8]>) -> Bound<'py, PyAny> {
    b.map_or_else(
        || py.None().into_bound(py),
        |b| PyBytes::new(py, b).into_any(),
    )
}

macro_rules! tuple {
    ($py:expr; $($item:expr),* $(,)?) => {
        PyTuple::new($py, [$($item.into_pyobject($py)?.into_any()),*])
    };
}

fn run_tuple(py: Python<'_>, r: Run) -> PyResult<Bound<'_, PyTuple>> {
    let params = bytes_or_none(py, r.params.as_deref());
    let outputs = bytes_or_none(py, r.outputs.as_deref());
    tuple!(py; r.run_id, r.workflow_ref, r.workflow_name, r.scope_key, r.status.as_str(), r.current_step_id,
        r.parent_run_id, r.parent_unit_id, r.invocation_key, r.origin_session_id, params, outputs,
        r.revision, r.created_at, r.updated_at, r.completed_at)
}

fn opt_run_tuple(py: Python<'_>, r: Option<Run>) -> PyResult<Py<PyAny>> {
    match r {
        Some(r) => Ok(run_tuple(py, r)?.into_any().unbind()),
        None => Ok(py.None()),
    }
}

fn runs_list(py: Python<'_>, runs: Vec<Run>) -> PyResult<Vec<Bound<'_, PyTuple>>> {
    runs.into_iter().map(|r| run_tuple(py, r)).collect()
}

fn step_tuple(py: Python<'_>, s: Step) -> PyResult<Bound<'_, PyTuple>> {
    let evidence = bytes_or_none(py, s.evidence.as_deref());
    tuple!(py; s.run_id, s.step_id, s.title, s.instructions, s.sequence_index, s.status.as_str(), s.notes,
        evidence, s.summary, s.completed_at)
}

fn unit_tuple(py: Python<'_>, u: Unit) -> PyResult<Bound<'_, PyTuple>> {
    let result = bytes_or_none(py, u.result.as_deref());
    tuple!(py; u.run_id, u.unit_id, u.step_id, u.phase, u.status.as_str(), u.attempts, result, u.tokens,
        u.failure_reason, u.claim_holder)
}

fn attempt_tuple(py: Python<'_>, a: Attempt) -> PyResult<Bound<'_, PyTuple>> {
    let result = bytes_or_none(py, a.result.as_deref());
    tuple!(py; a.run_id, a.unit_id, a.attempt, a.dispatch_id, a.status.as_str(), a.phase, a.holder,
        a.lease_generation, a.reclaims, result, a.tokens, a.failure_reason, a.started_at,
        a.finished_at)
}

fn event_tuple(py: Python<'_>, e: Event) -> PyResult<Bound<'_, PyTuple>> {
    let payload = PyBytes::new(py, &e.payload);
    tuple!(py; e.seq, e.resource_id, e.revision, e.event_type, e.actor_type, e.actor_id, e.generation,
        payload, e.ts)
}

type ReservationTuple = (String, String, &'static str, i64, String, i64, Option<i64>);

fn reservation_tuple(r: crate::model::Reservation) -> ReservationTuple {
    (
        r.run_id,
        r.unit_id,
        r.kind.as_str(),
        r.attempt,
        r.dispatch_id,
        r.reclaims,
        r.lease_generation,
    )
}

fn system_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl PyLedger {
    fn now(&self, py: Python<'_>) -> PyResult<i64> {
        let Some(clock) = &self.clock else {
            return Ok(system_now_ms());
        };
        let value = clock.call0(py)?;
        let bound = value.bind(py);
        let now = int(bound, "clock").map_err(|e| {
            if bound.is_instance_of::<PyInt>() && !bound.is_instance_of::<PyBool>() {
                return e; // an int beyond 64 bits: int() says so
            }
            invalid(
                py,
                "clock",
                format!(
                    "must return epoch milliseconds as an int, returned {}",
                    type_name(bound)
                ),
            )
        })?;
        leases::check_clock_ms(now).map_err(|e| to_pyerr(py, e))?;
        Ok(now)
    }

    /// Read the clock, detach, lock, run `op` on the store, re-attach.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut dyn Store, i64) -> Result<T> + Send,
    ) -> PyResult<T> {
        let now = self.now(py)?;
        py.detach(|| {
            let mut guard = self.store.lock().unwrap_or_else(PoisonError::into_inner);
            match guard.as_mut() {
                Some(store) => op(store.as_mut(), now),
                None => Err(LedgerError::StoreError {
                    operation: "using the ledger".into(),
                    message: "the ledger is closed; open it again with fencepost.Ledger.open()"
                        .into(),
                }),
            }
        })
        .map_err(|e| to_pyerr(py, e))
    }
}

#[pymethods]
impl PyLedger {
    #[new]
    #[pyo3(signature = (path, durability, busy_timeout_ms, clock, create=true, url=None, schema=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        durability: &str,
        busy_timeout_ms: u64,
        clock: Option<Py<PyAny>>,
        create: bool,
        url: Option<&Bound<'_, PyAny>>,
        schema: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // A path or URL is free text (no NUL, no lone surrogate), named as the facade's `target`.
        let path = opt_prose(path, "target")?;
        let url = url.map(|u| opt_prose(u, "target")).transpose()?.flatten();
        let schema = schema
            .map(|s| opt_prose(s, "schema"))
            .transpose()?
            .flatten();
        let (path, url, schema) = (path.as_deref(), url.as_deref(), schema.as_deref());
        let opts = OpenOptions {
            durability: if durability == "full" {
                Durability::Full
            } else {
                Durability::Normal
            },
            busy_timeout_ms,
            create,
        };
        let mut this = Self {
            store: Mutex::new(None),
            clock,
            target: String::new(),
        };
        let now = this.now(py)?;
        let store = py
            .detach(|| crate::store::open(path, url, schema, &opts, now))
            .map_err(|e| to_pyerr(py, e))?;
        store.label().clone_into(&mut this.target);
        *this.store.lock().unwrap_or_else(PoisonError::into_inner) = Some(store);
        Ok(this)
    }

    /// The store's label: the path, `:memory:`, or the PostgreSQL URL without its password.
    /// Readable after `close` (a closed ledger still says what it was).
    fn target(&self) -> String {
        self.target.clone()
    }

    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            drop(
                self.store
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take(),
            );
        });
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

    fn integrity_check(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.run(py, |s, _| s.integrity_check())
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

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn start_run<'py>(
        &self,
        py: Python<'py>,
        workflow_ref: &Bound<'py, PyAny>,
        scope_key: &Bound<'py, PyAny>,
        steps: &Bound<'py, PyAny>,
        params: &Bound<'py, PyAny>,
        plan: &Bound<'py, PyAny>,
        run_id: &Bound<'py, PyAny>,
        title: &Bound<'py, PyAny>,
        guard_refs: &Bound<'py, PyAny>,
        force: &Bound<'py, PyAny>,
        agent_harness: &Bound<'py, PyAny>,
        agent_session_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (specs, completions) = steps_arg(steps)?;
        let params = opt_doc(params, "params")?;
        let plan = opt_doc(plan, "plan")?;
        let mut req = NewRun {
            workflow_ref: text(workflow_ref, "workflow_ref")?,
            scope_key: opt_text(scope_key, "scope_key")?,
            steps: Vec::new(),
            params: None,
            plan: None,
            run_id: opt_text(run_id, "run_id")?,
            title: opt_text(title, "title")?,
            guard_refs: str_list(guard_refs, "guard_refs")?,
            force: flag(force, "force")?,
            agent_harness: opt_text(agent_harness, "agent_harness")?,
            agent_session_id: opt_text(agent_session_id, "agent_session_id")?,
        };
        let run = self.run(py, move |s, now| {
            req.steps = with_completions(specs, completions);
            req.params = json(params);
            req.plan = json(plan);
            runs::start_run(s, &req, now)
        })?;
        run_tuple(py, run)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn publish_child_run<'py>(
        &self,
        py: Python<'py>,
        parent_run_id: &Bound<'py, PyAny>,
        parent_unit_id: &Bound<'py, PyAny>,
        invocation_key: &Bound<'py, PyAny>,
        workflow_ref: &Bound<'py, PyAny>,
        steps: &Bound<'py, PyAny>,
        params: &Bound<'py, PyAny>,
        plan: &Bound<'py, PyAny>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (specs, completions) = steps_arg(steps)?;
        let params = opt_doc(params, "params")?;
        let plan = opt_doc(plan, "plan")?;
        let mut req = ChildRun {
            parent_run_id: text(parent_run_id, "parent_run_id")?,
            parent_unit_id: text(parent_unit_id, "parent_unit_id")?,
            invocation_key: text(invocation_key, "invocation_key")?,
            workflow_ref: text(workflow_ref, "workflow_ref")?,
            steps: Vec::new(),
            params: None,
            plan: None,
            run_id: opt_text(run_id, "run_id")?,
        };
        let run = self.run(py, move |s, now| {
            req.steps = with_completions(specs, completions);
            req.params = json(params);
            req.plan = json(plan);
            runs::publish_child_run(s, &req, now)
        })?;
        run_tuple(py, run)
    }

    fn get_run(&self, py: Python<'_>, run_id: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let run = self.run(py, move |s, _| runs::get_run(s, &run_id))?;
        opt_run_tuple(py, run)
    }

    fn resolve_run_id(&self, py: Python<'_>, prefix: &Bound<'_, PyAny>) -> PyResult<String> {
        let prefix = text(prefix, "prefix")?;
        self.run(py, move |s, _| runs::resolve_run_id(s, &prefix))
    }

    fn list_runs<'py>(
        &self,
        py: Python<'py>,
        all_scopes: bool,
        scope_key: &Bound<'py, PyAny>,
        workflow_refs: &Bound<'py, PyAny>,
        active_only: &Bound<'py, PyAny>,
        include_children: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let filter = RunFilter {
            all_scopes,
            scope_key: opt_text(scope_key, "scope_key")?,
            workflow_refs: str_list(workflow_refs, "workflow_refs")?,
            active_only: flag(active_only, "active_only")?,
            include_children: flag(include_children, "include_children")?,
        };
        let runs = self.run(py, move |s, _| runs::list_runs(s, &filter))?;
        runs_list(py, runs)
    }

    fn find_active_run(
        &self,
        py: Python<'_>,
        workflow_refs: &Bound<'_, PyAny>,
        scope_key: &Bound<'_, PyAny>,
        outside: bool,
    ) -> PyResult<Py<PyAny>> {
        let refs = str_list(workflow_refs, "workflow_refs")?.unwrap_or_default();
        let scope = text(scope_key, "scope_key")?;
        let run = self.run(py, move |s, _| {
            runs::find_active_run(s, &refs, &scope, outside)
        })?;
        opt_run_tuple(py, run)
    }

    fn find_scope_occupant(
        &self,
        py: Python<'_>,
        scope_key: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let scope = text(scope_key, "scope_key")?;
        let run = self.run(py, move |s, _| runs::find_scope_occupant(s, &scope))?;
        opt_run_tuple(py, run)
    }

    fn child_runs<'py>(
        &self,
        py: Python<'py>,
        parent_run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let parent = text(parent_run_id, "parent_run_id")?;
        let runs = self.run(py, move |s, _| runs::child_runs(s, &parent))?;
        runs_list(py, runs)
    }

    fn steps<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let run_id = text(run_id, "run_id")?;
        let steps = self.run(py, move |s, _| runs::steps(s, &run_id))?;
        steps.into_iter().map(|st| step_tuple(py, st)).collect()
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn complete_step<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        step_id: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
        notes: &Bound<'py, PyAny>,
        evidence: &Bound<'py, PyAny>,
        summary: &Bound<'py, PyAny>,
        claim: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let run_id = text(run_id, "run_id")?;
        let step_id = text(step_id, "step_id")?;
        let fence = fence_arg(claim)?;
        let evidence = opt_doc(evidence, "evidence")?;
        let mut result = StepResult {
            status: text(status, "status")?,
            notes: opt_text(notes, "notes")?,
            evidence: None,
            summary: opt_text(summary, "summary")?,
        };
        let run = self.run(py, move |s, now| {
            result.evidence = json_text(evidence);
            runs::complete_step(s, &run_id, &step_id, &result, fence.as_ref(), now)
        })?;
        run_tuple(py, run)
    }

    fn block_run<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        notes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let run_id = text(run_id, "run_id")?;
        let notes = opt_text(notes, "notes")?;
        let run = self.run(py, move |s, now| {
            runs::block_run(s, &run_id, notes.as_deref(), now)
        })?;
        run_tuple(py, run)
    }

    fn resume_run<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let run_id = text(run_id, "run_id")?;
        let run = self.run(py, move |s, now| runs::resume_run(s, &run_id, now))?;
        run_tuple(py, run)
    }

    fn abandon_run(&self, py: Python<'_>, run_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let run_id = text(run_id, "run_id")?;
        self.run(py, move |s, now| runs::abandon_run(s, &run_id, now))
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

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn reserve_attempt(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        unit_id: &Bound<'_, PyAny>,
        step_id: &Bound<'_, PyAny>,
        node_id: &Bound<'_, PyAny>,
        phase: &Bound<'_, PyAny>,
        runner: &Bound<'_, PyAny>,
        engine: &Bound<'_, PyAny>,
        model: &Bound<'_, PyAny>,
        input_hash: &Bound<'_, PyAny>,
        worktree_path: &Bound<'_, PyAny>,
        parent_unit_id: &Bound<'_, PyAny>,
        holder: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<ReservationTuple> {
        let run_id = text(run_id, "run_id")?;
        let unit = [UnitSpec {
            unit_id: text(unit_id, "unit_id")?,
            step_id: text(step_id, "step_id")?,
            node_id: opt_text(node_id, "node_id")?,
            phase: text(phase, "phase")?,
            runner: opt_text(runner, "runner")?,
            engine: opt_text(engine, "engine")?,
            model: opt_text(model, "model")?,
            input_hash: opt_text(input_hash, "input_hash")?,
            worktree_path: opt_text(worktree_path, "worktree_path")?,
            parent_unit_id: opt_text(parent_unit_id, "parent_unit_id")?,
            holder: opt_text(holder, "holder")?,
        }];
        let fence = fence_arg(claim)?;
        let mut out = self.run(py, move |s, now| {
            attempts::reserve_attempts(s, &run_id, &unit, fence.as_ref(), now)
        })?;
        Ok(reservation_tuple(out.remove(0)))
    }

    fn reserve_attempts(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        units: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<ReservationTuple>> {
        let run_id = text(run_id, "run_id")?;
        let units = dicts(units, "units")?
            .iter()
            .enumerate()
            .map(|(i, d)| unit_from_dict(d, i))
            .collect::<PyResult<Vec<_>>>()?;
        let fence = fence_arg(claim)?;
        let out = self.run(py, move |s, now| {
            attempts::reserve_attempts(s, &run_id, &units, fence.as_ref(), now)
        })?;
        Ok(out.into_iter().map(reservation_tuple).collect())
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn finish_attempt(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        unit_id: &Bound<'_, PyAny>,
        attempt: &Bound<'_, PyAny>,
        dispatch_id: &Bound<'_, PyAny>,
        status: &Bound<'_, PyAny>,
        result: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        failure_reason: &Bound<'_, PyAny>,
        session_id: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let result = opt_doc(result, "result")?;
        let mut spec = [FinishSpec {
            run_id: text(run_id, "run_id")?,
            unit_id: text(unit_id, "unit_id")?,
            attempt: int(attempt, "attempt")?,
            dispatch_id: text(dispatch_id, "dispatch_id")?,
            status: text(status, "status")?,
            result: None,
            tokens: opt_int(tokens, "tokens")?,
            failure_reason: opt_text(failure_reason, "failure_reason")?,
            session_id: opt_text(session_id, "session_id")?,
        }];
        let fence = fence_arg(claim)?;
        let out = self.run(py, move |s, now| {
            spec[0].result = json_text(result);
            attempts::finish_attempts(s, &spec, fence.as_ref(), now)
        })?;
        Ok(out.first().copied().unwrap_or(false))
    }

    fn finish_attempts(
        &self,
        py: Python<'_>,
        finishes: &Bound<'_, PyAny>,
        claim: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<bool>> {
        let mut specs = Vec::new();
        let mut results = Vec::new();
        for (i, d) in dicts(finishes, "finishes")?.iter().enumerate() {
            let f = Fields::read(d, "finishes", i, FINISH_KEYS)?;
            results.push(opt_doc(&f.get("result"), "result")?);
            specs.push(FinishSpec {
                run_id: text(&f.get("run_id"), "run_id")?,
                unit_id: text(&f.get("unit_id"), "unit_id")?,
                attempt: int(&f.get("attempt"), "attempt")?,
                dispatch_id: text(&f.get("dispatch_id"), "dispatch_id")?,
                status: text(&f.get("status"), "status")?,
                result: None,
                tokens: opt_int(&f.get("tokens"), "tokens")?,
                failure_reason: opt_text(&f.get("failure_reason"), "failure_reason")?,
                session_id: opt_text(&f.get("session_id"), "session_id")?,
            });
        }
        let fence = fence_arg(claim)?;
        self.run(py, move |s, now| {
            for (spec, r) in specs.iter_mut().zip(results) {
                spec.result = json_text(r);
            }
            attempts::finish_attempts(s, &specs, fence.as_ref(), now)
        })
    }

    fn attempts<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        unit_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let run_id = text(run_id, "run_id")?;
        let unit_id = text(unit_id, "unit_id")?;
        let rows = self.run(py, move |s, _| attempts::attempts(s, &run_id, &unit_id))?;
        rows.into_iter().map(|a| attempt_tuple(py, a)).collect()
    }

    fn units<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        step_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let run_id = text(run_id, "run_id")?;
        let step_id = opt_text(step_id, "step_id")?;
        let rows = self.run(py, move |s, _| {
            attempts::units(s, &run_id, step_id.as_deref())
        })?;
        rows.into_iter().map(|u| unit_tuple(py, u)).collect()
    }

    fn unit(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        unit_id: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let run_id = text(run_id, "run_id")?;
        let unit_id = text(unit_id, "unit_id")?;
        match self.run(py, move |s, _| attempts::unit(s, &run_id, &unit_id))? {
            Some(u) => Ok(unit_tuple(py, u)?.into_any().unbind()),
            None => Ok(py.None()),
        }
    }

    fn accounting(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
    ) -> PyResult<(i64, i64, i64, i64, i64, i64)> {
        let run_id = text(run_id, "run_id")?;
        let a = self.run(py, move |s, _| attempts::accounting(s, &run_id))?;
        Ok((
            a.total_attempts,
            a.total_tokens,
            a.dispatch_attempts,
            a.dispatch_tokens,
            a.gate_attempts,
            a.gate_tokens,
        ))
    }

    // ------------------------------------------------------------------ queue and claims

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn reserve_run<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        workflow_name: &Bound<'py, PyAny>,
        workflow_ref: &Bound<'py, PyAny>,
        source: &Bound<'py, PyAny>,
        definition_digest: &Bound<'py, PyAny>,
        definition: &Bound<'py, PyAny>,
        input: &Bound<'py, PyAny>,
        launch_options: &Bound<'py, PyAny>,
        runner_id: &Bound<'py, PyAny>,
        origin_session_id: &Bound<'py, PyAny>,
        parent_run_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let args = queued_args(
            run_id,
            workflow_name,
            workflow_ref,
            source,
            definition_digest,
            definition,
            input,
            launch_options,
            runner_id,
            origin_session_id,
            parent_run_id,
        )?;
        let run = self.run(py, move |s, now| {
            queue::reserve_run(s, &args.into_request(), now)
        })?;
        run_tuple(py, run)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the keyword-only Python signature"
    )]
    fn prepare_or_adopt<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        workflow_name: &Bound<'py, PyAny>,
        workflow_ref: &Bound<'py, PyAny>,
        source: &Bound<'py, PyAny>,
        definition_digest: &Bound<'py, PyAny>,
        definition: &Bound<'py, PyAny>,
        input: &Bound<'py, PyAny>,
        launch_options: &Bound<'py, PyAny>,
        runner_id: &Bound<'py, PyAny>,
        origin_session_id: &Bound<'py, PyAny>,
        parent_run_id: &Bound<'py, PyAny>,
        lease_ms: &Bound<'py, PyAny>,
        claim_token: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let args = queued_args(
            run_id,
            workflow_name,
            workflow_ref,
            source,
            definition_digest,
            definition,
            input,
            launch_options,
            runner_id,
            origin_session_id,
            parent_run_id,
        )?;
        let lease_ms = int(lease_ms, "lease_ms")?;
        let token = opt_text(claim_token, "claim_token")?;
        let runner = args.runner_id.clone();
        let prepared = self.run(py, move |s, now| {
            let spec = ClaimSpec::new(runner, lease_ms, token, "claim_token")?;
            queue::prepare_or_adopt(s, &args.into_request(), &spec, now)
        })?;
        let claim = match prepared.claim {
            Some(c) => claim_tuple(c).into_pyobject(py)?.into_any(),
            None => py.None().into_bound(py),
        };
        tuple!(py; prepared.state, run_tuple(py, prepared.run)?, claim)
    }

    fn claim(
        &self,
        py: Python<'_>,
        run_id: &Bound<'_, PyAny>,
        runner_id: &Bound<'_, PyAny>,
        lease_ms: &Bound<'_, PyAny>,
        token: &Bound<'_, PyAny>,
    ) -> PyResult<Option<ClaimTuple>> {
        let run_id = text(run_id, "run_id")?;
        let runner_id = text(runner_id, "runner_id")?;
        let lease_ms = int(lease_ms, "lease_ms")?;
        let token = opt_text(token, "token")?;
        let claim = self.run(py, move |s, now| {
            let spec = ClaimSpec::new(runner_id, lease_ms, token, "token")?;
            leases::claim(s, &run_id, &spec, now)
        })?;
        Ok(claim.map(claim_tuple))
    }

    fn heartbeat(
        &self,
        py: Python<'_>,
        claim: &Bound<'_, PyAny>,
        lease_ms: &Bound<'_, PyAny>,
    ) -> PyResult<ClaimTuple> {
        let (fence, token) = claim_arg(claim)?;
        let lease_ms = int(lease_ms, "lease_ms")?;
        let claim = self.run(py, move |s, now| {
            leases::heartbeat(s, &fence, &token, lease_ms, now)
        })?;
        Ok(claim_tuple(claim))
    }

    fn release(&self, py: Python<'_>, claim: &Bound<'_, PyAny>) -> PyResult<()> {
        let (fence, _) = claim_arg(claim)?;
        self.run(py, move |s, now| leases::release(s, &fence, now))
    }

    fn set_status<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
        claim: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let run_id = text(run_id, "run_id")?;
        let status = text(status, "status")?;
        let (fence, _) = claim_arg(claim)?;
        let run = self.run(py, move |s, now| {
            runs::set_status(s, &run_id, &status, &fence, now)
        })?;
        run_tuple(py, run)
    }

    fn lease(&self, py: Python<'_>, run_id: &Bound<'_, PyAny>) -> PyResult<LeaseTuple> {
        let run_id = text(run_id, "run_id")?;
        let lease = self.run(py, move |s, _| leases::lease(s, &run_id))?;
        Ok(lease_tuple(lease))
    }

    fn expired_leases(&self, py: Python<'_>) -> PyResult<Vec<LeaseTuple>> {
        let leases = self.run(py, leases::expired_leases)?;
        Ok(leases.into_iter().map(lease_tuple).collect())
    }

    // ------------------------------------------------------------------ events

    fn events<'py>(
        &self,
        py: Python<'py>,
        run_id: &Bound<'py, PyAny>,
        after_seq: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        types: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let run_id = opt_text(run_id, "run_id")?;
        let after_seq = int(after_seq, "after_seq")?;
        let limit = int(limit, "limit")?;
        let types = str_list(types, "types")?;
        let rows = self.run(py, move |s, _| {
            events::read(s, run_id.as_deref(), after_seq, limit, types.as_deref())
        })?;
        rows.into_iter().map(|e| event_tuple(py, e)).collect()
    }
}

#[allow(
    clippy::too_many_arguments,
    reason = "the shared keywords of reserve_run and prepare_or_adopt"
)]
fn queued_args(
    run_id: &Bound<'_, PyAny>,
    workflow_name: &Bound<'_, PyAny>,
    workflow_ref: &Bound<'_, PyAny>,
    source: &Bound<'_, PyAny>,
    definition_digest: &Bound<'_, PyAny>,
    definition: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    launch_options: &Bound<'_, PyAny>,
    runner_id: &Bound<'_, PyAny>,
    origin_session_id: &Bound<'_, PyAny>,
    parent_run_id: &Bound<'_, PyAny>,
) -> PyResult<QueuedArgs> {
    let py = run_id.py();
    Ok(QueuedArgs {
        run_id: text(run_id, "run_id")?,
        workflow_name: text(workflow_name, "workflow_name")?,
        workflow_ref: text(workflow_ref, "workflow_ref")?,
        source: read_doc(py, source, "source")?,
        definition_digest: text(definition_digest, "definition_digest")?,
        definition: read_doc(py, definition, "definition")?,
        input: opt_doc(input, "input")?,
        launch_options: opt_doc(launch_options, "launch_options")?,
        runner_id: text(runner_id, "runner_id")?,
        origin_session_id: text(origin_session_id, "origin_session_id")?,
        parent_run_id: opt_text(parent_run_id, "parent_run_id")?,
    })
}

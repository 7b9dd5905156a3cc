//! Python arguments -> owned Rust values, read while attached.
//!
//! Every reader names the argument it refuses: a wrong value raises `InvalidArgument` whose
//! `argument` is the facade's keyword (or the list argument an item came from), so the caller
//! sees which of a dozen keywords was wrong. JSON arguments are walked into a canonical tape
//! here and serialized later, detached (`into_request` on the argument structs).
//!
//! A method with many keywords takes them as `**kwargs` and reads them through [`Fields`], the
//! same reader the dict items of `steps`, `units` and `finishes` go through: a keyword set is
//! spelled once, in its `*_KEYS` list and its reader.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::attempts::{FinishSpec, UnitSpec};
use crate::canonical::{self, Doc};
use crate::errors::LedgerError;
use crate::leases::Fence;
use crate::py::convert;
use crate::py::errors::to_pyerr;
use crate::queue::NewQueuedRun;
use crate::runs::{ChildRun, Json, NewRun, StepResult, StepSpec};

/// `InvalidArgument` naming `argument`.
pub fn invalid(py: Python<'_>, argument: &str, message: impl Into<String>) -> PyErr {
    to_pyerr(py, LedgerError::invalid(argument, message))
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Walk `value` (the Python argument named `argument`) into a canonical tape while attached;
/// callers then serialize and hash it detached.
pub fn read_doc(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    argument: &str,
) -> PyResult<canonical::Doc> {
    convert::to_doc(value).map_err(|e| to_pyerr(py, LedgerError::canonical(argument, e)))
}

/// A required `str` argument, refused with `InvalidArgument` naming it. The text rules of
/// [`crate::ids::check_text`] apply (no NUL; identifiers and keys bounded).
pub fn text(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    let s = any_str(obj, argument)?;
    crate::ids::check_text(argument, &s).map_err(|e| to_pyerr(obj.py(), e))?;
    Ok(s)
}

/// A `str` that is free text wherever it appears (a step's title or instructions inside
/// `steps`, a path or URL): NUL refused, no length bound.
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
pub fn opt_text(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<String>> {
    optional(obj, argument, text)
}

/// An optional free-text `str` argument.
pub fn opt_prose(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<String>> {
    optional(obj, argument, prose)
}

/// A `bool` flag; `0`, `1` or `None` are refused rather than guessed at.
pub fn flag(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<bool> {
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
pub fn int(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<i64> {
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
pub fn opt_doc(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<Doc>> {
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
    doc.map(|d| canonical::into_text(d.to_vec()))
}

/// An optional list of `str` (the facade turns one `str` or any iterable into a list).
pub fn str_list(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<Vec<String>>> {
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

/// A method's `**kwargs`, or the items of one dict argument, read by iterating the dict once:
/// a key is never looked up, so no key's own `__eq__` or `__hash__` runs.
pub struct Fields<'py> {
    py: Python<'py>,
    items: Vec<(&'static str, Bound<'py, PyAny>)>,
}

impl<'py> Fields<'py> {
    /// The `**kwargs` of a method whose keywords are `keys`. Only the facade calls these
    /// methods, always with known keywords, so an unknown one is the `TypeError` Python raises
    /// for a bad keyword.
    pub fn kwargs(
        py: Python<'py>,
        d: Option<&Bound<'py, PyDict>>,
        keys: &[&'static str],
    ) -> PyResult<Self> {
        match d {
            Some(d) => Self::collect(d, keys, |shown| {
                PyTypeError::new_err(format!("unexpected keyword argument {shown}"))
            }),
            None => Ok(Self {
                py,
                items: Vec::new(),
            }),
        }
    }

    /// Item `i` of the list argument `argument`; a key that is not a `str` or not one of `keys`
    /// (a typo must not be silently ignored) is refused.
    fn item(
        d: &Bound<'py, PyDict>,
        argument: &str,
        i: usize,
        keys: &[&'static str],
    ) -> PyResult<Self> {
        Self::collect(d, keys, |shown| {
            invalid(
                d.py(),
                argument,
                format!(
                    "item {i} has unknown key {shown}; allowed: {}",
                    keys.join(", ")
                ),
            )
        })
    }

    /// The items of `d` whose keys are among `keys`; `unknown` builds the error for any other
    /// key (shown as its text, or its type when it is not a `str`).
    fn collect(
        d: &Bound<'py, PyDict>,
        keys: &[&'static str],
        unknown: impl FnOnce(String) -> PyErr,
    ) -> PyResult<Self> {
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
                return Err(unknown(shown));
            };
            items.push((*known, v));
        }
        Ok(Self { py: d.py(), items })
    }

    /// The value under `key`, or `None` when it was left out.
    pub fn get(&self, key: &str) -> Bound<'py, PyAny> {
        self.items
            .iter()
            .find(|(k, _)| *k == key)
            .map_or_else(|| self.py.None().into_bound(self.py), |(_, v)| v.clone())
    }
}

/// A claim (`fencepost.Claim`) as a fence: its token is hashed here, before any transaction.
pub fn fence_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Fence>> {
    if obj.is_none() {
        return Ok(None);
    }
    claim_arg(obj).map(|(fence, _)| Some(fence))
}

/// A `Claim` argument: the fence (token hashed now) and the plaintext token.
pub fn claim_arg(obj: &Bound<'_, PyAny>) -> PyResult<(Fence, String)> {
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

// ------------------------------------------------------------------ runs and steps

/// The keywords of `start_run`.
pub const START_RUN_KEYS: &[&str] = &[
    "workflow_ref",
    "scope_key",
    "steps",
    "params",
    "plan",
    "run_id",
    "title",
    "guard_refs",
    "force",
    "agent_harness",
    "agent_session_id",
];

/// The keywords of `publish_child_run`.
pub const CHILD_RUN_KEYS: &[&str] = &[
    "parent_run_id",
    "parent_unit_id",
    "invocation_key",
    "workflow_ref",
    "steps",
    "params",
    "plan",
    "run_id",
];

/// The plan and JSON arguments a new run (top-level or child) carries, serialized detached.
pub struct RunBody {
    steps: Vec<StepSpec>,
    completions: Vec<Option<Doc>>,
    params: Option<Doc>,
    plan: Option<Doc>,
}

impl RunBody {
    /// `steps`, `params` and `plan`, in that order (the first bad one is the one named).
    fn read(f: &Fields<'_>) -> PyResult<Self> {
        let (steps, completions) = steps_arg(&f.get("steps"))?;
        Ok(Self {
            steps,
            completions,
            params: opt_doc(&f.get("params"), "params")?,
            plan: opt_doc(&f.get("plan"), "plan")?,
        })
    }

    /// Serialize the JSON (detached): the steps, params and plan of the request.
    fn into_parts(self) -> (Vec<StepSpec>, Option<Json>, Option<Json>) {
        let mut steps = self.steps;
        for (s, c) in steps.iter_mut().zip(self.completions) {
            s.completion = json_text(c);
        }
        (steps, json(self.params), json(self.plan))
    }
}

/// `start_run`'s keywords, read while attached.
pub struct StartRunArgs {
    run: NewRun,
    body: RunBody,
}

impl StartRunArgs {
    /// Read the keywords of [`START_RUN_KEYS`].
    pub fn read(f: &Fields<'_>) -> PyResult<Self> {
        let body = RunBody::read(f)?;
        let run = NewRun {
            workflow_ref: text(&f.get("workflow_ref"), "workflow_ref")?,
            scope_key: opt_text(&f.get("scope_key"), "scope_key")?,
            steps: Vec::new(),
            params: None,
            plan: None,
            run_id: opt_text(&f.get("run_id"), "run_id")?,
            title: opt_text(&f.get("title"), "title")?,
            guard_refs: str_list(&f.get("guard_refs"), "guard_refs")?,
            force: flag(&f.get("force"), "force")?,
            agent_harness: opt_text(&f.get("agent_harness"), "agent_harness")?,
            agent_session_id: opt_text(&f.get("agent_session_id"), "agent_session_id")?,
        };
        Ok(Self { run, body })
    }

    /// The request, its JSON serialized (detached).
    pub fn into_request(self) -> NewRun {
        let (steps, params, plan) = self.body.into_parts();
        NewRun {
            steps,
            params,
            plan,
            ..self.run
        }
    }
}

/// `publish_child_run`'s keywords, read while attached.
pub struct ChildRunArgs {
    run: ChildRun,
    body: RunBody,
}

impl ChildRunArgs {
    /// Read the keywords of [`CHILD_RUN_KEYS`].
    pub fn read(f: &Fields<'_>) -> PyResult<Self> {
        let body = RunBody::read(f)?;
        let run = ChildRun {
            parent_run_id: text(&f.get("parent_run_id"), "parent_run_id")?,
            parent_unit_id: text(&f.get("parent_unit_id"), "parent_unit_id")?,
            invocation_key: text(&f.get("invocation_key"), "invocation_key")?,
            workflow_ref: text(&f.get("workflow_ref"), "workflow_ref")?,
            steps: Vec::new(),
            params: None,
            plan: None,
            run_id: opt_text(&f.get("run_id"), "run_id")?,
        };
        Ok(Self { run, body })
    }

    /// The request, its JSON serialized (detached).
    pub fn into_request(self) -> ChildRun {
        let (steps, params, plan) = self.body.into_parts();
        ChildRun {
            steps,
            params,
            plan,
            ..self.run
        }
    }
}

/// `steps`: dicts with `id` (required), `title`, `instructions`, `completion`.
fn steps_arg(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<StepSpec>, Vec<Option<Doc>>)> {
    let mut specs = Vec::new();
    let mut completions = Vec::new();
    for (i, d) in dicts(obj, "steps")?.iter().enumerate() {
        let f = Fields::item(
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

/// The keywords of `complete_step` besides the run, the step and the claim.
pub const STEP_RESULT_KEYS: &[&str] = &["status", "notes", "evidence", "summary"];

/// `complete_step`'s result keywords, read while attached.
pub struct StepResultArgs {
    result: StepResult,
    evidence: Option<Doc>,
}

impl StepResultArgs {
    /// Read the keywords of [`STEP_RESULT_KEYS`].
    pub fn read(f: &Fields<'_>) -> PyResult<Self> {
        let evidence = opt_doc(&f.get("evidence"), "evidence")?;
        let result = StepResult {
            status: text(&f.get("status"), "status")?,
            notes: opt_text(&f.get("notes"), "notes")?,
            evidence: None,
            summary: opt_text(&f.get("summary"), "summary")?,
        };
        Ok(Self { result, evidence })
    }

    /// The result, its evidence serialized (detached).
    pub fn into_result(self) -> StepResult {
        StepResult {
            evidence: json_text(self.evidence),
            ..self.result
        }
    }
}

// ------------------------------------------------------------------ attempts

/// The keywords of one unit to reserve: `reserve_attempt`'s (besides the run and the claim),
/// and the keys of a `reserve_attempts` item.
pub const UNIT_KEYS: &[&str] = &[
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

/// How a unit's `unit_id`, `step_id` and `phase` are read when `None` or left out.
#[derive(Clone, Copy)]
pub enum Omitted {
    /// `reserve_attempt`: the facade always passes them, so `None` is the caller's and refused.
    Refused,
    /// A `reserve_attempts` item: a left-out key takes its default (`""`, `""`, `"unit"`).
    Defaulted,
}

/// One unit to reserve (the keys of [`UNIT_KEYS`]).
pub fn unit_spec(f: &Fields<'_>, omitted: Omitted) -> PyResult<UnitSpec> {
    let opt = |k: &str| opt_text(&f.get(k), k);
    let given = |k: &str, default: &str| match omitted {
        Omitted::Refused => text(&f.get(k), k),
        Omitted::Defaulted => Ok(opt(k)?.unwrap_or_else(|| default.to_owned())),
    };
    Ok(UnitSpec {
        unit_id: given("unit_id", "")?,
        step_id: given("step_id", "")?,
        node_id: opt("node_id")?,
        phase: given("phase", "unit")?,
        runner: opt("runner")?,
        engine: opt("engine")?,
        model: opt("model")?,
        input_hash: opt("input_hash")?,
        worktree_path: opt("worktree_path")?,
        parent_unit_id: opt("parent_unit_id")?,
        holder: opt("holder")?,
    })
}

/// `units`: the dicts of `reserve_attempts`.
pub fn units_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<UnitSpec>> {
    dicts(obj, "units")?
        .iter()
        .enumerate()
        .map(|(i, d)| unit_spec(&Fields::item(d, "units", i, UNIT_KEYS)?, Omitted::Defaulted))
        .collect()
}

/// The keywords of one finish: `finish_attempt`'s (besides the claim), and the keys of a
/// `finish_attempts` item.
pub const FINISH_KEYS: &[&str] = &[
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

/// Finishes read while attached; their results are serialized detached.
pub struct FinishArgs {
    specs: Vec<FinishSpec>,
    results: Vec<Option<Doc>>,
}

impl FinishArgs {
    /// One finish (the keys of [`FINISH_KEYS`]).
    pub fn one(f: &Fields<'_>) -> PyResult<Self> {
        let mut args = Self {
            specs: Vec::with_capacity(1),
            results: Vec::with_capacity(1),
        };
        args.push(f)?;
        Ok(args)
    }

    /// `finishes`: the dicts of `finish_attempts`.
    pub fn many(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut args = Self {
            specs: Vec::new(),
            results: Vec::new(),
        };
        for (i, d) in dicts(obj, "finishes")?.iter().enumerate() {
            args.push(&Fields::item(d, "finishes", i, FINISH_KEYS)?)?;
        }
        Ok(args)
    }

    fn push(&mut self, f: &Fields<'_>) -> PyResult<()> {
        self.results.push(opt_doc(&f.get("result"), "result")?);
        self.specs.push(FinishSpec {
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
        Ok(())
    }

    /// The finishes, their results serialized (detached).
    pub fn into_specs(self) -> Vec<FinishSpec> {
        let mut specs = self.specs;
        for (spec, r) in specs.iter_mut().zip(self.results) {
            spec.result = json_text(r);
        }
        specs
    }
}

// ------------------------------------------------------------------ queue

/// The keywords `reserve_run` and `prepare_or_adopt` share.
pub const QUEUED_RUN_KEYS: &[&str] = &[
    "run_id",
    "workflow_name",
    "workflow_ref",
    "source",
    "definition_digest",
    "definition",
    "input",
    "launch_options",
    "runner_id",
    "origin_session_id",
    "parent_run_id",
];

/// The keywords of [`QUEUED_RUN_KEYS`], read once while attached.
pub struct QueuedRunArgs {
    run_id: String,
    workflow_name: String,
    workflow_ref: String,
    source: Doc,
    definition_digest: String,
    definition: Doc,
    input: Option<Doc>,
    launch_options: Option<Doc>,
    /// The runner the run is meant for; `prepare_or_adopt` claims it for this runner.
    pub runner_id: String,
    origin_session_id: String,
    parent_run_id: Option<String>,
}

impl QueuedRunArgs {
    /// Read the keywords, in the order of [`QUEUED_RUN_KEYS`] (the first bad one is named).
    pub fn read(f: &Fields<'_>) -> PyResult<Self> {
        let py = f.py;
        Ok(Self {
            run_id: text(&f.get("run_id"), "run_id")?,
            workflow_name: text(&f.get("workflow_name"), "workflow_name")?,
            workflow_ref: text(&f.get("workflow_ref"), "workflow_ref")?,
            source: read_doc(py, &f.get("source"), "source")?,
            definition_digest: text(&f.get("definition_digest"), "definition_digest")?,
            definition: read_doc(py, &f.get("definition"), "definition")?,
            input: opt_doc(&f.get("input"), "input")?,
            launch_options: opt_doc(&f.get("launch_options"), "launch_options")?,
            runner_id: text(&f.get("runner_id"), "runner_id")?,
            origin_session_id: text(&f.get("origin_session_id"), "origin_session_id")?,
            parent_run_id: opt_text(&f.get("parent_run_id"), "parent_run_id")?,
        })
    }

    /// The request, its JSON serialized and hashed (detached). A left-out `input` is `null`
    /// and left-out `launch_options` are `{}`, so adopting compares like with like.
    pub fn into_request(self) -> NewQueuedRun {
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

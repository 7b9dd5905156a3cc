//! The keyword sets of the methods that take many keywords, each read by one reader into the
//! core's request: the keys are spelled once here, and the stub's `TypedDict`s mirror them.
//!
//! Each reader reads its keys in a fixed order, so when several arguments are wrong the first
//! one in that order is the one named. JSON arguments are walked now and serialized detached
//! (`into_request`, `into_result`, `into_spec`).

use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};

use super::{
    dicts, flag, int, invalid, json, json_text, opt_doc, opt_int, opt_prose, opt_text, read_doc,
    str_list, text, Fields, Keys,
};
use crate::attempts::{FinishSpec, UnitSpec};
use crate::canonical::Doc;
use crate::canonical::Json;
use crate::queue::{NewQueuedRun, NotBefore};
use crate::retry::RetryPolicy;
use crate::runs::{ChildRun, NewRun, RunCursor, RunFilter, StepResult, StepSpec};

// ------------------------------------------------------------------ runs and steps

/// The keywords of `start_run`.
static START_RUN_KEYS: Keys = Keys::new(&[
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
    "retry",
]);

/// The keywords of `publish_child_run`.
static CHILD_RUN_KEYS: Keys = Keys::new(&[
    "parent_run_id",
    "parent_unit_id",
    "invocation_key",
    "workflow_ref",
    "steps",
    "params",
    "plan",
    "run_id",
    "retry",
]);

/// The keywords of `list_runs`: the filters, the page size and the cursor (the last run of the
/// page before, as its three order columns).
static LIST_RUNS_KEYS: Keys = Keys::new(&[
    "all_scopes",
    "scope_key",
    "workflow_refs",
    "active_only",
    "include_children",
    "statuses",
    "limit",
    "after_updated_ms",
    "after_created_ms",
    "after_run_id",
    "workflow_name",
    "updated_after_ms",
    "updated_before_ms",
]);

/// `list_runs`' keywords as the core's filter.
pub fn run_filter(d: &Bound<'_, PyDict>) -> PyResult<RunFilter> {
    let f = Fields::keywords(d, &LIST_RUNS_KEYS)?;
    let after = match opt_text(f.get("after_run_id"), "after")? {
        None => None,
        Some(run_id) => Some(RunCursor {
            updated_at: int(f.get("after_updated_ms"), "after")?,
            created_at: int(f.get("after_created_ms"), "after")?,
            run_id,
        }),
    };
    Ok(RunFilter {
        all_scopes: flag(f.get("all_scopes"), "all_scopes")?,
        scope_key: opt_text(f.get("scope_key"), "scope_key")?,
        workflow_refs: str_list(f.get("workflow_refs"), "workflow_refs")?,
        active_only: flag(f.get("active_only"), "active_only")?,
        include_children: flag(f.get("include_children"), "include_children")?,
        statuses: str_list(f.get("statuses"), "status")?,
        limit: opt_int(f.get("limit"), "limit")?,
        after,
        workflow_name: opt_text(f.get("workflow_name"), "workflow_name")?,
        updated_after: opt_int(f.get("updated_after_ms"), "updated_after")?,
        updated_before: opt_int(f.get("updated_before_ms"), "updated_before")?,
    })
}

/// The steps, params and plan a new run (top-level or child) carries, serialized detached.
struct RunBody {
    steps: Vec<StepSpec>,
    completions: Vec<Option<Doc>>,
    params: Option<Doc>,
    plan: Option<Doc>,
}

impl RunBody {
    /// `steps`, `params` and `plan`, in that order (the first bad one is the one named).
    fn read(f: &Fields<'_>) -> PyResult<Self> {
        let (steps, completions) = steps_arg(f.get("steps"))?;
        Ok(Self {
            steps,
            completions,
            params: opt_doc(f.get("params"), "params")?,
            plan: opt_doc(f.get("plan"), "plan")?,
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
    pub fn read(d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let f = Fields::keywords(d, &START_RUN_KEYS)?;
        let body = RunBody::read(&f)?;
        let run = NewRun {
            workflow_ref: text(f.get("workflow_ref"), "workflow_ref")?,
            scope_key: opt_text(f.get("scope_key"), "scope_key")?,
            steps: Vec::new(),
            params: None,
            plan: None,
            run_id: opt_text(f.get("run_id"), "run_id")?,
            title: opt_text(f.get("title"), "title")?,
            guard_refs: str_list(f.get("guard_refs"), "guard_refs")?,
            force: flag(f.get("force"), "force")?,
            agent_harness: opt_text(f.get("agent_harness"), "agent_harness")?,
            agent_session_id: opt_text(f.get("agent_session_id"), "agent_session_id")?,
            retry: retry_arg(f.get("retry"), "retry", "")?,
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
    pub fn read(d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let f = Fields::keywords(d, &CHILD_RUN_KEYS)?;
        let body = RunBody::read(&f)?;
        let run = ChildRun {
            parent_run_id: text(f.get("parent_run_id"), "parent_run_id")?,
            parent_unit_id: text(f.get("parent_unit_id"), "parent_unit_id")?,
            invocation_key: text(f.get("invocation_key"), "invocation_key")?,
            workflow_ref: text(f.get("workflow_ref"), "workflow_ref")?,
            steps: Vec::new(),
            params: None,
            plan: None,
            run_id: opt_text(f.get("run_id"), "run_id")?,
            retry: retry_arg(f.get("retry"), "retry", "")?,
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

/// The keys of a `steps` item.
static STEP_KEYS: Keys = Keys::new(&["id", "title", "instructions", "completion", "retry"]);

/// The keys of a retry policy.
static RETRY_KEYS: Keys = Keys::new(&["max_attempts", "initial_ms", "factor", "max_ms", "jitter"]);

/// A retry policy (`retry=`, or a step's `"retry"`): a dict of [`RETRY_KEYS`], `max_attempts`
/// and `initial_ms` required. Refused with `InvalidArgument` on `argument`, the message naming
/// the field (after `at`, which says which step); the ranges are checked by the core, with the
/// rest of the run's arguments (`RetryPolicy::check`).
fn retry_arg(obj: &Bound<'_, PyAny>, argument: &str, at: &str) -> PyResult<Option<RetryPolicy>> {
    if obj.is_none() {
        return Ok(None);
    }
    let py = obj.py();
    let Ok(d) = obj.cast::<PyDict>() else {
        return Err(invalid(
            py,
            argument,
            format!(
                "{at}retry must be a dict such as {{\"max_attempts\": 5, \"initial_ms\": 1000}}, \
                 not {}",
                super::type_name(obj)
            ),
        ));
    };
    let f = Fields::collect(d, &RETRY_KEYS, |shown| {
        invalid(
            py,
            argument,
            format!(
                "{at}retry has unknown key {shown}; allowed: {}",
                RETRY_KEYS.names.join(", ")
            ),
        )
    })?;
    let field = |name: &str| format!("{at}retry.{name}");
    let required = |name: &str| -> PyResult<i64> {
        let v = f.get(name);
        if v.is_none() {
            return Err(invalid(
                py,
                argument,
                format!("{} is required", field(name)),
            ));
        }
        int(v, &field(name)).map_err(|_| {
            invalid(
                py,
                argument,
                format!(
                    "{} must be an int, not {}",
                    field(name),
                    super::type_name(v)
                ),
            )
        })
    };
    let optional_int = |name: &str, default: i64| -> PyResult<i64> {
        if f.get(name).is_none() {
            Ok(default)
        } else {
            required(name)
        }
    };
    let number = |name: &str, default: f64| -> PyResult<f64> {
        let v = f.get(name);
        if v.is_none() {
            return Ok(default);
        }
        let wrong = || {
            invalid(
                py,
                argument,
                format!(
                    "{} must be a number, not {}",
                    field(name),
                    super::type_name(v)
                ),
            )
        };
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Err(wrong());
        }
        v.extract::<f64>().map_err(|_| wrong())
    };
    Ok(Some(RetryPolicy {
        max_attempts: required("max_attempts")?,
        initial_ms: required("initial_ms")?,
        factor: number("factor", crate::retry::DEFAULT_FACTOR)?,
        max_ms: optional_int("max_ms", crate::retry::DEFAULT_MAX_MS)?,
        jitter: number("jitter", 0.0)?,
    }))
}

/// `steps`: dicts with `id` (required), `title`, `instructions`, `completion`, `retry`.
fn steps_arg(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<StepSpec>, Vec<Option<Doc>>)> {
    let mut specs = Vec::new();
    let mut completions = Vec::new();
    for (i, d) in dicts(obj, "steps")?.iter().enumerate() {
        let f = Fields::item(d, "steps", i, &STEP_KEYS)?;
        let id = f.get("id");
        if id.is_none() {
            return Err(invalid(
                obj.py(),
                "steps",
                format!("item {i} has no \"id\""),
            ));
        }
        specs.push(StepSpec {
            id: text(id, "steps")?,
            title: opt_prose(f.get("title"), "steps")?.unwrap_or_default(),
            instructions: opt_prose(f.get("instructions"), "steps")?.unwrap_or_default(),
            completion: None,
            retry: retry_arg(f.get("retry"), "steps", &format!("item {i}: "))?,
        });
        completions.push(opt_doc(f.get("completion"), "steps")?);
    }
    Ok((specs, completions))
}

/// The keywords of `complete_step` besides the run, the step and the claim.
static STEP_RESULT_KEYS: Keys = Keys::new(&["status", "notes", "evidence", "summary"]);

/// `complete_step`'s result keywords, read while attached.
pub struct StepResultArgs {
    result: StepResult,
    evidence: Option<Doc>,
}

impl StepResultArgs {
    /// Read the keywords of [`STEP_RESULT_KEYS`].
    pub fn read(d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let f = Fields::keywords(d, &STEP_RESULT_KEYS)?;
        let evidence = opt_doc(f.get("evidence"), "evidence")?;
        let result = StepResult {
            status: text(f.get("status"), "status")?,
            notes: opt_text(f.get("notes"), "notes")?,
            evidence: None,
            summary: opt_text(f.get("summary"), "summary")?,
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
static UNIT_KEYS: Keys = Keys::new(&[
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
    "trace_context",
    "force",
]);

/// How a unit's `unit_id`, `step_id` and `phase` are read when `None` or left out.
#[derive(Clone, Copy)]
enum Omitted {
    /// `reserve_attempt`: the facade always passes them, so `None` is the caller's and refused.
    Refused,
    /// A `reserve_attempts` item: a left-out key takes its default (`""`, `""`, `"unit"`).
    Defaulted,
}

/// `reserve_attempt`'s unit: the keywords of [`UNIT_KEYS`].
pub fn unit_arg(d: &Bound<'_, PyDict>) -> PyResult<UnitSpec> {
    unit_spec(&Fields::keywords(d, &UNIT_KEYS)?, Omitted::Refused)
}

/// One unit to reserve (the keys of [`UNIT_KEYS`]).
fn unit_spec(f: &Fields<'_>, omitted: Omitted) -> PyResult<UnitSpec> {
    let opt = |k: &str| opt_text(f.get(k), k);
    let given = |k: &str, default: &str| match omitted {
        Omitted::Refused => text(f.get(k), k),
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
        trace_context: opt("trace_context")?,
        force: match f.get("force") {
            v if v.is_none() => false,
            v => flag(v, "force")?,
        },
    })
}

/// `units`: the dicts of `reserve_attempts`.
pub fn units_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<UnitSpec>> {
    dicts(obj, "units")?
        .iter()
        .enumerate()
        .map(|(i, d)| {
            unit_spec(
                &Fields::item(d, "units", i, &UNIT_KEYS)?,
                Omitted::Defaulted,
            )
        })
        .collect()
}

/// The keywords of one finish: `finish_attempt`'s (besides the claim), and the keys of a
/// `finish_attempts` item.
static FINISH_KEYS: Keys = Keys::new(&[
    "run_id",
    "unit_id",
    "attempt",
    "dispatch_id",
    "status",
    "result",
    "tokens",
    "failure_reason",
    "session_id",
]);

/// One finish read while attached; its result is serialized detached.
pub struct FinishArgs {
    spec: FinishSpec,
    result: Option<Doc>,
}

impl FinishArgs {
    /// `finish_attempt`'s finish: the keywords of [`FINISH_KEYS`].
    pub fn one(d: &Bound<'_, PyDict>) -> PyResult<Self> {
        Self::read(&Fields::keywords(d, &FINISH_KEYS)?)
    }

    /// `finishes`: the dicts of `finish_attempts`.
    pub fn many(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Self>> {
        dicts(obj, "finishes")?
            .iter()
            .enumerate()
            .map(|(i, d)| Self::read(&Fields::item(d, "finishes", i, &FINISH_KEYS)?))
            .collect()
    }

    fn read(f: &Fields<'_>) -> PyResult<Self> {
        let result = opt_doc(f.get("result"), "result")?;
        let spec = FinishSpec {
            run_id: text(f.get("run_id"), "run_id")?,
            unit_id: text(f.get("unit_id"), "unit_id")?,
            attempt: int(f.get("attempt"), "attempt")?,
            dispatch_id: text(f.get("dispatch_id"), "dispatch_id")?,
            status: text(f.get("status"), "status")?,
            result: None,
            tokens: opt_int(f.get("tokens"), "tokens")?,
            failure_reason: opt_text(f.get("failure_reason"), "failure_reason")?,
            session_id: opt_text(f.get("session_id"), "session_id")?,
        };
        Ok(Self { spec, result })
    }

    /// The finish, its result serialized (detached).
    pub fn into_spec(self) -> FinishSpec {
        FinishSpec {
            result: json_text(self.result),
            ..self.spec
        }
    }
}

// ------------------------------------------------------------------ queue

/// The keywords `reserve_run` and `prepare_or_adopt` share.
static QUEUED_RUN_KEYS: Keys = Keys::new(&[
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
    "not_before_ms",
    "not_before_after_ms",
    "priority",
    "concurrency_key",
    "retry",
]);

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
    not_before: NotBefore,
    priority: i64,
    concurrency_key: Option<String>,
    retry: Option<RetryPolicy>,
}

impl QueuedRunArgs {
    /// Read the keywords, in the order of [`QUEUED_RUN_KEYS`] (the first bad one is named).
    pub fn read(d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let f = Fields::keywords(d, &QUEUED_RUN_KEYS)?;
        let py = d.py();
        Ok(Self {
            run_id: text(f.get("run_id"), "run_id")?,
            workflow_name: text(f.get("workflow_name"), "workflow_name")?,
            workflow_ref: text(f.get("workflow_ref"), "workflow_ref")?,
            source: read_doc(py, f.get("source"), "source")?,
            definition_digest: text(f.get("definition_digest"), "definition_digest")?,
            definition: read_doc(py, f.get("definition"), "definition")?,
            input: opt_doc(f.get("input"), "input")?,
            launch_options: opt_doc(f.get("launch_options"), "launch_options")?,
            runner_id: text(f.get("runner_id"), "runner_id")?,
            origin_session_id: text(f.get("origin_session_id"), "origin_session_id")?,
            parent_run_id: opt_text(f.get("parent_run_id"), "parent_run_id")?,
            // The Python layer splits `not_before` into an instant or a delay.
            not_before: match (
                opt_int(f.get("not_before_ms"), "not_before")?,
                opt_int(f.get("not_before_after_ms"), "not_before")?,
            ) {
                (Some(at), _) => NotBefore::At(at),
                (None, Some(after)) => NotBefore::After(after),
                (None, None) => NotBefore::Now,
            },
            priority: int(f.get("priority"), "priority")?,
            concurrency_key: opt_text(f.get("concurrency_key"), "concurrency_key")?,
            retry: retry_arg(f.get("retry"), "retry", "")?,
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
            not_before: self.not_before,
            priority: self.priority,
            concurrency_key: self.concurrency_key,
            retry: self.retry,
        }
    }
}

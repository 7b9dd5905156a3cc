//! Core records -> the public model objects of `fencepost.models`.
//!
//! Each record is built once, here, by name: a field is matched by its name, never by its
//! position, so the dataclasses in `fencepost.models` are the one place a record's shape is
//! written. Times become aware UTC `datetime`s and JSON fields are decoded with `json.loads`,
//! exactly as `fencepost.models` documents them.
//!
//! A record is built the way a frozen dataclass's own `__init__` builds it: a new instance
//! whose fields are set one by one with `object.__setattr__` (which a frozen class's
//! `__setattr__` would refuse). Doing that from Rust skips the keyword dict and the Python frame
//! of `__init__`, which on the dispatcher's hot path (a `Reservation` per reserved attempt)
//! costs more than the rest of the conversion. It is sound only for plain slotted dataclasses,
//! so [`classes`] checks, once, that each class has slots and no `__post_init__`, and every
//! build checks that it set as many fields as the class has (a field set by a name the class
//! lacks raises `AttributeError`): a field added to or renamed in `fencepost.models` without
//! this file fails loudly on first use instead of leaving an attribute unset.
//!
//! The classes, `datetime`, `UTC` and `json.loads` are looked up once per process and the
//! field names are interned.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple, PyType};
use pyo3::{ffi, intern, IntoPyObjectExt, Py};

use crate::model::{
    Accounting, Attempt, Claim, Event, Lease, Message, Reservation, ReservationKind, Run, Step,
    Unit,
};
use crate::queue::Preparation;
use crate::schedules::Schedule;
use crate::status::RunStatus;

/// A model class of `fencepost.models` and its number of fields.
struct Model {
    class: Py<PyType>,
    fields: usize,
}

/// What building records needs from Python, looked up on first use.
struct Classes {
    run: Model,
    step: Model,
    unit: Model,
    attempt: Model,
    reservation: Model,
    accounting: Model,
    claim: Model,
    lease: Model,
    preparation: Model,
    event: Model,
    message: Model,
    schedule: Model,
    datetime: Py<PyType>,
    utc: Py<PyAny>,
    /// `fencepost.models.from_ms`, for a time outside `datetime`'s range (its error).
    from_ms: Py<PyAny>,
    loads: Py<PyAny>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let models = py.import("fencepost.models")?;
        let fields = py.import("dataclasses")?.getattr("fields")?;
        let model = |name: &str| -> PyResult<Model> {
            let class = models.getattr(name)?.cast_into::<PyType>()?;
            // Slotted (no instance `__dict__`), so a name the class lacks cannot be set.
            let slotted = class.getattr("__dictoffset__")?.extract::<isize>()? == 0;
            if !slotted || class.hasattr("__post_init__")? {
                return Err(PyTypeError::new_err(format!(
                    "fencepost.models.{name} must stay a slotted dataclass without \
                     __post_init__: the core builds it by setting its slots (rust/py/records.rs)"
                )));
            }
            let fields = fields.call1((&class,))?.len()?;
            Ok(Model {
                class: class.unbind(),
                fields,
            })
        };
        let datetime = py.import("datetime")?;
        Ok(Classes {
            run: model("Run")?,
            step: model("Step")?,
            unit: model("Unit")?,
            attempt: model("Attempt")?,
            reservation: model("Reservation")?,
            accounting: model("Accounting")?,
            claim: model("Claim")?,
            lease: model("Lease")?,
            preparation: model("Preparation")?,
            event: model("Event")?,
            message: model("Message")?,
            schedule: model("Schedule")?,
            datetime: datetime
                .getattr("datetime")?
                .cast_into::<PyType>()?
                .unbind(),
            utc: datetime.getattr("UTC")?.unbind(),
            from_ms: models.getattr("from_ms")?.unbind(),
            loads: py.import("json")?.getattr("loads")?.unbind(),
        })
    })
}

/// A new, empty instance of `model`'s class.
fn instance<'py>(py: Python<'py>, model: &Model) -> PyResult<Bound<'py, PyAny>> {
    let class = model.class.bind(py);
    // SAFETY: `class` is a live type object and we are attached. PyType_GenericNew allocates
    // an instance with every slot unset (what `object.__new__(class)` does, without looking at
    // arguments) and runs no Python code.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyType_GenericNew(
                class.as_type_ptr(),
                PyTuple::empty(py).as_ptr(),
                std::ptr::null_mut(),
            ),
        )
    }
}

/// `object.__setattr__(obj, name, value)`: sets a slot of a frozen dataclass, as its
/// `__init__` does.
fn set(
    obj: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // SAFETY: three live objects and we are attached; on failure the exception is set, and
    // fetched below.
    if unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) } < 0 {
        Err(PyErr::fetch(obj.py()))
    } else {
        Ok(())
    }
}

/// A new `$model` with each named field set; the count check is the one of the module docs.
macro_rules! build {
    ($py:expr, $model:expr; $($name:literal => $value:expr),+ $(,)?) => {{
        let model = &$model;
        let obj = instance($py, model)?;
        let mut set_fields = 0;
        $(
            set(&obj, intern!($py, $name), &$value.into_bound_py_any($py)?)?;
            set_fields += 1;
        )+
        if set_fields == model.fields {
            Ok(obj)
        } else {
            Err(PyTypeError::new_err(format!(
                "fencepost.models.{} has {} fields, the core sets {set_fields}; \
                 update rust/py/records.rs",
                model.class.bind($py).name()?,
                model.fields,
            )))
        }
    }};
}

/// The first and last epoch milliseconds a `datetime` can hold (0001-01-01 to
/// 9999-12-31T23:59:59.999, UTC).
const DATETIME_MS: std::ops::RangeInclusive<i64> = -62_135_596_800_000..=253_402_300_799_999;

const MS_PER_DAY: i64 = 86_400_000;

/// Epoch milliseconds -> aware UTC `datetime`, built from its fields: exact (no float), and
/// equal to `fencepost.models.from_ms(ms)`, which handles what `datetime` cannot hold.
fn datetime<'py>(py: Python<'py>, c: &Classes, ms: i64) -> PyResult<Bound<'py, PyAny>> {
    if !DATETIME_MS.contains(&ms) {
        return c.from_ms.bind(py).call1((ms,));
    }
    let (year, month, day) = civil_from_days(ms.div_euclid(MS_PER_DAY));
    let t = ms.rem_euclid(MS_PER_DAY);
    let (hour, minute, second) = (t / 3_600_000, t / 60_000 % 60, t / 1000 % 60);
    let micro = t % 1000 * 1000;
    c.datetime.bind(py).call1((
        year,
        month,
        day,
        hour,
        minute,
        second,
        micro,
        c.utc.bind(py),
    ))
}

/// An aware UTC `datetime` of epoch milliseconds, for a field outside the records (an error's).
pub fn time(py: Python<'_>, ms: i64) -> PyResult<Bound<'_, PyAny>> {
    datetime(py, classes(py)?, ms)
}

fn opt_datetime<'py>(py: Python<'py>, c: &Classes, ms: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
    match ms {
        Some(ms) => datetime(py, c, ms),
        None => Ok(py.None().into_bound(py)),
    }
}

/// Days since 1970-01-01 -> (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`: 400-year eras of 146 097 days, years starting in March so the
/// leap day falls last).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Canonical JSON -> its Python value via `json.loads`. Canonical text is UTF-8 and starts
/// with an ASCII character, so `json.loads` reads the `str` exactly as it would the bytes,
/// minus its encoding sniffing; bytes that are not UTF-8 go through as bytes, to raise what
/// `json.loads` raises for them.
fn json<'py>(py: Python<'py>, c: &Classes, raw: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let loads = c.loads.bind(py);
    match std::str::from_utf8(raw) {
        Ok(text) => loads.call1((PyString::new(py, text),)),
        Err(_) => loads.call1((PyBytes::new(py, raw),)),
    }
}

fn opt_json<'py>(py: Python<'py>, c: &Classes, raw: Option<&[u8]>) -> PyResult<Bound<'py, PyAny>> {
    match raw {
        Some(raw) => json(py, c, raw),
        None => Ok(py.None().into_bound(py)),
    }
}

/// `fencepost.Run`.
pub fn run(py: Python<'_>, r: Run) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.run;
        "run_id" => r.run_id,
        "workflow_ref" => r.workflow_ref,
        "workflow_name" => r.workflow_name,
        "scope_key" => r.scope_key,
        "status" => r.status.as_str(),
        "current_step_id" => r.current_step_id,
        "parent_run_id" => r.parent_run_id,
        "parent_unit_id" => r.parent_unit_id,
        "invocation_key" => r.invocation_key,
        "origin_session_id" => r.origin_session_id,
        "params" => opt_json(py, c, r.params.as_deref())?,
        "outputs" => opt_json(py, c, r.outputs.as_deref())?,
        "revision" => r.revision,
        "created_at" => datetime(py, c, r.created_at)?,
        "updated_at" => datetime(py, c, r.updated_at)?,
        "completed_at" => opt_datetime(py, c, r.completed_at)?,
        "not_before" => opt_datetime(py, c, r.not_before)?,
        "priority" => r.priority,
        "concurrency_key" => r.concurrency_key,
    )
}

/// `fencepost.Run`, or `None`.
pub fn opt_run(py: Python<'_>, r: Option<Run>) -> PyResult<Option<Bound<'_, PyAny>>> {
    r.map(|r| run(py, r)).transpose()
}

/// A list of `fencepost.Run`.
pub fn runs(py: Python<'_>, runs: Vec<Run>) -> PyResult<Vec<Bound<'_, PyAny>>> {
    runs.into_iter().map(|r| run(py, r)).collect()
}

/// `fencepost.Step`.
pub fn step(py: Python<'_>, s: Step) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.step;
        "run_id" => s.run_id,
        "step_id" => s.step_id,
        "title" => s.title,
        "instructions" => s.instructions,
        "sequence_index" => s.sequence_index,
        "status" => s.status.as_str(),
        "notes" => s.notes,
        "evidence" => opt_json(py, c, s.evidence.as_deref())?,
        "summary" => s.summary,
        "completed_at" => opt_datetime(py, c, s.completed_at)?,
    )
}

/// `fencepost.Unit`.
pub fn unit(py: Python<'_>, u: Unit) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.unit;
        "run_id" => u.run_id,
        "unit_id" => u.unit_id,
        "step_id" => u.step_id,
        "phase" => u.phase,
        "status" => u.status.as_str(),
        "attempts" => u.attempts,
        "result" => opt_json(py, c, u.result.as_deref())?,
        "tokens" => u.tokens,
        "failure_reason" => u.failure_reason,
        "claim_holder" => u.claim_holder,
        "retry_at" => opt_datetime(py, c, u.retry_at)?,
    )
}

/// `fencepost.Attempt`.
pub fn attempt(py: Python<'_>, a: Attempt) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.attempt;
        "run_id" => a.run_id,
        "unit_id" => a.unit_id,
        "attempt" => a.attempt,
        "dispatch_id" => a.dispatch_id,
        "status" => a.status.as_str(),
        "phase" => a.phase,
        "holder" => a.holder,
        "lease_generation" => a.lease_generation,
        "reclaims" => a.reclaims,
        "result" => opt_json(py, c, a.result.as_deref())?,
        "tokens" => a.tokens,
        "failure_reason" => a.failure_reason,
        "started_at" => datetime(py, c, a.started_at)?,
        "finished_at" => opt_datetime(py, c, a.finished_at)?,
        "trace_context" => a.trace_context,
    )
}

/// `fencepost.Reservation` (the dispatcher's hot path: no time, no JSON).
pub fn reservation(py: Python<'_>, r: Reservation) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.reservation;
        "run_id" => r.run_id,
        "unit_id" => r.unit_id,
        // Interned: the two kinds are the same two strings on every call.
        "kind" => match r.kind {
            ReservationKind::Reserved => intern!(py, "reserved"),
            ReservationKind::Reclaimed => intern!(py, "reclaimed"),
        },
        "attempt" => r.attempt,
        "dispatch_id" => r.dispatch_id,
        "reclaims" => r.reclaims,
        "lease_generation" => r.lease_generation,
    )
}

/// `fencepost.Accounting`.
pub fn accounting(py: Python<'_>, a: Accounting) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.accounting;
        "total_attempts" => a.total_attempts,
        "total_tokens" => a.total_tokens,
        "dispatch_attempts" => a.dispatch_attempts,
        "dispatch_tokens" => a.dispatch_tokens,
        "gate_attempts" => a.gate_attempts,
        "gate_tokens" => a.gate_tokens,
    )
}

/// `fencepost.Claim` (its token is the secret the caller presents on every fenced write).
pub fn claim(py: Python<'_>, cl: Claim) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    // Every committed claim reaches its caller through here: the one place to report a
    // takeover exactly once.
    if let Some(from) = &cl.taken_from {
        crate::py::observe::takeover(py, &cl.run_id, cl.generation, &cl.owner_id, from);
    }
    build!(py, c.claim;
        "run_id" => cl.run_id,
        "generation" => cl.generation,
        "token" => cl.token,
        "owner_id" => cl.owner_id,
        "expires_at" => datetime(py, c, cl.expires_at)?,
        "taken_from" => cl.taken_from,
    )
}

/// `fencepost.Claim`, or `None`.
pub fn opt_claim(py: Python<'_>, cl: Option<Claim>) -> PyResult<Option<Bound<'_, PyAny>>> {
    cl.map(|cl| claim(py, cl)).transpose()
}

/// `fencepost.Lease`.
pub fn lease(py: Python<'_>, l: Lease) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.lease;
        "run_id" => l.run_id,
        "generation" => l.generation,
        "owner_id" => l.owner_id,
        "owner_type" => l.owner_type,
        "expires_at" => opt_datetime(py, c, l.expires_at)?,
        "heartbeat_at" => opt_datetime(py, c, l.heartbeat_at)?,
        "takeovers" => l.takeovers,
        "refused_writes" => l.refused_writes,
    )
}

/// `fencepost.Preparation`: `claim` is set exactly when `state` is `"claimed"`.
pub fn preparation(py: Python<'_>, p: Preparation) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.preparation;
        "state" => p.state,
        "run" => run(py, p.run)?,
        "claim" => opt_claim(py, p.claim)?,
    )
}

/// `fencepost.Event`.
pub fn event(py: Python<'_>, e: Event) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.event;
        "seq" => e.seq,
        "resource_id" => e.resource_id,
        "revision" => e.revision,
        "type" => e.event_type,
        "actor_type" => e.actor_type,
        "actor_id" => e.actor_id,
        "generation" => e.generation,
        "payload" => json(py, c, &e.payload)?,
        "ts" => datetime(py, c, e.ts)?,
    )
}

/// A `Message`.
pub fn message(py: Python<'_>, m: Message) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    build!(py, c.message;
        "seq" => m.seq,
        "run_id" => m.run_id,
        "topic" => m.topic,
        "key" => m.key,
        "payload" => json(py, c, &m.payload)?,
        "sent_at" => datetime(py, c, m.sent_at)?,
        "consumed_at" => opt_datetime(py, c, m.consumed_at)?,
        "consumed_generation" => m.consumed_generation,
    )
}

/// A `Schedule`; its `template` is the `reserve_run` keywords each fire passes, decoded.
pub fn schedule(py: Python<'_>, s: Schedule) -> PyResult<Bound<'_, PyAny>> {
    let c = classes(py)?;
    let template = PyDict::new(py);
    template.set_item("workflow_ref", s.workflow_ref)?;
    template.set_item("source", json(py, c, s.source.as_bytes())?)?;
    template.set_item("definition_digest", s.definition_digest)?;
    template.set_item("definition", json(py, c, s.definition.as_bytes())?)?;
    template.set_item("input", json(py, c, s.input.as_bytes())?)?;
    template.set_item("launch_options", json(py, c, s.launch_options.as_bytes())?)?;
    template.set_item("runner_id", s.runner_id)?;
    template.set_item("origin_session_id", s.origin_session_id)?;
    template.set_item("priority", s.priority)?;
    template.set_item("concurrency_key", s.concurrency_key)?;
    let retry = match &s.retry_policy {
        Some(text) => json(py, c, text.as_bytes())?,
        None => py.None().into_bound(py),
    };
    template.set_item("retry", retry)?;
    // A schedule with no slot left has none to show.
    let next_slot = (s.next_slot != i64::MAX).then_some(s.next_slot);
    build!(py, c.schedule;
        "name" => s.name,
        "cron" => s.cron,
        "workflow_name" => s.workflow_name,
        "timezone" => s.timezone,
        "overlap" => s.overlap,
        "catch_up" => s.catch_up,
        "template" => template,
        "paused" => s.paused,
        "next_slot" => opt_datetime(py, c, next_slot)?,
        "last_slot" => opt_datetime(py, c, s.last_slot)?,
        "last_run_id" => s.last_run_id,
        "last_run_status" => s.last_run_status.map(RunStatus::as_str),
        "created_at" => datetime(py, c, s.created_at)?,
        "updated_at" => datetime(py, c, s.updated_at)?,
    )
}

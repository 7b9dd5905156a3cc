//! [`LedgerError`] -> the Python exceptions of `fencepost.errors`.
//!
//! Each exception is built by calling its Python class with keyword fields, so the classes
//! stay plain, typed, picklable Python and own their message text.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use crate::errors::LedgerError;
use crate::py::observe;

pyo3::import_exception!(fencepost.errors, NotFound);
pyo3::import_exception!(fencepost.errors, RunNotFound);
pyo3::import_exception!(fencepost.errors, AmbiguousRunId);
pyo3::import_exception!(fencepost.errors, InvalidArgument);
pyo3::import_exception!(fencepost.errors, CanonicalJsonError);
pyo3::import_exception!(fencepost.errors, ActiveRunExists);
pyo3::import_exception!(fencepost.errors, RunNotActive);
pyo3::import_exception!(fencepost.errors, PreparationConflict);
pyo3::import_exception!(fencepost.errors, ContinuationRefused);
pyo3::import_exception!(fencepost.errors, LeaseLost);
pyo3::import_exception!(fencepost.errors, RetryNotDue);
pyo3::import_exception!(fencepost.errors, UnitExhausted);
pyo3::import_exception!(fencepost.errors, StoreBusy);
pyo3::import_exception!(fencepost.errors, SchemaError);
pyo3::import_exception!(fencepost.errors, StoreError);

/// Build the Python exception for `err`.
pub fn to_pyerr(py: Python<'_>, err: LedgerError) -> PyErr {
    // Reported here, where every refusal reaches its caller, and once: the writer's
    // queued notices are flushed on the same way back.
    match &err {
        LedgerError::LeaseLost {
            run_id,
            expected_generation,
            actual_generation,
            reason,
        } => observe::refused(
            py,
            run_id,
            *expected_generation,
            *actual_generation,
            reason.as_str(),
        ),
        LedgerError::StoreBusy { waited_ms, retries } => {
            observe::gave_up(py, *waited_ms, *retries);
        }
        _ => {}
    }
    observe::flush(py);
    build(py, err).unwrap_or_else(|e| e)
}

/// Build the Python exception for `err` and nothing else: no notice is reported or flushed.
/// For a call refused in a forked child, where the queued notices are the parent's and the
/// lock guarding them may have been held by a parent thread at the fork.
pub fn to_pyerr_alone(py: Python<'_>, err: LedgerError) -> PyErr {
    build(py, err).unwrap_or_else(|e| e)
}

fn build(py: Python<'_>, err: LedgerError) -> PyResult<PyErr> {
    let kw = PyDict::new(py);
    let cls: Bound<'_, PyType> = match err {
        LedgerError::NotFound { kind, key } => {
            kw.set_item("kind", kind)?;
            kw.set_item("key", key)?;
            py.get_type::<NotFound>()
        }
        LedgerError::RunNotFound { run_id } => {
            kw.set_item("run_id", run_id)?;
            py.get_type::<RunNotFound>()
        }
        LedgerError::AmbiguousRunId { prefix, matches } => {
            kw.set_item("prefix", prefix)?;
            kw.set_item("matches", matches)?;
            py.get_type::<AmbiguousRunId>()
        }
        LedgerError::InvalidArgument { argument, message } => {
            kw.set_item("argument", &argument)?;
            kw.set_item("message", format!("{argument}: {message}"))?;
            py.get_type::<InvalidArgument>()
        }
        LedgerError::CanonicalJsonError { argument, source } => {
            kw.set_item("argument", argument)?;
            kw.set_item("path", source.path())?;
            kw.set_item("reason", source.reason)?;
            py.get_type::<CanonicalJsonError>()
        }
        LedgerError::ActiveRunExists {
            scope_key,
            occupant_run_id,
        } => {
            kw.set_item("scope_key", scope_key)?;
            kw.set_item("occupant_run_id", occupant_run_id)?;
            py.get_type::<ActiveRunExists>()
        }
        LedgerError::RunNotActive { run_id, status } => {
            kw.set_item("run_id", run_id)?;
            kw.set_item("status", status)?;
            py.get_type::<RunNotActive>()
        }
        LedgerError::PreparationConflict { run_id, fields } => {
            kw.set_item("run_id", run_id)?;
            kw.set_item("fields", fields)?;
            py.get_type::<PreparationConflict>()
        }
        LedgerError::ContinuationRefused {
            parent_run_id,
            reason,
        } => {
            kw.set_item("parent_run_id", parent_run_id)?;
            kw.set_item("reason", reason)?;
            py.get_type::<ContinuationRefused>()
        }
        LedgerError::LeaseLost {
            run_id,
            expected_generation,
            actual_generation,
            reason,
        } => {
            kw.set_item("run_id", run_id)?;
            kw.set_item("expected_generation", expected_generation)?;
            kw.set_item("actual_generation", actual_generation)?;
            kw.set_item("reason", reason.as_str())?;
            py.get_type::<LeaseLost>()
        }
        e @ (LedgerError::RetryNotDue { .. } | LedgerError::UnitExhausted { .. }) => {
            retry_refusal(py, &kw, e)?
        }
        LedgerError::StoreBusy { waited_ms, retries } => {
            kw.set_item("waited_ms", waited_ms)?;
            kw.set_item("retries", retries)?;
            py.get_type::<StoreBusy>()
        }
        LedgerError::SchemaError {
            database_version,
            library_version,
        } => {
            kw.set_item("database_version", database_version)?;
            kw.set_item("library_version", library_version)?;
            py.get_type::<SchemaError>()
        }
        LedgerError::StoreError { operation, message } => {
            kw.set_item("operation", operation)?;
            kw.set_item("message", message)?;
            py.get_type::<StoreError>()
        }
    };
    let instance = cls.call((), Some(&kw))?;
    if instance.is_instance_of::<pyo3::exceptions::PyBaseException>() {
        Ok(PyErr::from_value(instance))
    } else {
        Err(PyRuntimeError::new_err(
            "fencepost.errors class did not build an exception",
        ))
    }
}

/// The fields and class of a reservation a unit's retry policy refused.
fn retry_refusal<'py>(
    py: Python<'py>,
    kw: &Bound<'py, PyDict>,
    err: LedgerError,
) -> PyResult<Bound<'py, PyType>> {
    Ok(match err {
        LedgerError::RetryNotDue {
            run_id,
            unit_id,
            retry_at,
        } => {
            kw.set_item("run_id", run_id)?;
            kw.set_item("unit_id", unit_id)?;
            kw.set_item("retry_at", crate::py::records::time(py, retry_at)?)?;
            py.get_type::<RetryNotDue>()
        }
        LedgerError::UnitExhausted {
            run_id,
            unit_id,
            attempts,
        } => {
            kw.set_item("run_id", run_id)?;
            kw.set_item("unit_id", unit_id)?;
            kw.set_item("attempts", attempts)?;
            py.get_type::<UnitExhausted>()
        }
        other => unreachable!("not a retry refusal: {other:?}"),
    })
}

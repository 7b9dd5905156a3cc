//! Python glue (`#[cfg(feature = "python")]`): no ledger logic lives here.
//!
//! - `args`: Python arguments -> owned Rust values, each refusal naming its argument.
//! - `convert`: the Python value -> canonical JSON walk behind every JSON argument.
//! - `ledger`: the `fencepost._core.Ledger` methods (read, detach, run, re-attach).
//! - `aio`: the same methods called with `future=`: queued without waiting, resolved later.
//! - `records`: core records -> the model objects of `fencepost.models`.
//! - `errors`: `LedgerError` -> the exceptions of `fencepost.errors`.
//! - `observe`: what the core reports -> the `fencepost` logger and metrics.

pub mod aio;
pub mod args;
pub mod convert;
pub mod errors;
pub mod ledger;
pub mod observe;
pub mod records;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// `canonical_json(value) -> bytes`: RFC 8785 canonical UTF-8 bytes.
#[pyfunction]
pub fn canonical_json<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut doc = args::read_doc(py, value, "value")?;
    let bytes = PyBytes::new(py, py.detach(|| doc.write()));
    doc.recycle();
    Ok(bytes)
}

/// `digest(value) -> "sha256:<64 hex>"` of the canonical bytes.
#[pyfunction]
pub fn digest(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut doc = args::read_doc(py, value, "value")?;
    let digest = py.detach(|| doc.digest());
    doc.recycle();
    Ok(digest)
}

//! Python glue (`#[cfg(feature = "python")]`): argument extraction, detaching, and conversion
//! of results and errors. No ledger logic lives here.

pub mod convert;
pub mod errors;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::canonical;
use crate::errors::LedgerError;

/// Walk `value` while attached, then serialize with the interpreter detached.
fn read_value(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    argument: &str,
) -> PyResult<canonical::Value> {
    convert::to_value(value).map_err(|e| errors::to_pyerr(py, LedgerError::canonical(argument, e)))
}

/// `canonical_json(value) -> bytes`: RFC 8785 canonical UTF-8 bytes.
#[pyfunction]
pub fn canonical_json<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let v = read_value(py, value, "value")?;
    let bytes = py.detach(move || canonical::to_vec(v));
    Ok(PyBytes::new(py, &bytes))
}

/// `digest(value) -> "sha256:<64 hex>"` of the canonical bytes.
#[pyfunction]
pub fn digest(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
    let v = read_value(py, value, "value")?;
    Ok(py.detach(move || canonical::digest(v)))
}

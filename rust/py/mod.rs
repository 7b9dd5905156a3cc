//! Python glue (`#[cfg(feature = "python")]`): argument extraction, detaching, and conversion
//! of results and errors. No ledger logic lives here.

pub mod convert;
pub mod errors;
pub mod ledger;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::canonical;
use crate::errors::LedgerError;

/// Walk `value` (the Python argument named `argument`) into a canonical tape while attached;
/// callers then serialize and hash it detached.
pub fn read_doc(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    argument: &str,
) -> PyResult<canonical::Doc> {
    convert::to_doc(value).map_err(|e| errors::to_pyerr(py, LedgerError::canonical(argument, e)))
}

/// `canonical_json(value) -> bytes`: RFC 8785 canonical UTF-8 bytes.
#[pyfunction]
pub fn canonical_json<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut doc = read_doc(py, value, "value")?;
    let bytes = PyBytes::new(py, py.detach(|| doc.write()));
    doc.recycle();
    Ok(bytes)
}

/// `digest(value) -> "sha256:<64 hex>"` of the canonical bytes.
#[pyfunction]
pub fn digest(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut doc = read_doc(py, value, "value")?;
    let digest = py.detach(|| doc.digest());
    doc.recycle();
    Ok(digest)
}

//! fencepost: a durable run ledger for workflow orchestrators and high-fanout dispatchers.
//!
//! The core modules (`canonical`, `errors`, ...) are plain Rust and never import pyo3, so
//! `cargo test --no-default-features` exercises them without libpython. The `python` feature
//! adds the `fencepost._core` extension module.

pub mod attempts;
pub mod blobs;
pub mod canonical;
pub mod cron;
pub mod errors;
pub mod events;
pub mod ids;
pub mod leases;
pub mod messages;
pub mod model;
pub mod observe;
pub(crate) mod plan;
pub mod queue;
pub mod retention;
pub mod retry;
pub mod runs;
pub mod schedules;
pub mod status;
pub mod store;
pub mod writer;

#[cfg(test)]
mod conformance;

#[cfg(feature = "python")]
pub mod py;

/// The version of the plan format stored with each run (`runs.plan_version`).
pub const PLAN_VERSION: i64 = 1;

/// The crate version, exported to Python as `fencepost._core.__version__`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The compiled half of the `fencepost` package. Python code imports the typed facade
/// (`fencepost`), not this module.
///
/// `gil_used = true`: the canonical walk (`py::convert`) reads containers through borrowed
/// references, which is sound only while no other thread can run Python code, that is, under
/// the GIL. A free-threaded interpreter importing this module turns the GIL back on for the
/// process (and says so), rather than running the walk unprotected. Every GIL-holding build is
/// unaffected, and the ledger still detaches for all database work.
#[cfg(feature = "python")]
#[pyo3::pymodule(gil_used = true)]
mod _core {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::py::{canonical_json, digest};

    #[pymodule_export]
    use crate::py::ledger::PyLedger;

    #[pymodule_export]
    use crate::py::ledger::{wait_timeout, PyWatch};

    #[pymodule_export]
    use crate::py::observe::{notices_dropped, observe_groups};

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", crate::VERSION)?;
        m.add("MAX_DEPTH", crate::canonical::MAX_DEPTH)?;
        m.add("SCHEMA_VERSION", crate::store::migrate::SCHEMA_VERSION)?;
        // The statuses in lifecycle order, for the facade's choices and zero-filled counts.
        let runs = crate::status::RunStatus::ALL.iter().map(|s| s.as_str());
        m.add("RUN_STATUSES", pyo3::types::PyTuple::new(m.py(), runs)?)?;
        let units = crate::status::UnitStatus::ALL.iter().map(|s| s.as_str());
        m.add("UNIT_STATUSES", pyo3::types::PyTuple::new(m.py(), units)?)?;
        Ok(())
    }
}

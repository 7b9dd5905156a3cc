//! How a method reaches the store: the clock read while attached, then, detached, either the
//! store itself (reads and the calls the writer does not group) or the writer's queue.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use super::PyLedger;
use crate::errors::{LedgerError, Result};
use crate::py::aio::{self, Build};
use crate::py::args::{self, int};
use crate::py::errors::{to_pyerr, to_pyerr_alone};
use crate::store::Store;
use crate::writer::{Op, Output, Writer};

fn system_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl PyLedger {
    pub(super) fn now(&self, py: Python<'_>) -> PyResult<i64> {
        let Some(clock) = &self.clock else {
            return Ok(system_now_ms());
        };
        let value = clock.call0(py)?;
        let bound = value.bind(py);
        let now = int(bound, "clock").map_err(|e| {
            if bound.is_instance_of::<PyInt>() && !bound.is_instance_of::<PyBool>() {
                return e; // an int beyond 64 bits: int() says so
            }
            args::invalid(
                py,
                "clock",
                format!(
                    "must return epoch milliseconds as an int, returned {}",
                    args::type_name(bound)
                ),
            )
        })?;
        crate::leases::check_clock_ms(now).map_err(|e| to_pyerr(py, e))?;
        Ok(now)
    }

    /// Refuse a call in any process but the one that opened the ledger: a forked child
    /// inherits the connection (its socket, its SQLite handle) and the locks as the fork found
    /// them, perhaps held by a parent thread that does not exist in the child. So this comes
    /// before any lock is taken or anything is sent, touches nothing shared, and costs one
    /// `getpid`.
    pub(super) fn check_process(&self, py: Python<'_>) -> PyResult<()> {
        let here = std::process::id();
        if here == self.pid {
            return Ok(());
        }
        Err(to_pyerr_alone(
            py,
            LedgerError::StoreError {
                operation: "using the ledger".into(),
                message: format!(
                    "this Ledger was opened in process {}; open a new Ledger after fork (this \
                     is process {here}) and leave the inherited one to its parent",
                    self.pid
                ),
            },
        ))
    }

    /// Whether this is a process the ledger was not opened in (a forked child).
    pub(super) fn inherited(&self) -> bool {
        std::process::id() != self.pid
    }

    pub(super) fn writer(&self) -> Result<&Arc<Writer>> {
        self.writer.as_ref().ok_or_else(|| LedgerError::StoreError {
            operation: "using the ledger".into(),
            message: "the ledger is not open".into(),
        })
    }

    /// Check the process, read the clock, detach, lock, run `op` on the store, re-attach.
    pub(super) fn run<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut dyn Store, i64) -> Result<T> + Send,
    ) -> PyResult<T> {
        self.check_process(py)?;
        let now = self.now(py)?;
        let out = py.detach(|| self.writer()?.with_store(|s| op(s, now)));
        crate::py::observe::flush(py);
        out.map_err(|e| to_pyerr(py, e))
    }

    /// Check the process, read the clock, detach, build the call and queue it on the writer,
    /// re-attach. A closed ledger refuses before the arguments are checked, as a call on the
    /// store would.
    pub(super) fn submit(
        &self,
        py: Python<'_>,
        build: impl FnOnce(i64) -> Result<Op> + Send,
    ) -> PyResult<Output> {
        self.check_process(py)?;
        let now = self.now(py)?;
        let out = py.detach(|| {
            let writer = self.writer()?;
            if writer.is_closed() {
                return Err(crate::writer::closed());
            }
            writer.submit(build(now)?)
        });
        crate::py::observe::flush(py);
        out.map_err(|e| to_pyerr(py, e))
    }

    /// A call the writer groups: without `future`, queue it, wait and return `build`'s
    /// result; with it, check everything on this thread, queue the call to resolve the
    /// future, and return `None` at once. Either way a closed ledger refuses first.
    pub(super) fn call<'py>(
        &self,
        py: Python<'py>,
        future: Option<&Bound<'py, PyAny>>,
        op: impl FnOnce(i64) -> Result<Op> + Send,
        build: Build,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(future) = future else {
            let out = self.submit(py, op)?;
            return build(py, out).map(Some);
        };
        self.check_process(py)?;
        let now = self.now(py)?;
        let queued = self.writer().and_then(|writer| {
            if writer.is_closed() {
                return Err(crate::writer::closed());
            }
            Ok((writer, op(now)?))
        });
        let (writer, op) = queued.map_err(|e| to_pyerr(py, e))?;
        aio::submit(py, writer, future, op, build)?;
        Ok(None)
    }
}

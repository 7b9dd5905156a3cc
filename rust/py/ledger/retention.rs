//! `prune` and `restore` for the Python class: the core steps them batch by batch, each batch
//! in its own store lock and transaction, so other calls on this ledger run in between, the
//! caller's progress callback sees every batch, and Ctrl-C stops a prune between two batches
//! (with every committed batch complete, in the ledger and the archive alike).
//!
//! The archive's file is Python's (the facade opens it, gzip or not): the core hands each
//! batch's lines to `sink` and reads an archive through `lines`, a callable returning a fresh
//! iterator of lines, called twice (check everything, then insert every tree in one
//! transaction).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyIterator};

use super::PyLedger;
use crate::errors::LedgerError;
use crate::py::errors::to_pyerr;
use crate::retention::{self, Lines, PruneReport, PruneSpec, Pruner};

pub(super) fn report<'py>(py: Python<'py>, r: &PruneReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("runs", r.runs)?;
    d.set_item("attempts", r.attempts)?;
    d.set_item("events", r.events)?;
    d.set_item("blobs", r.blobs)?;
    d.set_item("archived_bytes", r.archived_bytes)?;
    d.set_item("dry_run", r.dry_run)?;
    d.set_item("reclaimed_bytes", r.reclaimed_bytes)?;
    d.set_item("transactions", r.transactions)?;
    d.set_item(
        "longest_transaction_ms",
        f64::from(u32::try_from(r.longest_transaction_us).unwrap_or(u32::MAX)) / 1000.0,
    )?;
    Ok(d)
}

fn take(failed: &std::sync::Mutex<Option<PyErr>>) -> Option<PyErr> {
    failed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

impl PyLedger {
    /// See the facade's `prune`. `cutoff_ms` or `age_ms` (read against the ledger's clock).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prune_in<'py>(
        &self,
        py: Python<'py>,
        cutoff_ms: Option<i64>,
        age_ms: Option<i64>,
        statuses: &[String],
        limit: Option<i64>,
        dry_run: bool,
        sink: Option<&Bound<'py, PyAny>>,
        progress: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.check_process(py)?;
        let now = self.now(py)?;
        let cutoff = match (cutoff_ms, age_ms) {
            (Some(c), _) => Ok(c),
            (None, Some(age)) => PruneSpec::cutoff_for_age(age, now),
            (None, None) => Err(LedgerError::invalid("older_than", "is required")),
        };
        let spec = cutoff
            .and_then(|c| PruneSpec::new(c, statuses, limit, dry_run))
            .map_err(|e| to_pyerr(py, e))?;
        let mut pruner = Pruner::new(spec);
        let sink = sink.map(|s| s.clone().unbind());
        // Behind a lock: the sink runs on this thread, inside the detached store call.
        let failed: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
        let mut write = |bytes: &[u8]| -> crate::errors::Result<()> {
            let Some(sink) = &sink else { return Ok(()) };
            Python::attach(|py| sink.call1(py, (PyBytes::new(py, bytes),)).map(|_| ()))
                .map_err(|e| keep(&failed, e, "writing the archive"))
        };
        loop {
            let more = py.detach(|| {
                self.writer()?.with_store(|s| {
                    let sink: Option<retention::Sink<'_, '_>> = if sink.is_some() {
                        Some(&mut write)
                    } else {
                        None
                    };
                    pruner.step(s, sink)
                })
            });
            if let Some(e) = take(&failed) {
                return Err(e);
            }
            let more = more.map_err(|e| to_pyerr(py, e))?;
            if let Some(progress) = progress {
                progress.call1((report(py, pruner.report())?,))?;
            }
            py.check_signals()?;
            if !more {
                break;
            }
        }
        let close = pruner.finish(if sink.is_some() {
            Some(&mut write)
        } else {
            None
        });
        if let Some(e) = take(&failed) {
            return Err(e);
        }
        close.map_err(|e| to_pyerr(py, e))?;
        // Hand the freed pages back, a short transaction at a time, each reported.
        loop {
            let more = py
                .detach(|| self.writer()?.with_store(|s| pruner.reclaim_step(s)))
                .map_err(|e| to_pyerr(py, e))?;
            if !more {
                break;
            }
            if let Some(progress) = progress {
                progress.call1((report(py, pruner.report())?,))?;
            }
            py.check_signals()?;
        }
        report(py, pruner.report())
    }

    /// See the facade's `restore`: the core reads `lines()` twice (checking, then inserting in
    /// one transaction), calling back into Python for each line.
    pub(super) fn restore_in(
        &self,
        py: Python<'_>,
        lines: &Bound<'_, PyAny>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.check_process(py)?;
        let failed: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
        let mut source = PyLines {
            open: lines.clone().unbind(),
            now: None,
            failed: &failed,
            read: 0,
        };
        let progress = progress.map(|p| p.clone().unbind());
        let mut shown = 0;
        let mut report = |runs: u64| -> crate::errors::Result<()> {
            // The callback sees a count every few hundred runs, not every tree.
            if runs < shown + PROGRESS_RUNS {
                return Ok(());
            }
            shown = runs;
            Python::attach(|py| match &progress {
                Some(p) => p.call1(py, (runs,)).map(|_| ()),
                None => Ok(()),
            })
            .map_err(|e| keep(&failed, e, "restoring"))
        };
        let restored = py.detach(|| {
            self.writer()?
                .with_store(|s| retention::restore(s, &mut source, &mut report))
        });
        if let Some(e) = take(&failed) {
            return Err(e);
        }
        let restored = restored.map_err(|e| to_pyerr(py, e))?;
        if let Some(p) = &progress {
            p.call1(py, (restored,))?;
        }
        Ok(restored)
    }
}

/// Runs between two calls of restore's progress callback.
const PROGRESS_RUNS: u64 = 500;

/// Keep a Python callback's exception (the archive's file, a progress callback) to raise as
/// itself once the store has rolled back; the core sees only that `operation` stopped.
fn keep(failed: &std::sync::Mutex<Option<PyErr>>, e: PyErr, operation: &str) -> LedgerError {
    *failed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
    LedgerError::StoreError {
        operation: operation.into(),
        message: "a Python callback raised; its exception is raised in place of this".into(),
    }
}

/// The facade's line source: `open()` returns a fresh iterator of byte lines. Every line
/// attaches to the interpreter (the store call runs detached), and every few thousand lines
/// Ctrl-C is looked for, so a long restore can be stopped (and rolls back).
struct PyLines<'a> {
    open: Py<PyAny>,
    now: Option<Py<PyAny>>,
    failed: &'a std::sync::Mutex<Option<PyErr>>,
    read: u64,
}

impl Lines for PyLines<'_> {
    fn rewind(&mut self) -> crate::errors::Result<()> {
        let failed = self.failed;
        self.now = Some(
            Python::attach(|py| {
                let it = self.open.call0(py)?;
                Ok::<_, PyErr>(it.bind(py).try_iter()?.into_any().unbind())
            })
            .map_err(|e| keep(failed, e, "reading the archive"))?,
        );
        Ok(())
    }

    fn next_line(&mut self) -> crate::errors::Result<Option<Vec<u8>>> {
        let Some(now) = &self.now else {
            return Ok(None);
        };
        self.read += 1;
        let check = self.read % 4096 == 0;
        Python::attach(|py| {
            if check {
                py.check_signals()?;
            }
            let it = now.bind(py).cast::<PyIterator>()?.clone();
            match it.into_iter().next() {
                None => Ok(None),
                Some(line) => Ok(Some(line?.cast::<PyBytes>()?.as_bytes().to_vec())),
            }
        })
        .map_err(|e: PyErr| keep(self.failed, e, "reading the archive"))
    }
}

//! `prune` and `restore` for the Python class: the core steps them batch by batch, each batch
//! in its own store lock and transaction, so other calls on this ledger run in between, the
//! caller's progress callback sees every batch, and Ctrl-C stops a prune between two batches
//! (with every committed batch complete, in the ledger and the archive alike).
//!
//! The archive's file is Python's (the facade opens it, gzip or not): the core hands each
//! batch's lines to `sink` and reads an archive through `lines`, a callable returning a fresh
//! iterator of lines, called twice (check everything, then insert).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::PyLedger;
use crate::errors::LedgerError;
use crate::py::errors::to_pyerr;
use crate::retention::{self, PruneReport, PruneSpec, Pruner, Reader};

/// Trees whose rows reach this many go to the database in one restore transaction.
const RESTORE_ROWS: usize = 20_000;

/// A Python callback's failure, kept to be raised as itself once the transaction is rolled
/// back (the core sees only that the sink failed).
fn sink_failed() -> LedgerError {
    LedgerError::StoreError {
        operation: "writing the archive".into(),
        message: "the archive's file refused a write".into(),
    }
}

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
            Python::attach(|py| sink.call1(py, (PyBytes::new(py, bytes),)).map(|_| ())).map_err(
                |e| {
                    *failed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                    sink_failed()
                },
            )
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

    /// See the facade's `restore`: `lines()` twice, checking then inserting.
    pub(super) fn restore_in(
        &self,
        py: Python<'_>,
        lines: &Bound<'_, PyAny>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.check_process(py)?;
        // First reading: every line checked, every run id collected; nothing written.
        let mut reader = Reader::new();
        let mut ids: Vec<String> = Vec::new();
        for line in lines.call0()?.try_iter()? {
            let line = line?;
            let bytes = line.cast::<PyBytes>()?.as_bytes();
            if let Some(tree) = reader.read(bytes).map_err(|e| to_pyerr(py, e))? {
                ids.extend(tree.run_ids().into_iter().map(str::to_owned));
            }
        }
        reader.finish().map_err(|e| to_pyerr(py, e))?;
        let existing = py
            .detach(|| {
                self.writer()?
                    .with_store(|s| retention::existing_runs(s, &ids))
            })
            .map_err(|e| to_pyerr(py, e))?;
        if !existing.is_empty() {
            let shown: Vec<&str> = existing.iter().take(5).map(String::as_str).collect();
            return Err(to_pyerr(
                py,
                LedgerError::invalid(
                    "archive",
                    format!(
                        "{} of its runs exist in the ledger ({}{}); restore never overwrites a \
                         run, so nothing was restored",
                        existing.len(),
                        shown.join(", "),
                        if existing.len() > shown.len() {
                            ", ..."
                        } else {
                            ""
                        }
                    ),
                ),
            ));
        }
        // Second reading: insert, a bounded batch of trees per transaction.
        let mut reader = Reader::new();
        let mut batch = Vec::new();
        let mut rows = 0;
        let mut restored = 0;
        let mut flush = |batch: &mut Vec<retention::archive::Tree>| -> PyResult<()> {
            if batch.is_empty() {
                return Ok(());
            }
            restored += py
                .detach(|| {
                    self.writer()?
                        .with_store(|s| retention::insert_trees(s, batch))
                })
                .map_err(|e| to_pyerr(py, e))?;
            batch.clear();
            if let Some(progress) = progress {
                progress.call1((restored,))?;
            }
            py.check_signals()
        };
        for line in lines.call0()?.try_iter()? {
            let line = line?;
            let bytes = line.cast::<PyBytes>()?.as_bytes();
            if let Some(tree) = reader.read(bytes).map_err(|e| to_pyerr(py, e))? {
                rows += tree.rows.iter().map(|(_, r)| r.len()).sum::<usize>();
                batch.push(tree);
                if rows >= RESTORE_ROWS {
                    flush(&mut batch)?;
                    rows = 0;
                }
            }
        }
        reader.finish().map_err(|e| to_pyerr(py, e))?;
        flush(&mut batch)?;
        Ok(restored)
    }
}

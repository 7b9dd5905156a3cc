//! Reading attempts, units and their totals.

use crate::params;

use crate::errors::Result;
use crate::model::{Accounting, Attempt, Unit};
use crate::status::run_state;
use crate::store::{sql, DbResult, Row, Store};

/// Every attempt of a unit, oldest first.
pub fn attempts(store: &mut dyn Store, run_id: &str, unit_id: &str) -> Result<Vec<Attempt>> {
    store.read("listing attempts", |tx| {
        tx.rows(&sql::LIST_ATTEMPTS_SQL, params![run_id, unit_id], |r| {
            Ok(Attempt {
                run_id: r.get(0)?,
                unit_id: r.get(1)?,
                attempt: r.get(2)?,
                dispatch_id: r.get(3)?,
                status: r.get(4)?,
                phase: r.get(5)?,
                holder: r.get(6)?,
                lease_generation: r.get(7)?,
                reclaims: r.get(8)?,
                result: r.get::<Option<String>>(9)?.map(String::into_bytes),
                tokens: r.get(10)?,
                failure_reason: r.get(11)?,
                started_at: r.get(12)?,
                finished_at: r.get(13)?,
            })
        })
    })
}

fn unit_from_row(r: &dyn Row) -> DbResult<Unit> {
    Ok(Unit {
        run_id: r.get(0)?,
        unit_id: r.get(1)?,
        step_id: r.get(2)?,
        phase: r.get(3)?,
        status: r.get(4)?,
        attempts: r.get(5)?,
        result: r.get::<Option<String>>(6)?.map(String::into_bytes),
        tokens: r.get(7)?,
        failure_reason: r.get(8)?,
        claim_holder: r.get(9)?,
    })
}

/// The run's unit projections in order of first reservation.
pub fn units(store: &mut dyn Store, run_id: &str, step_id: Option<&str>) -> Result<Vec<Unit>> {
    store.read("listing units", |tx| {
        tx.rows(
            &sql::LIST_UNITS_SQL,
            params![run_id, step_id],
            unit_from_row,
        )
    })
}

/// One unit projection.
pub fn unit(store: &mut dyn Store, run_id: &str, unit_id: &str) -> Result<Option<Unit>> {
    store.read("reading a unit", |tx| {
        tx.row(&sql::GET_UNIT_SQL, params![run_id, unit_id], unit_from_row)
    })
}

/// Attempt and token totals of a run.
pub fn accounting(store: &mut dyn Store, run_id: &str) -> Result<Accounting> {
    store.read("reading accounting", |tx| {
        run_state(tx, run_id)?;
        Ok(tx
            .row(&sql::ACCOUNTING_SQL, params![run_id], |r| {
                Ok(Accounting {
                    total_attempts: r.get(0)?,
                    total_tokens: r.get(1)?,
                    dispatch_attempts: r.get(2)?,
                    dispatch_tokens: r.get(3)?,
                    gate_attempts: r.get(4)?,
                    gate_tokens: r.get(5)?,
                })
            })?
            .unwrap_or_default())
    })
}

/// Attempts without their `unit.started` event (at most 100): a ledger written only by
/// fencepost has none, whatever crashed; `fencepost doctor` reports any it finds.
pub fn orphans(store: &mut dyn Store) -> Result<Vec<(String, String, i64, String)>> {
    store.read("looking for orphan attempts", |tx| {
        tx.rows(&sql::ORPHAN_ATTEMPTS_SQL, params![], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
    })
}

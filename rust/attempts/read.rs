//! Reading attempts, units and their totals.

use crate::params;

use crate::errors::{LedgerError, Result};
use crate::events::check_page;
use crate::model::{Accounting, Attempt, Unit};
use crate::status::{run_state, UnitStatus};
use crate::store::{sql, DbResult, Row, Store};

/// An attempt row, in the column order of the attempt reads.
fn attempt_row(r: &dyn Row) -> DbResult<Attempt> {
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
        trace_context: r.get(14)?,
    })
}

/// Every attempt of a unit, oldest first.
pub fn attempts(store: &mut dyn Store, run_id: &str, unit_id: &str) -> Result<Vec<Attempt>> {
    store.read("listing attempts", |tx| {
        tx.rows(
            &sql::LIST_ATTEMPTS_SQL,
            params![run_id, unit_id],
            attempt_row,
        )
    })
}

/// The newest `latest` attempts (1 to 10 000) of each of `unit_ids` (at most 10 000; units the
/// run does not have are left out), by unit and then attempt, in one read: each unit's range of
/// the attempts' primary key, however many attempts the run has.
pub fn unit_attempts(
    store: &mut dyn Store,
    run_id: &str,
    unit_ids: &[String],
    latest: i64,
) -> Result<Vec<Attempt>> {
    crate::events::check_keys("unit_ids", unit_ids.len(), "units")?;
    if !(1..=crate::events::MAX_PAGE).contains(&latest) {
        return Err(LedgerError::invalid(
            "latest",
            format!(
                "must be from 1 to {}, not {latest}",
                crate::events::MAX_PAGE
            ),
        ));
    }
    if unit_ids.is_empty() {
        return Ok(Vec::new());
    }
    let ids = crate::events::json_array(unit_ids);
    store.read("listing attempts", |tx| {
        tx.rows(
            &sql::UNIT_ATTEMPTS_SQL,
            params![run_id, ids, latest],
            attempt_row,
        )
    })
}

/// A unit from `run_id, unit_id, step_id, phase, status, attempts, result, tokens,
/// failure_reason, claim_holder, retry_at`.
pub(crate) fn unit_from_row(r: &dyn Row) -> DbResult<Unit> {
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
        retry_at: r.get(10)?,
    })
}

/// `units` filters and page.
#[derive(Debug, Clone, Default)]
pub struct UnitFilter {
    /// The run.
    pub run_id: String,
    /// Only units of this step.
    pub step_id: Option<String>,
    /// Only units in this status.
    pub status: Option<String>,
    /// At most this many units, from 1 to [`crate::events::MAX_PAGE`] (`None` = all).
    pub limit: Option<i64>,
    /// Continue after this unit: the last unit of the page before.
    pub after: Option<String>,
}

impl UnitFilter {
    /// Every unit of `run_id`.
    #[must_use]
    pub fn of(run_id: &str) -> Self {
        Self {
            run_id: run_id.to_owned(),
            ..Self::default()
        }
    }
}

/// The run's unit projections in order of first reservation, a page of them with `limit` and
/// `after`. A unit keeps its place in that order for good (its first reservation does not
/// change), so a cursor stays valid while the run goes on.
pub fn units(store: &mut dyn Store, f: &UnitFilter) -> Result<Vec<Unit>> {
    if let Some(limit) = f.limit {
        check_page(limit, "; page on with after=")?;
    }
    let status = match &f.status {
        Some(s) => Some(UnitStatus::parse_argument("status", s)?),
        None => None,
    };
    store.read("listing units", |tx| {
        let place = match &f.after {
            None => (i64::MIN, String::new()),
            Some(unit_id) => {
                let at = tx.row(&sql::UNIT_PLACE_SQL, params![f.run_id, unit_id], |r| {
                    r.get::<i64>(0)
                })?;
                let at = at.ok_or_else(|| {
                    LedgerError::invalid(
                        "after",
                        format!(
                            "run {:?} has no unit {unit_id:?}; pass the unit_id of the last \
                             unit of the page before",
                            f.run_id
                        ),
                    )
                })?;
                (at, unit_id.clone())
            }
        };
        let statement = match status {
            Some(s) if sql::OFF_PATH.contains(&s) => &sql::LIST_UNITS_OF_STATUS_SQL,
            _ => &sql::LIST_UNITS_SQL,
        };
        tx.rows(
            statement,
            params![
                f.run_id,
                place.0,
                place.1,
                f.step_id,
                status,
                f.limit.unwrap_or(i64::MAX)
            ],
            unit_from_row,
        )
    })
}

/// How many of the run's units are in each status (statuses without units left out), counted
/// by the database; `RunNotFound` for an unknown run.
pub fn unit_counts(store: &mut dyn Store, run_id: &str) -> Result<Vec<(UnitStatus, i64)>> {
    store.read("counting units", |tx| {
        run_state(tx, run_id)?;
        let mut counts = tx.rows(&sql::UNIT_COUNTS_SQL, params![run_id], |r| {
            Ok((r.get::<UnitStatus>(0)?, r.get::<i64>(1)?))
        })?;
        counts.sort_by_key(|(s, _)| UnitStatus::ALL.iter().position(|a| a == s));
        Ok(counts)
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

//! The failed units under a retry policy, read and moved: the units whose retry time has come
//! (`due_units`), the units that have used every attempt (`exhausted_units`, the dead
//! letters), and an operator's bulk moves, `retry_units` and `cancel_units`.
//!
//! Both reads page by a cursor on their index (`units_retry_due*`, `units_exhausted`), which
//! holds the waiting or exhausted units and nothing else, so a page costs what it returns
//! whatever the ledger holds; each is planned once for the session, not for each call's values
//! (`Tx::plan_generic`), which on a large table PostgreSQL would otherwise do on every call.
//! Both moves are fenced like every write, take the run's lock, and write one event per unit
//! they change (`unit.retried`, `unit.cancelled`).

use crate::params;

use crate::canonical::Value;
use crate::errors::{LedgerError, Result};
use crate::events::{self, check_page, Actor};
use crate::leases::Fence;
use crate::model::Unit;
use crate::status::{AttemptStatus, UnitStatus};
use crate::store::{sql, Sql, Store, ToSql, Tx};

use super::read::unit_from_row;
use super::FinishSpec;

/// Where a page of `due_units` starts: after this unit's (retry time, run, unit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueCursor {
    /// Its retry time, epoch ms.
    pub retry_at: i64,
    /// Its run.
    pub run_id: String,
    /// Its id.
    pub unit_id: String,
}

/// Where a page of `exhausted_units` starts: after this unit (run, then unit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitCursor {
    /// Its run.
    pub run_id: String,
    /// Its id.
    pub unit_id: String,
}

/// The failed units whose retry time has come by `now_ms`, of one run or of every run, the
/// soonest due first (then by run and unit), at most `limit` (1 to 10 000) after `after`.
pub fn due_units(
    store: &mut dyn Store,
    run_id: Option<&str>,
    limit: i64,
    after: Option<&DueCursor>,
    now_ms: i64,
) -> Result<Vec<Unit>> {
    check_page(limit, "; page on with after=")?;
    let (at, run, unit) = after.map_or((i64::MIN, "", ""), |c| {
        (c.retry_at, c.run_id.as_str(), c.unit_id.as_str())
    });
    store.read("listing due units", |tx| {
        tx.plan_generic()?;
        match run_id {
            // A cursor from another run continues after it: the run's own rows start over.
            Some(run_id) => {
                let (at, unit) = if run == run_id {
                    (at, unit)
                } else {
                    (i64::MIN, "")
                };
                tx.rows(
                    &sql::DUE_UNITS_RUN_SQL,
                    params![run_id, now_ms, at, unit, limit],
                    unit_from_row,
                )
            }
            None => tx.rows(
                &sql::DUE_UNITS_SQL,
                params![now_ms, at, run, unit, limit],
                unit_from_row,
            ),
        }
    })
}

/// The exhausted units, of one run or of every run, by run and then unit, at most `limit`
/// (1 to 10 000) after `after`.
pub fn exhausted_units(
    store: &mut dyn Store,
    run_id: Option<&str>,
    limit: i64,
    after: Option<&UnitCursor>,
) -> Result<Vec<Unit>> {
    check_page(limit, "; page on with after=")?;
    let (run, unit) = after.map_or(("", ""), |c| (c.run_id.as_str(), c.unit_id.as_str()));
    store.read("listing exhausted units", |tx| {
        tx.plan_generic()?;
        match run_id {
            Some(run_id) => {
                let unit = if run == run_id { unit } else { "" };
                tx.rows(
                    &sql::EXHAUSTED_UNITS_RUN_SQL,
                    params![run_id, unit, limit],
                    unit_from_row,
                )
            }
            None => tx.rows(
                &sql::EXHAUSTED_UNITS_SQL,
                params![run, unit, limit],
                unit_from_row,
            ),
        }
    })
}

/// A unit a bulk move may take, as read under the run's lock.
struct Taken {
    unit_id: String,
    status: UnitStatus,
    attempts: i64,
    dispatch_id: String,
}

/// Lock the run, check the fence and that the run has not ended, and read the units named
/// (every unit of the run when `unit_ids` is `None`; an id the run does not have is
/// `NotFound`, and nothing is written).
fn take(
    tx: &dyn Tx,
    run_id: &str,
    unit_ids: Option<&[String]>,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<(Actor<'static>, Vec<Taken>)> {
    let (actor, state) = crate::runs::fenced_state(tx, run_id, fence, now_ms)?;
    if state.status.is_terminal() {
        return Err(LedgerError::RunNotActive {
            run_id: run_id.to_owned(),
            status: state.status.as_str().to_owned(),
        });
    }
    let row = |r: &dyn crate::store::Row| {
        Ok(Taken {
            unit_id: r.get(0)?,
            status: r.get(1)?,
            attempts: r.get(2)?,
            dispatch_id: r.get(3)?,
        })
    };
    let Some(ids) = unit_ids else {
        return Ok((actor, tx.rows(&sql::UNIT_STATES_SQL, params![run_id], row)?));
    };
    // A unit named twice moves once.
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<&String> = ids.iter().filter(|id| seen.insert(id.as_str())).collect();
    let params: Vec<[&dyn ToSql; 2]> = ids.iter().map(|u| [&run_id as &dyn ToSql, *u]).collect();
    let queries: Vec<(&Sql, &[&dyn ToSql])> = params
        .iter()
        .map(|p| (&sql::UNIT_STATE_SQL, p.as_slice()))
        .collect();
    let mut found: Vec<Option<Taken>> = ids.iter().map(|_| None).collect();
    tx.query_many(&queries, &mut |i, r| {
        found[i] = Some(row(r)?);
        Ok(())
    })
    .map_err(|e| tx.fail(&e))?;
    let taken = ids
        .iter()
        .zip(found)
        .map(|(id, unit)| {
            unit.ok_or_else(|| LedgerError::NotFound {
                kind: "unit",
                key: format!("{run_id}/{id}"),
            })
        })
        .collect::<Result<Vec<Taken>>>()?;
    Ok((actor, taken))
}

/// Check the unit ids of a bulk move.
fn check_ids(unit_ids: Option<&[String]>) -> Result<()> {
    for id in unit_ids.unwrap_or_default() {
        crate::ids::check_name("unit_ids", id)?;
    }
    Ok(())
}

/// The payload of a unit's `unit.retried` or `unit.cancelled` event.
fn moved_payload(run_id: &str, t: &Taken, reason: Option<&str>) -> Value {
    let mut payload = vec![
        ("attempts".into(), Value::Int(t.attempts)),
        ("run_id".into(), Value::Str(run_id.to_owned())),
        ("status".into(), Value::Str(t.status.as_str().to_owned())),
        ("unit_id".into(), Value::Str(t.unit_id.clone())),
    ];
    if let Some(reason) = reason {
        payload.push(("reason".into(), Value::Str(reason.to_owned())));
    }
    Value::Object(payload)
}

/// Make the failed, timed-out and exhausted units of `run_id` (those named, or all) due now:
/// each may be reserved at once and `due_units` lists it (a unit already due keeps its place).
/// An exhausted unit gets exactly one more attempt: its status goes back to its last attempt's
/// and its attempt count stays, so that attempt failing exhausts it again. Returns how many
/// units it took; each has a `unit.retried` event.
pub fn retry_units(
    store: &mut dyn Store,
    run_id: &str,
    unit_ids: Option<&[String]>,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<i64> {
    check_ids(unit_ids)?;
    store.write("retrying units", |tx| {
        let (actor, units) = take(tx, run_id, unit_ids, fence, now_ms)?;
        let mut moved = 0;
        for t in units.iter().filter(|t| {
            matches!(
                t.status,
                UnitStatus::Failed | UnitStatus::TimedOut | UnitStatus::Exhausted
            )
        }) {
            tx.exec_later(&sql::RETRY_UNIT_SQL, params![run_id, t.unit_id, now_ms])?;
            let payload = moved_payload(run_id, t, None);
            events::append(tx, run_id, "unit.retried", &payload, &actor, now_ms)?;
            moved += 1;
        }
        Ok(moved)
    })
}

/// Cancel the units of `run_id` (those named, or all) that are not completed or cancelled: a
/// running attempt is finished as `cancelled` through the finish itself (its compare-and-set
/// and `unit.finished` event), a failed, timed-out or exhausted unit becomes `cancelled` and
/// waits for no retry. Returns how many units it changed; each has a `unit.cancelled` event.
pub fn cancel_units(
    store: &mut dyn Store,
    run_id: &str,
    unit_ids: Option<&[String]>,
    reason: Option<&str>,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<i64> {
    check_ids(unit_ids)?;
    if let Some(reason) = reason {
        crate::ids::check_prose("reason", reason)?;
    }
    store.write("cancelling units", |tx| {
        let (actor, units) = take(tx, run_id, unit_ids, fence, now_ms)?;
        let units: Vec<&Taken> = units
            .iter()
            .filter(|t| !matches!(t.status, UnitStatus::Completed | UnitStatus::Cancelled))
            .collect();
        let running: Vec<FinishSpec> = units
            .iter()
            .filter(|t| t.status == UnitStatus::Running)
            .map(|t| FinishSpec {
                run_id: run_id.to_owned(),
                unit_id: t.unit_id.clone(),
                attempt: t.attempts,
                dispatch_id: t.dispatch_id.clone(),
                status: AttemptStatus::Cancelled.as_str().to_owned(),
                failure_reason: Some(reason.unwrap_or("cancelled by cancel_units").to_owned()),
                ..FinishSpec::default()
            })
            .collect();
        if !running.is_empty() {
            super::finish_in(tx, &running, fence, now_ms)?;
        }
        for t in &units {
            if t.status != UnitStatus::Running {
                tx.exec_later(
                    &sql::CANCEL_UNIT_SQL,
                    params![run_id, t.unit_id, reason, now_ms],
                )?;
            }
            let payload = moved_payload(run_id, t, reason);
            events::append(tx, run_id, "unit.cancelled", &payload, &actor, now_ms)?;
        }
        Ok(i64::try_from(units.len()).unwrap_or(i64::MAX))
    })
}

//! The rules of reserving and finishing, judged over what the store read: pure functions of a
//! unit's latest attempt (a reservation) or of the still-running attempts a finish may name,
//! so a call alone, a batch and a commit group decide alike (see `crate::plan`).
//!
//! - A reservation of a unit whose latest attempt is still running reclaims that attempt in
//!   place (same number, same dispatch id), provided it is the same work: the same step, and
//!   the same input where both name one. Otherwise it starts attempt n + 1 (1 for a new unit).
//! - A finish wins exactly when the attempt it names (run, unit, attempt, dispatch id) is still
//!   running; it then stops running, so a second finish of it loses.

use std::collections::HashMap;

use crate::errors::{LedgerError, Result};
use crate::retry::{AfterFailure, RetryPolicy};
use crate::status::{AttemptStatus, UnitStatus};
use crate::store::{DbResult, Row};

use super::{FinishSpec, UnitSpec};

/// The latest attempt of a unit, as the store reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LatestAttempt {
    /// Its number.
    pub attempt: i64,
    /// Its dispatch id.
    pub dispatch_id: String,
    /// Its status.
    pub status: AttemptStatus,
    /// The step it was reserved for.
    pub step_id: Option<String>,
    /// The input it was reserved with.
    pub input_hash: Option<String>,
    /// How often it was reclaimed.
    pub reclaims: i64,
    /// The generation of the claim that handed it out last.
    pub lease_generation: Option<i64>,
    /// Its unit has used every attempt its retry policy allows.
    pub exhausted: bool,
    /// When its failed unit may be reserved again, under its retry policy.
    pub retry_at: Option<i64>,
}

impl LatestAttempt {
    /// The nine columns `attempt, dispatch_id, status, step_id, input_hash, reclaims,
    /// lease_generation` of the attempt and `status, retry_at` of its unit, from column `at`
    /// on (every latest-attempt statement reads them in this order).
    pub(crate) fn from_row(r: &dyn Row, at: usize) -> DbResult<Self> {
        Ok(Self {
            attempt: r.get(at)?,
            dispatch_id: r.get(at + 1)?,
            status: r.get(at + 2)?,
            step_id: r.get(at + 3)?,
            input_hash: r.get(at + 4)?,
            reclaims: r.get(at + 5)?,
            lease_generation: r.get(at + 6)?,
            exhausted: r.get::<UnitStatus>(at + 7)? == UnitStatus::Exhausted,
            retry_at: r.get(at + 8)?,
        })
    }

    /// The attempt a new reservation makes: running, for `u`, handed out under `generation`.
    pub(crate) fn started(
        attempt: i64,
        dispatch_id: &str,
        u: &UnitSpec,
        generation: Option<i64>,
    ) -> Self {
        Self {
            attempt,
            dispatch_id: dispatch_id.to_owned(),
            status: AttemptStatus::Running,
            step_id: Some(u.step_id.clone()),
            input_hash: u.input_hash.clone(),
            reclaims: 0,
            lease_generation: generation,
            exhausted: false,
            retry_at: None,
        }
    }
}

/// What a reservation of a unit does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReserveVerdict<'a> {
    /// Start this attempt number.
    New {
        /// The new attempt's number.
        attempt: i64,
    },
    /// Hand the still-running latest attempt back in place.
    Reclaim(&'a LatestAttempt),
}

/// Judge a reservation of `u` of run `run_id`, whose latest attempt is `latest`, at `now_ms`.
/// A unit that failed under a retry policy waits for its retry time (`force` passes it) and
/// an exhausted unit takes no attempt at all.
pub(crate) fn reserve<'a>(
    run_id: &str,
    latest: Option<&'a LatestAttempt>,
    u: &UnitSpec,
    now_ms: i64,
) -> Result<ReserveVerdict<'a>> {
    let Some(l) = latest else {
        return Ok(ReserveVerdict::New { attempt: 1 });
    };
    if l.status != AttemptStatus::Running {
        if l.exhausted {
            return Err(LedgerError::UnitExhausted {
                run_id: run_id.to_owned(),
                unit_id: u.unit_id.clone(),
                attempts: l.attempt,
            });
        }
        if let Some(retry_at) = l.retry_at.filter(|&t| t > now_ms && !u.force) {
            return Err(LedgerError::RetryNotDue {
                run_id: run_id.to_owned(),
                unit_id: u.unit_id.clone(),
                retry_at,
            });
        }
        return Ok(ReserveVerdict::New {
            attempt: l.attempt + 1,
        });
    }
    // One dispatch id must never stand for two different pieces of work.
    if l.step_id.as_deref() != Some(u.step_id.as_str()) {
        return Err(LedgerError::invalid(
            "step_id",
            format!(
                "attempt {} of unit {:?} is still running for step {:?}; finish it before \
                 reserving the unit for step {:?}",
                l.attempt,
                u.unit_id,
                l.step_id.as_deref().unwrap_or(""),
                u.step_id
            ),
        ));
    }
    if let (Some(want), Some(had)) = (&u.input_hash, &l.input_hash) {
        if want != had {
            return Err(LedgerError::invalid(
                "input_hash",
                format!(
                    "attempt {} of unit {:?} is still running with input {had:?}; a reclaim \
                     cannot change the input to {want:?} (finish it first)",
                    l.attempt, u.unit_id
                ),
            ));
        }
    }
    Ok(ReserveVerdict::Reclaim(l))
}

/// The attempt a finish names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct AttemptKey {
    /// Its run.
    pub run_id: String,
    /// Its unit.
    pub unit_id: String,
    /// Its number.
    pub attempt: i64,
    /// Its dispatch id.
    pub dispatch_id: String,
}

/// What a still-running attempt's `unit.finished` event carries of it, and the retry policy a
/// failing finish applies to its unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunningAttempt {
    /// The step it was reserved for.
    pub step_id: Option<String>,
    /// `unit` or `gate`.
    pub phase: String,
    /// The policy of its step, else of its run, as stored; read only for a finish that fails
    /// it (`AttemptRef::failing`).
    pub retry_policy: Option<String>,
}

impl FinishSpec {
    /// The attempt this finish names.
    pub(crate) fn key(&self) -> AttemptKey {
        AttemptKey {
            run_id: self.run_id.clone(),
            unit_id: self.unit_id.clone(),
            attempt: self.attempt,
            dispatch_id: self.dispatch_id.clone(),
        }
    }
}

/// A row of a running-attempts statement: `run_id, unit_id, attempt, dispatch_id, step_id,
/// phase, retry_policy`.
pub(crate) fn running_row(r: &dyn Row) -> DbResult<(AttemptKey, RunningAttempt)> {
    Ok((
        AttemptKey {
            run_id: r.get(0)?,
            unit_id: r.get(1)?,
            attempt: r.get(2)?,
            dispatch_id: r.get(3)?,
        },
        RunningAttempt {
            step_id: r.get(4)?,
            phase: r.get(5)?,
            retry_policy: r.get(6)?,
        },
    ))
}

/// Judge a finish against the still-running attempts: the attempt it names, if the finish
/// wins. The attempt leaves `running`, so a second finish of it, in this batch or a later
/// call judged over the same snapshot, loses.
pub(crate) fn finish(
    running: &mut HashMap<AttemptKey, RunningAttempt>,
    f: &FinishSpec,
) -> Option<RunningAttempt> {
    running.remove(&f.key())
}

/// What a winning finish leaves its unit to under the retry policy `policy` (stored text):
/// nothing unless the attempt failed or timed out and a policy applies.
pub(crate) fn after_finish(
    f: &FinishSpec,
    policy: Option<&str>,
    finished_at: i64,
) -> Option<AfterFailure> {
    if !f.fails() {
        return None;
    }
    let policy = RetryPolicy::from_text(policy?)?;
    Some(policy.after_failure(&f.run_id, &f.unit_id, f.attempt, finished_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(step: &str, input: Option<&str>) -> UnitSpec {
        UnitSpec {
            unit_id: "u".into(),
            step_id: step.into(),
            input_hash: input.map(Into::into),
            ..UnitSpec::default()
        }
    }

    fn latest(status: AttemptStatus, input: Option<&str>) -> LatestAttempt {
        LatestAttempt {
            attempt: 3,
            dispatch_id: "d".into(),
            status,
            step_id: Some("s".into()),
            input_hash: input.map(Into::into),
            reclaims: 0,
            lease_generation: None,
            exhausted: false,
            retry_at: None,
        }
    }

    #[test]
    fn a_reservation_starts_the_next_attempt_or_reclaims_the_running_one() {
        let u = unit("s", Some("i"));
        assert_eq!(
            reserve("r", None, &u, 0).unwrap(),
            ReserveVerdict::New { attempt: 1 }
        );
        let done = latest(AttemptStatus::Failed, Some("other"));
        assert_eq!(
            reserve("r", Some(&done), &u, 0).unwrap(),
            ReserveVerdict::New { attempt: 4 }
        );
        let running = latest(AttemptStatus::Running, Some("i"));
        assert_eq!(
            reserve("r", Some(&running), &u, 0).unwrap(),
            ReserveVerdict::Reclaim(&running)
        );
        let unnamed = latest(AttemptStatus::Running, None);
        assert_eq!(
            reserve("r", Some(&unnamed), &u, 0).unwrap(),
            ReserveVerdict::Reclaim(&unnamed)
        );
    }

    #[test]
    fn a_reclaim_never_changes_the_work() {
        let running = latest(AttemptStatus::Running, Some("i"));
        for (u, argument) in [
            (unit("t", Some("i")), "step_id"),
            (unit("s", Some("j")), "input_hash"),
        ] {
            match reserve("r", Some(&running), &u, 0) {
                Err(LedgerError::InvalidArgument { argument: a, .. }) => assert_eq!(a, argument),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_failed_unit_waits_for_its_retry_time_and_an_exhausted_one_takes_no_attempt() {
        let mut u = unit("s", None);
        let waiting = LatestAttempt {
            retry_at: Some(100),
            ..latest(AttemptStatus::Failed, None)
        };
        match reserve("r", Some(&waiting), &u, 99) {
            Err(LedgerError::RetryNotDue { retry_at, .. }) => assert_eq!(retry_at, 100),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            reserve("r", Some(&waiting), &u, 100).unwrap(),
            ReserveVerdict::New { attempt: 4 }
        );
        let exhausted = LatestAttempt {
            exhausted: true,
            ..latest(AttemptStatus::Failed, None)
        };
        u.force = true;
        assert_eq!(
            reserve("r", Some(&waiting), &u, 0).unwrap(),
            ReserveVerdict::New { attempt: 4 }
        );
        match reserve("r", Some(&exhausted), &u, 0) {
            Err(LedgerError::UnitExhausted { attempts, .. }) => assert_eq!(attempts, 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_a_failing_finish_under_a_policy_schedules_a_retry() {
        let policy = RetryPolicy::new(2, 1_000).to_text();
        let finish = |status: &str, attempt: i64| FinishSpec {
            run_id: "r".into(),
            unit_id: "u".into(),
            attempt,
            status: status.into(),
            ..FinishSpec::default()
        };
        let after = |f: &FinishSpec, p: Option<&str>| after_finish(f, p, 5_000);
        assert_eq!(
            after(&finish("failed", 1), Some(&policy)),
            Some(AfterFailure::RetryAt(6_000))
        );
        assert_eq!(
            after(&finish("timed_out", 2), Some(&policy)),
            Some(AfterFailure::Exhausted)
        );
        assert_eq!(after(&finish("completed", 1), Some(&policy)), None);
        assert_eq!(after(&finish("cancelled", 1), Some(&policy)), None);
        assert_eq!(after(&finish("failed", 1), None), None);
    }
}

//! The calls a writer can group: a closed set of operations held as data, so one can run again
//! (a busy group re-runs every call with the same ids) and a group can see which runs its calls
//! lock before it begins.

use crate::attempts::{self, FinishSpec, UnitSpec};
use crate::errors::{LedgerError, Result};
use crate::ids::new_dispatch_id;
use crate::leases::{self, ClaimSpec, Fence};
use crate::model::{Claim, Reservation, Run};
use crate::runs::{self, StepResult};
use crate::status::{RunStatus, StepStatus};
use crate::store::Tx;

/// One call, with everything its transaction needs decided beforehand: arguments checked,
/// dispatch ids and claim tokens drawn, JSON serialized, the clock read.
#[derive(Debug, Clone)]
pub enum Op {
    /// `reserve_attempt(s)`.
    Reserve {
        /// The run.
        run_id: String,
        /// The units, checked.
        units: Vec<UnitSpec>,
        /// One new dispatch id per unit (used unless the unit is reclaimed).
        dispatch_ids: Vec<String>,
        /// The caller's claim.
        fence: Option<Fence>,
        /// The clock.
        now_ms: i64,
    },
    /// `finish_attempt(s)`.
    Finish {
        /// The finishes, checked.
        finishes: Vec<FinishSpec>,
        /// The caller's claim.
        fence: Option<Fence>,
        /// The clock.
        now_ms: i64,
    },
    /// `heartbeat`.
    Heartbeat {
        /// The claim being renewed.
        fence: Fence,
        /// Its plaintext token, handed back in the renewed claim.
        token: String,
        /// The new lease length.
        lease_ms: i64,
        /// The clock.
        now_ms: i64,
    },
    /// `claim`.
    Claim {
        /// The run.
        run_id: String,
        /// The claimant, the lease length and the token (drawn if the caller gave none).
        spec: ClaimSpec,
        /// The clock.
        now_ms: i64,
    },
    /// `set_status`.
    SetStatus {
        /// The run.
        run_id: String,
        /// The status moved to, parsed.
        to: RunStatus,
        /// The caller's claim.
        fence: Fence,
        /// The clock.
        now_ms: i64,
    },
    /// `complete_step`.
    CompleteStep {
        /// The run.
        run_id: String,
        /// The step completed.
        step_id: String,
        /// `result.status`, parsed.
        status: StepStatus,
        /// The result, its evidence serialized.
        result: StepResult,
        /// The caller's claim.
        fence: Option<Fence>,
        /// The clock.
        now_ms: i64,
    },
    /// Writes an event on the run, then fails as a broken store would: what a group does when
    /// one call aborts the transaction.
    #[cfg(test)]
    Poison {
        /// The run written to.
        run_id: String,
    },
}

/// What a call returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A reservation per unit.
    Reservations(Vec<Reservation>),
    /// Whether each finish won its compare-and-set.
    Finished(Vec<bool>),
    /// The renewed claim.
    Claim(Claim),
    /// A new claim, or `None` when the run is held or terminal.
    MaybeClaim(Option<Claim>),
    /// The run after the call (boxed: a run is many times the size of the other outputs, and
    /// every queued call's slot holds the largest).
    Run(Box<Run>),
}

impl Op {
    /// A reservation of `units` on `run_id`, checked, with its dispatch ids drawn.
    pub fn reserve(
        run_id: String,
        units: Vec<UnitSpec>,
        fence: Option<Fence>,
        now_ms: i64,
    ) -> Result<Self> {
        for u in &units {
            u.check()?;
        }
        let dispatch_ids = units.iter().map(|_| new_dispatch_id()).collect();
        Ok(Self::Reserve {
            run_id,
            units,
            dispatch_ids,
            fence,
            now_ms,
        })
    }

    /// Finishes, checked.
    pub fn finish(finishes: Vec<FinishSpec>, fence: Option<Fence>, now_ms: i64) -> Result<Self> {
        for f in &finishes {
            f.check()?;
        }
        Ok(Self::Finish {
            finishes,
            fence,
            now_ms,
        })
    }

    /// A heartbeat, checked.
    pub fn heartbeat(fence: Fence, token: String, lease_ms: i64, now_ms: i64) -> Result<Self> {
        leases::check_lease_ms("lease_ms", lease_ms)?;
        Ok(Self::Heartbeat {
            fence,
            token,
            lease_ms,
            now_ms,
        })
    }

    /// A claim of `run_id` (the spec is checked and its token drawn by [`ClaimSpec::new`]).
    pub fn claim(run_id: String, spec: ClaimSpec, now_ms: i64) -> Self {
        Self::Claim {
            run_id,
            spec,
            now_ms,
        }
    }

    /// A move of `run_id` to `status`, parsed.
    pub fn set_status(run_id: String, status: &str, fence: Fence, now_ms: i64) -> Result<Self> {
        let to = RunStatus::parse_argument("status", status)?;
        Ok(Self::SetStatus {
            run_id,
            to,
            fence,
            now_ms,
        })
    }

    /// The completion of `step_id`, its result's status parsed.
    pub fn complete_step(
        run_id: String,
        step_id: String,
        result: StepResult,
        fence: Option<Fence>,
        now_ms: i64,
    ) -> Result<Self> {
        let status = StepStatus::parse_result(&result.status)?;
        Ok(Self::CompleteStep {
            run_id,
            step_id,
            status,
            result,
            fence,
            now_ms,
        })
    }

    /// The operation's name in error messages, as the call alone names it.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Reserve { .. } => "reserving attempts",
            Self::Finish { .. } => "finishing attempts",
            Self::Heartbeat { .. } => "renewing a claim",
            Self::Claim { .. } => "claiming a run",
            Self::SetStatus { .. } => "changing a run's status",
            Self::CompleteStep { .. } => "completing a step",
            #[cfg(test)]
            Self::Poison { .. } => "poisoning a group",
        }
    }

    /// The runs the call locks, so a group can lock them all first, in one order.
    pub fn runs(&self) -> Vec<&str> {
        match self {
            Self::Reserve { run_id, .. } => vec![run_id],
            Self::Finish { finishes, .. } => finishes.iter().map(|f| f.run_id.as_str()).collect(),
            Self::Heartbeat { fence, .. } => vec![&fence.run_id],
            // Each of these locks its own run only: a claim, a status move or a step's
            // completion never writes to a parent or a child run.
            Self::Claim { run_id, .. }
            | Self::SetStatus { run_id, .. }
            | Self::CompleteStep { run_id, .. } => vec![run_id],
            #[cfg(test)]
            Self::Poison { run_id } => vec![run_id],
        }
    }

    /// Whether a group judges the call with the others of its kinds (`crate::plan`), rather
    /// than under a savepoint of its own.
    pub fn judged(&self) -> bool {
        matches!(
            self,
            Self::Reserve { .. } | Self::Finish { .. } | Self::Heartbeat { .. }
        )
    }

    /// How much of a group the call fills: its units or finishes, at least 1.
    pub fn weight(&self) -> usize {
        match self {
            Self::Reserve { units, .. } => units.len().max(1),
            Self::Finish { finishes, .. } => finishes.len().max(1),
            Self::Heartbeat { .. }
            | Self::Claim { .. }
            | Self::SetStatus { .. }
            | Self::CompleteStep { .. } => 1,
            #[cfg(test)]
            Self::Poison { .. } => 1,
        }
    }

    /// Run the call in `tx`. Takes `&self`: it may run again, with the same ids.
    pub fn apply(&self, tx: &dyn Tx) -> Result<Output> {
        match self {
            Self::Reserve {
                run_id,
                units,
                dispatch_ids,
                fence,
                now_ms,
            } => attempts::reserve_in(tx, run_id, units, dispatch_ids, fence.as_ref(), *now_ms)
                .map(Output::Reservations),
            Self::Finish {
                finishes,
                fence,
                now_ms,
            } => attempts::finish_in(tx, finishes, fence.as_ref(), *now_ms).map(Output::Finished),
            Self::Heartbeat {
                fence,
                token,
                lease_ms,
                now_ms,
            } => leases::heartbeat_in(tx, fence, token, *lease_ms, *now_ms).map(Output::Claim),
            Self::Claim {
                run_id,
                spec,
                now_ms,
            } => leases::claim_run_in(tx, run_id, spec, *now_ms).map(Output::MaybeClaim),
            Self::SetStatus {
                run_id,
                to,
                fence,
                now_ms,
            } => runs::set_status_in(tx, run_id, *to, fence, *now_ms).map(Output::run_of),
            Self::CompleteStep {
                run_id,
                step_id,
                status,
                result,
                fence,
                now_ms,
            } => runs::complete_step_in(
                tx,
                run_id,
                step_id,
                *status,
                result,
                fence.as_ref(),
                *now_ms,
            )
            .map(Output::run_of),
            #[cfg(test)]
            Self::Poison { run_id } => {
                let payload = crate::canonical::Value::Object(vec![]);
                let actor = crate::events::Actor::default();
                crate::events::append(tx, run_id, "test.poison", &payload, &actor, 0)?;
                Err(LedgerError::StoreError {
                    operation: self.label().into(),
                    message: "poisoned".into(),
                })
            }
        }
    }
}

impl Output {
    /// The reservations of a reserve call.
    pub fn reservations(self) -> Result<Vec<Reservation>> {
        match self {
            Self::Reservations(r) => Ok(r),
            other => Err(mismatch(&other)),
        }
    }

    /// The outcomes of a finish call.
    pub fn finished(self) -> Result<Vec<bool>> {
        match self {
            Self::Finished(f) => Ok(f),
            other => Err(mismatch(&other)),
        }
    }

    /// The claim of a heartbeat.
    pub fn claim(self) -> Result<Claim> {
        match self {
            Self::Claim(c) => Ok(c),
            other => Err(mismatch(&other)),
        }
    }

    /// The outcome of a claim: the claim, or `None`.
    pub fn maybe_claim(self) -> Result<Option<Claim>> {
        match self {
            Self::MaybeClaim(c) => Ok(c),
            other => Err(mismatch(&other)),
        }
    }

    fn run_of(run: Run) -> Self {
        Self::Run(Box::new(run))
    }

    /// The run a status move or a step's completion returns.
    pub fn run(self) -> Result<Run> {
        match self {
            Self::Run(r) => Ok(*r),
            other => Err(mismatch(&other)),
        }
    }
}

fn mismatch(output: &Output) -> LedgerError {
    LedgerError::StoreError {
        operation: "answering a grouped call".into(),
        message: format!("the writer answered with another call's kind of result: {output:?}"),
    }
}

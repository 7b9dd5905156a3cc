//! The calls a writer can group: a closed set of operations held as data, so one can run again
//! (a busy group re-runs every call with the same ids) and a group can see which runs its calls
//! lock before it begins.

use crate::attempts::{self, FinishSpec, UnitSpec};
use crate::errors::{LedgerError, Result};
use crate::ids::new_dispatch_id;
use crate::leases::{self, Fence};
use crate::model::{Claim, Reservation};
use crate::store::Tx;

/// One call, with everything its transaction needs decided beforehand: arguments checked,
/// dispatch ids drawn, the clock read.
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

    /// The operation's name in error messages, as the call alone names it.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Reserve { .. } => "reserving attempts",
            Self::Finish { .. } => "finishing attempts",
            Self::Heartbeat { .. } => "renewing a claim",
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
            #[cfg(test)]
            Self::Poison { run_id } => vec![run_id],
        }
    }

    /// How much of a group the call fills: its units or finishes, at least 1.
    pub fn weight(&self) -> usize {
        match self {
            Self::Reserve { units, .. } => units.len().max(1),
            Self::Finish { finishes, .. } => finishes.len().max(1),
            Self::Heartbeat { .. } => 1,
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
}

fn mismatch(output: &Output) -> LedgerError {
    LedgerError::StoreError {
        operation: "answering a grouped call".into(),
        message: format!("the writer answered with another call's kind of result: {output:?}"),
    }
}

//! One group: the calls that queued together, committed in one transaction, each keeping its
//! own outcome.
//!
//! The shape of a group of two or more:
//!
//! ```text
//! BEGIN
//!   lock every run any call locks, sorted      -- one order for every group: no deadlock
//!   SAVEPOINT fp_call; <call 1>; RELEASE fp_call                  -- call 1 succeeded
//!   SAVEPOINT fp_call; <call 2>; ROLLBACK TO fp_call; RELEASE fp_call  -- call 2 refused
//!   ...
//! COMMIT                                       -- only now is any caller answered
//! ```
//!
//! The locks are taken before any savepoint: PostgreSQL drops a lock taken inside a savepoint
//! when it is rolled back. A refusal that belongs to its call (a lost lease, a run that is not
//! active, a bad argument) is undone and goes to that caller only; a failure of the transaction
//! itself (contention, a race, a store error) ends the group. Contention and races run the
//! whole group again with the same calls; any other failure falls back to running each call
//! alone, so a call that breaks the transaction fails by itself and its neighbours commit. A
//! lost connection fails every call: the commit may have landed, so nothing is run again.

use crate::errors::{LedgerError, Result};
use crate::store::{FailureScope, Savepoint, Store, Tx};
use crate::writer::op::{Op, Output};

/// The name of a grouped transaction in messages about the transaction itself.
const GROUP_OPERATION: &str = "committing grouped calls";

/// How a group went, for the writer's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The group failed and its calls ran one by one.
    pub fell_back: bool,
}

/// Run `ops` as one group on `store`: one result per call, in order.
pub fn run_group(store: &mut dyn Store, ops: &[&Op]) -> (Vec<Result<Output>>, Outcome) {
    if let [op] = ops {
        // A group of one is exactly the call alone: no savepoint, no extra lock.
        return (
            vec![store.write(op.label(), |tx| op.apply(tx))],
            Outcome::default(),
        );
    }
    let mut runs: Vec<&str> = ops.iter().flat_map(|op| op.runs()).collect();
    runs.sort_unstable();
    runs.dedup();
    let mut outs: Vec<Result<Output>> = Vec::with_capacity(ops.len());
    let done = store.write_dyn(GROUP_OPERATION, &mut |tx| {
        // Run again after contention: start from nothing.
        outs.clear();
        for run in &runs {
            tx.lock_run(run)?;
        }
        for op in ops {
            outs.push(call(tx, op)?);
        }
        tx.set_operation(GROUP_OPERATION);
        Ok(())
    });
    match done {
        Ok(()) => (outs, Outcome::default()),
        // What a lone call would have met: contention past the budget, or a lost session
        // (the commit may have landed, so nothing runs again).
        Err(e) if matches!(e, LedgerError::StoreBusy { .. }) || store.lost() => {
            (vec![Err(e); ops.len()], Outcome::default())
        }
        Err(_) => {
            let outs = ops
                .iter()
                .map(|op| store.write(op.label(), |tx| op.apply(tx)))
                .collect();
            (outs, Outcome { fell_back: true })
        }
    }
}

/// One call under its savepoint: `Ok(result)` is the call's own outcome (success or refusal);
/// `Err` ends the transaction.
fn call(tx: &dyn Tx, op: &Op) -> Result<Result<Output>> {
    tx.set_operation(op.label());
    tx.savepoint(Savepoint::Begin)?;
    match op.apply(tx) {
        Ok(out) => {
            tx.savepoint(Savepoint::Release)?;
            Ok(Ok(out))
        }
        Err(e) if aborts(tx, &e) => Err(e),
        Err(e) => {
            tx.savepoint(Savepoint::Undo)?;
            Ok(Err(e))
        }
    }
}

/// Whether a call's error ends the transaction rather than the call.
fn aborts(tx: &dyn Tx, err: &LedgerError) -> bool {
    matches!(
        err,
        LedgerError::StoreError { .. } | LedgerError::StoreBusy { .. }
    ) || tx.failure_scope() != FailureScope::Call
}

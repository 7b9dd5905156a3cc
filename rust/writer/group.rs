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
//!
//! On PostgreSQL, where every statement is a round trip, the group first answers its
//! reservations, finishes and heartbeats together (see `merge`): one read for the whole
//! group, each call judged in memory, one statement per kind. Only the calls it declines take
//! the savepoint path, after it.
//!
//! The calls of a group were concurrent (none had returned), so any order of them is one its
//! callers could have seen; the group's rows and events are those of the calls run one by one
//! in the order it applied them ([`Outcome::order`]):
//!
//! - on the savepoint path alone (SQLite), arrival order;
//! - on PostgreSQL, first the calls the merge answered, by kind — heartbeats, then finishes,
//!   then reservations — and by arrival within a kind; then the declined calls, by arrival;
//! - when the group falls back, arrival order.

use crate::errors::{LedgerError, Result};
use crate::store::{FailureScope, Savepoint, Store, Tx};
use crate::writer::op::{Op, Output};

/// The name of a grouped transaction in messages about the transaction itself.
const GROUP_OPERATION: &str = "committing grouped calls";

/// How a group went, for the writer's counters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The group failed and its calls ran one by one.
    pub fell_back: bool,
    /// The order in which the calls were applied (indices into the group): running them one
    /// by one in this order leaves the same rows and events.
    pub order: Vec<usize>,
}

/// Run `ops` as one group on `store`: one result per call, in order.
/// [`Outcome::order`] says in which order they were applied.
pub fn run_group(store: &mut dyn Store, ops: &[&Op]) -> (Vec<Result<Output>>, Outcome) {
    let arrival = Outcome {
        fell_back: false,
        order: (0..ops.len()).collect(),
    };
    if let [op] = ops {
        // A group of one is exactly the call alone: no savepoint, no extra lock.
        return (vec![store.write(op.label(), |tx| op.apply(tx))], arrival);
    }
    let mut runs: Vec<&str> = ops.iter().flat_map(|op| op.runs()).collect();
    runs.sort_unstable();
    runs.dedup();
    let mut outs: Vec<Result<Output>> = Vec::with_capacity(ops.len());
    let mut order: Vec<usize> = Vec::with_capacity(ops.len());
    let done = store.write_dyn(GROUP_OPERATION, &mut |tx| {
        // Run again after contention: start from nothing.
        outs.clear();
        order.clear();
        for run in &runs {
            tx.lock_run(run)?;
        }
        let mut answered: Vec<Option<Result<Output>>> = match tx.batch_statements() {
            Some(batch) => {
                tx.set_operation(GROUP_OPERATION);
                let merged = super::merge::apply(tx, batch, ops)?;
                order.extend(merged.order);
                merged.outs
            }
            None => ops.iter().map(|_| None).collect(),
        };
        for (i, op) in ops.iter().enumerate() {
            if answered[i].is_none() {
                answered[i] = Some(call(tx, op)?);
                order.push(i);
            }
        }
        outs.extend(answered.into_iter().flatten());
        tx.set_operation(GROUP_OPERATION);
        Ok(())
    });
    match done {
        Ok(()) => (
            outs,
            Outcome {
                fell_back: false,
                order,
            },
        ),
        // What a lone call would have met: contention past the budget, or a lost session
        // (the commit may have landed, so nothing runs again).
        Err(e) if matches!(e, LedgerError::StoreBusy { .. }) || store.lost() => {
            (vec![Err(e); ops.len()], arrival)
        }
        Err(_) => {
            let outs = ops
                .iter()
                .map(|op| store.write(op.label(), |tx| op.apply(tx)))
                .collect();
            (
                outs,
                Outcome {
                    fell_back: true,
                    ..arrival
                },
            )
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

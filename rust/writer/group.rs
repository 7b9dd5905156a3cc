//! One group: the calls that queued together, committed in one transaction, each keeping its
//! own outcome.
//!
//! The shape of a group of two or more:
//!
//! ```text
//! BEGIN
//!   lock every run any call locks, sorted      -- one order for every group: no deadlock
//!                                                 (unless every call is judged: see below)
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
//! Before any savepoint, the group answers its reservations, finishes and heartbeats together
//! (see `crate::plan`): one read for the whole group, each call judged in memory, one write of
//! all their rows. A refused call among them leaves nothing behind and needs no savepoint. A
//! group of these calls only is that one judgment, and locks its runs as a lone call does.
//! Only the other kinds of call (claims, status moves, step completions) take the savepoint
//! path, after it.
//!
//! The calls of a group were concurrent (none had returned), so any order of them is one its
//! callers could have seen; the group's rows and events are those of the calls run one by one
//! in the order it applied them ([`Outcome::order`]): first the judged calls, by kind —
//! heartbeats, then finishes, then reservations — and by arrival within a kind; then the
//! others, by arrival. When the group falls back, arrival order.

use crate::errors::{LedgerError, Result};
use crate::plan::{Judgment, Keys};
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
    // A group of reservations, finishes and heartbeats only is one judgment, which locks its
    // runs itself (on PostgreSQL's first try, with its writes). Any other call needs its
    // run's lock before its savepoint, so then every run is locked first, in one order.
    let mut runs: Vec<&str> = if ops.iter().all(|op| op.judged()) {
        Vec::new()
    } else {
        ops.iter().flat_map(|op| op.runs()).collect()
    };
    runs.sort_unstable();
    runs.dedup();
    let mut outs: Vec<Result<Output>> = Vec::with_capacity(ops.len());
    let mut order: Vec<usize> = Vec::with_capacity(ops.len());
    let done = store.write_dyn(GROUP_OPERATION, &mut |tx| {
        // Run again after contention: start from nothing.
        outs.clear();
        order.clear();
        crate::observe::forget_held();
        for run in &runs {
            tx.lock_run(run)?;
        }
        tx.set_operation(GROUP_OPERATION);
        let mut answered = judge(tx, ops, &mut order)?;
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
    crate::observe::settle_held(done.is_ok());
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

/// Judge the group's reservations, finishes and heartbeats together (see `crate::plan`): one
/// read for all of them, each call judged in turn, one write of every accepted call's rows.
/// The kinds go in a fixed order — heartbeats, then finishes, then reservations — and by
/// arrival within a kind; `order` gets the calls in that order. Every other kind of call is
/// left unanswered, for the savepoint path.
// The wildcard arms leave every other kind of call, including kinds added later.
#[allow(clippy::match_wildcard_for_single_variants)]
fn judge(tx: &dyn Tx, ops: &[&Op], order: &mut Vec<usize>) -> Result<Vec<Option<Result<Output>>>> {
    let mut answered: Vec<Option<Result<Output>>> = ops.iter().map(|_| None).collect();
    let rank = |op: &Op| match op {
        Op::Heartbeat { .. } => Some(0_u8),
        Op::Finish { .. } => Some(1),
        Op::Reserve { .. } => Some(2),
        _ => None,
    };
    debug_assert!(ops.iter().all(|op| rank(op).is_some() == op.judged()));
    let mut plan: Vec<(u8, usize)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| rank(op).map(|r| (r, i)))
        .collect();
    if plan.is_empty() {
        return Ok(answered);
    }
    plan.sort_unstable();
    let mut keys = Keys::default();
    for &(_, i) in &plan {
        match ops[i] {
            Op::Heartbeat { fence, .. } => keys.heartbeat(fence),
            Op::Finish {
                finishes, fence, ..
            } => keys.finish(finishes, fence.is_some()),
            Op::Reserve { run_id, units, .. } => keys.reserve(run_id, units),
            _ => {}
        }
    }
    let mut judgment = Judgment::read(tx, keys)?;
    for &(_, i) in &plan {
        let answer = match ops[i] {
            Op::Heartbeat {
                fence,
                token,
                lease_ms,
                now_ms,
            } => judgment
                .heartbeat(fence, token, *lease_ms, *now_ms)
                .map(Output::Claim),
            Op::Finish {
                finishes,
                fence,
                now_ms,
            } => judgment
                .finish(finishes, fence.as_ref(), *now_ms)
                .map(Output::Finished),
            Op::Reserve {
                run_id,
                units,
                dispatch_ids,
                fence,
                now_ms,
            } => judgment
                .reserve(run_id, units, dispatch_ids, fence.as_ref(), *now_ms)
                .map(Output::Reservations),
            _ => continue,
        };
        answered[i] = Some(answer);
        order.push(i);
    }
    judgment.write(tx)?;
    Ok(answered)
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

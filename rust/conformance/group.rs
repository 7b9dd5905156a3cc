//! Grouped calls against the same calls one by one: a group of mixed calls (stale fences, a
//! duplicate finish, a reserve on a run that is not active, a reclaim that changes the step)
//! gives every call the result or error it gets alone, in the order the group applied them,
//! and leaves the same rows and events;
//! a call that breaks the transaction fails alone and its neighbours commit.

use super::{finish, started, unit, LEASE_MS, T0};
use crate::attempts::{self, UnitSpec};
use crate::errors::{LedgerError, Result};
use crate::leases::{self, ClaimSpec, Fence};
use crate::model::{Claim, Event};
use crate::runs;
use crate::store::Store;
use crate::writer::{run_group, Op, Outcome, Output};
use crate::{events, store};

/// A second empty ledger on the same backend as `store`, and what keeps it alive.
fn twin(store: &mut dyn Store) -> (Box<dyn Store>, Box<dyn std::any::Any>) {
    let backend = store.pragmas().expect("pragmas").journal_mode;
    if backend == "postgresql" {
        #[cfg(feature = "postgres")]
        {
            let (twin, dropper) = store::testing::postgres_fresh();
            return (twin, Box::new(dropper));
        }
    }
    (store::testing::sqlite_memory(), Box::new(()))
}

/// A claim with a fixed token, so both ledgers hold the same fences.
fn claim(store: &mut dyn Store, run_id: &str, token: &str, now: i64) -> Claim {
    let spec = ClaimSpec::new("host-a".into(), LEASE_MS, Some(token.into()), "token").unwrap();
    leases::claim(store, run_id, &spec, now)
        .expect("claim")
        .expect("claimed")
}

fn fence_of(c: &Claim) -> Fence {
    Fence::from_token(&c.run_id, c.generation, &c.token)
}

/// Runs `r1` (claimed twice: a stale and a live fence), `r2` (unfenced, two units reserved)
/// and `r3` (blocked); the same on every ledger given the same `setup` calls.
fn prepare(store: &mut dyn Store, setup: &[Op]) -> (Fence, Fence) {
    for run in ["r1", "r2", "r3"] {
        started(store, run);
    }
    runs::block_run(store, "r3", None, T0).expect("block");
    let stale = claim(store, "r1", &"a".repeat(40), T0);
    let live = claim(store, "r1", &"b".repeat(40), T0 + 1);
    for op in setup {
        run_group(store, &[op]).0.remove(0).expect("setup call");
    }
    (fence_of(&stale), fence_of(&live))
}

/// Everything the calls can have written: per run, its events (without the global cursor,
/// which a rolled-back insert may have advanced on PostgreSQL), units, attempts and lease.
fn rows(store: &mut dyn Store) -> Vec<String> {
    let mut out = Vec::new();
    for run in ["r1", "r2", "r3"] {
        let evs: Vec<Event> = events::read(store, Some(run), 0, 1000, None).expect("events");
        for e in evs {
            out.push(format!(
                "{} {} {} {:?} {:?} {:?} {} {}",
                e.resource_id,
                e.revision,
                e.event_type,
                e.actor_type,
                e.actor_id,
                e.generation,
                String::from_utf8_lossy(&e.payload),
                e.ts
            ));
        }
        for u in attempts::units(store, run, None).expect("units") {
            for a in attempts::attempts(store, run, &u.unit_id).expect("attempts") {
                out.push(format!("{a:?}"));
            }
            out.push(format!("{u:?}"));
        }
        out.push(format!("{:?}", leases::lease(store, run).expect("lease")));
    }
    out
}

fn on_step(unit_id: &str, step: &str) -> UnitSpec {
    UnitSpec {
        step_id: step.into(),
        ..unit(unit_id)
    }
}

fn reserve(run: &str, units: Vec<UnitSpec>, fence: Option<&Fence>, now: i64) -> Op {
    Op::reserve(run.into(), units, fence.cloned(), now).expect("reserve op")
}

fn finishing(run: &str, u: &str, attempt: i64, dispatch: &str, fence: Option<&Fence>) -> Op {
    let f = finish(run, u, attempt, dispatch);
    Op::finish(vec![f], fence.cloned(), T0 + 10).expect("finish op")
}

fn heartbeat(fence: &Fence, token: &str) -> Op {
    Op::heartbeat(fence.clone(), token.into(), LEASE_MS, T0 + 10).expect("heartbeat op")
}

/// The dispatch id a setup reservation drew.
fn dispatch(op: &Op, index: usize) -> String {
    match op {
        Op::Reserve { dispatch_ids, .. } => dispatch_ids[index].clone(),
        _ => unreachable!("a reservation"),
    }
}

/// Apply `group` as one group on `store` and one by one on a twin; both give the same.
fn compare(
    store: &mut dyn Store,
    twin: &mut dyn Store,
    group: &[Op],
) -> (Vec<Result<Output>>, Outcome) {
    let ops: Vec<&Op> = group.iter().collect();
    let (grouped, outcome) = run_group(store, &ops);
    let mut order = outcome.order.clone();
    order.sort_unstable();
    assert_eq!(
        order,
        (0..ops.len()).collect::<Vec<_>>(),
        "every call applied once"
    );
    let mut alone: Vec<Option<Result<Output>>> = ops.iter().map(|_| None).collect();
    for &i in &outcome.order {
        alone[i] = Some(run_group(twin, &[ops[i]]).0.remove(0));
    }
    for (i, (g, a)) in grouped.iter().zip(&alone).enumerate() {
        assert_eq!(Some(g), a.as_ref(), "call {i} ({:?})", group[i]);
    }
    assert_eq!(rows(store), rows(twin));
    (grouped, outcome)
}

pub(super) fn group_matches_one_by_one(store: &mut dyn Store) {
    let (mut other, _keep) = twin(store);
    let live_probe = reserve("r1", vec![unit("u1")], None, T0 + 2);
    let setup = [
        reserve("r2", vec![unit("u1"), unit("u2")], None, T0 + 2),
        live_probe,
    ];
    let (stale, live) = prepare(store, &setup);
    prepare(other.as_mut(), &setup);
    let (d1, d2, d_r1) = (
        dispatch(&setup[0], 0),
        dispatch(&setup[0], 1),
        dispatch(&setup[1], 0),
    );
    let b = "b".repeat(40);
    let group = [
        heartbeat(&stale, &"a".repeat(40)),
        heartbeat(&live, &b),
        finishing("r2", "u1", 1, &d1, None),
        finishing("r2", "u1", 1, &d1, None),
        finishing("r1", "u1", 1, &d_r1, Some(&stale)),
        reserve("r3", vec![unit("u1")], None, T0 + 10),
        reserve("r2", vec![unit("u3"), unit("u4")], None, T0 + 10),
        reserve("r2", vec![unit("u1")], None, T0 + 10),
        finishing("r2", "u2", 1, "wrong", None),
        reserve("r2", vec![on_step("u2", "b")], None, T0 + 10),
        finishing("r1", "u1", 1, &d_r1, Some(&live)),
        reserve("r1", vec![unit("u5")], Some(&live), T0 + 10),
        reserve("r2", vec![unit("u2")], None, T0 + 10),
        finishing("r2", "u2", 1, &d2, Some(&live)),
        finishing("r2", "u2", 1, &d2, None),
    ];
    let (out, outcome) = compare(store, other.as_mut(), &group);
    assert!(!outcome.fell_back, "every refusal stays with its call");
    assert!(matches!(out[0], Err(LedgerError::LeaseLost { .. })));
    assert!(matches!(out[1], Ok(Output::Claim(_))));
    assert_eq!(out[2], Ok(Output::Finished(vec![true])));
    assert_eq!(out[3], Ok(Output::Finished(vec![false])));
    assert!(matches!(out[4], Err(LedgerError::LeaseLost { .. })));
    assert!(matches!(out[5], Err(LedgerError::RunNotActive { .. })));
    // The step-changing reservation of u2 is a refused reclaim while u2 runs, and a new
    // attempt once call 14 finished it: which one depends on the order the group chose.
    let at = |i: usize| outcome.order.iter().position(|&j| j == i);
    // Then call 12 (step a) reclaims attempt 1, or is a reclaim refused by attempt 2's step.
    if at(9) < at(14) {
        assert!(matches!(out[9], Err(LedgerError::InvalidArgument { .. })));
        assert!(out[12].is_ok(), "{:?}", out[12]);
    } else {
        assert!(out[9].is_ok(), "{:?}", out[9]);
        assert!(matches!(out[12], Err(LedgerError::InvalidArgument { .. })));
    }
    assert_eq!(out[10], Ok(Output::Finished(vec![true])));
    assert!(out[11].is_ok());
    assert!(matches!(out[13], Err(LedgerError::InvalidArgument { .. })));
    assert_eq!(out[14], Ok(Output::Finished(vec![true])));
}

pub(super) fn a_failing_call_keeps_its_neighbours(store: &mut dyn Store) {
    let (mut other, _keep) = twin(store);
    prepare(store, &[]);
    prepare(other.as_mut(), &[]);
    let group = [
        reserve("r2", vec![unit("u1")], None, T0 + 10),
        Op::Poison {
            run_id: "r2".into(),
        },
        reserve("r2", vec![unit("u2"), unit("u3")], None, T0 + 10),
    ];
    let (out, outcome) = compare(store, other.as_mut(), &group);
    assert!(outcome.fell_back, "a store error ends the group");
    assert!(out[0].is_ok() && out[2].is_ok());
    assert!(matches!(out[1], Err(LedgerError::StoreError { .. })));
    let units = attempts::units(store, "r2", None).expect("units");
    assert_eq!(units.len(), 3, "the neighbours' writes are kept");
    let types: Vec<String> = events::read(store, Some("r2"), 0, 1000, None)
        .expect("events")
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert!(!types.iter().any(|t| t == "test.poison"), "{types:?}");
}

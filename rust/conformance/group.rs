//! Grouped calls against the same calls one by one: a group of mixed calls (stale fences, a
//! duplicate finish, a reserve on a run that is not active, a reclaim that changes the step)
//! gives every call the result or error it gets alone, and leaves the same rows and events;
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
    let alone: Vec<Result<Output>> = ops
        .iter()
        .map(|op| run_group(twin, &[op]).0.remove(0))
        .collect();
    for (i, (g, a)) in grouped.iter().zip(&alone).enumerate() {
        assert_eq!(g, a, "call {i} ({:?})", group[i]);
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
    assert!(matches!(out[9], Err(LedgerError::InvalidArgument { .. })));
    assert_eq!(out[10], Ok(Output::Finished(vec![true])));
    assert!(out[11].is_ok() && out[12].is_ok());
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

// ------------------------------------------------------------------ claims, status moves and
// step completions in a group

/// Claims, status moves and step completions grouped with reserves, finishes and heartbeats:
/// each on both backends, as conformance cases of their own.
mod run_calls {
    use super::super::{queued, LEASE_MS, T0};
    use super::{compare, dispatch, finishing, heartbeat, prepare, reserve, rows, twin};
    use super::{unit, Op, Output, Store};
    use crate::errors::LedgerError;
    use crate::leases::{self, ClaimSpec, Fence};
    use crate::queue;
    use crate::runs::{self, NewRun, StepResult, StepSpec};
    use crate::status::RunStatus;
    use crate::{events, writer::run_group};

    conformance!(
        grouped_run_calls_match_one_by_one,
        a_failing_call_keeps_its_run_call_neighbours,
        run_call_arguments_are_refused_before_the_queue,
        a_move_into_an_occupied_scope_fails_alone,
    );

    /// `r1`..`r3` as [`prepare`] makes them, and `r4`, queued and never claimed.
    fn prepare_runs(store: &mut dyn Store) -> (Fence, Fence) {
        let fences = prepare(store, &[]);
        queue::reserve_run(store, &queued("r4"), T0).expect("reserve_run");
        fences
    }

    /// [`rows`], plus what these calls also write: each run's row, its steps, and `r4`'s
    /// lease and events.
    fn run_rows(store: &mut dyn Store) -> Vec<String> {
        let mut out = rows(store);
        for run in ["r1", "r2", "r3", "r4"] {
            out.push(format!("{:?}", runs::get_run(store, run).expect("run")));
            out.push(format!("{:?}", runs::steps(store, run).expect("steps")));
        }
        out.push(format!("{:?}", leases::lease(store, "r4").expect("lease")));
        for e in events::read(store, Some("r4"), 0, 1000, None).expect("events") {
            let payload = String::from_utf8_lossy(&e.payload).into_owned();
            out.push(format!("{} {} {payload}", e.revision, e.event_type));
        }
        out
    }

    /// A claim with a fixed token, and the fence that claim will hold at `generation`.
    fn claiming(run: &str, runner: &str, token: &str, generation: i64, now: i64) -> (Op, Fence) {
        let spec = ClaimSpec::new(runner.into(), LEASE_MS, Some(token.into()), "token").unwrap();
        let fence = Fence::from_token(run, generation, token);
        (Op::claim(run.into(), spec, now), fence)
    }

    fn moving(run: &str, to: &str, fence: &Fence, now: i64) -> Op {
        Op::set_status(run.into(), to, fence.clone(), now).expect("set_status op")
    }

    fn completing(run: &str, step: &str, status: &str, fence: Option<&Fence>, now: i64) -> Op {
        let result = StepResult {
            status: status.into(),
            notes: Some("n".into()),
            evidence: Some(r#"{"ok":true}"#.into()),
            summary: None,
        };
        Op::complete_step(run.into(), step.into(), result, fence.cloned(), now)
            .expect("complete_step op")
    }

    fn grouped_run_calls_match_one_by_one(store: &mut dyn Store) {
        let (mut other, _keep) = twin(store);
        let (stale, live) = prepare_runs(store);
        prepare_runs(other.as_mut());
        let now = T0 + 10;
        let (claim_r2, f2) = claiming("r2", "host-b", &"c".repeat(40), 1, now);
        let (claim_r3, f3) = claiming("r3", "host-c", &"d".repeat(40), 1, now);
        let (claim_r4, f4) = claiming("r4", "host-d", &"e".repeat(40), 1, now);
        let (held_r1, _) = claiming("r1", "host-c", &"f".repeat(40), 3, now);
        let (done_r1, _) = claiming("r1", "host-a", &"g".repeat(40), 3, now);
        let reserve_r3 = reserve("r3", vec![unit("u1")], Some(&f3), now);
        let d3 = dispatch(&reserve_r3, 0);
        let group = [
            heartbeat(&live, &"b".repeat(40)),
            claim_r2,
            reserve("r2", vec![unit("u1")], Some(&f2), now),
            moving("r2", "blocked", &f2, now),
            completing("r2", "a", "completed", Some(&f2), now),
            reserve("r2", vec![unit("u2")], None, now),
            moving("r1", "queued", &live, now),
            moving("r1", "blocked", &stale, now),
            completing("r1", "a", "completed", Some(&stale), now),
            completing("r1", "a", "completed", Some(&live), now),
            completing("r1", "a", "completed", Some(&live), now),
            held_r1,
            claim_r3,
            moving("r3", "active", &f3, now),
            reserve_r3,
            finishing("r3", "u1", 1, &d3, Some(&f3)),
            claim_r4,
            moving("r4", "active", &f4, now),
            completing("r1", "b", "completed", None, now),
            done_r1,
            moving("r1", "blocked", &live, now),
        ];
        let (out, outcome) = compare(store, other.as_mut(), &group);
        assert_eq!(run_rows(store), run_rows(other.as_mut()));
        assert!(!outcome.fell_back, "every refusal stays with its call");
        let status = |i: usize| match &out[i] {
            Ok(Output::Run(run)) => run.status,
            other => panic!("call {i}: {other:?}"),
        };
        let claimed = |i: usize| match &out[i] {
            Ok(Output::MaybeClaim(c)) => c.as_ref().map(|c| c.generation),
            other => panic!("call {i}: {other:?}"),
        };
        assert!(matches!(out[0], Ok(Output::Claim(_))));
        assert_eq!(claimed(1), Some(1), "a claim of a never-claimed run");
        assert!(
            out[2].is_ok(),
            "a reserve under a claim taken earlier in the group"
        );
        assert_eq!(status(3), RunStatus::Blocked);
        assert!(matches!(out[4], Err(LedgerError::RunNotActive { .. })));
        assert!(matches!(out[5], Err(LedgerError::RunNotActive { .. })));
        assert!(
            matches!(&out[6], Err(LedgerError::InvalidArgument { argument, .. }) if argument == "status"),
            "an invalid move: {:?}",
            out[6]
        );
        assert!(matches!(out[7], Err(LedgerError::LeaseLost { .. })));
        assert!(matches!(out[8], Err(LedgerError::LeaseLost { .. })));
        assert_eq!(status(9), RunStatus::Active);
        assert!(
            matches!(&out[10], Err(LedgerError::InvalidArgument { argument, .. }) if argument == "step_id"),
            "a step already completed: {:?}",
            out[10]
        );
        assert_eq!(claimed(11), None, "another owner's live lease");
        assert_eq!(claimed(12), Some(1));
        assert_eq!(status(13), RunStatus::Active);
        assert!(out[14].is_ok());
        assert_eq!(out[15], Ok(Output::Finished(vec![true])));
        assert_eq!(claimed(16), Some(1));
        assert_eq!(status(17), RunStatus::Active);
        assert_eq!(status(18), RunStatus::Completed);
        assert_eq!(claimed(19), None, "a terminal run");
        assert!(out[20].is_err(), "a completed run moves nowhere");
        let r4 = runs::get_run(store, "r4").unwrap().unwrap();
        assert_eq!(
            r4.status,
            RunStatus::Active,
            "claimed (starting), then moved"
        );
    }

    /// A call that breaks the transaction among claims, moves and completions: the group falls
    /// back, the culprit fails alone and every other call gets what it gets alone.
    fn a_failing_call_keeps_its_run_call_neighbours(store: &mut dyn Store) {
        let (mut other, _keep) = twin(store);
        let (_, live) = prepare_runs(store);
        prepare_runs(other.as_mut());
        let now = T0 + 10;
        let (claim_r4, f4) = claiming("r4", "host-d", &"e".repeat(40), 1, now);
        let group = [
            claim_r4,
            completing("r1", "a", "blocked", Some(&live), now),
            Op::Poison {
                run_id: "r1".into(),
            },
            moving("r4", "active", &f4, now),
            moving("r4", "queued", &f4, now),
        ];
        let (out, outcome) = compare(store, other.as_mut(), &group);
        assert_eq!(run_rows(store), run_rows(other.as_mut()));
        assert!(outcome.fell_back, "a store error ends the group");
        assert!(matches!(out[2], Err(LedgerError::StoreError { .. })));
        assert!(matches!(out[0], Ok(Output::MaybeClaim(Some(_)))));
        assert!(matches!(&out[1], Ok(Output::Run(r)) if r.status == RunStatus::Blocked));
        assert!(matches!(&out[3], Ok(Output::Run(r)) if r.status == RunStatus::Active));
        assert!(matches!(out[4], Err(LedgerError::InvalidArgument { .. })));
    }

    /// A bad status or step result never makes a call: the caller gets `InvalidArgument`
    /// naming the argument before anything is queued, and a lone call gives the same error.
    fn run_call_arguments_are_refused_before_the_queue(store: &mut dyn Store) {
        let (_, live) = prepare_runs(store);
        let bad_move = Op::set_status("r1".into(), "running", live.clone(), T0);
        assert!(
            matches!(&bad_move, Err(LedgerError::InvalidArgument { argument, .. }) if argument == "status"),
            "{bad_move:?}"
        );
        let alone = runs::set_status(store, "r1", "running", &live, T0);
        assert_eq!(bad_move.map(|_| ()), alone.map(|_| ()));
        let result = StepResult {
            status: "done".into(),
            ..StepResult::default()
        };
        let bad_step = Op::complete_step("r1".into(), "a".into(), result.clone(), None, T0);
        assert!(
            matches!(&bad_step, Err(LedgerError::InvalidArgument { argument, .. }) if argument == "status"),
            "{bad_step:?}"
        );
        let alone = runs::complete_step(store, "r1", "a", &result, None, T0);
        assert_eq!(bad_step.map(|_| ()), alone.map(|_| ()));
        let bad_claim = ClaimSpec::new("host-a".into(), 0, None, "token");
        assert!(matches!(
            bad_claim,
            Err(LedgerError::InvalidArgument { ref argument, .. }) if argument == "lease_ms"
        ));
        // The token is drawn when the call is made, not when it runs: a group run again after
        // contention claims with the same token, which the caller's claim then holds.
        let spec = ClaimSpec::new("host-d".into(), LEASE_MS, None, "token").expect("spec");
        let op = Op::claim("r4".into(), spec, T0 + 10);
        let Op::Claim { spec, .. } = &op else {
            unreachable!("a claim")
        };
        let token = spec.token.clone();
        let claimed = run_group(store, &[&op]).0.remove(0).expect("claim");
        let Output::MaybeClaim(Some(claim)) = claimed else {
            panic!("{claimed:?}")
        };
        assert_eq!(claim.token, token);
    }

    /// A guarded run, blocked, whose scope another run took meanwhile: moving it back to
    /// `active` fails at the scope guard's unique index. That statement's failure belongs to
    /// its call: `ActiveRunExists` naming the occupant, as alone, and the neighbours commit.
    fn a_move_into_an_occupied_scope_fails_alone(store: &mut dyn Store) {
        let (mut other, _keep) = twin(store);
        let guarded = |run_id: &str| NewRun {
            workflow_ref: "wf/guarded".into(),
            scope_key: Some("scope".into()),
            steps: vec![StepSpec {
                id: "a".into(),
                title: String::new(),
                instructions: String::new(),
                completion: None,
            }],
            run_id: Some(run_id.into()),
            ..NewRun::default()
        };
        let mut fences = Vec::new();
        for s in [&mut *store, other.as_mut()] {
            fences.push(prepare_runs(s));
            runs::start_run(s, &guarded("g1"), T0).expect("g1");
            runs::block_run(s, "g1", None, T0).expect("block g1");
            runs::start_run(s, &guarded("g2"), T0).expect("g2 takes the scope");
        }
        let live = fences[0].1.clone();
        let now = T0 + 10;
        let (claim_g1, fg1) = claiming("g1", "host-a", &"h".repeat(40), 1, now);
        let (take_r4, _) = claiming("r4", "host-d", &"e".repeat(40), 1, now);
        let group = [
            claim_g1,
            completing("r1", "a", "completed", Some(&live), now),
            moving("g1", "active", &fg1, now),
            take_r4,
            moving("r1", "blocked", &live, now),
        ];
        let (out, outcome) = compare(store, other.as_mut(), &group);
        assert!(
            !outcome.fell_back,
            "the guard's refusal stays with its call"
        );
        assert_eq!(run_rows(store), run_rows(other.as_mut()));
        assert!(
            matches!(&out[2], Err(LedgerError::ActiveRunExists { occupant_run_id, .. }) if occupant_run_id == "g2"),
            "{:?}",
            out[2]
        );
        assert!(out[0].is_ok() && out[1].is_ok() && out[3].is_ok() && out[4].is_ok());
        let g1 = runs::get_run(store, "g1").unwrap().unwrap();
        assert_eq!(g1.status, RunStatus::Blocked);
    }
}

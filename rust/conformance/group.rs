//! Grouped calls against the same calls one by one: a group of mixed calls (stale fences, a
//! duplicate finish, a reserve on a run that is not active, a reclaim that changes the step)
//! gives every call the result or error it gets alone, in the order the group applied them,
//! and leaves the same rows and events;
//! a call that breaks the transaction fails alone and its neighbours commit.

use super::{finish, started, unit, LEASE_MS, T0};
use crate::attempts::{self, UnitSpec};
use crate::errors::{LedgerError, Result};
use crate::leases::{self, ClaimSpec, Fence};
use crate::model::{Claim, Event, Reservation};
use crate::runs;
use crate::store::Store;
use crate::writer::{run_group, Op, Outcome, Output};
use crate::{events, store};

/// A second empty ledger on the same backend as `store`, and what keeps it alive.
pub(super) fn twin(store: &mut dyn Store) -> (Box<dyn Store>, Box<dyn std::any::Any>) {
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

/// Everything the calls can have written on `runs`: per run, its events (without the global cursor,
/// which a rolled-back insert may have advanced on PostgreSQL), units, attempts and lease.
pub(super) fn rows_of(store: &mut dyn Store, runs: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for &run in runs {
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
        for u in attempts::units(store, &attempts::UnitFilter::of(run)).expect("units") {
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
    compare_on(store, twin, group, &["r1", "r2", "r3"])
}

/// [`compare`], with the rows and events of `runs`.
fn compare_on(
    store: &mut dyn Store,
    twin: &mut dyn Store,
    group: &[Op],
    runs: &[&str],
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
    assert_eq!(rows_of(store, runs), rows_of(twin, runs));
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
    let units = attempts::units(store, &attempts::UnitFilter::of("r2")).expect("units");
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
    use super::{compare, dispatch, finishing, heartbeat, prepare, reserve, rows_of, twin};
    use super::{unit, Op, Output, Store};
    use crate::errors::LedgerError;
    use crate::leases::{ClaimSpec, Fence};
    use crate::queue;
    use crate::runs::{self, NewRun, StepResult, StepSpec};
    use crate::status::RunStatus;
    use crate::writer::{run_group, Outcome};

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

    /// [`rows_of`] the four runs, plus what these calls also write: each run's row and its
    /// steps.
    fn run_rows(store: &mut dyn Store) -> Vec<String> {
        let mut out = rows_of(store, &["r1", "r2", "r3", "r4"]);
        for run in ["r1", "r2", "r3", "r4"] {
            out.push(format!("{:?}", runs::get_run(store, run).expect("run")));
            out.push(format!("{:?}", runs::steps(store, run).expect("steps")));
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
        check_outcomes(&out, &outcome);
        let r4 = runs::get_run(store, "r4").unwrap().unwrap();
        assert_eq!(
            r4.status,
            RunStatus::Active,
            "claimed (starting), then moved"
        );
    }

    /// The outcomes of `grouped_run_calls_match_one_by_one`'s group, call by call.
    fn check_outcomes(out: &[crate::errors::Result<Output>], outcome: &Outcome) {
        let status = |i: usize| match &out[i] {
            Ok(Output::Run(run)) => run.status,
            other => panic!("call {i}: {other:?}"),
        };
        let claimed = |i: usize| match &out[i] {
            Ok(Output::MaybeClaim(c)) => c.as_ref().map(|c| c.generation),
            other => panic!("call {i}: {other:?}"),
        };
        // A group may apply its calls in another order than they arrived (on PostgreSQL the
        // reserves, finishes and heartbeats go first); `compare` already checked every outcome
        // against the calls alone in the applied order. The outcomes below that depend on the
        // order are checked for the order the group reports.
        let at = |i: usize| outcome.order.iter().position(|&j| j == i);
        let before = |a: usize, b: usize| at(a) < at(b);
        assert!(matches!(out[0], Ok(Output::Claim(_))));
        assert_eq!(claimed(1), Some(1), "a claim of a never-claimed run");
        if before(1, 2) {
            assert!(
                out[2].is_ok(),
                "a reserve under a claim taken earlier: {:?}",
                out[2]
            );
        } else {
            assert!(
                out[2].is_err(),
                "a reserve under a claim not yet taken: {:?}",
                out[2]
            );
        }
        assert_eq!(status(3), RunStatus::Blocked);
        assert!(matches!(out[4], Err(LedgerError::RunNotActive { .. })));
        if before(3, 5) {
            assert!(matches!(out[5], Err(LedgerError::RunNotActive { .. })));
        }
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
        if before(12, 14) && before(13, 14) {
            assert!(out[14].is_ok(), "{:?}", out[14]);
        } else {
            assert!(
                out[14].is_err(),
                "r3 is not claimed and active yet: {:?}",
                out[14]
            );
        }
        let finished = Ok(Output::Finished(vec![true]));
        if out[14].is_ok() && before(14, 15) {
            assert_eq!(out[15], finished);
        } else {
            assert_ne!(out[15], finished, "a finish of an attempt not yet reserved");
        }
        assert_eq!(claimed(16), Some(1));
        assert_eq!(status(17), RunStatus::Active);
        assert_eq!(status(18), RunStatus::Completed);
        assert_eq!(claimed(19), None, "a terminal run");
        assert!(out[20].is_err(), "a completed run moves nowhere");
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
                retry: None,
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
/// A seeded xorshift64: the same draws on every run of the test, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % (n as u64)).expect("small")
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The runs of a random round: `p0` claimed twice (a stale and a live fence), `p1` claimed
/// once, `p2` blocked, `p3` unclaimed, and `px`, which does not exist.
const RUNS: [&str; 5] = ["p0", "p1", "p2", "p3", "px"];

/// The same runs, claims and attempts on `store` as on every ledger given the same `setup`:
/// the fences (with their tokens), and the attempts the setup reserved (run, unit, attempt,
/// dispatch id).
fn prepare_random(
    store: &mut dyn Store,
    setup: &[Op],
    finished: &[Op],
) -> Vec<(Option<Fence>, String)> {
    // p0 and p1 retry their units: a failed attempt's unit waits a lease's length, so the
    // clocks fall before its retry time and after it; step b's units wait a millisecond and
    // may fail once more. Reservations then meet RetryNotDue and UnitExhausted.
    let policy = crate::retry::RetryPolicy::new(2, LEASE_MS);
    let step_b = crate::retry::RetryPolicy {
        jitter: 0.5,
        ..crate::retry::RetryPolicy::new(3, 1)
    };
    for run in &RUNS[..2] {
        crate::conformance::started_retrying(store, run, Some(policy), Some(step_b));
    }
    for run in &RUNS[2..4] {
        started(store, run);
    }
    runs::block_run(store, "p2", None, T0).expect("block");
    let stale = claim(store, "p0", &"a".repeat(40), T0);
    let live = claim(store, "p0", &"b".repeat(40), T0 + 1);
    let other = claim(store, "p1", &"c".repeat(40), T0);
    for op in setup.iter().chain(finished) {
        run_group(store, &[op]).0.remove(0).expect("setup call");
    }
    vec![
        (None, String::new()),
        (Some(fence_of(&stale)), stale.token),
        (Some(fence_of(&live)), live.token),
        (Some(fence_of(&other)), other.token),
    ]
}

/// An attempt the setup reserved: run, unit, attempt, dispatch id.
type Known = (String, String, i64, String);

/// One random call: a heartbeat, a finish or a reservation, at one of `clocks`, mostly with
/// the fence of its own run (none for an unclaimed run), sometimes with any.
fn draw_op(
    rng: &mut Rng,
    fences: &[(Option<Fence>, String)],
    known: &[Known],
    clocks: &[i64],
) -> Op {
    let now = if rng.below(2) == 0 {
        clocks[0]
    } else {
        *rng.pick(clocks)
    };
    let run = *rng.pick(&RUNS);
    let own = match run {
        "p0" => 1 + rng.below(2),
        "p1" => 3,
        _ => 0,
    };
    let (fence, token) = if rng.below(4) == 0 {
        rng.pick(fences).clone()
    } else {
        fences[own].clone()
    };
    match rng.below(3) {
        0 => {
            // A stale or live fence, or one of another run, renewed at any clock.
            let (fence, token) = match fence {
                Some(fence) => (fence, token),
                None => (fences[1].0.clone().expect("a fence"), fences[1].1.clone()),
            };
            Op::heartbeat(fence, token, LEASE_MS, now).expect("heartbeat op")
        }
        1 => {
            // The attempts of one run, mostly (a claim names one run); some finishes name a
            // wrong dispatch id, a later attempt or an unknown unit.
            let mine: Vec<Known> = known.iter().filter(|k| k.0 == run).cloned().collect();
            let pool = if mine.is_empty() || rng.below(5) == 0 {
                known
            } else {
                &mine
            };
            let count = 1 + rng.below(2);
            let specs: Vec<_> = (0..count)
                .map(|_| {
                    let (run_id, unit_id, attempt, dispatch) = rng.pick(pool).clone();
                    let mut spec = match rng.below(6) {
                        0 => finish(&run_id, &unit_id, attempt, "wrong-dispatch"),
                        1 => finish(&run_id, &unit_id, attempt + 1, &dispatch),
                        2 => finish(&run_id, "u9", 1, &dispatch),
                        _ => finish(&run_id, &unit_id, attempt, &dispatch),
                    };
                    if rng.below(3) == 0 {
                        spec.status = "failed".into();
                        spec.failure_reason = Some("boom".into());
                    }
                    spec
                })
                .collect();
            Op::finish(specs, fence, now).expect("finish op")
        }
        _ => {
            // Up to three units, maybe one twice, sometimes moved to step b (a reclaim that
            // changes the step is refused).
            let count = 1 + rng.below(3);
            let units = (0..count)
                .map(|_| {
                    let unit_id = *rng.pick(&["u0", "u1", "u2", "u3", "u4", "u5"]);
                    if rng.below(5) == 0 {
                        on_step(unit_id, "b")
                    } else {
                        unit(unit_id)
                    }
                })
                .collect();
            Op::reserve(run.into(), units, fence, now).expect("reserve op")
        }
    }
}

/// One random group of `size` calls, grouped on one fresh ledger and one by one (in the order
/// the group applied them) on another. How many calls reserved, finished (one winning finish
/// at least), renewed a lease, lost their lease, were refused by a unit's retry policy.
fn random_round(store: &mut dyn Store, twin: &mut dyn Store, seed: u64, size: usize) -> [usize; 5] {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let setup = [
        reserve("p0", vec![unit("u0"), unit("u1"), unit("u2")], None, T0 + 2),
        reserve("p1", vec![unit("u0"), unit("u1")], None, T0 + 2),
        reserve("p3", vec![unit("u0"), unit("u1")], None, T0 + 2),
    ];
    // The setup finishes the second unit of every run, so some reservations make attempt 2.
    let mut known: Vec<Known> = Vec::new();
    for op in &setup {
        if let Op::Reserve {
            run_id,
            units,
            dispatch_ids,
            ..
        } = op
        {
            for (u, d) in units.iter().zip(dispatch_ids) {
                known.push((run_id.clone(), u.unit_id.clone(), 1, d.clone()));
            }
        }
    }
    let done: Vec<Op> = known
        .iter()
        .filter(|k| k.1 == "u1")
        .map(|(r, u, a, d)| Op::finish(vec![finish(r, u, *a, d)], None, T0 + 3).expect("finish"))
        .collect();
    let fences = prepare_random(store, &setup, &done);
    prepare_random(twin, &setup, &done);
    // The live lease of p0 ends at T0 + 1 + LEASE_MS: the clocks fall before it, just before
    // it (a heartbeat then keeps it live for later calls), after it, and far after.
    let clocks = [
        T0 + 10,
        T0 + LEASE_MS - 1,
        T0 + LEASE_MS + 5,
        T0 + 3 * LEASE_MS,
    ];
    let group: Vec<Op> = (0..size)
        .map(|_| draw_op(&mut rng, &fences, &known, &clocks))
        .collect();
    let (out, outcome) = compare_on(store, twin, &group, &RUNS[..4]);
    assert!(
        !outcome.fell_back,
        "seed {seed}: every refusal stays with its call"
    );
    assert_eq!(out.len(), size);
    out.iter()
        .map(|o| match o {
            Ok(Output::Reservations(r)) if !r.is_empty() => [1, 0, 0, 0, 0],
            Ok(Output::Finished(f)) if f.contains(&true) => [0, 1, 0, 0, 0],
            Ok(Output::Claim(_)) => [0, 0, 1, 0, 0],
            Err(LedgerError::LeaseLost { .. }) => [0, 0, 0, 1, 0],
            Err(LedgerError::RetryNotDue { .. } | LedgerError::UnitExhausted { .. }) => {
                [0, 0, 0, 0, 1]
            }
            _ => [0; 5],
        })
        .fold([0; 5], |acc, x| std::array::from_fn(|i| acc[i] + x[i]))
}

/// Random groups of every size up to 32, each on two fresh ledgers of `store`'s backend.
pub(super) fn random_groups_match_one_by_one(store: &mut dyn Store) {
    let sizes = [2, 5, 8, 16, 24, 32, 32, 32, 32, 32, 32, 32];
    let mut seen = [0; 5];
    for (seed, size) in (1..).zip(sizes) {
        let (mut a, _keep_a) = twin(store);
        let (mut b, _keep_b) = twin(store);
        let counts = random_round(a.as_mut(), b.as_mut(), seed, size);
        seen = std::array::from_fn(|i| seen[i] + counts[i]);
    }
    // The draws reach every outcome: reservations, winning finishes, renewals, lost leases,
    // refusals by a retry policy.
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
}

/// A reservation of `units` with the dispatch ids `ids` (drawn once, so a batch and the same
/// units one at a time hand out the same ids).
fn reserve_with(run: &str, units: Vec<UnitSpec>, ids: Vec<String>, now: i64) -> Op {
    Op::Reserve {
        run_id: run.into(),
        units,
        dispatch_ids: ids,
        fence: None,
        now_ms: now,
    }
}

/// A batch call against the same work one unit at a time, in the batch's order, and against
/// a commit group of those one-unit calls, each on a twin: the same answers, the same rows and
/// events. The three take different shapes through the judge (one call of many units, many
/// calls in turn, many calls over one snapshot) and, on PostgreSQL, different statements (a
/// one-key read and one-row sets, or set statements over many keys): all must decide alike
/// (new attempts, reclaims of running ones and of a unit reserved earlier in the same batch,
/// the next attempt of finished ones; winning, duplicate, wrong and late finishes).
pub(super) fn batches_match_lone_calls(store: &mut dyn Store) {
    let mut repeated = 0;
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (mut a, _keep_a) = twin(store);
        let (mut b, _keep_b) = twin(store);
        let (mut c, _keep_c) = twin(store);
        // u0 and u2 running, u1 and u3 finished, u4.. new.
        let setup = reserve(
            "q",
            (0..4).map(|i| unit(&format!("u{i}"))).collect(),
            None,
            T0 + 2,
        );
        let done: Vec<Op> = [1, 3]
            .iter()
            .map(|&i| finishing("q", &format!("u{i}"), 1, &dispatch(&setup, i), None))
            .collect();
        for s in [a.as_mut(), b.as_mut(), c.as_mut()] {
            started(s, "q");
            for op in std::iter::once(&setup).chain(&done) {
                run_group(s, &[op]).0.remove(0).expect("setup call");
            }
        }
        // Units in a random order, now and then one twice (its second reservation reclaims
        // the first).
        let mut pool: Vec<usize> = (0..8).collect();
        let mut units = Vec::new();
        for _ in 0..2 + rng.below(6) {
            units.push(pool.remove(rng.below(pool.len())));
            if rng.below(4) == 0 {
                units.push(units[rng.below(units.len())]);
            }
        }
        let mut seen = std::collections::HashSet::new();
        repeated += units.iter().filter(|&&u| !seen.insert(u)).count();
        let specs: Vec<UnitSpec> = units.iter().map(|i| unit(&format!("u{i}"))).collect();
        let ids: Vec<String> = (0..specs.len()).map(|i| format!("d{seed}-{i}")).collect();
        let batch = reserve_with("q", specs.clone(), ids.clone(), T0 + 10);
        let batched = run_group(a.as_mut(), &[&batch]).0.remove(0);
        let mut alone = Vec::new();
        for (u, id) in specs.iter().cloned().zip(ids.iter().cloned()) {
            let op = reserve_with("q", vec![u], vec![id], T0 + 10);
            alone.extend(
                run_group(b.as_mut(), &[&op])
                    .0
                    .remove(0)
                    .and_then(Output::reservations)
                    .expect("reserved alone"),
            );
        }
        let lone: Vec<Op> = specs
            .iter()
            .zip(&ids)
            .map(|(u, id)| reserve_with("q", vec![u.clone()], vec![id.clone()], T0 + 10))
            .collect();
        let grouped = answers(run_group(c.as_mut(), &lone.iter().collect::<Vec<_>>()));
        let grouped: Vec<Reservation> = grouped
            .into_iter()
            .flat_map(|o| o.reservations().expect("reserved in a group"))
            .collect();
        let reserved = batched.and_then(Output::reservations).expect("reserved");
        assert_eq!(reserved, alone, "seed {seed}");
        assert_eq!(reserved, grouped, "seed {seed}");
        // Finishes of what was reserved: some twice, some with a wrong id or a later attempt.
        let mut finishes = Vec::new();
        for r in &reserved {
            let mut f = finish("q", &r.unit_id, r.attempt, &r.dispatch_id);
            match rng.below(5) {
                0 => f.dispatch_id = "wrong".into(),
                1 => f.attempt += 1,
                2 => finishes.push(f.clone()),
                _ => {}
            }
            if rng.below(3) == 0 {
                f.status = "failed".into();
                f.failure_reason = Some("boom".into());
            }
            finishes.push(f);
        }
        let batch = Op::finish(finishes.clone(), None, T0 + 20).expect("finish op");
        let batched = run_group(a.as_mut(), &[&batch]).0.remove(0);
        let lone: Vec<Op> = finishes
            .iter()
            .map(|f| Op::finish(vec![f.clone()], None, T0 + 20).expect("finish op"))
            .collect();
        let mut alone = Vec::new();
        for op in &lone {
            match run_group(b.as_mut(), &[op]).0.remove(0) {
                Ok(Output::Finished(won)) => alone.extend(won),
                other => panic!("seed {seed}: {other:?}"),
            }
        }
        let grouped: Vec<bool> = answers(run_group(c.as_mut(), &lone.iter().collect::<Vec<_>>()))
            .into_iter()
            .flat_map(|o| o.finished().expect("finished in a group"))
            .collect();
        assert_eq!(batched, Ok(Output::Finished(alone.clone())), "seed {seed}");
        assert_eq!(grouped, alone, "seed {seed}");
        let rows = rows_of(a.as_mut(), &["q"]);
        assert_eq!(rows, rows_of(b.as_mut(), &["q"]), "seed {seed}");
        assert_eq!(rows, rows_of(c.as_mut(), &["q"]), "seed {seed}");
    }
    assert!(repeated > 0, "some batch reserves a unit twice");
}

/// The answers of a group that did not fall back and whose calls all succeeded, in arrival
/// order, having been applied in arrival order (one kind of call).
fn answers((out, outcome): (Vec<Result<Output>>, Outcome)) -> Vec<Output> {
    assert!(!outcome.fell_back, "{out:?}");
    assert!(outcome.order.windows(2).all(|w| w[0] < w[1]), "{outcome:?}");
    out.into_iter().map(|o| o.expect("answered")).collect()
}

/// Round trips a grouped call waited for on this thread so far (0 on SQLite).
#[cfg(feature = "postgres")]
fn round_trips(store: &mut dyn Store) -> u64 {
    store
        .read("counting round trips", |tx| Ok(tx.round_trips()))
        .expect("round trips")
}

/// On PostgreSQL a group costs two round trips, whatever its size: one read, then one
/// statement per kind sent with the commit.
#[cfg(feature = "postgres")]
fn merged_groups_take_few_round_trips(store: &mut dyn Store) {
    started(store, "r1");
    let mut spent = Vec::new();
    let mut reserved = Vec::new();
    for (round, size) in [(0, 16), (1, 16), (2, 32)] {
        let group: Vec<Op> = (0..size)
            .map(|i| reserve("r1", vec![unit(&format!("u{round}-{i}"))], None, T0 + 10))
            .collect();
        let ops: Vec<&Op> = group.iter().collect();
        let before = round_trips(store);
        let (out, outcome) = run_group(store, &ops);
        spent.push(round_trips(store) - before);
        assert!(!outcome.fell_back);
        for o in out {
            reserved.extend(o.expect("reserved").reservations().expect("reservations"));
        }
    }
    // The first group also prepared its statements; after that, 2: the read, then the write
    // sent with the commit.
    assert_eq!(spent[1..], [2, 2], "reservations: {spent:?}");
    // 32 finishes (the first also prepares its read and its write: a judgment reads only the
    // parts its calls need), then a mix of 16 finishes and 16 reservations: both writes ride
    // with the commit.
    let finishes: Vec<Op> = reserved
        .iter()
        .map(|r| finishing("r1", &r.unit_id, r.attempt, &r.dispatch_id, None))
        .collect();
    let mixed: Vec<Op> = finishes[32..48]
        .iter()
        .cloned()
        .chain((0..16).map(|i| reserve("r1", vec![unit(&format!("m{i}"))], None, T0 + 10)))
        .collect();
    let mut more = Vec::new();
    for group in [&finishes[..32], &mixed[..]] {
        let ops: Vec<&Op> = group.iter().collect();
        let before = round_trips(store);
        let (out, outcome) = run_group(store, &ops);
        more.push(round_trips(store) - before);
        assert!(
            !outcome.fell_back && out.iter().all(Result::is_ok),
            "{out:?}"
        );
    }
    assert!(more[0] <= 4 && more[1] == 2, "{spent:?} then {more:?}");
}

#[test]
fn batches_match_lone_calls_on_sqlite() {
    batches_match_lone_calls(store::testing::sqlite_memory().as_mut());
}

#[cfg(feature = "postgres")]
#[test]
fn batches_match_lone_calls_on_postgres() {
    let (mut store, _schema) = store::testing::postgres_fresh();
    batches_match_lone_calls(store.as_mut());
}

#[test]
fn random_groups_match_one_by_one_on_sqlite() {
    random_groups_match_one_by_one(store::testing::sqlite_memory().as_mut());
}

#[cfg(feature = "postgres")]
#[test]
fn random_groups_match_one_by_one_on_postgres() {
    let (mut store, _schema) = store::testing::postgres_fresh();
    random_groups_match_one_by_one(store.as_mut());
}

#[cfg(feature = "postgres")]
#[test]
fn merged_groups_take_few_round_trips_on_postgres() {
    let (mut store, _schema) = store::testing::postgres_fresh();
    merged_groups_take_few_round_trips(store.as_mut());
}

/// A judged write that changes another number of rows than it names (the snapshot it was
/// judged on would have been stale) fails its transaction: nothing of it is kept, and the
/// caller gets a `StoreError` (a group then falls back to its calls one by one). Each kind of
/// row, on each backend: SQLite counts each row's statement, PostgreSQL's set statements count
/// themselves and fail the commit they ride with.
fn a_write_that_matches_no_row_fails_its_transaction(store: &mut dyn Store) {
    use crate::store::rows::{ClaimRow, FinishRow, HeartbeatRow, ReclaimRow, Stamp, Writes};

    started(store, "r1");
    let before = events::read(store, Some("r1"), 0, 100, None).expect("events");
    let finish = FinishRow {
        run_id: "r1",
        unit_id: "u1",
        attempt: 1,
        dispatch_id: "no-such-dispatch",
        status: "completed",
        result: None,
        tokens: None,
        failure_reason: None,
        session_id: None,
        payload: "{}".into(),
        stamp: Stamp::default(),
        unit_status: "completed",
        retry_at: None,
        exhausted: None,
    };
    let reclaim = ReclaimRow {
        run_id: "r1",
        unit_id: "u1",
        attempt: 1,
        reclaims: 0,
        times: 1,
        holder: Some("h"),
        generation: None,
        trace_context: None,
    };
    let heartbeat = HeartbeatRow {
        run_id: "r1",
        generation: 7,
        token_hash: "no-such-token",
        heartbeat_at: T0,
        expires_at: T0 + 1,
    };
    // A claim from a generation the lease is not at.
    let claim = ClaimRow {
        run_id: "r1",
        previous: 41,
        generation: 42,
        owner_type: "session",
        owner_id: "someone",
        token_hash: "hash",
        expires_at: T0 + 1,
        queued: false,
        payload: "{}".into(),
        stamp: Stamp::default(),
    };
    // Each kind alone and twice: PostgreSQL writes one row and several by different
    // statements.
    let mut writes = Vec::new();
    for n in [1, 2] {
        writes.extend([
            Writes {
                claims: vec![claim.clone(); n],
                ..Writes::default()
            },
            Writes {
                finishes: vec![finish.clone(); n],
                ..Writes::default()
            },
            Writes {
                reclaims: vec![reclaim.clone(); n],
                ..Writes::default()
            },
            Writes {
                heartbeats: vec![heartbeat.clone(); n],
                ..Writes::default()
            },
        ]);
    }
    for w in &writes {
        let err = store
            .write("finishing attempts", |tx| {
                tx.lock_run("r1")?;
                tx.write_rows(w).map_err(|e| tx.fail(&e))
            })
            .expect_err("the count check fails the transaction");
        assert!(
            matches!(&err, LedgerError::StoreError { message, .. }
                if message.contains("another number of rows")
                    || message.contains("changed 0 rows, not 1")),
            "{w:?}: {err:?}"
        );
        let after = events::read(store, Some("r1"), 0, 100, None).expect("events");
        assert_eq!(before, after, "nothing of the transaction was kept");
    }
}

#[test]
fn a_write_that_matches_no_row_fails_its_transaction_on_sqlite() {
    a_write_that_matches_no_row_fails_its_transaction(store::testing::sqlite_memory().as_mut());
}

#[cfg(feature = "postgres")]
#[test]
fn a_write_that_matches_no_row_fails_its_transaction_on_postgres() {
    let (mut store, _schema) = store::testing::postgres_fresh();
    a_write_that_matches_no_row_fails_its_transaction(store.as_mut());
}

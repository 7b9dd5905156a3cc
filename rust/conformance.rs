//! Conformance tests: the ledger's compare-and-set rules, written once over `&mut dyn Store`
//! and run on every backend (SQLite `:memory:` always; PostgreSQL with the `postgres` feature),
//! so a backend that disagrees fails the same case. Each case is a plain function of a fresh
//! store; [`conformance!`] makes one `#[test]` per case and backend.

use crate::attempts::{self, FinishSpec, UnitSpec};
use crate::canonical::Json;
use crate::errors::{LedgerError, LostReason};
use crate::events;
use crate::leases::{self, ClaimSpec, Fence};
use crate::model::{Claim, ReservationKind, Run};
use crate::queue::{self, NewQueuedRun};
use crate::runs::{self, NewRun, StepResult, StepSpec};
use crate::status::{AttemptStatus, RunStatus};
use crate::store::Store;

/// One `#[test]` per case on `:memory:` (module `sqlite`) and on a fresh PostgreSQL schema
/// (module `postgres`).
macro_rules! conformance {
    ($($case:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $case() {
                    let mut store = crate::store::testing::sqlite_memory();
                    super::$case(store.as_mut());
                }
            )+
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[test]
                fn $case() {
                    let (mut store, _schema) = crate::store::testing::postgres_fresh();
                    super::$case(store.as_mut());
                }
            )+
        }
    };
}

conformance!(
    reserve_and_reclaim,
    finish_cas_has_one_winner,
    claim_cas_and_fenced_writes,
    expiry_fences_the_old_owner,
    event_revisions,
    set_status_follows_the_lifecycle,
    the_operations_move_runs_along_the_lifecycle,
    group_matches_one_by_one,
    a_failing_call_keeps_its_neighbours,
    claim_next_writes_what_claims_write,
    a_queued_run_without_a_lease_row_is_claimed,
);

mod curve;
mod group;
mod next;
pub(crate) mod plans;
mod reads;
mod retention;
#[cfg(feature = "postgres")]
mod stale;
use group::{a_failing_call_keeps_its_neighbours, group_matches_one_by_one};
use next::{a_queued_run_without_a_lease_row_is_claimed, claim_next_writes_what_claims_write};

pub(crate) const T0: i64 = 1_700_000_000_000;
const LEASE_MS: i64 = 60_000;

fn json(text: &str) -> Json {
    Json::new(text.as_bytes().to_vec())
}

/// An active run with steps `a` and `b`, outside any scope guard.
pub(crate) fn started(store: &mut dyn Store, run_id: &str) -> Run {
    started_retrying(store, run_id, None, None)
}

/// [`started`] with a retry policy for the run's units and one for step `b`'s.
pub(crate) fn started_retrying(
    store: &mut dyn Store,
    run_id: &str,
    retry: Option<crate::retry::RetryPolicy>,
    step_b: Option<crate::retry::RetryPolicy>,
) -> Run {
    let step = |id: &str, retry| StepSpec {
        id: id.into(),
        title: String::new(),
        instructions: String::new(),
        completion: None,
        retry,
    };
    let req = NewRun {
        workflow_ref: "wf".into(),
        steps: vec![step("a", None), step("b", step_b)],
        run_id: Some(run_id.into()),
        force: true,
        retry,
        ..NewRun::default()
    };
    runs::start_run(store, &req, T0).expect("start_run")
}

fn queued(run_id: &str) -> NewQueuedRun {
    let definition = json(r#"{"steps":["a"]}"#);
    NewQueuedRun {
        run_id: run_id.into(),
        workflow_name: "wf".into(),
        workflow_ref: "wf@1".into(),
        source: json(r#"{"path":"wf.yaml"}"#),
        definition_digest: definition.digest.clone(),
        definition,
        input: json("null"),
        launch_options: json("{}"),
        runner_id: "host-a".into(),
        origin_session_id: "session-1".into(),
        parent_run_id: None,
        not_before: crate::queue::NotBefore::Now,
        priority: 0,
        concurrency_key: None,
        retry: None,
    }
}

fn spec(runner: &str) -> ClaimSpec {
    ClaimSpec::new(runner.into(), LEASE_MS, None, "token").expect("claim spec")
}

fn fence(claim: &Claim) -> Fence {
    Fence::from_token(&claim.run_id, claim.generation, &claim.token)
}

fn unit(unit_id: &str) -> UnitSpec {
    UnitSpec {
        unit_id: unit_id.into(),
        step_id: "a".into(),
        phase: "unit".into(),
        ..UnitSpec::default()
    }
}

fn finish(run_id: &str, unit_id: &str, attempt: i64, dispatch_id: &str) -> FinishSpec {
    FinishSpec {
        run_id: run_id.into(),
        unit_id: unit_id.into(),
        attempt,
        dispatch_id: dispatch_id.into(),
        status: "completed".into(),
        tokens: Some(7),
        ..FinishSpec::default()
    }
}

fn event_types(store: &mut dyn Store, run_id: &str) -> Vec<String> {
    events::read(store, Some(run_id), 0, 1000, None)
        .expect("events")
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}

fn revision(store: &mut dyn Store, run_id: &str) -> i64 {
    runs::get_run(store, run_id)
        .expect("get_run")
        .expect("the run")
        .revision
}

fn assert_lease_lost(result: crate::errors::Result<impl std::fmt::Debug>, actual: i64) {
    assert_lost_because(result, actual, LostReason::Superseded);
}

fn assert_lost_because(
    result: crate::errors::Result<impl std::fmt::Debug>,
    actual: i64,
    why: LostReason,
) {
    match result {
        Err(LedgerError::LeaseLost {
            actual_generation,
            reason,
            ..
        }) => assert_eq!((actual_generation, reason), (actual, why)),
        other => panic!("expected LeaseLost({why}), got {other:?}"),
    }
}

fn assert_invalid(result: crate::errors::Result<impl std::fmt::Debug>, argument: &str) {
    match result {
        Err(LedgerError::InvalidArgument { argument: a, .. }) => assert_eq!(a, argument),
        other => panic!("expected InvalidArgument on {argument}, got {other:?}"),
    }
}

fn assert_not_active(result: crate::errors::Result<impl std::fmt::Debug>, status: RunStatus) {
    match result {
        Err(LedgerError::RunNotActive { status: s, .. }) => assert_eq!(s, status.as_str()),
        other => panic!("expected RunNotActive ({status}), got {other:?}"),
    }
}

// ------------------------------------------------------------------ the cases

/// A new attempt, then the same attempt handed back while it runs, then a new one once it is
/// finished; a reclaim that changes the step is refused; batches take the same paths.
fn reserve_and_reclaim(store: &mut dyn Store) {
    started(store, "r");
    let first = attempts::reserve_attempts(store, "r", &[unit("u")], None, T0).unwrap();
    assert_eq!(
        (first[0].kind, first[0].attempt),
        (ReservationKind::Reserved, 1)
    );
    let again = attempts::reserve_attempts(store, "r", &[unit("u")], None, T0 + 1).unwrap();
    assert_eq!(
        (again[0].kind, again[0].attempt, again[0].reclaims),
        (ReservationKind::Reclaimed, 1, 1)
    );
    assert_eq!(again[0].dispatch_id, first[0].dispatch_id);
    let mut moved = unit("u");
    moved.step_id = "b".into();
    assert_invalid(
        attempts::reserve_attempts(store, "r", &[moved], None, T0),
        "step_id",
    );
    let done = finish("r", "u", 1, &first[0].dispatch_id);
    assert_eq!(
        attempts::finish_attempts(store, &[done], None, T0).unwrap(),
        [true]
    );
    let second = attempts::reserve_attempts(store, "r", &[unit("u")], None, T0).unwrap();
    assert_eq!(
        (second[0].kind, second[0].attempt),
        (ReservationKind::Reserved, 2)
    );
    assert_ne!(second[0].dispatch_id, first[0].dispatch_id);

    // A batch of distinct units, then the same batch again: all reclaimed in place.
    let batch = [unit("x"), unit("y"), unit("z")];
    let fresh = attempts::reserve_attempts(store, "r", &batch, None, T0).unwrap();
    let back = attempts::reserve_attempts(store, "r", &batch, None, T0).unwrap();
    for (f, b) in fresh.iter().zip(&back) {
        assert_eq!(
            (f.kind, b.kind),
            (ReservationKind::Reserved, ReservationKind::Reclaimed)
        );
        assert_eq!((f.attempt, &f.dispatch_id), (b.attempt, &b.dispatch_id));
    }
    // A unit twice in one batch: the second reclaims the attempt the first just made.
    let twice = attempts::reserve_attempts(store, "r", &[unit("w"), unit("w")], None, T0).unwrap();
    assert_eq!(twice[1].kind, ReservationKind::Reclaimed);
    assert_eq!(twice[0].dispatch_id, twice[1].dispatch_id);
    let started_events = event_types(store, "r")
        .iter()
        .filter(|t| *t == "unit.started")
        .count();
    assert_eq!(
        started_events, 6,
        "one unit.started per new attempt, none per reclaim"
    );
}

/// Of every finish of one attempt exactly one writes; the others return `false` and change
/// nothing, in one call, in a batch, or with a wrong dispatch id.
fn finish_cas_has_one_winner(store: &mut dyn Store) {
    started(store, "r");
    let units = [unit("u"), unit("v")];
    let r = attempts::reserve_attempts(store, "r", &units, None, T0).unwrap();
    let (u, v) = (&r[0], &r[1]);
    let wrong = finish("r", "u", 1, "not-the-dispatch-id");
    assert_eq!(
        attempts::finish_attempts(store, &[wrong], None, T0).unwrap(),
        [false]
    );
    let once = finish("r", "u", 1, &u.dispatch_id);
    assert_eq!(
        attempts::finish_attempts(store, std::slice::from_ref(&once), None, T0).unwrap(),
        [true]
    );
    let mut late = once.clone();
    late.tokens = Some(999);
    late.status = "failed".into();
    assert_eq!(
        attempts::finish_attempts(store, &[late], None, T0).unwrap(),
        [false]
    );
    // Two identical finishes in one batch: the first wins.
    let twice = finish("r", "v", 1, &v.dispatch_id);
    assert_eq!(
        attempts::finish_attempts(store, &[twice.clone(), twice], None, T0).unwrap(),
        [true, false]
    );
    let history = attempts::attempts(store, "r", "u").unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].status, history[0].tokens),
        (AttemptStatus::Completed, Some(7))
    );
    let unit_u = attempts::unit(store, "r", "u").unwrap().unwrap();
    assert_eq!(unit_u.tokens, Some(7));
    let finished = event_types(store, "r")
        .iter()
        .filter(|t| *t == "unit.finished")
        .count();
    assert_eq!(finished, 2, "one unit.finished per attempt");
    let mut not_terminal = finish("r", "u", 1, &u.dispatch_id);
    not_terminal.status = "running".into();
    assert_invalid(
        attempts::finish_attempts(store, &[not_terminal], None, T0),
        "status",
    );
}

/// A claim takes the next generation by compare-and-set; a live lease of another owner
/// refuses it; a re-claim moves the generation on, and then every fenced write of the old
/// claim is refused with `LeaseLost`, writing nothing.
fn claim_cas_and_fenced_writes(store: &mut dyn Store) {
    queue::reserve_run(store, &queued("q"), T0).unwrap();
    let lease = leases::lease(store, "q").unwrap();
    assert_eq!((lease.generation, lease.owner_id), (0, None));
    let first = leases::claim(store, "q", &spec("host-a"), T0)
        .unwrap()
        .unwrap();
    assert_eq!(first.generation, 1);
    let run = runs::get_run(store, "q").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Starting);
    assert!(leases::claim(store, "q", &spec("host-b"), T0 + 1)
        .unwrap()
        .is_none());
    let old = fence(&first);
    runs::set_status(store, "q", "active", &old, T0).unwrap();
    started(store, "work");

    let second = leases::claim(store, "q", &spec("host-a"), T0 + 2)
        .unwrap()
        .unwrap();
    assert_eq!(second.generation, 2);
    let before = revision(store, "q");
    let events_before = event_types(store, "q").len();
    assert_lease_lost(
        leases::heartbeat(store, &old, &first.token, LEASE_MS, T0 + 3),
        2,
    );
    assert_lease_lost(leases::release(store, &old, T0 + 3), 2);
    assert_lease_lost(runs::set_status(store, "q", "blocked", &old, T0 + 3), 2);
    let result = StepResult {
        status: "completed".into(),
        ..StepResult::default()
    };
    assert_lease_lost(
        runs::complete_step(store, "q", "a", &result, Some(&old), T0 + 3),
        2,
    );
    assert_lease_lost(
        runs::set_outputs(store, "q", &json("{}"), Some(&old), T0 + 3),
        2,
    );
    assert_lease_lost(
        attempts::reserve_attempts(store, "q", &[unit("u")], Some(&old), T0 + 3),
        2,
    );
    assert_lease_lost(
        attempts::finish_attempts(store, &[finish("q", "u", 1, "d")], Some(&old), T0 + 3),
        2,
    );
    // A token that is not the claim's, at the right generation, is refused too.
    let forged = Fence::from_token("q", 2, "fpt_forged");
    assert_lost_because(
        leases::release(store, &forged, T0 + 3),
        2,
        LostReason::Token,
    );
    // A claim names one run: presenting it for another is a usage error.
    assert_invalid(
        runs::set_outputs(store, "work", &json("{}"), Some(&fence(&second)), T0),
        "claim",
    );
    assert_eq!(
        revision(store, "q"),
        before,
        "refused writes change nothing"
    );
    assert_eq!(event_types(store, "q").len(), events_before);

    // The current claim writes; a release keeps the generation and frees the lease.
    let current = fence(&second);
    let renewed = leases::heartbeat(store, &current, &second.token, LEASE_MS, T0 + 4).unwrap();
    assert_eq!(
        (renewed.generation, renewed.expires_at),
        (2, T0 + 4 + LEASE_MS)
    );
    leases::release(store, &current, T0 + 5).unwrap();
    assert_lost_because(
        leases::release(store, &current, T0 + 6),
        2,
        LostReason::Released,
    );
    let lease = leases::lease(store, "q").unwrap();
    assert_eq!((lease.generation, lease.owner_id), (2, None));
    let third = leases::claim(store, "q", &spec("host-b"), T0 + 7)
        .unwrap()
        .unwrap();
    assert_eq!(third.generation, 3);
    let types = event_types(store, "q");
    assert_eq!(types.iter().filter(|t| *t == "lease.claimed").count(), 3);
    assert_eq!(types.iter().filter(|t| *t == "lease.released").count(), 1);

    // No claim on a terminal run.
    runs::set_status(store, "q", "cancelled", &fence(&third), T0 + 8).unwrap();
    assert!(leases::claim(store, "q", &spec("host-c"), T0 + 9)
        .unwrap()
        .is_none());
}

/// The ledger's clock ends a lease: past its expiry the owner's writes are refused and another
/// owner may claim; the expired lease is listed until then.
fn expiry_fences_the_old_owner(store: &mut dyn Store) {
    queue::reserve_run(store, &queued("q"), T0).unwrap();
    let claim = leases::claim(store, "q", &spec("host-a"), T0)
        .unwrap()
        .unwrap();
    let expiry = T0 + LEASE_MS;
    assert!(leases::expired_leases(store, expiry - 1, false)
        .unwrap()
        .is_empty());
    let expired = leases::expired_leases(store, expiry, false).unwrap();
    assert_eq!(expired.len(), 1);
    // Claimed but not yet running: not a lease `doctor` reports on an active run.
    assert!(leases::expired_leases(store, expiry, true)
        .unwrap()
        .is_empty());
    assert_eq!(expired[0].run_id, "q");
    assert_lost_because(
        leases::heartbeat(store, &fence(&claim), &claim.token, LEASE_MS, expiry),
        1,
        LostReason::Expired,
    );
    let taken = leases::claim(store, "q", &spec("host-b"), expiry)
        .unwrap()
        .unwrap();
    assert_eq!(taken.generation, 2);
    // Once another owner has claimed it, the old claim was superseded, not merely expired.
    assert_lease_lost(
        leases::heartbeat(store, &fence(&claim), &claim.token, LEASE_MS, expiry),
        2,
    );
    assert!(leases::expired_leases(store, expiry, false)
        .unwrap()
        .is_empty());
}

/// Every event takes its run's next revision, the run's revision is its newest event's, and
/// `seq` pages every run's events in order.
fn event_revisions(store: &mut dyn Store) {
    started(store, "one");
    started(store, "two");
    runs::block_run(store, "one", Some("wait"), T0).unwrap();
    runs::resume_run(store, "one", T0).unwrap();
    let result = StepResult {
        status: "completed".into(),
        ..StepResult::default()
    };
    runs::complete_step(store, "one", "a", &result, None, T0).unwrap();
    runs::complete_step(store, "one", "b", &result, None, T0).unwrap();
    let events = events::read(store, Some("one"), 0, 1000, None).unwrap();
    let revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, (1..=6).collect::<Vec<_>>());
    assert_eq!(revision(store, "one"), 6);
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "run.started",
            "run.status",
            "run.status",
            "step.completed",
            "step.completed",
            "run.status"
        ]
    );
    let all = events::read(store, None, 0, 1000, None).unwrap();
    assert_eq!(all.len(), 7);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    let page = events::read(store, None, all[2].seq, 2, None).unwrap();
    assert_eq!(page, all[3..5]);
    let wanted = ["run.started".to_owned()];
    let started_only = events::read(store, None, 0, 1000, Some(&wanted)).unwrap();
    assert_eq!(started_only.len(), 2);
    assert_invalid(events::read(store, None, 0, 0, None), "limit");
    assert_invalid(events::read(store, None, -1, 10, None), "after_seq");
}

/// Bring a fresh queued run to `status` through the controller's path: reserved, claimed
/// (`starting`), then moved by `set_status`. Its claim, unless it is still `queued`.
fn run_at(store: &mut dyn Store, run_id: &str, status: RunStatus) -> Option<Claim> {
    queue::reserve_run(store, &queued(run_id), T0).unwrap();
    if status == RunStatus::Queued {
        return None;
    }
    let claim = leases::claim(store, run_id, &spec("host-a"), T0)
        .unwrap()
        .unwrap();
    let path: &[RunStatus] = match status {
        RunStatus::Queued | RunStatus::Starting => &[],
        RunStatus::Active => &[RunStatus::Active],
        other => &[RunStatus::Active, other],
    };
    for step in path {
        runs::set_status(store, run_id, step.as_str(), &fence(&claim), T0).unwrap();
    }
    Some(claim)
}

/// `set_status` offers every move of the lifecycle and refuses every other, naming both
/// statuses, without writing. (A queued run has never been claimed, so no claim can move it:
/// its moves are the claim's and `abandon_run`'s, below.)
fn set_status_follows_the_lifecycle(store: &mut dyn Store) {
    for (i, &from) in RunStatus::ALL.iter().enumerate() {
        for (j, &to) in RunStatus::ALL.iter().enumerate() {
            let run_id = format!("run-{i}-{j}");
            let Some(claim) = run_at(store, &run_id, from) else {
                continue;
            };
            let before = runs::get_run(store, &run_id).unwrap().unwrap();
            assert_eq!(before.status, from);
            let moved = runs::set_status(store, &run_id, to.as_str(), &fence(&claim), T0 + 1);
            if from.can_move_to(to) {
                let run = moved.unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
                assert_eq!(run.status, to);
                assert_eq!(run.revision, before.revision + 1);
                assert_eq!(run.completed_at.is_some(), to.is_terminal());
                let events = events::read(store, Some(&run_id), 0, 1000, None).unwrap();
                let last = events.last().unwrap();
                assert_eq!(last.event_type, "run.status");
                assert_eq!(last.generation, Some(claim.generation));
            } else {
                match moved {
                    Err(LedgerError::InvalidArgument { argument, message }) => {
                        assert_eq!(argument, "status");
                        assert!(
                            message.contains(&format!("from {from} to {to}")),
                            "{message}"
                        );
                    }
                    other => panic!("{from} -> {to}: expected InvalidArgument, got {other:?}"),
                }
                assert_eq!(runs::get_run(store, &run_id).unwrap().unwrap(), before);
            }
        }
    }
    assert_invalid(
        runs::set_status(
            store,
            "run-1-1",
            "running",
            &Fence::from_token("x", 1, "t"),
            T0,
        ),
        "status",
    );
}

/// The operations that move a run make only their own moves of the lifecycle, and refuse the
/// others with their own errors.
fn the_operations_move_runs_along_the_lifecycle(store: &mut dyn Store) {
    let failed = StepResult {
        status: "failed".into(),
        ..StepResult::default()
    };
    let done = StepResult {
        status: "completed".into(),
        ..StepResult::default()
    };
    // block_run: active -> blocked only.
    started(store, "b");
    assert_eq!(
        runs::block_run(store, "b", None, T0).unwrap().status,
        RunStatus::Blocked
    );
    assert_not_active(runs::block_run(store, "b", None, T0), RunStatus::Blocked);
    // resume_run: blocked -> active; an active run unchanged.
    let resumed = runs::resume_run(store, "b", T0).unwrap();
    assert_eq!(resumed.status, RunStatus::Active);
    assert_eq!(runs::resume_run(store, "b", T0).unwrap(), resumed);
    // complete_step: a failed step blocks the run, the last step completes it.
    let blocked = runs::complete_step(store, "b", "a", &failed, None, T0).unwrap();
    assert_eq!(blocked.status, RunStatus::Blocked);
    runs::resume_run(store, "b", T0).unwrap();
    runs::complete_step(store, "b", "a", &done, None, T0).unwrap();
    let completed = runs::complete_step(store, "b", "b", &done, None, T0).unwrap();
    assert_eq!(completed.status, RunStatus::Completed);
    assert_not_active(runs::resume_run(store, "b", T0), RunStatus::Completed);
    assert_not_active(
        runs::complete_step(store, "b", "b", &done, None, T0),
        RunStatus::Completed,
    );
    assert_not_active(
        attempts::reserve_attempts(store, "b", &[unit("u")], None, T0),
        RunStatus::Completed,
    );
    // abandon_run: every non-terminal status -> cancelled; terminal runs stay as they are.
    for (i, &from) in RunStatus::ALL.iter().enumerate() {
        let run_id = format!("abandon-{i}");
        run_at(store, &run_id, from);
        assert_eq!(
            runs::abandon_run(store, &run_id, None, true, T0).unwrap(),
            !from.is_terminal()
        );
        let status = runs::get_run(store, &run_id).unwrap().unwrap().status;
        let want = if from.is_terminal() {
            from
        } else {
            RunStatus::Cancelled
        };
        assert_eq!(status, want, "abandoning a {from} run");
    }
    // A continuation completes a parked parent, and only a parked one.
    let parked = run_at(store, "parent", RunStatus::Parked).unwrap();
    leases::release(store, &fence(&parked), T0).unwrap();
    run_at(store, "active-parent", RunStatus::Active);
    let mut refused = queued("refused");
    refused.parent_run_id = Some("active-parent".into());
    match queue::reserve_run(store, &refused, T0) {
        Err(LedgerError::ContinuationRefused { .. }) => {}
        other => panic!("expected ContinuationRefused, got {other:?}"),
    }
    let mut next = queued("next");
    next.parent_run_id = Some("parent".into());
    queue::reserve_run(store, &next, T0).unwrap();
    let parent = runs::get_run(store, "parent").unwrap().unwrap();
    assert_eq!(parent.status, RunStatus::Completed);
    assert_eq!(
        event_types(store, "parent").last().unwrap(),
        "run.continued"
    );
    // A terminal run is neither adopted nor claimed.
    assert_not_active(
        queue::prepare_or_adopt(store, &queued("parent"), &spec("host-a"), T0),
        RunStatus::Completed,
    );
}

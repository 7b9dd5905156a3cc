//! `claim_next` on every backend: what it writes is what claims by id write, in queue order;
//! a queued run without a lease row is still claimed; on PostgreSQL it costs two round trips.

use super::group::{rows_of, twin};
use super::{queued, T0};
use crate::leases::{self, ClaimSpec};
use crate::model::Claim;
use crate::params;
use crate::queue::{self, NextClaims};
use crate::runs;
use crate::store::{Sql, Store};

const RUNS: [&str; 5] = ["q1", "q2", "q3", "q4", "q5"];

/// `q1`..`q5` queued at T0, T0+1, ..., and `q2` claimed by id (so `starting`, no longer queued).
fn queue_five(store: &mut dyn Store) {
    for (i, run) in (0..).zip(RUNS) {
        queue::reserve_run(store, &queued(run), T0 + i).expect("reserve_run");
    }
    let spec = ClaimSpec::new("host-a".into(), 60_000, Some("a".repeat(40)), "token").unwrap();
    leases::claim(store, "q2", &spec, T0 + 10)
        .expect("claim")
        .expect("claimed");
}

fn next(store: &mut dyn Store, limit: i64, now: i64) -> Vec<Claim> {
    let req = NextClaims {
        runner_id: "host-b".into(),
        lease_ms: 30_000,
        workflow_names: None,
        limit,
        token: None,
        rescue: true,
    };
    queue::claim_next(store, &req, now).expect("claim_next")
}

/// Everything the claims wrote: the rows [`rows_of`] compares, and each run's row.
fn state(store: &mut dyn Store) -> Vec<String> {
    let mut out = rows_of(store, &RUNS);
    for run in RUNS {
        out.push(format!("{:?}", runs::get_run(store, run).expect("run")));
    }
    out
}

/// Three claims by `claim_next` leave exactly the rows and events that claiming the same runs
/// by id, with the same tokens at the same time, leaves: oldest queued first, the run claimed
/// by id skipped, each a new generation with its `lease.claimed` event and `starting`.
pub(super) fn claim_next_writes_what_claims_write(store: &mut dyn Store) {
    let now = T0 + 20;
    queue_five(store);
    let claims = next(store, 3, now);
    let order: Vec<&str> = claims.iter().map(|c| c.run_id.as_str()).collect();
    assert_eq!(order, ["q1", "q3", "q4"]);
    assert!(claims
        .iter()
        .all(|c| c.generation == 1 && c.expires_at == now + 30_000));
    let (mut by_id, _keep) = twin(store);
    queue_five(by_id.as_mut());
    for c in &claims {
        let spec = ClaimSpec::new("host-b".into(), 30_000, Some(c.token.clone()), "token").unwrap();
        let again = leases::claim(by_id.as_mut(), &c.run_id, &spec, now)
            .expect("claim")
            .expect("claimed");
        assert_eq!(&again, c);
    }
    assert_eq!(state(store), state(by_id.as_mut()));
    // The rest of the queue, then nothing.
    let rest = next(store, 10, now + 1);
    assert_eq!(
        rest.iter().map(|c| c.run_id.as_str()).collect::<Vec<_>>(),
        ["q5"]
    );
    assert!(next(store, 10, now + 2).is_empty());
}

/// A queued run whose lease row is missing is claimed all the same (its lease is created), and
/// the runs around it in the same call too.
pub(super) fn a_queued_run_without_a_lease_row_is_claimed(store: &mut dyn Store) {
    queue_five(store);
    let drop_lease = Sql::same("DELETE FROM leases WHERE resource_id = 'q3'");
    store
        .write("dropping a lease", |tx| {
            tx.exec(&drop_lease, params![]).map(|_| ())
        })
        .expect("drop");
    let claims = next(store, 3, T0 + 20);
    let order: Vec<(&str, i64)> = claims
        .iter()
        .map(|c| (c.run_id.as_str(), c.generation))
        .collect();
    assert_eq!(order, [("q1", 1), ("q3", 1), ("q4", 1)]);
    for c in &claims {
        let lease = leases::lease(store, &c.run_id).expect("lease");
        assert_eq!(
            (lease.generation, lease.owner_id.as_deref()),
            (1, Some("host-b"))
        );
    }
}

/// The round trips `store`'s connection has made so far (PostgreSQL counts them).
#[cfg(feature = "postgres")]
fn trips(store: &mut dyn Store) -> u64 {
    store
        .read("counting round trips", |tx| Ok(tx.round_trips()))
        .expect("round trips")
}

/// On PostgreSQL a `claim_next` costs two round trips however many runs it claims: the read
/// that finds and locks them, then the claims' statements sent with the commit.
#[cfg(feature = "postgres")]
pub(super) fn claim_next_takes_two_round_trips(store: &mut dyn Store) {
    for i in 0..14 {
        queue::reserve_run(store, &queued(&format!("n{i:02}")), T0 + i).expect("reserve_run");
    }
    // The first calls prepare their statements: one claim is written by the one-row
    // statements, several by the set statement.
    next(store, 1, T0 + 20);
    next(store, 2, T0 + 20);
    let mut spent = Vec::new();
    for limit in [1, 1, 4, 5] {
        let before = trips(store);
        let got = next(store, limit, T0 + 20);
        spent.push((trips(store) - before, got.len()));
    }
    assert_eq!(spent, [(2, 1), (2, 1), (2, 4), (2, 5)]);
}

#[cfg(feature = "postgres")]
#[test]
fn claim_next_takes_two_round_trips_on_postgres() {
    let (mut store, _schema) = crate::store::testing::postgres_fresh();
    claim_next_takes_two_round_trips(store.as_mut());
}

/// A run with a limited key costs a claim one round trip more (its key's lock and count), and
/// only when the claim may reach it: keyed runs behind as many runs without a key as the
/// claim takes are not counted, and cost nothing.
#[cfg(feature = "postgres")]
#[test]
fn a_key_is_counted_only_when_a_claim_may_reach_it() {
    let (mut store, _schema) = crate::store::testing::postgres_fresh();
    let store = store.as_mut();
    for key in ["h", "k"] {
        queue::set_concurrency_limit(store, key, Some(5), T0).expect("limit");
    }
    // First in order, two runs of "h", claimed first to prepare every statement; then the
    // runs without a key; then those of "k".
    for (run, priority, key) in [
        ("hot0", 2, Some("h")),
        ("hot1", 2, Some("h")),
        ("free0", 1, None),
        ("free1", 1, None),
        ("free2", 1, None),
        ("free3", 1, None),
        ("keyed0", 0, Some("k")),
        ("keyed1", 0, Some("k")),
        ("keyed2", 0, Some("k")),
    ] {
        let mut q = queued(run);
        q.priority = priority;
        q.concurrency_key = key.map(str::to_owned);
        queue::reserve_run(store, &q, T0).expect("reserve_run");
    }
    next(store, 1, T0 + 20);
    next(store, 2, T0 + 20);
    let mut spent = Vec::new();
    for limit in [1, 2, 3] {
        let before = trips(store);
        let got: Vec<String> = next(store, limit, T0 + 20)
            .into_iter()
            .map(|c| c.run_id)
            .collect();
        spent.push((trips(store) - before, got));
    }
    assert_eq!(
        spent,
        [
            (2, vec!["free1".to_owned()]),
            (2, vec!["free2".to_owned(), "free3".to_owned()]),
            (
                3,
                vec![
                    "keyed0".to_owned(),
                    "keyed1".to_owned(),
                    "keyed2".to_owned()
                ]
            ),
        ]
    );
}

/// A claim of one run of any workflow is not planned again on every call: PostgreSQL plans
/// each statement with parameters for their values at first (custom plans), then keeps one
/// plan for the session once it is estimated no dearer (a generic plan); the keyed lane's read
/// never is, so it is sent without parameters (see `NEXT_KEYED_ONE_SQL`). So after 30 claims,
/// of runs with a limited key and runs without, no statement of the session has been planned
/// more than the five custom times.
#[cfg(feature = "postgres")]
#[test]
fn a_claim_of_one_run_is_not_planned_again_each_time() {
    const PLANS: Sql = Sql::same(
        "SELECT statement, custom_plans FROM pg_prepared_statements WHERE custom_plans > 5",
    );
    let (mut store, _schema) = crate::store::testing::postgres_fresh();
    let store = store.as_mut();
    queue::set_concurrency_limit(store, "k", Some(100), T0).expect("limit");
    for i in 0..40 {
        let mut q = queued(&format!("k{i:02}"));
        if i % 2 == 0 {
            q.concurrency_key = Some("k".to_owned());
        }
        queue::reserve_run(store, &q, T0).expect("reserve_run");
    }
    for _ in 0..30 {
        assert_eq!(next(store, 1, T0 + 20).len(), 1);
    }
    let replanned = store
        .read("reading the plans", |tx| {
            tx.rows(&PLANS, params![], |r| {
                Ok((r.get::<String>(0)?, r.get::<i64>(1)?))
            })
        })
        .expect("plans");
    assert!(
        replanned.is_empty(),
        "planned on every call: {replanned:#?}"
    );
}

/// Claimers that start together meet the same keys first: a key another claimer holds is
/// passed over in the round trip that locks the keys, not in one round trip each. Keys `a` and
/// `b` come first in claim order and are held by another session; the claim takes `c`'s run in
/// the round trips of a claim whose first key was free (read, lock and count, write).
#[cfg(feature = "postgres")]
#[test]
fn keys_held_by_other_claimers_are_passed_over_in_one_round_trip() {
    use crate::store::testing::postgres_url;
    use crate::store::{open, OpenOptions};

    const HOLD_KEYS: Sql = Sql::same(
        "SELECT concurrency_key FROM concurrency_limits
        WHERE concurrency_key IN ('a', 'b') FOR UPDATE",
    );
    let (mut store, schema) = crate::store::testing::postgres_fresh();
    let store = store.as_mut();
    let mut other = open(
        None,
        Some(&postgres_url()),
        Some(schema.schema()),
        &OpenOptions::default(),
        0,
    )
    .expect("a second session");
    for key in ["a", "b", "c"] {
        queue::set_concurrency_limit(store, key, Some(5), T0).expect("limit");
    }
    for (run, priority, key) in [
        ("warm0", 3, "c"),
        ("warm1", 3, "c"),
        ("a0", 2, "a"),
        ("b0", 1, "b"),
        ("c0", 0, "c"),
    ] {
        let mut q = queued(run);
        q.priority = priority;
        q.concurrency_key = Some(key.to_owned());
        queue::reserve_run(store, &q, T0).expect("reserve_run");
    }
    // The first claim prepares every statement; the next locks and counts its key in one trip.
    assert_eq!(next(store, 1, T0 + 20)[0].run_id, "warm0");
    let before = trips(store);
    assert_eq!(next(store, 1, T0 + 20)[0].run_id, "warm1");
    assert_eq!(trips(store) - before, 3, "read, lock and count, write");
    let (spent, got) = other
        .write("holding two keys", |tx| {
            let held = tx.rows(&HOLD_KEYS, params![], |r| r.get::<String>(0))?;
            assert_eq!(held.len(), 2);
            let before = trips(store);
            let got: Vec<String> = next(store, 1, T0 + 20)
                .into_iter()
                .map(|c| c.run_id)
                .collect();
            Ok((trips(store) - before, got))
        })
        .expect("held");
    assert_eq!(got, ["c0"], "a and b are held: their runs are passed over");
    assert_eq!(spent, 3, "read, lock and count (past a and b), write");
    // Released, the keys' runs are claimed in order again.
    let got: Vec<String> = next(store, 2, T0 + 20)
        .into_iter()
        .map(|c| c.run_id)
        .collect();
    assert_eq!(got, ["a0", "b0"]);
}

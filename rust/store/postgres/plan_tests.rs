//! The write path's statements on a fresh schema: tables that hold a few thousand rows but
//! have never been analyzed (autovacuum off for them, so none is analyzed midway). Each
//! statement must find its rows by key, not by a sequential scan whose cost grows with the
//! ledger, and not by `units_first_started`, which holds a run's units in reservation order and
//! so can only filter a run's units for one of them. And a session that planned its statements
//! while the tables were nearly empty must not keep those plans as the tables grow.

use super::sql;
use crate::attempts::{self, FinishSpec, UnitSpec};
use crate::conformance::{started, T0};
use crate::events;
use crate::leases::{self, ClaimSpec, Fence};
use crate::model::Reservation;
use crate::params;
use crate::store::testing::postgres_fresh;
use crate::store::{self as store_mod, Sql, Store, ToSql};

const LEASE_MS: i64 = 60_000;
/// Runs started, each claimed (one lease row each).
const RUNS: usize = 600;
/// Units reserved and finished on each of the first `UNIT_RUNS` runs.
const UNITS: usize = 1500;
const UNIT_RUNS: usize = 2;
const HOT: [&str; 5] = ["runs", "leases", "units", "attempts", "events"];

/// Autovacuum off for every table of the fresh schema: nothing analyzes them during the test.
fn never_analyze(store: &mut dyn Store) {
    store
        .write("keeping autovacuum away", |tx| {
            for table in HOT {
                let text = format!("ALTER TABLE {table} SET (autovacuum_enabled = false)");
                tx.execute_script(&text).map_err(|e| tx.fail(&e))?;
            }
            Ok(())
        })
        .expect("autovacuum off");
}

fn unit(unit_id: String) -> UnitSpec {
    UnitSpec {
        unit_id,
        step_id: "a".into(),
        phase: "unit".into(),
        ..UnitSpec::default()
    }
}

fn finishes(run_id: &str, got: &[Reservation]) -> Vec<FinishSpec> {
    got.iter()
        .map(|r| FinishSpec {
            run_id: run_id.into(),
            unit_id: r.unit_id.clone(),
            attempt: r.attempt,
            dispatch_id: r.dispatch_id.clone(),
            status: "completed".into(),
            ..FinishSpec::default()
        })
        .collect()
}

/// Reserve and finish `count` units of `run_id` named `{prefix}{i}`, `per_call` at a time
/// (one at a time takes the one-by-one statements, more the set-based ones).
fn cycle(store: &mut dyn Store, run_id: &str, prefix: &str, count: usize, per_call: usize) {
    for start in (0..count).step_by(per_call) {
        let units: Vec<UnitSpec> = (start..count.min(start + per_call))
            .map(|i| unit(format!("{prefix}{i}")))
            .collect();
        let got = attempts::reserve_attempts(store, run_id, &units, None, T0 + 1).expect("reserve");
        let done = attempts::finish_attempts(store, &finishes(run_id, &got), None, T0 + 2)
            .expect("finish");
        assert!(done.iter().all(|d| *d));
    }
}

/// The plan PostgreSQL makes for `text` with `params`, one line per node.
fn plan(store: &mut dyn Store, text: &str, params: &[&dyn ToSql]) -> String {
    let statement = Sql::native(Box::leak(text.to_owned().into_boxed_str()));
    crate::conformance::plans::plan(store, &statement, params)
}

/// How many rows `index` has read since the server started counting, as seen after this
/// session's own counts are flushed.
fn index_reads(store: &mut dyn Store, index: &str) -> i64 {
    let flush = Sql::native("SELECT pg_stat_force_next_flush()");
    store
        .read("flushing counts", |tx| {
            tx.rows(&flush, params![], |_| Ok(()))
        })
        .expect("flush");
    // The counts go out when the session goes idle after the transaction that asked.
    let reads = Sql::native(
        "SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
        WHERE schemaname = current_schema() AND indexrelname = ?1",
    );
    store
        .read("reading counts", |tx| {
            tx.row(&reads, params![index], |r| r.get(0))
        })
        .expect("counts")
        .expect("one row")
}

/// `RUNS` runs, each claimed, and `UNITS` units reserved and finished on each of the first
/// `UNIT_RUNS`, in batches and alone; the first run's fence. Nothing analyzed.
fn fill(store: &mut dyn Store) -> Fence {
    never_analyze(store);
    let spec = ClaimSpec::new("host-a".into(), LEASE_MS, Some("b".repeat(40)), "token").unwrap();
    let mut fence = None;
    for r in 0..RUNS {
        let run_id = format!("r{r}");
        started(store, &run_id);
        let claim = leases::claim(store, &run_id, &spec, T0).unwrap().unwrap();
        fence.get_or_insert_with(|| Fence::from_token(&run_id, claim.generation, &claim.token));
    }
    for r in 0..UNIT_RUNS {
        cycle(store, &format!("r{r}"), "u", UNITS, 250);
    }
    cycle(store, "r0", "one", 3, 1);
    let never: i64 = store
        .read("reading pg_class", |tx| {
            tx.row(
                &Sql::native(
                    "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace
                    AND relname = ANY(CAST(CAST(?1 AS TEXT) AS TEXT[])) AND reltuples < 0",
                ),
                params![format!("{{{}}}", HOT.join(","))],
                |r| r.get(0),
            )
        })
        .unwrap()
        .unwrap();
    assert_eq!(never, 5, "the test's tables are never analyzed");
    fence.expect("a claim")
}

/// Each statement's plan reads none of the `HOT` tables by a sequential scan, and no unit by
/// `units_first_started`.
fn assert_probes(store: &mut dyn Store, statements: &[(&str, &str, Vec<&dyn ToSql>)]) {
    let mut bad = Vec::new();
    for (name, text, params) in statements {
        let plan = plan(store, text, params);
        let scans = HOT
            .iter()
            .any(|t| plan.contains(&format!("Seq Scan on {t} ")));
        if scans || plan.contains("units_first_started") {
            bad.push(format!("{name}:\n{plan}"));
        }
    }
    assert!(
        bad.is_empty(),
        "plans that scan or filter:\n\n{}",
        bad.join("\n\n")
    );
}

#[test]
fn the_write_path_probes_by_key_on_a_fresh_schema() {
    let (mut store, _schema) = postgres_fresh();
    let store = store.as_mut();
    let fence = fill(store);
    let runs = r#"["r0","r1","r7","r599","gone"]"#.to_owned();
    let reclaims = r#"[{"run_id":"r0","unit_id":"u5","attempt":1,"times":1,"holder":"h",
        "generation":null,"trace_context":null}]"#
        .to_owned();
    let units = r#"[{"run_id":"r0","unit_id":"u5"},{"run_id":"r1","unit_id":"new"}]"#.to_owned();
    // One finish fails its attempt, so the plan includes reading the retry policy.
    let keys = r#"[{"attempt":1,"dispatch_id":"d1","run_id":"r0","unit_id":"u5","failing":true},
        {"attempt":1,"dispatch_id":"d2","run_id":"r1","unit_id":"u6","failing":false}]"#
        .to_owned();
    let beats = format!(
        r#"[{{"run_id":"r0","generation":{},"token_hash":"{}","heartbeat_at":1,"expires_at":2}}]"#,
        fence.generation, fence.token_hash
    );
    let read = format!(
        r#"[{{"run_id":"r0","status":"active","generation":{},"token_hash":"{}"}},
        {{"run_id":"r1","status":null,"generation":null,"token_hash":null}}]"#,
        fence.generation, fence.token_hash
    );
    let two = 2_i64;
    let statements: Vec<(&str, &str, Vec<&dyn ToSql>)> = vec![
        // A judgment's reads and writes of many keys (`store::postgres::rows`).
        ("GROUP_RUNS_SQL", sql::GROUP_RUNS_SQL, vec![&runs]),
        (
            "LATEST_ATTEMPTS_GROUP_SQL",
            sql::LATEST_ATTEMPTS_GROUP_SQL,
            vec![&units],
        ),
        (
            "RUNNING_ATTEMPTS_SQL",
            sql::RUNNING_ATTEMPTS_SQL,
            vec![&keys],
        ),
        (
            "RESERVE_GROUP_SQL",
            sql::RESERVE_GROUP_SQL,
            vec![&units, &two],
        ),
        ("FINISH_GROUP_SQL", sql::FINISH_GROUP_SQL, vec![&keys, &two]),
        (
            "HEARTBEAT_GROUP_SQL",
            sql::HEARTBEAT_GROUP_SQL,
            vec![&beats, &two],
        ),
        (
            "RECLAIM_GROUP_SQL",
            sql::RECLAIM_GROUP_SQL,
            vec![&reclaims, &two],
        ),
        (
            "LOCK_RUNS_AS_READ_SQL",
            sql::LOCK_RUNS_AS_READ_SQL,
            vec![&read, &two],
        ),
    ];
    assert_probes(store, &statements);
}

#[test]
fn the_one_key_statements_probe_by_key_on_a_fresh_schema() {
    let (mut store, _schema) = postgres_fresh();
    let store = store.as_mut();
    let fence = fill(store);
    let none: Option<String> = None;
    let no_time: Option<i64> = None;
    // A judgment of one key per part, and what a call alone reads besides.
    let statements: Vec<(&str, &str, Vec<&dyn ToSql>)> = vec![
        ("LOCK_RUN_SQL", sql::LOCK_RUN_SQL, vec![&"r0"]),
        (
            "RUN_STATUS_SQL",
            store_mod::sql::RUN_STATUS_SQL.postgres,
            vec![&"r0"],
        ),
        ("FENCE_SQL", store_mod::sql::FENCE_SQL.postgres, vec![&"r0"]),
        (
            "SNAPSHOT_RUN_SQL",
            store_mod::sql::SNAPSHOT_RUN_SQL.postgres,
            vec![&"r0"],
        ),
        (
            "SNAPSHOT_LATEST_SQL",
            store_mod::sql::SNAPSHOT_LATEST_SQL.postgres,
            vec![&"r0", &"u5"],
        ),
        (
            "SNAPSHOT_RUNNING_SQL",
            store_mod::sql::SNAPSHOT_RUNNING_SQL.postgres,
            vec![&"r0", &"u5", &1_i64, &"d"],
        ),
        (
            "SNAPSHOT_RUNNING_POLICY_SQL",
            store_mod::sql::SNAPSHOT_RUNNING_POLICY_SQL.postgres,
            vec![&"r0", &"u5", &1_i64, &"d"],
        ),
        (
            "RECLAIM_ATTEMPT_SQL",
            store_mod::sql::RECLAIM_ATTEMPT_SQL.postgres,
            vec![&"r0", &"u5", &1_i64, &none, &none, &none, &1_i64, &0_i64],
        ),
        (
            "LOCK_RUN_AS_READ_SQL",
            sql::LOCK_RUN_AS_READ_SQL,
            vec![&"r0", &"active", &1_i64, &"h"],
        ),
        (
            "FINISH_ATTEMPT_SQL",
            store_mod::sql::FINISH_ATTEMPT_SQL.postgres,
            vec![
                &"r0",
                &"u5",
                &1_i64,
                &"d",
                &"completed",
                &none,
                &none,
                &none,
                &none,
                &T0,
            ],
        ),
        (
            "FINISH_ATTEMPT_UNIT_SQL",
            store_mod::sql::FINISH_ATTEMPT_UNIT_SQL.postgres,
            vec![
                &"r0",
                &"u5",
                &1_i64,
                &"completed",
                &none,
                &none,
                &none,
                &none,
                &T0,
                &no_time,
            ],
        ),
        (
            "INSERT_EVENT_SQL",
            store_mod::sql::INSERT_EVENT_SQL.postgres,
            vec![&"r0", &"test.a", &none, &none, &none, &"{}", &none, &T0],
        ),
        (
            "HEARTBEAT_SQL",
            store_mod::sql::HEARTBEAT_SQL.postgres,
            vec![&"r0", &T0, &(T0 + 1), &fence.generation, &fence.token_hash],
        ),
    ];
    assert_probes(store, &statements);
}

#[test]
fn a_session_plans_again_as_a_fresh_schema_grows() {
    let (mut store, _schema) = postgres_fresh();
    let store = store.as_mut();
    never_analyze(store);
    started(store, "r");
    // Enough calls alone for every statement to settle on a plan made on nearly empty tables.
    cycle(store, "r", "early", 8, 1);
    cycle(store, "r", "u", 3000, 100);
    let before = index_reads(store, "units_first_started");
    cycle(store, "r", "late", 20, 1);
    let read = index_reads(store, "units_first_started") - before;
    // 20 reservations and finishes, each a lookup of one unit (a foreign-key check and an
    // update): by that index, each walks the run's 3 000 units.
    assert!(
        read < 1000,
        "the unit lookups read {read} rows of units_first_started"
    );
}

/// The retry reads and the event pages are planned once for the session, not for each call's
/// values: PostgreSQL plans a prepared statement for its values at first, and keeps doing so
/// while that is estimated cheaper, which with a `LIMIT` it cannot see it always is on a large
/// table (at a million units, 0.055 ms of planning on every due read of 0.06 ms).
#[test]
fn the_retry_reads_and_event_pages_are_planned_once() {
    let (mut store, _schema) = postgres_fresh();
    let store = store.as_mut();
    started(store, "r0");
    let rare = ["run.started".to_owned()];
    for _ in 0..8 {
        attempts::due_units(store, None, 10, None, T0).expect("due");
        attempts::due_units(store, Some("r0"), 10, None, T0).expect("due of a run");
        attempts::exhausted_units(store, None, 10, None).expect("exhausted");
        attempts::exhausted_units(store, Some("r0"), 10, None).expect("exhausted of a run");
        events::read(store, Some("r0"), 0, 10, None).expect("a run's events");
        events::read(store, None, 0, 10, None).expect("the log");
        events::read(store, None, 0, 10, Some(&rare)).expect("a rare type");
    }
    let plans = Sql::native(
        "SELECT statement, custom_plans, generic_plans FROM pg_prepared_statements
        WHERE (statement LIKE '%retry_at <=%' OR statement LIKE '%status = ''exhausted''%'
               OR statement LIKE '%FROM events%ORDER BY%')
          AND statement NOT LIKE '%pg_prepared_statements%'",
    );
    let counts: Vec<(String, i64, i64)> = store
        .read("reading plans", |tx| {
            tx.rows(&plans, params![], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        })
        .expect("plans");
    assert_eq!(counts.len(), 7, "the seven reads' statements: {counts:?}");
    for (statement, custom, generic) in counts {
        assert_eq!(
            (custom, generic),
            (0, 8),
            "planned for its values {custom} times, once for the session {generic}: {statement}"
        );
    }
}

//! The pages an operator or a dashboard repeats — runs by status, newest first; a run's units in
//! order; the live leases — read exactly their rows by an index (checked with the backend's
//! planner, as in `plans`), and paging by cursor returns every row once, in order.

use super::plans::{analyze, many_runs, plan};
use super::{started, T0};
use crate::attempts::{self, UnitFilter};
use crate::errors::LedgerError;
use crate::leases;
use crate::params;
use crate::runs::{self, RunCursor, RunFilter};
use crate::status::{RunStatus, UnitStatus};
use crate::store::{sql, Sql, Store};

conformance!(
    run_pages_are_read_by_index,
    run_pages_follow_the_cursor,
    run_pages_filter_by_name_and_time,
    unit_pages_are_read_by_index,
    unit_pages_follow_the_cursor,
    live_leases_are_read_by_index,
    next_queued_runs_are_read_by_index,
    scheduling_is_read_by_index,
    unit_retries_are_read_by_index,
    a_childs_end_probes_for_live_siblings,
    messages_are_read_by_index,
    due_schedules_are_read_by_index,
    a_page_of_units_attempts_is_read_by_index,
    a_page_of_runs_leases_is_read_by_index,
    runs_are_counted_by_index_up_to_a_bound
);

/// `p0` and 3 000 more runs (see [`many_runs`]).
fn fill_runs(store: &mut dyn Store) {
    started(store, "p0");
    many_runs(store);
}

fn run_pages_are_read_by_index(store: &mut dyn Store) {
    fill_runs(store);
    let refs: Option<String> = None;
    let none: Option<String> = None;
    let cursor = (200_i64, 1400_i64, "m1400");
    let floor = i64::MIN;
    let all = plan(
        store,
        &sql::LIST_RUNS_SQL,
        params![1_i64, none, refs, 1_i64, cursor.0, cursor.1, cursor.2, 50_i64, floor],
    );
    assert!(all.contains("runs_recent"), "a page by runs_recent:\n{all}");
    let one = plan(
        store,
        &sql::LIST_RUNS_OF_STATUS_SQL,
        params![1_i64, none, refs, 0_i64, cursor.0, cursor.1, cursor.2, 50_i64, floor, "failed"],
    );
    assert!(
        one.contains("runs_status_recent"),
        "a status's page by runs_status_recent:\n{one}"
    );
    // A time range bounds the same ranges at both ends.
    let window = plan(
        store,
        &sql::LIST_RUNS_SQL,
        params![1_i64, none, refs, 1_i64, cursor.0, cursor.1, cursor.2, 50_i64, 100_i64],
    );
    assert!(
        window.contains("runs_recent"),
        "a range of runs_recent:\n{window}"
    );
    name_runs(store);
    let named = plan(
        store,
        &sql::LIST_RUNS_OF_NAME_SQL,
        params![
            1_i64, none, refs, 1_i64, cursor.0, cursor.1, cursor.2, 50_i64, floor, "active", "rare"
        ],
    );
    assert!(
        named.contains("runs_name_status_recent"),
        "a name's page by runs_name_status_recent:\n{named}"
    );
    for p in [&all, &one, &window, &named] {
        // No scan of the runs. SQLite walks the index in page order from the cursor, with no
        // sort; PostgreSQL may instead fetch a rare status's few rows by the same index and
        // sort them, which its costs prefer only when they are few.
        assert!(
            !p.contains("SCAN r") && !p.contains("Seq Scan on runs"),
            "no scan of the runs:\n{p}"
        );
        assert!(
            !p.contains("TEMP B-TREE"),
            "the page comes in index order, unsorted:\n{p}"
        );
    }
}

fn run_pages_filter_by_name_and_time(store: &mut dyn Store) {
    fill_runs(store);
    let every = every_run();
    let everything = runs::list_runs(store, &every).expect("all runs");
    // A time range: runs updated in [100, 300), with and without statuses.
    let window = RunFilter {
        updated_after: Some(100),
        updated_before: Some(300),
        ..every.clone()
    };
    let inside = |r: &crate::model::Run| (100..300).contains(&r.updated_at);
    assert_eq!(all_pages(store, &window, 50), ids(&everything, &inside));
    let failed_inside = RunFilter {
        statuses: Some(vec!["failed".into(), "completed".into()]),
        ..window.clone()
    };
    assert_eq!(
        all_pages(store, &failed_inside, 7),
        ids(&everything, &|r| inside(r) && r.status != RunStatus::Active)
    );
    // A cursor above the range's end starts at the end; below it, at the cursor.
    let mut from_cursor = window.clone();
    from_cursor.after = Some(RunCursor {
        updated_at: 200,
        created_at: 0,
        run_id: String::new(),
    });
    assert_eq!(
        all_pages(store, &from_cursor, 50),
        ids(&everything, &|r| (100..200).contains(&r.updated_at))
    );
    // A workflow name, alone (every status's range, merged) and with statuses and a range.
    name_runs(store);
    let everything = runs::list_runs(store, &every).expect("all runs, named");
    let w3 = RunFilter {
        workflow_name: Some("w3".into()),
        ..every.clone()
    };
    let want = ids(&everything, &|r| r.workflow_name == "w3");
    assert!(want.len() > 500, "{}", want.len());
    assert_eq!(all_pages(store, &w3, 61), want);
    let rare = RunFilter {
        workflow_name: Some("rare".into()),
        ..every.clone()
    };
    assert_eq!(
        all_pages(store, &rare, 9),
        ids(&everything, &|r| r.workflow_name == "rare")
    );
    let w3_ended = RunFilter {
        statuses: Some(vec!["completed".into(), "failed".into()]),
        updated_after: Some(50),
        ..w3.clone()
    };
    assert_eq!(
        all_pages(store, &w3_ended, 3),
        ids(&everything, &|r| r.workflow_name == "w3"
            && r.status != RunStatus::Active
            && r.updated_at >= 50)
    );
    let nobody = RunFilter {
        workflow_name: Some("nobody".into()),
        ..every.clone()
    };
    assert!(runs::list_runs(store, &nobody).expect("none").is_empty());
}

/// Gives the runs of [`many_runs`] workflow names by creation: one in 50 is `rare`, the rest
/// `w0` to `w3`; then `ANALYZE`.
fn name_runs(store: &mut dyn Store) {
    let names = Sql::same(
        "UPDATE runs SET workflow_name = CASE WHEN created_at % 50 = 0 THEN 'rare'
            ELSE 'w' || CAST(created_at % 4 AS TEXT) END
        WHERE run_id <> 'p0'",
    );
    store
        .write("naming runs", |tx| tx.exec(&names, params![]).map(|_| ()))
        .expect("name runs");
    analyze(store);
}

/// Every run, of every scope, children included.
fn every_run() -> RunFilter {
    RunFilter {
        all_scopes: true,
        include_children: true,
        ..RunFilter::default()
    }
}

/// The ids of the `runs` that `keep` keeps, in order.
fn ids(runs: &[crate::model::Run], keep: &dyn Fn(&crate::model::Run) -> bool) -> Vec<String> {
    runs.iter()
        .filter(|r| keep(r))
        .map(|r| r.run_id.clone())
        .collect()
}

/// Every page of `filter`, following the cursor, concatenated.
fn all_pages(store: &mut dyn Store, filter: &RunFilter, size: i64) -> Vec<String> {
    let mut filter = RunFilter {
        limit: Some(size),
        ..filter.clone()
    };
    let mut ids = Vec::new();
    loop {
        let page = runs::list_runs(store, &filter).expect("page");
        assert!(page.len() <= usize::try_from(size).unwrap());
        let Some(last) = page.last() else { break };
        filter.after = Some(RunCursor {
            updated_at: last.updated_at,
            created_at: last.created_at,
            run_id: last.run_id.clone(),
        });
        ids.extend(page.into_iter().map(|r| r.run_id));
    }
    ids
}

fn run_pages_follow_the_cursor(store: &mut dyn Store) {
    fill_runs(store);
    let every = every_run();
    let everything = runs::list_runs(store, &every).expect("all runs");
    assert_eq!(everything.len(), 3001);
    // Newest first, run ids bytewise among runs updated and created together.
    assert!(everything.windows(2).all(|w| {
        (w[0].updated_at, w[0].created_at, w[0].run_id.as_bytes())
            > (w[1].updated_at, w[1].created_at, w[1].run_id.as_bytes())
    }));
    assert_eq!(all_pages(store, &every, 97), ids(&everything, &|_| true));
    // Several statuses: one range each, merged into one order, paged across the seams.
    let ended = RunFilter {
        statuses: Some(vec!["failed".into(), "completed".into(), "failed".into()]),
        ..every.clone()
    };
    assert_eq!(
        all_pages(store, &ended, 13),
        ids(&everything, &|r| r.status == RunStatus::Failed
            || r.status == RunStatus::Completed)
    );
    // Top-level failed runs only: the filters hold on the walked rows.
    let failed = RunFilter {
        statuses: Some(vec!["failed".into()]),
        ..RunFilter::default()
    };
    let all_scopes = RunFilter {
        all_scopes: true,
        ..failed
    };
    assert_eq!(
        all_pages(store, &all_scopes, 4),
        ids(&everything, &|r| r.status == RunStatus::Failed
            && r.parent_run_id.is_none())
    );
    // active_only with statuses: both must hold.
    let neither = RunFilter {
        active_only: true,
        statuses: Some(vec!["completed".into()]),
        ..every.clone()
    };
    assert!(runs::list_runs(store, &neither).expect("none").is_empty());
    let active = RunFilter {
        active_only: true,
        limit: Some(5),
        ..every.clone()
    };
    let page = runs::list_runs(store, &active).expect("active");
    assert_eq!(page.len(), 5);
    assert!(page.iter().all(|r| r.status == RunStatus::Active));
    for (filter, argument) in [
        (
            RunFilter {
                statuses: Some(vec!["done".into()]),
                ..every.clone()
            },
            "status",
        ),
        (
            RunFilter {
                limit: Some(0),
                ..every.clone()
            },
            "limit",
        ),
        (
            RunFilter {
                limit: Some(10_001),
                ..every.clone()
            },
            "limit",
        ),
        (
            RunFilter {
                updated_after: Some(300),
                updated_before: Some(300),
                ..every
            },
            "updated_before",
        ),
    ] {
        match runs::list_runs(store, &filter) {
            Err(LedgerError::InvalidArgument { argument: a, .. }) => assert_eq!(a, argument),
            other => panic!("expected InvalidArgument({argument}), got {other:?}"),
        }
    }
}

const UNITS: i64 = 500;

/// 12 runs of `UNITS` units each, made by SQL: first reserved in pairs (ties broken by the unit
/// id), one in five failed. Then `ANALYZE`.
fn fill_units(store: &mut dyn Store) {
    for r in 0..12 {
        started(store, &format!("u{r}"));
    }
    let many = Sql::same(
        "INSERT INTO units (run_id, unit_id, phase, status, attempts, first_started_at,
            started_at)
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 5999)
        SELECT 'u' || CAST(i % 12 AS TEXT), 'x' || CAST(i AS TEXT), 'unit',
            CASE WHEN i % 5 = 0 THEN 'failed' ELSE 'completed' END, 1, i / 24, i / 24
        FROM n",
    );
    store
        .write("filling units", |tx| tx.exec(&many, params![]).map(|_| ()))
        .expect("fill units");
    analyze(store);
}

fn unit_pages_are_read_by_index(store: &mut dyn Store) {
    fill_units(store);
    let none: Option<String> = None;
    let page = plan(
        store,
        &sql::LIST_UNITS_SQL,
        params!["u3", 40_i64, "x963", none, none, 100_i64],
    );
    assert!(
        page.contains("units_first_started"),
        "a run's units by units_first_started:\n{page}"
    );
    assert!(
        !page.contains("TEMP B-TREE"),
        "the page comes in index order, unsorted:\n{page}"
    );
    // A status off the usual path is a range of its own index. Running and completed units
    // are not indexed by status (every reserve and finish would write that index): a page of
    // them walks the run's units in order, checking each, as `page` does above.
    let failed = plan(
        store,
        &sql::LIST_UNITS_OF_STATUS_SQL,
        params!["u3", 40_i64, "x963", none, "failed", 100_i64],
    );
    assert!(
        failed.contains("units_by_status"),
        "a run's failed units by units_by_status:\n{failed}"
    );
    // SQLite walks it in page order; PostgreSQL may fetch a few rows by it and sort them,
    // which its costs prefer only when they are few.
    assert!(
        !failed.contains("TEMP B-TREE"),
        "the page comes in index order, unsorted:\n{failed}"
    );
    let mut statuses: Vec<_> = sql::OFF_PATH.to_vec();
    statuses.extend([UnitStatus::Running, UnitStatus::Completed]);
    statuses.sort_by_key(|s| s.as_str());
    let mut all = UnitStatus::ALL.to_vec();
    all.sort_by_key(|s| s.as_str());
    assert_eq!(
        statuses, all,
        "OFF_PATH is every status but running and completed"
    );
    let counts = plan(store, &sql::UNIT_COUNTS_SQL, params!["u3"]);
    for p in [&page, &counts, &failed] {
        assert!(
            !p.contains("SCAN units") && !p.contains("Seq Scan on units"),
            "only the run's own units are read:\n{p}"
        );
    }
}

fn unit_pages_follow_the_cursor(store: &mut dyn Store) {
    fill_units(store);
    let everything = attempts::units(store, &UnitFilter::of("u3")).expect("units");
    assert_eq!(everything.len(), usize::try_from(UNITS).unwrap());
    let mut seen = Vec::new();
    let mut filter = UnitFilter {
        limit: Some(7),
        ..UnitFilter::of("u3")
    };
    loop {
        let page = attempts::units(store, &filter).expect("page");
        let Some(last) = page.last() else { break };
        filter.after = Some(last.unit_id.clone());
        seen.extend(page.into_iter().map(|u| u.unit_id));
    }
    let want: Vec<_> = everything.iter().map(|u| u.unit_id.clone()).collect();
    assert_eq!(seen, want);
    // A status filter keeps the order and the cursor.
    let failed = UnitFilter {
        status: Some("failed".into()),
        after: Some(want[10].clone()),
        ..UnitFilter::of("u3")
    };
    let got: Vec<_> = attempts::units(store, &failed)
        .expect("failed")
        .into_iter()
        .map(|u| u.unit_id)
        .collect();
    let expect: Vec<_> = everything[11..]
        .iter()
        .filter(|u| u.status == UnitStatus::Failed)
        .map(|u| u.unit_id.clone())
        .collect();
    assert_eq!(got, expect);
    // The counts, by the database, agree with the units.
    let counts = attempts::unit_counts(store, "u3").expect("counts");
    let failed_n = everything
        .iter()
        .filter(|u| u.status == UnitStatus::Failed)
        .count();
    assert_eq!(
        counts,
        vec![
            (
                UnitStatus::Completed,
                i64::try_from(500 - failed_n).unwrap()
            ),
            (UnitStatus::Failed, i64::try_from(failed_n).unwrap()),
        ]
    );
    match attempts::unit_counts(store, "nope") {
        Err(LedgerError::RunNotFound { .. }) => {}
        other => panic!("expected RunNotFound, got {other:?}"),
    }
    let refused = [
        (
            UnitFilter {
                after: Some("x4".into()),
                ..UnitFilter::of("u3")
            },
            "after",
        ),
        (
            UnitFilter {
                status: Some("done".into()),
                ..UnitFilter::of("u3")
            },
            "status",
        ),
        (
            UnitFilter {
                limit: Some(0),
                ..UnitFilter::of("u3")
            },
            "limit",
        ),
    ];
    for (filter, argument) in refused {
        match attempts::units(store, &filter) {
            Err(LedgerError::InvalidArgument { argument: a, .. }) => assert_eq!(a, argument),
            other => panic!("expected InvalidArgument({argument}), got {other:?}"),
        }
    }
}

fn live_leases_are_read_by_index(store: &mut dyn Store) {
    fill_runs(store);
    let owners = Sql::same(
        "INSERT INTO leases (resource_id, generation, owner_type, owner_id, token_hash,
            acquired_at, heartbeat_at, expires_at)
        SELECT run_id, 1,
            CASE WHEN updated_at % 20 = 0 THEN 'host' END,
            CASE WHEN updated_at % 20 = 0 THEN 'h' END,
            CASE WHEN updated_at % 20 = 0 THEN 't' END,
            CASE WHEN updated_at % 20 = 0 THEN updated_at END,
            CASE WHEN updated_at % 20 = 0 THEN updated_at END,
            CASE WHEN updated_at % 20 = 0 THEN updated_at + 1000 END
        FROM runs WHERE run_id <> 'p0'",
    );
    store
        .write("leasing", |tx| tx.exec(&owners, params![]).map(|_| ()))
        .expect("leases");
    analyze(store);
    let owned = plan(store, &sql::OWNED_LEASES_SQL, params![]);
    assert!(
        owned.contains("leases_expires") && !owned.contains("Seq Scan on leases"),
        "the owned leases by the partial leases_expires index:\n{owned}"
    );
    let expired = plan(store, &sql::EXPIRED_LEASES_SQL, params![T0, 1_i64]);
    assert!(
        expired.contains("leases_expires") && !expired.contains("Seq Scan on leases"),
        "expired leases by leases_expires:\n{expired}"
    );
    // Every run's lease in one read, in list_runs' order; p0 was never claimed.
    let all = leases::leases(store, false).expect("all");
    let every = RunFilter {
        all_scopes: true,
        include_children: true,
        ..RunFilter::default()
    };
    let everything = runs::list_runs(store, &every).expect("runs");
    let order: Vec<_> = all.iter().map(|l| l.run_id.as_str()).collect();
    let want: Vec<_> = everything.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(order, want);
    let never = all.iter().find(|l| l.run_id == "p0").expect("p0");
    assert_eq!((never.generation, never.owner_id.as_deref()), (0, None));
    // The owned ones, soonest to expire first.
    let live = leases::leases(store, true).expect("owned");
    let mut owned: Vec<_> = all
        .iter()
        .filter(|l| l.owner_id.is_some())
        .cloned()
        .collect();
    owned.sort_by(|a, b| (a.expires_at, &a.run_id).cmp(&(b.expires_at, &b.run_id)));
    assert!(!live.is_empty());
    assert_eq!(live, owned);
    // Expired on active runs: the owned ones whose run is active (some are not).
    let active: Vec<_> = owned
        .iter()
        .filter(|l| {
            everything
                .iter()
                .any(|r| r.run_id == l.run_id && r.status == RunStatus::Active)
        })
        .cloned()
        .collect();
    assert!(active.len() < owned.len());
    assert_eq!(
        leases::expired_leases(store, T0, true).expect("expired"),
        active
    );
}

/// `claim_next`'s read walks the index of due queued runs alone, in claim order, and reads each
/// one's lease by its key; moving the runs that have come due reads only those: however many
/// runs have moved on or wait for a later time, finding the next one costs the same.
fn next_queued_runs_are_read_by_index(store: &mut dyn Store) {
    fill_runs(store);
    // A queued run in three of every four is due, and the rest wait for a later time.
    let queue = Sql::same(
        "UPDATE runs SET status = 'queued', due_at = created_at,
            priority = created_at % 7 - 3,
            queue_lane = CASE WHEN created_at % 200 = 0 THEN 'later' ELSE 'due' END
        WHERE completed_at IS NULL AND created_at % 50 = 0",
    );
    // Every run has its lease row, as `reserve_run` leaves it.
    let lease = Sql::same(
        "INSERT INTO leases(resource_id, generation) SELECT run_id, 0 FROM runs WHERE true
        ON CONFLICT DO NOTHING",
    );
    store
        .write("queueing", |tx| {
            tx.exec(&queue, params![])?;
            tx.exec(&lease, params![]).map(|_| ())
        })
        .expect("queue");
    analyze(store);
    let none: Option<String> = None;
    let next = plan(store, &sql::NEXT_QUEUED_SQL, params![none, 10_i64]);
    assert!(
        next.contains("runs_lane_due"),
        "the next queued runs by runs_lane_due:\n{next}"
    );
    // Walking the whole partial index is the point (it holds the due queued runs only); a walk
    // of the table or of another index is not.
    let walks = next.lines().any(|l| {
        (l.contains("SCAN runs") && !l.contains("runs_lane_due"))
            || l.contains("SCAN l ")
            || l.contains("SCAN leases")
            || l.contains("Seq Scan")
    });
    assert!(!walks, "no scan of the runs or the leases:\n{next}");
    // PostgreSQL sorts the claimed runs (at most `limit`) after the CTE that locks them; the
    // backlog inside it is read in the index's order.
    let backlog = next.split("CTE q").nth(1).unwrap_or(&next);
    let backlog = backlog.split("Nested Loop").next().unwrap_or(backlog);
    assert!(
        !next.contains("TEMP B-TREE") && !backlog.contains("Sort"),
        "in the index's order, unsorted:\n{next}"
    );
    let promote = plan(store, &sql::PROMOTE_DUE_SQL, params![T0]);
    assert!(
        promote.contains("runs_lane_later"),
        "the runs come due by runs_lane_later:\n{promote}"
    );
    let walks = promote.lines().any(|l| {
        (l.contains("SCAN runs") && !l.contains("runs_lane_later"))
            || l.contains("Seq Scan on runs")
    });
    assert!(!walks, "no scan of the runs:\n{promote}");
    // The dashboard's pages of the queue, deep in the lane as well as at its head, and its
    // counts: each a range of its lane's index, with nothing but the page itself sorted.
    let deep = (1_i64, 1000_i64, "m1000");
    for (what, statement, args, index) in [
        (
            "the due lane's first page",
            &sql::QUEUED_DUE_SQL,
            params![1001_i64, i64::MIN, "", 50_i64],
            "runs_lane_due",
        ),
        (
            "a page deep in the due lane",
            &sql::QUEUED_DUE_SQL,
            params![deep.0, deep.1, deep.2, 50_i64],
            "runs_lane_due",
        ),
        (
            "a page of the later lane",
            &sql::QUEUED_LATER_SQL,
            params![deep.1, deep.2, 50_i64],
            "runs_lane_later",
        ),
        (
            "the counts",
            &sql::QUEUE_COUNTS_SQL,
            params![10_000_i64],
            "runs_lane_due",
        ),
    ] {
        let p = plan(store, statement, args);
        assert!(p.contains(index), "{what}: by {index}:\n{p}");
        let walks = p.lines().any(|l| {
            (l.contains("SCAN runs") && !l.contains("runs_lane_"))
                || l.contains("SCAN r ")
                || l.trim_end().ends_with("SCAN r")
                || l.contains("Seq Scan on runs")
        });
        assert!(!walks, "{what}: no scan of the runs:\n{p}");
    }
}

/// [`fill_runs`], then 50 keys with limits over them: queued runs (one in 50) in the keyed
/// lane, the others live or (most) ended.
fn keyed_runs(store: &mut dyn Store) {
    fill_runs(store);
    // Every run gets one of 50 keys; queued runs (one in 50) are in the keyed lane, and the
    // other runs of those keys are live or ended.
    let keyed = Sql::same(
        "UPDATE runs SET concurrency_key = 'k' || CAST(created_at % 50 AS TEXT),
            workflow_name = 'wf' || CAST(created_at % 9 AS TEXT), due_at = created_at,
            status = CASE WHEN completed_at IS NULL AND created_at % 50 = 0 THEN 'queued'
                          ELSE status END,
            queue_lane = CASE WHEN completed_at IS NULL AND created_at % 50 = 0 THEN 'keyed' END
        WHERE run_id <> 'p0'",
    );
    let limits = Sql::same(
        "INSERT INTO concurrency_limits(concurrency_key, max_live, updated_at)
        SELECT DISTINCT concurrency_key, 3, 0 FROM runs WHERE concurrency_key IS NOT NULL",
    );
    let lease = Sql::same(
        "INSERT INTO leases(resource_id, generation, owner_type, owner_id, token_hash,
            acquired_at, heartbeat_at, expires_at)
        SELECT run_id, 1, 'host', 'h', 'x', 0, 0, ?1 + created_at FROM runs WHERE true
        ON CONFLICT DO NOTHING",
    );
    // Most runs have ended, as in any ledger that has run for a while (their leases still name
    // their last owners); the trigger on runs marks those leases.
    let ended = Sql::same(
        "UPDATE runs SET status = 'completed', completed_at = created_at
        WHERE status = 'active' AND created_at % 5 <> 0 AND run_id <> 'p0'",
    );
    store
        .write("keying", |tx| {
            tx.exec(&keyed, params![])?;
            tx.exec(&limits, params![])?;
            tx.exec(&lease, params![T0])?;
            tx.exec(&ended, params![]).map(|_| ())
        })
        .expect("key");
}

/// Key limits and paused workflows are served by their indexes: the keyed lane per limited
/// key, a key's live count by `runs_key_live`, and moving a key's or a workflow's queued runs
/// between lanes by `runs_queued_key` and `runs_queued_name`, whatever the rest of the runs.
fn scheduling_is_read_by_index(store: &mut dyn Store) {
    keyed_runs(store);
    analyze(store);
    let scans_runs = |p: &str| {
        p.lines().any(|l| {
            l.contains("SCAN r ")
                || l.trim_end().ends_with("SCAN r")
                || l.contains("SCAN k")
                || l.contains("SCAN runs")
                || l.contains("Seq Scan on runs")
        })
    };
    let none: Option<String> = None;
    for (statement, args) in [
        (&sql::NEXT_KEYED_SQL, params![none, 10_i64]),
        (&sql::NEXT_KEYED_ONE_SQL, params![]),
    ] {
        let next = plan(store, statement, args);
        assert!(
            next.contains("runs_lane_keyed"),
            "by runs_lane_keyed:\n{next}"
        );
        assert!(!scans_runs(&next), "no scan of the runs:\n{next}");
    }
    // A third of the live runs' leases have expired by then.
    let rescue = plan(store, &sql::RESCUABLE_SQL, params![none, T0 + 333]);
    assert!(
        rescue.contains("leases_rescue"),
        "by leases_rescue:\n{rescue}"
    );
    assert!(
        !scans_runs(&rescue)
            && !rescue.contains("SCAN l")
            && !rescue.contains("Seq Scan on leases"),
        "no scan of the runs or the leases:\n{rescue}"
    );
    let keys = r#"["k1","k2"]"#;
    let room = plan(store, &sql::KEY_ROOM_SQL, params![keys, T0]);
    assert!(room.contains("runs_key_live"), "by runs_key_live:\n{room}");
    assert!(!scans_runs(&room), "no scan of the runs:\n{room}");
    for (what, statement, args) in [
        (
            "a key's lane",
            &sql::KEY_LANE_SQL,
            params!["k1", "due", "keyed"],
        ),
        ("pausing", &sql::PAUSE_LANE_SQL, params!["wf1"]),
        ("resuming", &sql::RESUME_LANE_SQL, params!["wf1"]),
    ] {
        let p = plan(store, statement, args);
        assert!(!scans_runs(&p), "{what}: no scan of the runs:\n{p}");
    }
    // The dashboard's view of the keys and the paused workflows: per key its live runs by
    // `runs_key_live` and its queued ones by `runs_queued_key`; per workflow by
    // `runs_queued_name`.
    let usage = plan(
        store,
        &sql::KEY_USAGE_SQL,
        params![10_000_i64, T0, "", 100_i64],
    );
    for index in ["runs_key_live", "runs_queued_key"] {
        assert!(usage.contains(index), "by {index}:\n{usage}");
    }
    assert!(!scans_runs(&usage), "no scan of the runs:\n{usage}");
    let paused =
        Sql::same("INSERT INTO paused_workflows(workflow_name, paused_at) VALUES ('wf1', 0)");
    store
        .write("pausing", |tx| tx.exec(&paused, params![]).map(|_| ()))
        .expect("pause");
    let held = plan(
        store,
        &sql::PAUSED_USAGE_SQL,
        params![10_000_i64, "", 100_i64],
    );
    assert!(
        held.contains("runs_queued_name"),
        "by runs_queued_name:\n{held}"
    );
    assert!(!scans_runs(&held), "no scan of the runs:\n{held}");
}

/// `due_units` and `exhausted_units`, across the ledger and of one run, head and deep pages:
/// each a range of its own index (which holds the waiting or the exhausted units and nothing
/// else), in the index's order, however many other units there are.
fn unit_retries_are_read_by_index(store: &mut dyn Store) {
    for r in 0..12 {
        started(store, &format!("u{r}"));
    }
    // 60 000 units: one in five waits for a retry (due at its number), one in fifty is
    // exhausted, the rest completed. A page is smaller than what it pages through (a run has
    // 100 exhausted units, and its page is 10): a read whose whole answer fits one page may
    // rightly be fetched whole and sorted.
    let many = Sql::same(
        "INSERT INTO units (run_id, unit_id, phase, status, attempts, first_started_at,
            started_at, retry_at)
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 59999)
        SELECT 'u' || CAST(i % 12 AS TEXT), 'x' || CAST(i AS TEXT), 'unit',
            CASE WHEN i % 5 = 0 THEN 'failed' WHEN i % 50 = 1 THEN 'exhausted'
                 ELSE 'completed' END,
            1, i, i, CASE WHEN i % 5 = 0 THEN i END
        FROM n",
    );
    store
        .write("filling units", |tx| tx.exec(&many, params![]).map(|_| ()))
        .expect("fill units");
    analyze(store);
    let min = i64::MIN;
    // PostgreSQL may fetch a run's due units by the run's own index and sort them when it
    // estimates them fewer than a page (it estimates a row-value bound poorly): that costs the
    // run's waiting units, never the ledger's. Every other read is walked in its index's order.
    for (what, statement, args, index) in [
        (
            "the due units' first page",
            &sql::DUE_UNITS_SQL,
            params![30_000_i64, min, "", "", 100_i64],
            "units_retry_due",
        ),
        (
            "a page deep in the due units",
            &sql::DUE_UNITS_SQL,
            params![60_000_i64, 20_000_i64, "u8", "x20000", 100_i64],
            "units_retry_due",
        ),
        (
            "a run's due units",
            &sql::DUE_UNITS_RUN_SQL,
            params!["u3", 60_000_i64, 900_i64, "x900", 100_i64],
            "units_retry_due_run",
        ),
        (
            "the exhausted units",
            &sql::EXHAUSTED_UNITS_SQL,
            params!["u3", "x999", 100_i64],
            "units_exhausted",
        ),
        (
            "a run's exhausted units",
            &sql::EXHAUSTED_UNITS_RUN_SQL,
            params!["u3", "", 10_i64],
            "units_exhausted",
        ),
    ] {
        // As the reads run on PostgreSQL too: planned once, without the values.
        for p in super::plans::plans(store, statement, args) {
            assert!(p.contains(index), "{what}: by {index}:\n{p}");
            let sorted_ok = what == "a run's due units" && p.contains("Bitmap Index Scan");
            let walks = p.lines().any(|l| {
                (l.contains("SCAN units")
                    && !l.contains("units_retry_due")
                    && !l.contains("units_exhausted"))
                    || l.contains("Seq Scan on units")
                    || l.contains("TEMP B-TREE")
                    || (l.contains("Sort") && !sorted_ok)
                    || l.contains("units_pkey")
                    || l.contains("units_first_started")
            });
            assert!(!walks, "{what}: no scan of the units, no sort:\n{p}");
        }
    }
}

/// The fan-in's check, run by a trigger on every child's end: whether the parent has a live
/// child left. It probes `runs_live_children`, which holds only the children that have not
/// ended, so it costs the same after a parent's thousandth child as after its first (the
/// statement here is the trigger's own condition; a trigger's plan cannot be asked for).
fn a_childs_end_probes_for_live_siblings(store: &mut dyn Store) {
    fill_runs(store);
    let live = Sql::same(
        "SELECT 1 FROM runs WHERE parent_run_id = ?1
        AND status NOT IN ('completed', 'failed', 'cancelled')",
    );
    let p = plan(store, &live, params!["p0"]);
    assert!(
        p.contains("runs_live_children"),
        "by runs_live_children:\n{p}"
    );
}

/// `receive`, `messages` and a keyed `send`: each a range (or a probe) of an index of the
/// run's messages, in the index's order. `receive` reads `messages_waiting`, which holds the
/// messages not taken yet, so a mailbox that has taken a million costs it nothing.
fn messages_are_read_by_index(store: &mut dyn Store) {
    for r in 0..12 {
        started(store, &format!("m{r}"));
    }
    // 60 000 messages over 12 runs and 3 topics; all but one in a hundred taken.
    let many = Sql::same(
        "INSERT INTO messages (run_id, seq, topic, key, payload, sent_at, consumed_at,
            consumed_generation)
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 59999)
        SELECT 'm' || CAST(i % 12 AS TEXT), i + 1, 't' || CAST(i % 3 AS TEXT),
            'k' || CAST(i AS TEXT), '{}', i,
            CASE WHEN i % 100 <> 0 THEN i END, CASE WHEN i % 100 <> 0 THEN 1 END
        FROM n",
    );
    store
        .write("filling messages", |tx| {
            tx.exec(&many, params![]).map(|_| ())
        })
        .expect("fill messages");
    analyze(store);
    for (what, statement, args, index) in [
        (
            "a receive",
            &sql::WAITING_MESSAGES_SQL,
            params!["m3", "t1", 10_i64],
            "messages_waiting",
        ),
        (
            "a keyed send's probe",
            &sql::MESSAGE_BY_KEY_SQL,
            params!["m3", "t1", "k999"],
            "messages_key",
        ),
        (
            "a topic's page",
            &sql::TOPIC_MESSAGES_SQL,
            params!["m3", "t1", 30_000_i64, 100_i64],
            "messages_topic",
        ),
    ] {
        let p = plan(store, statement, args);
        assert!(p.contains(index), "{what}: by {index}:\n{p}");
        let walks = p.lines().any(|l| {
            l.contains("SCAN messages") && !l.contains("USING")
                || l.contains("Seq Scan on messages")
                || l.contains("TEMP B-TREE")
                || l.contains("Sort")
        });
        assert!(!walks, "{what}: no scan, no sort:\n{p}");
    }
    let page = plan(
        store,
        &sql::RUN_MESSAGES_SQL,
        params!["m3", 30_000_i64, 100_i64],
    );
    assert!(
        page.contains("messages_pkey") || page.contains("PRIMARY KEY"),
        "a run's page by the primary key:\n{page}"
    );
    assert!(
        !page.contains("Sort") && !page.contains("TEMP B-TREE"),
        "no sort:\n{page}"
    );
}

/// A tick's read of the due schedules: a range of `schedules_due` (the schedules not paused,
/// by next slot), however many schedules there are and however many are paused.
fn due_schedules_are_read_by_index(store: &mut dyn Store) {
    let many = Sql::same(
        "INSERT INTO schedules (name, cron, timezone, overlap, catch_up, paused, next_slot,
            workflow_name, workflow_ref, source, definition_digest, definition, input,
            launch_options, runner_id, origin_session_id, priority, created_at, updated_at)
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 9999)
        SELECT 's' || CAST(i AS TEXT), '* * * * *', 'UTC', 'skip', 0,
            CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END, i * 1000, 'w', 'w', '{}', 'd', '{}',
            'null', '{}', 'r', 'o', 0, 0, 0
        FROM n",
    );
    store
        .write("filling schedules", |tx| {
            tx.exec(&many, params![]).map(|_| ())
        })
        .expect("fill schedules");
    analyze(store);
    let p = plan(
        store,
        &sql::DUE_SCHEDULES_SQL,
        params![50_000_i64, 1000_i64],
    );
    assert!(p.contains("schedules_due"), "by schedules_due:\n{p}");
    let walks = p.lines().any(|l| {
        l.contains("SCAN schedules") && !l.contains("USING")
            || l.contains("Seq Scan on schedules")
            || l.contains("TEMP B-TREE")
            || l.contains("Sort")
    });
    assert!(!walks, "no scan, no sort:\n{p}");
}

/// `unit_attempts`: the newest attempts of a page of units, each unit's range of the attempts'
/// primary key (entered at its count less `latest`), whatever the run and the ledger hold.
fn a_page_of_units_attempts_is_read_by_index(store: &mut dyn Store) {
    for r in 0..12 {
        started(store, &format!("u{r}"));
    }
    // 6 000 units with 8 attempts each.
    let units = Sql::same(
        "INSERT INTO units (run_id, unit_id, phase, status, attempts, first_started_at,
            started_at)
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 5999)
        SELECT 'u' || CAST(i % 12 AS TEXT), 'x' || CAST(i AS TEXT), 'unit', 'failed', 8, i, i
        FROM n",
    );
    let attempts = Sql::same(
        "INSERT INTO attempts (run_id, unit_id, attempt, dispatch_id, phase, status,
            started_at, finished_at)
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 47999)
        SELECT 'u' || CAST((i / 8) % 12 AS TEXT), 'x' || CAST(i / 8 AS TEXT), i % 8 + 1,
            'd' || CAST(i AS TEXT), 'unit', 'failed', i, i
        FROM n",
    );
    store
        .write("filling attempts", |tx| {
            tx.exec(&units, params![])?;
            tx.exec(&attempts, params![])
        })
        .expect("fill attempts");
    analyze(store);
    let page: Vec<String> = (0..50).map(|i| format!("x{}", 3 + 12 * i)).collect();
    let p = plan(
        store,
        &sql::UNIT_ATTEMPTS_SQL,
        params!["u3", crate::events::json_array(&page), 2_i64],
    );
    assert!(
        !p.contains("SCAN attempts") && !p.contains("Seq Scan on attempts"),
        "each unit's attempts by the primary key:\n{p}"
    );
    assert!(
        !p.contains("SCAN units") && !p.contains("Seq Scan on units"),
        "each unit by the primary key:\n{p}"
    );
    let got = crate::attempts::unit_attempts(store, "u3", &page, 2).expect("attempts");
    assert_eq!(got.len(), 100);
    assert!(got.iter().all(|a| a.attempt >= 7));
}

/// `leases(run_ids=...)`: each run and its lease a primary-key probe, whatever the ledger holds.
fn a_page_of_runs_leases_is_read_by_index(store: &mut dyn Store) {
    fill_runs(store);
    let leases = Sql::same(
        "INSERT INTO leases (resource_id, generation) SELECT run_id, 1 FROM runs WHERE true
        ON CONFLICT DO NOTHING",
    );
    store
        .write("filling leases", |tx| {
            tx.exec(&leases, params![]).map(|_| ())
        })
        .expect("fill leases");
    analyze(store);
    let page: Vec<String> = (1..=50).map(|i| format!("m{}", i * 7)).collect();
    let p = plan(
        store,
        &sql::RUN_LEASES_SQL,
        params![crate::events::json_array(&page)],
    );
    assert!(
        !p.contains("SCAN runs") && !p.contains("Seq Scan on runs"),
        "each run by its primary key:\n{p}"
    );
    assert!(
        !p.contains("SCAN leases") && !p.contains("Seq Scan on leases"),
        "each lease by its primary key:\n{p}"
    );
    let got = crate::leases::run_leases(store, &page).expect("leases");
    assert_eq!(got.len(), 50);
}

fn runs_are_counted_by_index_up_to_a_bound(store: &mut dyn Store) {
    fill_runs(store);
    let counted = plan(store, &sql::RUN_COUNTS_SQL, params![100_i64]);
    assert!(
        counted.contains("runs_status_recent"),
        "each status's runs counted by runs_status_recent:\n{counted}"
    );
    assert!(
        !counted.contains("SCAN r ")
            && !counted.contains("SCAN runs")
            && !counted.contains("Seq Scan on runs"),
        "no scan of the runs:\n{counted}"
    );
    // The statement's spelled-out statuses are every status.
    let mut listed: Vec<String> = store
        .read("listing", |tx| {
            tx.rows(&sql::RUN_COUNTS_SQL, params![1_i64], |r| r.get(0))
        })
        .expect("statuses");
    let mut all: Vec<String> = RunStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    listed.sort();
    all.sort();
    assert_eq!(listed, all);
    let exact = runs::run_counts(store, 1_000_000).expect("counts");
    assert_eq!(
        exact.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        RunStatus::ALL.to_vec(),
        "every status, in lifecycle order"
    );
    let of = |counts: &[(RunStatus, i64)], status| {
        counts.iter().find(|(s, _)| *s == status).map(|(_, n)| *n)
    };
    // many_runs: 30 failed, 270 completed, 2 700 active, and p0 active.
    assert_eq!(of(&exact, RunStatus::Failed), Some(30));
    assert_eq!(of(&exact, RunStatus::Completed), Some(270));
    assert_eq!(of(&exact, RunStatus::Active), Some(2701));
    assert_eq!(of(&exact, RunStatus::Queued), Some(0));
    let capped = runs::run_counts(store, 100).expect("capped");
    assert_eq!(of(&capped, RunStatus::Failed), Some(30));
    assert_eq!(of(&capped, RunStatus::Completed), Some(100));
    assert_eq!(of(&capped, RunStatus::Active), Some(100));
    for bad in [-1, 1_000_001] {
        match runs::run_counts(store, bad) {
            Err(LedgerError::InvalidArgument { argument, .. }) => assert_eq!(argument, "count_max"),
            other => panic!("expected InvalidArgument(count_max), got {other:?}"),
        }
    }
}

//! The reads a poller repeats cost the same at any size of the ledger: their query plans use
//! an index for exactly the rows they return, checked with the backend's own planner (`EXPLAIN
//! QUERY PLAN` on SQLite, `EXPLAIN` on PostgreSQL, after `ANALYZE` so the planner knows the
//! table is not tiny). A statement that scans fails here, before it is slow in production.

use super::{started, T0};
use crate::canonical::Value;
use crate::events::{self, Actor};
use crate::params;
use crate::retention;
use crate::store::{sql, Sql, Store, ToSql};

conformance!(
    run_events_are_read_by_index,
    run_event_pages_follow_the_cursor,
    rare_event_types_are_read_by_index,
    prune_reads_by_index,
    event_appends_probe_by_index,
    the_newest_event_is_one_probe
);

const RUNS: usize = 12;
const PER_RUN: i64 = 60;

/// `RUNS` runs with `PER_RUN` events each, interleaved, then `ANALYZE`.
fn fill(store: &mut dyn Store) {
    for r in 0..RUNS {
        started(store, &format!("p{r}"));
    }
    store
        .write("filling the log", |tx| {
            for i in 0..PER_RUN {
                for r in 0..RUNS {
                    let kind = if i % 3 == 0 { "test.a" } else { "test.b" };
                    let payload = Value::Object(vec![("i".into(), Value::Int(i))]);
                    events::append(tx, &format!("p{r}"), kind, &payload, &Actor::default(), T0)?;
                }
            }
            Ok(())
        })
        .expect("fill");
    analyze(store);
}

/// 3 000 runs made by SQL beside `p0` (which must exist): one in ten completed, one in a
/// hundred failed, the rest active; `updated_at` and `created_at` repeat (every 7 and every 3
/// runs), so that ties are broken by the run id; every fourth run is a child of `p0`. Then
/// `ANALYZE`.
pub(super) fn many_runs(store: &mut dyn Store) {
    let many = Sql::same(
        "INSERT INTO runs (run_id, workflow_ref, workflow_name, status, parent_run_id,
            created_at, updated_at, completed_at)
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
        SELECT 'm' || CAST(i AS TEXT), 'wf', 'wf',
            CASE WHEN i % 100 = 0 THEN 'failed' WHEN i % 10 = 0 THEN 'completed'
                 ELSE 'active' END,
            CASE WHEN i % 4 = 0 THEN 'p0' END,
            i / 3, i / 7, CASE WHEN i % 10 = 0 THEN i END
        FROM n",
    );
    store
        .write("filling runs", |tx| tx.exec(&many, params![]).map(|_| ()))
        .expect("fill runs");
    analyze(store);
}

/// `ANALYZE`, so the planner knows the tables are not tiny.
pub(super) fn analyze(store: &mut dyn Store) {
    let analyze = Sql::same("ANALYZE");
    store
        .write("analyzing", |tx| tx.exec(&analyze, params![]).map(|_| ()))
        .expect("analyze");
}

/// The plan the backend makes for `statement` with `params`, one line per node.
pub(crate) fn plan(store: &mut dyn Store, statement: &Sql, params: &[&dyn ToSql]) -> String {
    plan_after(store, None, statement, params)
}

/// [`plan`] in a transaction that first ran `setup` (a setting the statement's own transaction
/// makes).
fn plan_after(
    store: &mut dyn Store,
    setup: Option<&Sql>,
    statement: &Sql,
    params: &[&dyn ToSql],
) -> String {
    let explain = Sql {
        sqlite: Box::leak(format!("EXPLAIN QUERY PLAN {}", statement.sqlite).into_boxed_str()),
        postgres: Box::leak(format!("EXPLAIN {}", statement.postgres).into_boxed_str()),
    };
    // PostgreSQL plans an EXPLAIN with the parameters' values (a custom plan); SQLite
    // without them, as its prepared statement runs.
    // SQLite answers (id, parent, notused, detail); PostgreSQL one line of text.
    let postgres = store.pragmas().expect("pragmas").journal_mode == "postgresql";
    let column = if postgres { 0 } else { 3 };
    store
        .read("explaining", |tx| {
            if let Some(setup) = setup {
                tx.rows(setup, params![], |_| Ok(()))?;
            }
            tx.rows(&explain, params, |r| r.get::<String>(column))
        })
        .expect("explain")
        .join("\n")
}

/// The plans a read runs by: the one for `params`' values and, on PostgreSQL, the one made
/// without them (`Tx::plan_generic`), each to be checked alike.
pub(crate) fn plans(store: &mut dyn Store, statement: &Sql, params: &[&dyn ToSql]) -> Vec<String> {
    let custom = plan(store, statement, params);
    std::iter::once(custom)
        .chain(generic_plan(store, statement, params))
        .collect()
}

/// Without the `postgres` feature no store is PostgreSQL: there is no generic plan to explain.
#[cfg(not(feature = "postgres"))]
fn generic_plan(_: &mut dyn Store, _: &Sql, _: &[&dyn ToSql]) -> Option<String> {
    None
}

/// On PostgreSQL, the plan `statement` is given when planned without its parameters' values
/// (`Tx::plan_generic`), explained for `params`; `None` on SQLite, which never plans for values.
#[cfg(feature = "postgres")]
fn generic_plan(store: &mut dyn Store, statement: &Sql, params: &[&dyn ToSql]) -> Option<String> {
    static NAMES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if store.pragmas().expect("pragmas").journal_mode != "postgresql" {
        return None;
    }
    // A name of its own each time: the EXPLAIN is itself a cached statement, typed by the
    // statement its name stood for when it was first sent.
    let name = format!(
        "fp_generic_{}",
        NAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let text = crate::store::postgres::placeholders(statement.postgres);
    // The values as literals: an EXPLAIN EXECUTE takes no parameters of its own.
    let args = params
        .iter()
        .map(|p| match p.to_sql() {
            crate::store::SqlValue::Null => "NULL".to_owned(),
            crate::store::SqlValue::Int(v) => v.to_string(),
            crate::store::SqlValue::Text(t) => format!("'{}'", t.replace('\'', "''")),
            crate::store::SqlValue::Blob(_) => unreachable!("no read pages by bytes"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let explain = Sql::native(Box::leak(
        format!("EXPLAIN EXECUTE {name}({args})").into_boxed_str(),
    ));
    let lines = store
        .read("explaining", |tx| {
            tx.execute_script(&format!("PREPARE {name} AS {text}"))
                .map_err(|e| tx.fail(&e))?;
            tx.plan_generic()?;
            let lines = tx.rows(&explain, params![], |r| r.get::<String>(0))?;
            tx.execute_script(&format!("DEALLOCATE {name}"))
                .map_err(|e| tx.fail(&e))?;
            Ok(lines)
        })
        .expect("explain");
    let plan = lines.join("\n");
    // A plan made for the values shows them where a generic one shows `$1`.
    assert!(
        params.is_empty() || plan.contains("$1"),
        "not planned without the values:\n{plan}"
    );
    Some(plan)
}

fn run_events_are_read_by_index(store: &mut dyn Store) {
    fill(store);
    let types = Some(events::json_array(&["test.a".to_owned()]));
    let none: Option<String> = None;
    let cursor = 7_i64;
    for filter in [&none, &types] {
        let args = params![cursor, "p3", filter, 100_i64];
        for per_run in plans(store, &sql::LIST_RUN_EVENTS_SQL, args) {
            let indexed = per_run
                .contains("USING INDEX sqlite_autoindex_events_1 (resource_id=? AND revision>?)")
                || per_run.contains("events_resource_id_revision_key");
            assert!(indexed, "a run's events by its index:\n{per_run}");
            assert!(
                !per_run.contains("SCAN events") && !per_run.contains("Seq Scan on events"),
                "no scan of the log for one run's events:\n{per_run}"
            );
        }
        let args = params![cursor, filter, 100_i64, none];
        for all in plans(store, &sql::LIST_EVENTS_SQL, args) {
            let ranged =
                all.contains("USING INTEGER PRIMARY KEY (rowid>?)") || all.contains("events_pkey");
            assert!(ranged, "the log's events by their seq range:\n{all}");
            assert!(
                !all.contains("SCAN events") && !all.contains("Seq Scan on events"),
                "no scan of the log:\n{all}"
            );
        }
    }
}

/// Every event a dispatcher writes reads its run's newest revision and, on SQLite, the newest
/// `seq` and the floor under it: three probes, however long the log.
fn event_appends_probe_by_index(store: &mut dyn Store) {
    fill(store);
    let none: Option<&str> = None;
    let no_generation: Option<i64> = None;
    let insert = plan(
        store,
        &sql::INSERT_EVENT_SQL,
        params!["p3", "test.a", none, none, no_generation, "{}", none, T0],
    );
    assert!(
        !insert.lines().any(|l| l.contains("SCAN")) && !insert.contains("Seq Scan"),
        "an event insert scans nothing:\n{insert}"
    );
    let revision = insert
        .contains("USING COVERING INDEX sqlite_autoindex_events_1 (resource_id=?)")
        || insert.contains("events_resource_id_revision_key");
    assert!(revision, "the run's revision by its index:\n{insert}");
    // PostgreSQL numbers by its sequence: no floor to read.
    let floored = insert.contains("SEARCH event_seq_floor USING INTEGER PRIMARY KEY (rowid=?)")
        || insert.contains("Insert on events");
    assert!(floored, "the seq floor by its rowid:\n{insert}");
    let floor = plan(store, &retention::sql::SEQ_FLOOR_SQL, params![]);
    assert!(
        !floor.lines().any(|l| l.contains("SCAN")),
        "prune raises the floor by probes:\n{floor}"
    );
}

fn run_event_pages_follow_the_cursor(store: &mut dyn Store) {
    fill(store);
    let everything = events::read(store, None, 0, 10_000, None).expect("all events");
    let mine: Vec<_> = everything
        .iter()
        .filter(|e| e.resource_id == "p3")
        .collect();
    // A run's seq and revision rise together.
    assert!(mine
        .windows(2)
        .all(|w| w[0].seq < w[1].seq && w[0].revision + 1 == w[1].revision));
    // Paging with the run's own cursor gives every event once, in order.
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = events::read(store, Some("p3"), after, 7, None).expect("page");
        let Some(last) = page.last() else { break };
        after = last.seq;
        paged.extend(page);
    }
    assert_eq!(paged.iter().collect::<Vec<_>>(), mine);
    // Any other cursor (another run's event, a seq between this run's) is exact too.
    for after in [everything[40].seq, everything[41].seq + 1, mine[10].seq] {
        let got = events::read(store, Some("p3"), after, 10_000, None).expect("after a cursor");
        let want: Vec<_> = mine.iter().filter(|e| e.seq > after).copied().collect();
        assert_eq!(got.iter().collect::<Vec<_>>(), want, "after {after}");
    }
    // A type filter keeps the order and the cursor.
    let only = ["test.a".to_owned()];
    let got = events::read(store, Some("p3"), mine[5].seq, 10_000, Some(&only)).expect("typed");
    let want: Vec<_> = mine
        .iter()
        .filter(|e| e.seq > mine[5].seq && e.event_type == "test.a")
        .copied()
        .collect();
    assert_eq!(got.iter().collect::<Vec<_>>(), want);
}

/// A log that is mostly unit events, as a dispatcher's is, with one `run.done` per run.
fn fill_dense(store: &mut dyn Store) {
    for r in 0..RUNS {
        started(store, &format!("d{r}"));
    }
    store
        .write("filling the log", |tx| {
            for i in 0..PER_RUN * 4 {
                for r in 0..RUNS {
                    let kind = if i % 2 == 0 {
                        "unit.started"
                    } else {
                        "unit.finished"
                    };
                    let payload = Value::Object(vec![("i".into(), Value::Int(i))]);
                    events::append(tx, &format!("d{r}"), kind, &payload, &Actor::default(), T0)?;
                }
            }
            for r in 0..RUNS {
                let payload = Value::Object(vec![]);
                events::append(
                    tx,
                    &format!("d{r}"),
                    "run.done",
                    &payload,
                    &Actor::default(),
                    T0,
                )?;
            }
            Ok(())
        })
        .expect("fill");
    analyze(store);
}

fn rare_event_types_are_read_by_index(store: &mut dyn Store) {
    fill_dense(store);
    let none: Option<i64> = None;
    let types = events::json_array(&["run.done".to_owned()]);
    // A page of 100 and one of 5 (where a walk of the log in seq order, filtered, looks
    // cheaper to a planner that does not know how rare the type is), planned for the values
    // and, on PostgreSQL, without them.
    for limit in [100_i64, 5] {
        let args = params![0_i64, types, limit, none];
        for rare in plans(store, &sql::LIST_RARE_EVENTS_SQL, args) {
            assert!(
                rare.contains("events_rare_type"),
                "a rare type by its partial index:\n{rare}"
            );
            assert!(
                !rare.contains("SCAN events")
                    && !rare.contains("Seq Scan on events")
                    && !rare.contains("events_pkey"),
                "no scan of the log for a rare type:\n{rare}"
            );
        }
    }
    // The same answer as filtering the whole log, in seq order, from any cursor.
    let everything = events::read(store, None, 0, 10_000, None).expect("all events");
    let only = ["run.done".to_owned(), "run.started".to_owned()];
    for after in [0, everything[100].seq, everything[everything.len() - 3].seq] {
        let got = events::read(store, None, after, 10_000, Some(&only)).expect("rare");
        let want: Vec<_> = everything
            .iter()
            .filter(|e| e.seq > after && only.contains(&e.event_type))
            .collect();
        assert_eq!(got.iter().collect::<Vec<_>>(), want, "after {after}");
        assert!(!got.is_empty() || after > everything[everything.len() - 13].seq);
    }
}

/// A prune batch costs the same however many runs the ledger holds: its candidates are a range
/// of `runs_prune`, a tree's rows are read and deleted by their run's key, and "does anything
/// still refer to this blob" is a probe of each referring column's index.
fn prune_reads_by_index(store: &mut dyn Store) {
    fill(store);
    // Many runs, few of them finished top-level ones: what a ledger in use looks like.
    many_runs(store);
    let candidates = plan_after(
        store,
        Some(&retention::sql::PLANNER_SQL),
        &retention::sql::CANDIDATES_SQL,
        params![T0, i64::MIN, "", 16_i64],
    );
    assert!(
        candidates.contains("runs_prune"),
        "prune's candidates by runs_prune:\n{candidates}"
    );
    let runs = events::json_array(&["p1".to_owned(), "p2".to_owned()]);
    for table in &retention::archive::RUN_TABLES {
        let read = plan_after(
            store,
            Some(&retention::sql::PLANNER_SQL),
            &retention::archive::statements(table).select,
            params![runs],
        );
        assert!(
            !read.contains(&format!("SCAN {}", table.name))
                && !read.contains(&format!("Seq Scan on {}", table.name)),
            "a tree's {} rows by their key:\n{read}",
            table.name
        );
    }
    let digests = events::json_array(&["sha256:00".to_owned()]);
    let blobs = plan_after(
        store,
        Some(&retention::sql::PLANNER_SQL),
        &retention::sql::BLOBS_DELETE_SQL,
        params![digests],
    );
    assert!(
        !blobs.contains("SCAN r") && !blobs.contains("Seq Scan on runs"),
        "every reference probe by an index:\n{blobs}"
    );
}

/// `newest_event_seq`: the log's last primary-key entry, not a walk of the log.
fn the_newest_event_is_one_probe(store: &mut dyn Store) {
    fill(store);
    let p = plan(
        store,
        &sql::NEWEST_EVENT_SEQ_SQL,
        params![Option::<i64>::None],
    );
    assert!(
        !p.contains("SCAN events") || p.contains("SEARCH events") || p.contains("USING"),
        "by the primary key:\n{p}"
    );
    assert!(
        !p.contains("Seq Scan on events"),
        "no walk of the log:\n{p}"
    );
    // `event_counts`' probe: a seek into the primary key, whatever the log holds.
    let at = plan(store, &sql::EVENT_AT_SQL, params![100_i64]);
    assert!(
        !at.contains("Seq Scan on events") && !at.contains("SCAN events"),
        "a seek, not a walk:\n{at}"
    );
    let newest = crate::events::newest_seq(store).expect("newest");
    let mut all = crate::events::read(store, None, 0, 10_000, None).expect("events");
    assert_eq!(newest, all.pop().map_or(0, |e| e.seq));
}

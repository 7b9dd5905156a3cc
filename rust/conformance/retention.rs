//! Prune and restore on every backend: whole terminal trees only, the archive round trip row for
//! row, the events' delete trigger, and restore's refusals.

use super::{finish, started, unit, T0};
use crate::attempts;
use crate::canonical::Json;
use crate::errors::LedgerError;
use crate::events;
use crate::params;
use crate::retention::archive::{self, Cell, Tree};
use crate::retention::{raise_event_seq, BytesLines, PruneReport, PruneSpec, Pruner, Reader};
use crate::runs::{self, ChildRun, StepSpec};
use crate::store::{Sql, Store};

conformance!(
    prune_takes_whole_terminal_trees,
    prune_archive_restores_every_row,
    events_stay_append_only_outside_prune,
    restore_refuses_bad_archives,
    a_ledger_whose_last_activity_was_one_tree_prunes_to_empty,
    restored_events_above_the_numbering_raise_it
);

const DAY: i64 = 86_400_000;

/// Every row of every archived table, in key order.
fn dump(store: &mut dyn Store) -> Vec<(&'static str, Vec<Vec<Cell>>)> {
    store
        .read("dumping", |tx| {
            let mut out = Vec::new();
            for t in archive::tables() {
                let text: &'static str = Box::leak(
                    format!(
                        "SELECT {} FROM {} ORDER BY {}",
                        t.columns.join(", "),
                        t.name,
                        t.order
                    )
                    .into_boxed_str(),
                );
                let rows = tx.rows(&Sql::same(text), params![], |r| {
                    archive::read_row(r, t.columns.len())
                })?;
                out.push((t.name, rows));
            }
            Ok(out)
        })
        .expect("dump")
}

fn count(store: &mut dyn Store, table: &str) -> usize {
    dump(store)
        .into_iter()
        .find(|(t, _)| *t == table)
        .map_or(0, |(_, rows)| rows.len())
}

fn child(store: &mut dyn Store, parent: &str, id: &str) {
    let req = ChildRun {
        parent_run_id: parent.into(),
        parent_unit_id: "u1".into(),
        invocation_key: id.into(),
        workflow_ref: "child".into(),
        steps: vec![StepSpec {
            id: "a".into(),
            title: String::new(),
            instructions: String::new(),
            completion: None,
            retry: None,
        }],
        params: Some(Json::new(br#"{"shared":true}"#.to_vec())),
        plan: None,
        run_id: Some(id.into()),
        retry: None,
    };
    runs::publish_child_run(store, &req, T0).expect("child");
}

/// A run with two finished attempts, cancelled at `at`.
fn finished_run(store: &mut dyn Store, id: &str, at: i64) {
    started(store, id);
    work(store, id);
    assert!(runs::abandon_run(store, id, None, true, at).unwrap());
}

fn work(store: &mut dyn Store, id: &str) {
    let got = attempts::reserve_attempts(store, id, &[unit("u1"), unit("u2")], None, T0).unwrap();
    let done: Vec<_> = got
        .iter()
        .map(|r| finish(id, &r.unit_id, r.attempt, &r.dispatch_id))
        .collect();
    attempts::finish_attempts(store, &done, None, T0).unwrap();
}

fn spec(cutoff: i64) -> PruneSpec {
    PruneSpec::new(
        cutoff,
        &["completed".into(), "failed".into(), "cancelled".into()],
        None,
        false,
    )
    .unwrap()
}

fn prune(store: &mut dyn Store, cutoff: i64, archive: Option<&mut Vec<u8>>) -> PruneReport {
    let pruner = Pruner::new(spec(cutoff));
    match archive {
        Some(out) => {
            let mut sink = |bytes: &[u8]| -> crate::errors::Result<()> {
                out.extend_from_slice(bytes);
                Ok(())
            };
            pruner.run(store, Some(&mut sink)).unwrap()
        }
        None => pruner.run(store, None).unwrap(),
    }
}

fn restore(store: &mut dyn Store, archive: &[u8]) -> crate::errors::Result<u64> {
    crate::retention::restore(store, &mut BytesLines::new(archive), &mut |_| Ok(()))
}

fn prune_takes_whole_terminal_trees(store: &mut dyn Store) {
    // old: a finished tree with two children; live: a finished parent with a live child;
    // young: finished after the cutoff; active: never finished; last: finished, and holds the
    // newest event.
    started(store, "old");
    work(store, "old");
    started(store, "live");
    child(store, "old", "old-c1");
    child(store, "old", "old-c2");
    child(store, "live", "live-c");
    work(store, "old-c1");
    // The whole old tree at once; live alone, its child left running.
    assert!(runs::abandon_run(store, "old", None, true, T0 + DAY).unwrap());
    assert!(runs::abandon_run(store, "live", None, false, T0 + DAY).unwrap());
    finished_run(store, "young", T0 + 10 * DAY);
    started(store, "active");
    work(store, "active");
    finished_run(store, "last", T0 + DAY);
    let before_attempts = count(store, "attempts");

    let report = prune(store, T0 + 5 * DAY, None);
    assert_eq!(
        report.runs, 4,
        "old and its two children, and last: {report:?}"
    );
    assert_eq!(report.attempts, 6);
    assert!(report.events >= 4 * 2, "{report:?}");
    assert_eq!(count(store, "attempts"), before_attempts - 6);
    for gone in ["old", "old-c1", "old-c2", "last"] {
        assert!(runs::get_run(store, gone).unwrap().is_none(), "{gone}");
    }
    for kept in ["live", "live-c", "young", "active"] {
        assert!(runs::get_run(store, kept).unwrap().is_some(), "{kept}");
    }
    // The child params blob was shared by old's and live's children: live-c still holds it.
    let shared = Json::new(br#"{"shared":true}"#.to_vec()).digest;
    assert!(crate::blobs::get_json(store, &shared).is_ok());
    let left: Vec<String> = dump(store)
        .into_iter()
        .flat_map(|(t, rows)| {
            let key = archive::table(t).key_position();
            rows.into_iter()
                .filter_map(move |r| r[key].text().map(str::to_owned))
        })
        .collect();
    assert!(
        !left.iter().any(|k| k.starts_with("old")),
        "a row of a pruned tree is left: {left:?}"
    );
    // Nothing more goes at the same cutoff: live stays with its live child.
    assert_eq!(prune(store, T0 + 5 * DAY, None).runs, 0);
    assert!(runs::get_run(store, "live").unwrap().is_some());
}

/// The newest `seq` handed out so far that is still in the log (0 for an empty log).
fn newest_seq(store: &mut dyn Store) -> i64 {
    let mut newest = 0;
    loop {
        let page = events::read(store, None, newest, 1000, None).unwrap();
        match page.last() {
            Some(e) => newest = e.seq,
            None => return newest,
        }
    }
}

fn a_ledger_whose_last_activity_was_one_tree_prunes_to_empty(store: &mut dyn Store) {
    finished_run(store, "a", T0 + DAY);
    finished_run(store, "b", T0 + 2 * DAY);
    let newest = newest_seq(store);
    let report = prune(store, T0 + 5 * DAY, None);
    assert_eq!(report.runs, 2, "{report:?}");
    for (table, rows) in dump(store) {
        assert!(rows.is_empty(), "{table} keeps {rows:?}");
    }
    // A follower whose cursor reached the newest event sees the next one: it is numbered
    // above every `seq` handed out, not after the (now empty) log's max.
    started(store, "next");
    let seen = events::read(store, None, newest, 1000, None).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].resource_id, "next");
    assert!(seen[0].seq > newest, "{seen:?} after {newest}");
    // Pruning the newest tree again, and a tree restored above the numbering, still never hand
    // a number out twice.
    assert!(runs::abandon_run(store, "next", None, true, T0 + DAY).unwrap());
    let newest = newest_seq(store);
    let mut out = Vec::new();
    assert_eq!(prune(store, T0 + 5 * DAY, Some(&mut out)).runs, 1);
    started(store, "after");
    let seen = events::read(store, None, newest, 1000, None).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].seq > newest, "{seen:?} after {newest}");
}

fn restored_events_above_the_numbering_raise_it(store: &mut dyn Store) {
    finished_run(store, "a", T0 + DAY);
    let mut out = Vec::new();
    assert_eq!(prune(store, T0 + 5 * DAY, Some(&mut out)).runs, 1);
    // The archive as another ledger, further along, would have written it: every event
    // numbered 1000 higher.
    let shifted: Vec<u8> = out
        .split_inclusive(|b| *b == b'\n')
        .flat_map(|line| {
            let mut doc: serde_json::Value = serde_json::from_slice(line).unwrap();
            if let Some(rows) = doc.get_mut("events").and_then(|e| e.as_array_mut()) {
                for row in rows {
                    row[0] = (row[0].as_i64().unwrap() + 1000).into();
                }
            }
            let mut line = serde_json::to_vec(&doc).unwrap();
            line.push(b'\n');
            line
        })
        .collect();
    let mut reader = Reader::new();
    let trees: Vec<Tree> = shifted
        .split_inclusive(|b| *b == b'\n')
        .filter_map(|line| reader.read(line).unwrap())
        .collect();
    let highest = trees.iter().map(Tree::highest_seq).max().unwrap();
    assert!(highest > 1000);
    assert_eq!(restore(store, &shifted).unwrap(), 1);
    assert_eq!(newest_seq(store), highest);
    started(store, "new");
    let seen = events::read(store, None, highest, 1000, None).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].resource_id, "new");
    assert!(seen[0].seq > highest);
    // Raising below the numbering changes nothing; and the restored tree prunes again without
    // its numbers coming back.
    let newest = newest_seq(store);
    raise_event_seq(store, 1).unwrap();
    assert!(runs::abandon_run(store, "new", None, true, T0 + DAY).unwrap());
    let newest_after = newest_seq(store);
    assert!(newest_after > newest);
    assert_eq!(prune(store, T0 + 5 * DAY, None).runs, 2);
    started(store, "last");
    let seen = events::read(store, None, 0, 1000, None).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].seq > newest_after, "{seen:?} after {newest_after}");
}

fn prune_archive_restores_every_row(store: &mut dyn Store) {
    started(store, "a");
    work(store, "a");
    child(store, "a", "a-c");
    work(store, "a-c");
    assert!(runs::abandon_run(store, "a", None, true, T0 + DAY).unwrap());
    finished_run(store, "b", T0 + 2 * DAY);
    finished_run(store, "z", T0 + 30 * DAY);
    let before = dump(store);
    let mut out = Vec::new();
    let report = prune(store, T0 + 5 * DAY, Some(&mut out));
    assert_eq!(report.runs, 3);
    assert_eq!(
        usize::try_from(report.archived_bytes).unwrap(),
        out.len() - header_and_trailer(&out)
    );
    assert_ne!(dump(store), before);
    assert_eq!(restore(store, &out).unwrap(), 3);
    assert_eq!(
        dump(store),
        before,
        "restore puts back every row, byte for byte"
    );
    // Restoring again is refused: the runs exist.
    assert!(restore(store, &out).is_err());
    assert_eq!(dump(store), before);
}

fn header_and_trailer(archive: &[u8]) -> usize {
    let lines: Vec<&[u8]> = archive.split_inclusive(|b| *b == b'\n').collect();
    lines[0].len() + lines[lines.len() - 1].len()
}

fn events_stay_append_only_outside_prune(store: &mut dyn Store) {
    finished_run(store, "done", T0 + DAY);
    started(store, "newer");
    let delete = Sql::same("DELETE FROM events WHERE resource_id = 'done'");
    let listed = Sql::same("INSERT INTO pruning (run_id) VALUES ('newer')");
    let delete_live = Sql::same("DELETE FROM events WHERE resource_id = 'newer'");
    assert!(store
        .write("deleting", |tx| tx.exec(&delete, params![]).map(|_| ()))
        .is_err());
    // Listed in pruning but not terminal: still refused.
    assert!(store
        .write("deleting", |tx| {
            tx.exec(&listed, params![])?;
            tx.exec(&delete_live, params![]).map(|_| ())
        })
        .is_err());
    let update = Sql::same("UPDATE events SET type = 'x' WHERE resource_id = 'done'");
    assert!(store
        .write("updating", |tx| tx.exec(&update, params![]).map(|_| ()))
        .is_err());
    assert!(count(store, "events") > 0);
    assert_eq!(count(store, "pruning"), 0);
}

fn restore_refuses_bad_archives(store: &mut dyn Store) {
    finished_run(store, "a", T0 + DAY);
    finished_run(store, "b", T0 + DAY);
    started(store, "newest");
    let mut out = Vec::new();
    assert_eq!(prune(store, T0 + 5 * DAY, Some(&mut out)).runs, 2);
    let before = dump(store);
    let lines: Vec<&[u8]> = out.split_inclusive(|b| *b == b'\n').collect();
    let invalid = |r: crate::errors::Result<u64>| match r {
        Err(LedgerError::InvalidArgument { argument, .. }) => assert_eq!(argument, "archive"),
        other => panic!("expected InvalidArgument(archive), got {other:?}"),
    };
    // Truncated at a line boundary (no trailer), and in the middle of a line.
    invalid(restore(store, &lines[..lines.len() - 1].concat()));
    invalid(restore(store, &out[..out.len() - 40]));
    // Foreign: JSON lines that are not an archive; not JSON at all.
    invalid(restore(store, b"{\"hello\":1}\n"));
    invalid(restore(store, b"PK\x03\x04 zip bytes\n"));
    // A tampered blob no longer hashes to its digest.
    let mut tree: serde_json::Value = serde_json::from_slice(lines[1]).unwrap();
    let blob = &mut tree["blobs"][0][1];
    assert!(blob.is_string(), "the tree carries its blobs: {tree}");
    *blob = serde_json::Value::String(format!("{} ", blob.as_str().unwrap()));
    let mut tampered = lines[0].to_vec();
    tampered.extend(archive::line(&tree));
    tampered.extend(lines[2..].concat());
    invalid(restore(store, &tampered));
    assert_eq!(dump(store), before, "a refused archive writes nothing");
    assert_eq!(restore(store, &out).unwrap(), 2);
}

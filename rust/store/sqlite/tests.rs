//! The SQLite store's tests: settings read back, refused files, rollback, busy retry, and the
//! migration runner on SQLite (fresh, re-run, newer, older, inconsistent, foreign, failing).

use super::*;
use crate::params;
use crate::store::{Durability, FailureScope, Savepoint, Sql, Store};

pub(super) fn temp_path(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!(
        "fencepost-test-{}-{}-{name}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("ledger.db").to_string_lossy().into_owned()
}

#[test]
fn file_database_is_wal_and_settings_read_back() {
    let path = temp_path("wal");
    let opts = OpenOptions {
        durability: Durability::Full,
        busy_timeout_ms: 1234,
        create: true,
        listen: false,
    };
    let store = SqliteStore::open(Some(&path), &opts, 5).unwrap();
    let p = store.pragmas().unwrap();
    assert_eq!(p.journal_mode, "wal");
    assert_eq!(p.synchronous, "full");
    assert_eq!(p.busy_timeout, 1234);
    assert!(p.foreign_keys);
    assert_eq!(p.schema_version, migrate::SCHEMA_VERSION);
    assert_eq!(store.integrity_check(false).unwrap(), vec!["ok".to_owned()]);
    assert_eq!(store.integrity_check(true).unwrap(), vec!["ok".to_owned()]);
    drop(store);
    let again = SqliteStore::open(Some(&path), &OpenOptions::default(), 6).unwrap();
    assert_eq!(again.pragmas().unwrap().synchronous, "normal");
}

#[test]
fn text_file_is_refused_clearly() {
    let path = temp_path("text");
    std::fs::write(&path, "definitely not sqlite\n".repeat(200)).unwrap();
    let err = SqliteStore::open(Some(&path), &OpenOptions::default(), 0).unwrap_err();
    match err {
        LedgerError::StoreError { message, .. } => {
            assert!(message.contains("not a fencepost database"), "{message}");
            assert!(message.contains(&path));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn missing_file_without_create() {
    let path = temp_path("absent").replace("ledger.db", "absent.db");
    let opts = OpenOptions {
        create: false,
        ..OpenOptions::default()
    };
    let err = SqliteStore::open(Some(&path), &opts, 0).unwrap_err();
    assert!(
        matches!(err, LedgerError::StoreError { ref message, .. } if message.contains("cannot open"))
    );
    assert!(!std::path::Path::new(&path).exists());
}

#[test]
fn refused_body_rolls_back() {
    let mut opened = SqliteStore::open(None, &OpenOptions::default(), 0).unwrap();
    let store: &mut dyn Store = &mut opened;
    let err = store
        .write("testing", |tx| {
            tx.exec(
                &Sql::same("INSERT INTO blobs(digest, bytes, created_at) VALUES (?1, x'00', 0)"),
                params![format!("sha256:{}", "0".repeat(64))],
            )
            .unwrap();
            Err::<(), _>(LedgerError::invalid("x", "refused"))
        })
        .unwrap_err();
    assert_eq!(err, LedgerError::invalid("x", "refused"));
    let n: Option<i64> = store
        .read("counting", |tx| {
            tx.row(&Sql::same("SELECT count(*) FROM blobs"), params![], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert_eq!(n, Some(0));
}

#[test]
fn check_constraints_hold() {
    let mut opened = SqliteStore::open(None, &OpenOptions::default(), 0).unwrap();
    let store: &mut dyn Store = &mut opened;
    let r = store.write("testing", |tx| {
        tx.exec(
            &Sql::same(
                "INSERT INTO runs(run_id, workflow_ref, workflow_name, status, created_at, \
                 updated_at) VALUES ('r', 'w', 'w', 'exploded', 0, 0)",
            ),
            params![],
        )
    });
    assert!(matches!(r, Err(LedgerError::StoreError { .. })));
}

#[test]
fn busy_lock_becomes_store_busy_after_retries() {
    let path = temp_path("busy");
    let opts = OpenOptions {
        busy_timeout_ms: 50,
        ..OpenOptions::default()
    };
    let mut opened = SqliteStore::open(Some(&path), &opts, 0).unwrap();
    let store: &mut dyn Store = &mut opened;
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = store.write("testing", |_| Ok(())).unwrap_err();
    match err {
        LedgerError::StoreBusy { waited_ms, retries } => {
            assert!(waited_ms >= 50, "{waited_ms}");
            assert!(retries <= MAX_BUSY_RETRIES);
        }
        other => panic!("unexpected {other:?}"),
    }
    other.execute_batch("COMMIT").unwrap();
    store.write("testing", |_| Ok(())).unwrap();
}

// ------------------------------------------------------------------ migrations

/// The ledger's rows, in version order.
fn ledger_rows(conn: &Connection) -> Vec<(i64, String, i64)> {
    conn.prepare("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

const RECORD: &str = "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?1, ?2, ?3)";

#[test]
fn fresh_then_noop_then_newer_refused() {
    let mut store = SqliteStore::open(None, &OpenOptions::default(), 1).unwrap();
    let dialect = dialect(&store.label);
    assert_eq!(
        migrate::migrate(&mut store, &dialect, 2).unwrap(),
        migrate::SCHEMA_VERSION
    );
    let rows = ledger_rows(&store.conn);
    assert_eq!(i64::try_from(rows.len()).unwrap(), migrate::SCHEMA_VERSION);
    assert_eq!(rows[0].2, 1, "re-running is a no-op");
    store
        .conn
        .execute(
            RECORD,
            rusqlite::params![migrate::SCHEMA_VERSION + 41, "future", 0],
        )
        .unwrap();
    let err = migrate::migrate(&mut store, &dialect, 3).unwrap_err();
    assert_eq!(
        err,
        LedgerError::SchemaError {
            database_version: migrate::SCHEMA_VERSION + 41,
            library_version: migrate::SCHEMA_VERSION
        }
    );
}

#[test]
fn an_older_database_migrates_forward_and_keeps_its_rows() {
    // A database as the first release left it: migration 1 only, with a run in it.
    let path = temp_path("older");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(CREATE_LEDGER_SQL).unwrap();
    conn.execute_batch(migrate::SQLITE_MIGRATIONS[0].sql)
        .unwrap();
    conn.execute(RECORD, rusqlite::params![1, "init", 7])
        .unwrap();
    conn.execute(
        "INSERT INTO runs(run_id, workflow_ref, workflow_name, status, created_at, \
         updated_at) VALUES ('r1', 'wf', 'wf', 'active', 1, 1)",
        [],
    )
    .unwrap();
    drop(conn);
    let store = SqliteStore::open(Some(&path), &OpenOptions::default(), 9).unwrap();
    assert_eq!(
        store.pragmas().unwrap().schema_version,
        migrate::SCHEMA_VERSION
    );
    assert_eq!(
        ledger_rows(&store.conn),
        vec![
            (1, "init".into(), 7),
            (2, "fillfactor".into(), 9),
            (3, "prune".into(), 9),
            (4, "reads".into(), 9),
            (5, "queue".into(), 9),
            (6, "fencing".into(), 9),
            (7, "seq_floor".into(), 9),
            (8, "schedule".into(), 9),
            (9, "retry".into(), 9),
            (10, "fan_in".into(), 9),
            (11, "messages".into(), 9),
            (12, "schedules".into(), 9),
            (13, "views".into(), 9)
        ]
    );
    let kept: String = store
        .conn
        .query_row("SELECT status FROM runs WHERE run_id = 'r1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kept, "active");
    // 0009 widened the units' status CHECK in place: this connection (which migrated) and a
    // new one both take `exhausted`, and both still refuse a status that is not one.
    let other = Connection::open(&path).unwrap();
    for conn in [&store.conn, &other] {
        conn.execute_batch(
            "INSERT INTO units(run_id, unit_id, phase, status, attempts, first_started_at, \
             started_at) VALUES ('r1', 'u', 'unit', 'exhausted', 1, 1, 1); \
             DELETE FROM units WHERE run_id = 'r1'",
        )
        .unwrap();
        let bogus = conn.execute(
            "INSERT INTO units(run_id, unit_id, phase, status, attempts, first_started_at, \
             started_at) VALUES ('r1', 'u', 'unit', 'bogus', 1, 1, 1)",
            [],
        );
        assert!(bogus.is_err(), "{bogus:?}");
    }
    let check: String = other
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'units'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        check.contains("'timed_out',\n                        'exhausted')"),
        "{check}"
    );
}

#[test]
fn inconsistent_and_foreign_databases_are_refused() {
    let path = temp_path("inconsistent");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(CREATE_LEDGER_SQL).unwrap();
    conn.execute(RECORD, rusqlite::params![1, "renamed", 0])
        .unwrap();
    drop(conn);
    let err = SqliteStore::open(Some(&path), &OpenOptions::default(), 1).unwrap_err();
    assert!(
        matches!(err, LedgerError::StoreError { ref message, .. } if message.contains("inconsistent"))
    );

    let path = temp_path("theirs");
    let other = Connection::open(&path).unwrap();
    other.execute_batch("CREATE TABLE theirs(x)").unwrap();
    let err = SqliteStore::open(Some(&path), &OpenOptions::default(), 1).unwrap_err();
    assert!(
        matches!(err, LedgerError::StoreError { ref message, .. } if message.contains("not a fencepost database"))
    );
    let count: i64 = other
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'schema_migrations'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(count, 0, "nothing written into a foreign database");
}

#[test]
fn a_failing_migration_rolls_back() {
    // Simulate: the tables of migration 1 exist already (as if half-applied by hand), so
    // the script fails; the ledger must stay empty.
    let path = temp_path("failing");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(CREATE_LEDGER_SQL).unwrap();
    conn.execute_batch("CREATE TABLE blobs(x)").unwrap();
    assert!(SqliteStore::open(Some(&path), &OpenOptions::default(), 1).is_err());
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0);
}

// ------------------------------------------------------------------ savepoints of a group

const INSERT_BLOB: Sql =
    Sql::same("INSERT INTO blobs(digest, bytes, created_at) VALUES (?1, x'00', ?2)");
const TOUCH_BLOB: Sql = Sql::same("UPDATE blobs SET created_at = ?2 WHERE digest = ?1");

fn blob_digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

/// `(digest, created_at)` of every blob, as `tx` sees them.
fn blobs(tx: &dyn crate::store::Tx) -> Vec<(String, i64)> {
    tx.rows(
        &Sql::same("SELECT digest, created_at FROM blobs ORDER BY digest"),
        params![],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[test]
fn an_undone_call_leaves_its_neighbours_and_nothing_of_its_own() {
    let mut store = crate::store::testing::sqlite_memory();
    let (a, b, c) = (blob_digest('a'), blob_digest('b'), blob_digest('c'));
    store
        .write("testing", |tx| {
            tx.savepoint(Savepoint::Begin)?;
            tx.exec(&INSERT_BLOB, params![a, 1_i64])?;
            tx.savepoint(Savepoint::Release)?;

            // The refused call rewrites its neighbour's row, adds its own, then fails.
            tx.savepoint(Savepoint::Begin)?;
            tx.exec(&TOUCH_BLOB, params![a, 2_i64])?;
            tx.exec(&INSERT_BLOB, params![b, 2_i64])?;
            let err = tx
                .exec_raw(&INSERT_BLOB, params!["not a digest", 2_i64])
                .unwrap_err();
            assert!(matches!(err.kind, DbErrorKind::Other), "{err:?}");
            assert_eq!(tx.failure_scope(), FailureScope::Call);
            tx.savepoint(Savepoint::Undo)?;
            // Undone to where its savepoint began: the first call's row as that call left it.
            assert_eq!(blobs(tx), vec![(a.clone(), 1)]);

            tx.savepoint(Savepoint::Begin)?;
            tx.exec(&INSERT_BLOB, params![c, 3_i64])?;
            tx.savepoint(Savepoint::Release)?;
            Ok(())
        })
        .unwrap();
    let after = store.read("reading", |tx| Ok(blobs(tx))).unwrap();
    assert_eq!(after, vec![(a, 1), (c, 3)]);
}

#[test]
fn a_released_call_commits_and_the_savepoint_name_is_reusable() {
    let mut store = crate::store::testing::sqlite_memory();
    let digests: Vec<String> = "defg".chars().map(blob_digest).collect();
    store
        .write("testing", |tx| {
            // Many calls in a row reuse the one savepoint name; none nests in another.
            for (i, d) in digests.iter().enumerate() {
                tx.savepoint(Savepoint::Begin)?;
                tx.exec(&INSERT_BLOB, params![d, i64::try_from(i).unwrap()])?;
                tx.savepoint(Savepoint::Release)?;
            }
            Ok(())
        })
        .unwrap();
    let after = store.read("reading", |tx| Ok(blobs(tx))).unwrap();
    let want: Vec<(String, i64)> = digests.into_iter().zip(0..).collect();
    assert_eq!(after, want);
}

#[test]
fn undoing_every_call_commits_nothing() {
    let mut store = crate::store::testing::sqlite_memory();
    store
        .write("testing", |tx| {
            for c in ['h', 'i'] {
                tx.savepoint(Savepoint::Begin)?;
                tx.exec(&INSERT_BLOB, params![blob_digest(c), 0_i64])?;
                tx.savepoint(Savepoint::Undo)?;
            }
            Ok(())
        })
        .unwrap();
    assert!(store
        .read("reading", |tx| Ok(blobs(tx)))
        .unwrap()
        .is_empty());
}

#[test]
fn reclaim_gives_back_as_many_pages_as_asked_in_one_transaction() {
    let path = temp_path("reclaim");
    let mut store = SqliteStore::open(Some(&path), &OpenOptions::default(), 0).unwrap();
    // About 3 000 pages of blobs, then deleted: free pages in an incremental auto-vacuum file.
    let fill = Sql::same(
        "INSERT INTO blobs(digest, bytes, created_at)
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
        SELECT printf('sha256:%064d', i), randomblob(900), 0 FROM n",
    );
    let clear = Sql::same("DELETE FROM blobs");
    for statement in [&fill, &clear] {
        (&mut store as &mut dyn Store)
            .write("filling", |tx| tx.exec(statement, params![]).map(|_| ()))
            .unwrap();
    }
    let free = |s: &SqliteStore| -> i64 {
        s.conn
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap()
    };
    let before = free(&store);
    assert!(before > 2500, "{before} free pages");
    // Each call is one transaction that frees exactly the pages asked for (the pragma frees
    // one page per step, so a call that stopped after one step would free one).
    assert_eq!(
        store.reclaim(1000).unwrap(),
        512 * 1024,
        "a power of two at most"
    );
    assert_eq!(free(&store), before - 512);
    assert_eq!(store.reclaim(1024).unwrap(), 1024 * 1024);
    let mut total = 0;
    loop {
        let freed = store.reclaim(1 << 16).unwrap();
        if freed == 0 {
            break;
        }
        total += freed;
    }
    assert_eq!(free(&store), 0);
    assert_eq!(
        i64::try_from(total).unwrap(),
        (before - 512 - 1024) * 1024,
        "every free page given back"
    );
}

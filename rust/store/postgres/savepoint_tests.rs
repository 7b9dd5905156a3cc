//! The savepoint around one call of a grouped transaction, on PostgreSQL: its statements are
//! queued, so a failed statement aborts the transaction until the queued `ROLLBACK TO` goes out
//! with the next call's first statement. These tests check that the transaction is usable
//! again after it, that the run locks taken before the savepoint survive it, and that the
//! undone call's locks and writes do not.

use crate::params;
use crate::store::testing::{postgres_fresh, postgres_url};
use crate::store::{open, DbErrorKind, FailureScope, OpenOptions, Savepoint, Sql, Store, Tx};

const INSERT_BLOB: Sql =
    Sql::same("INSERT INTO blobs(digest, bytes, created_at) VALUES (?1, ?2, ?3)");
/// Fails inside the server (division by zero), not in the driver: the transaction aborts.
const FAILING: Sql = Sql::same("SELECT 1 / (CAST(?1 AS BIGINT) - CAST(?1 AS BIGINT))");
/// Whether another session can take the run lock that `lock_run` takes on a run without a
/// row (the advisory lock of `LOCK_RUN_SQL`); an xact lock, so it goes with the probe's
/// transaction.
const TRY_RUN_LOCK: Sql = Sql::same(
    "SELECT pg_try_advisory_xact_lock(hashtextextended('fencepost/run/' || CAST(?1 AS TEXT), 0))",
);

fn blob_digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn blobs(tx: &dyn Tx) -> Vec<(String, i64)> {
    tx.rows(
        &Sql::same("SELECT digest, created_at FROM blobs ORDER BY digest"),
        params![],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

/// Whether some other session holds `run_id`'s lock, asked from `other`'s session.
fn held_elsewhere(other: &mut dyn Store, run_id: &str) -> bool {
    let free = other
        .read("probing a run lock", |tx| {
            tx.row(&TRY_RUN_LOCK, params![run_id], |r| r.get::<bool>(0))
        })
        .unwrap()
        .unwrap();
    !free
}

#[test]
fn a_failed_call_undone_by_a_queued_rollback_leaves_the_transaction_and_its_locks() {
    let (mut store, dropper) = postgres_fresh();
    let mut other = open(
        None,
        Some(&postgres_url()),
        Some(dropper.schema()),
        &OpenOptions::default(),
        0,
    )
    .unwrap();
    let (a, b, c) = (blob_digest('a'), blob_digest('b'), blob_digest('c'));
    let byte = vec![0_u8];
    let mut runs = 0;
    store
        .write("testing", |tx| {
            runs += 1;
            // Top level, before any savepoint, as a group locks its runs.
            tx.lock_run("top")?;
            tx.savepoint(Savepoint::Begin)?;
            tx.exec(&INSERT_BLOB, params![a, byte, 1_i64])?;
            tx.savepoint(Savepoint::Release)?;

            // The failing call: its own lock and row, then a statement the server refuses.
            tx.savepoint(Savepoint::Begin)?;
            tx.lock_run("inner")?;
            tx.exec(&INSERT_BLOB, params![b, byte, 2_i64])?;
            assert!(held_elsewhere(other.as_mut(), "inner"));
            let err = tx
                .query(&FAILING, params![7_i64], &mut |_| Ok(true))
                .unwrap_err();
            assert!(matches!(err.kind, DbErrorKind::Other), "{err:?}");
            assert_eq!(tx.failure_scope(), FailureScope::Call);
            // Queued: it goes out with the next call's first statement.
            tx.savepoint(Savepoint::Undo)?;

            tx.savepoint(Savepoint::Begin)?;
            tx.exec(&INSERT_BLOB, params![c, byte, 3_i64])?;
            tx.savepoint(Savepoint::Release)?;
            assert_eq!(blobs(tx), vec![(a.clone(), 1), (c.clone(), 3)]);
            // The top-level lock is still this transaction's; the undone call's is gone.
            assert!(held_elsewhere(other.as_mut(), "top"));
            assert!(!held_elsewhere(other.as_mut(), "inner"));
            // Taking the undone call's run again really locks it again (not skipped as held).
            tx.lock_run("inner")?;
            assert_eq!(blobs(tx).len(), 2);
            assert!(held_elsewhere(other.as_mut(), "inner"));
            Ok(())
        })
        .unwrap();
    assert_eq!(runs, 1, "nothing in the transaction asked for a re-run");
    let after = store.read("reading", |tx| Ok(blobs(tx))).unwrap();
    assert_eq!(after, vec![(a, 1), (c, 3)]);
    assert!(!held_elsewhere(other.as_mut(), "top"));
    assert!(!held_elsewhere(other.as_mut(), "inner"));
}

#[test]
fn released_calls_commit_and_undone_ones_leave_nothing() {
    let (mut store, _dropper) = postgres_fresh();
    let byte = vec![0_u8];
    store
        .write("testing", |tx| {
            tx.lock_run("r")?;
            for (i, c) in "defgh".chars().enumerate() {
                tx.savepoint(Savepoint::Begin)?;
                tx.exec(
                    &INSERT_BLOB,
                    params![blob_digest(c), byte, i64::try_from(i).unwrap()],
                )?;
                // Every other call is undone after its write went out; the rest are released.
                tx.savepoint(if i % 2 == 0 {
                    Savepoint::Release
                } else {
                    Savepoint::Undo
                })?;
            }
            Ok(())
        })
        .unwrap();
    let after = store.read("reading", |tx| Ok(blobs(tx))).unwrap();
    let want = vec![
        (blob_digest('d'), 0),
        (blob_digest('f'), 2),
        (blob_digest('h'), 4),
    ];
    assert_eq!(after, want);
}

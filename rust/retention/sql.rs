//! The statements of `prune` and `restore` that are not per-table (those are made from the
//! table list in `archive`). A list of run ids or digests is one JSON array parameter, read
//! with `json_each` on SQLite and `json_array_elements_text` on PostgreSQL.

use crate::store::Sql;

/// First in every prune transaction. PostgreSQL plans a list parameter (`= ANY (ARRAY(...))`)
/// as if it held 100 ids, and for a few runs of a small or freshly grown table that estimate can
/// make a sequential scan look cheaper than the key lookups; a prune batch only ever touches its
/// own runs' rows, by key, so no scan is ever the right plan: the setting lasts until the batch
/// commits. SQLite plans by its indexes as written: nothing to set.
pub const PLANNER_SQL: Sql = Sql::split(
    "SELECT 1",
    "SELECT set_config('enable_seqscan', 'off', true)",
);

/// The next top-level terminal runs finished before `?1`, after the cursor `(?2, ?3)`, oldest
/// finish first, `?4` at most: a range of the partial index `runs_prune`, so a batch costs the
/// same however many runs the ledger holds. Non-terminal runs are not in the index; the
/// statuses a caller asked for are checked over the whole tree, in Rust. PostgreSQL locks the
/// roots and skips those another prune holds (two prunes never wait on each other's runs).
pub const CANDIDATES_SQL: Sql = Sql::split(
    "SELECT run_id, completed_at FROM runs
    WHERE parent_run_id IS NULL AND completed_at IS NOT NULL AND completed_at < ?1
      AND (completed_at, run_id) > (?2, ?3)
    ORDER BY completed_at, run_id LIMIT ?4",
    "SELECT run_id, completed_at FROM runs
    WHERE parent_run_id IS NULL AND completed_at IS NOT NULL
      AND completed_at < CAST(?1 AS BIGINT)
      AND (completed_at, run_id) > (CAST(?2 AS BIGINT), CAST(?3 AS TEXT))
    ORDER BY completed_at, run_id LIMIT ?4
    FOR UPDATE SKIP LOCKED",
);

/// Every run under the roots in `?1` (the roots included), with its root and depth: children
/// and continuations, followed down `runs_parent`.
pub const TREE_SQL: Sql = Sql::split(
    "WITH RECURSIVE tree(root, run_id, depth) AS (
        SELECT value, value, 0 FROM json_each(?1)
        UNION ALL
        SELECT t.root, r.run_id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.run_id)
    SELECT root, run_id, depth FROM tree",
    "WITH RECURSIVE tree(root, run_id, depth) AS (
        SELECT x, x, 0 FROM json_array_elements_text(CAST(?1 AS TEXT)::json) AS x
        UNION ALL
        SELECT t.root, r.run_id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.run_id)
    SELECT root, run_id, CAST(depth AS BIGINT) FROM tree",
);

/// Which event seqs of the JSON array `?1` (decimal strings) the log holds: restore refuses
/// them, as it never renumbers an event. Probes of the primary key.
pub const EXISTING_SEQS_SQL: Sql = Sql::split(
    "SELECT CAST(seq AS TEXT) FROM events
    WHERE seq IN (SELECT CAST(value AS INTEGER) FROM json_each(?1))",
    "SELECT CAST(seq AS TEXT) FROM events
    WHERE seq = ANY (ARRAY(SELECT CAST(json_array_elements_text(CAST(?1 AS TEXT)::json) AS BIGINT)))",
);

/// Which dispatch ids of `?1` an attempt holds (the unique index on `dispatch_id`).
pub const EXISTING_DISPATCH_IDS_SQL: Sql = Sql::split(
    "SELECT dispatch_id FROM attempts WHERE dispatch_id IN (SELECT value FROM json_each(?1))",
    "SELECT dispatch_id FROM attempts
    WHERE dispatch_id = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))",
);

/// Which idempotency keys of `?1` an event holds. `IS NOT NULL` names the partial unique
/// index's condition, so both planners probe that index.
pub const EXISTING_IDEMPOTENCY_KEYS_SQL: Sql = Sql::split(
    "SELECT idempotency_key FROM events
    WHERE idempotency_key IS NOT NULL AND idempotency_key IN (SELECT value FROM json_each(?1))",
    "SELECT idempotency_key FROM events
    WHERE idempotency_key IS NOT NULL
      AND idempotency_key = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))",
);

/// A statement that waits for its answer, so whatever a transaction has queued before it (on
/// PostgreSQL) goes out and fails here, where the caller can name what failed.
pub const FLUSH_SQL: Sql = Sql::same("SELECT 1");

/// The state of each run in `?1`, read after locking them on PostgreSQL (a late write on one
/// of them waits for the prune, then finds the run gone). In run id order, the order every
/// multi-run lock is taken in.
pub const STATES_SQL: Sql = Sql::split(
    "SELECT run_id, status, completed_at FROM runs
    WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id",
    "SELECT run_id, status, completed_at FROM runs
    WHERE run_id = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))
    ORDER BY run_id FOR UPDATE",
);

/// Before a batch deletes events: SQLite's floor under the next `seq` rises to the newest one
/// (one probe of the rowid's last entry), so deleting the newest events never hands their
/// numbers out again (a reader whose cursor had passed them would skip the new events). Every
/// batch raises it, whether or not it holds the newest event: cheaper than finding out, and
/// the floor never passes a number already handed out. PostgreSQL's sequence never goes back:
/// nothing to do.
pub const SEQ_FLOOR_SQL: Sql = Sql::split(
    "UPDATE event_seq_floor SET seq = max(seq, coalesce((SELECT max(seq) FROM events), 0))
    WHERE id = 1",
    "SELECT 1",
);

/// [`SEQ_AT_LEAST_SQL`]'s lock. PostgreSQL: `setval` is not a compare-and-set, so no writer
/// may draw a number between the sequence's read and its `setval` (a lower value would then be
/// set back and handed out again); an INSERT into events holds ROW EXCLUSIVE until its
/// transaction ends, which SHARE ROW EXCLUSIVE excludes, as it does a second caller of this.
/// SQLite's write transaction already excludes every other writer.
pub const SEQ_LOCK_SQL: Sql =
    Sql::split("SELECT 1", "LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE");

/// Every new event numbered above `?1`: SQLite raises its floor; PostgreSQL moves the sequence
/// up when its next number would not be above `?1` (with `is_called` false, `last_value` is
/// the next number itself, not yet handed out). Never lowers either.
pub const SEQ_AT_LEAST_SQL: Sql = Sql::split(
    "UPDATE event_seq_floor SET seq = max(seq, ?1) WHERE id = 1",
    "SELECT setval('events_seq_seq', CAST(?1 AS BIGINT)) FROM events_seq_seq
    WHERE last_value < CAST(?1 AS BIGINT) OR (last_value = CAST(?1 AS BIGINT) AND NOT is_called)",
);

/// List the runs being pruned, which the events' delete trigger requires.
pub const PRUNING_INSERT_SQL: Sql = Sql::split(
    "INSERT INTO pruning (run_id) SELECT value FROM json_each(?1)",
    "INSERT INTO pruning (run_id) SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)",
);

/// Empty the list before the commit: a committed row would let a later transaction delete.
pub const PRUNING_CLEAR_SQL: Sql = Sql::same("DELETE FROM pruning");

/// The definitions in `?1` that no run refers to any more (`runs_definition_ref`).
pub const DEFINITIONS_DELETE_SQL: Sql = Sql::split(
    "DELETE FROM definitions WHERE definition_digest IN (SELECT value FROM json_each(?1))
      AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.definition_digest = definitions.definition_digest)",
    "DELETE FROM definitions
    WHERE definition_digest = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))
      AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.definition_digest = definitions.definition_digest)",
);

/// The `NOT EXISTS` conditions of [`BLOBS_DELETE_SQL`], one per column that refers to a blob.
macro_rules! blobs_unreferenced {
    () => {
        "
      AND NOT EXISTS (SELECT 1 FROM definitions d WHERE d.definition_digest = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.definition_digest = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.params = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.input = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.launch_options = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.source = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.plan = blobs.digest)
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.outputs = blobs.digest)"
    };
}

/// The blobs in `?1` that no run and no definition refers to any more: one index probe per
/// referring column (the `runs_*_ref` indexes). A blob stored with `put_json` and never named
/// by a run is not in `?1`: prune removes only what the pruned runs held.
pub const BLOBS_DELETE_SQL: Sql = Sql::split(
    concat!(
        "DELETE FROM blobs WHERE digest IN (SELECT value FROM json_each(?1))",
        blobs_unreferenced!()
    ),
    concat!(
        "DELETE FROM blobs
        WHERE digest = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))",
        blobs_unreferenced!()
    ),
);

/// Which of the runs in `?1` exist (restore refuses them).
pub const EXISTING_RUNS_SQL: Sql = Sql::split(
    "SELECT run_id FROM runs WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id",
    "SELECT run_id FROM runs
    WHERE run_id = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))
    ORDER BY run_id",
);

//! Every SQL statement the ledger operations run on both backends, named after the operation
//! that runs it, so a statement leads to its caller and back. Each one is prepared once per
//! connection (statement cache). Lists are passed as one JSON array parameter and read with
//! `json_each` (`jsonb_array_elements_text` on PostgreSQL), so a statement never changes shape
//! with the number of refs or types and stays cached. A statement only one backend runs lives
//! in that backend.

use crate::status::UnitStatus;
use crate::store::Sql;

// ------------------------------------------------------------------ blobs

/// Content addressing makes a second insert of the same digest a no-op.
pub const PUT_BLOB_SQL: Sql = Sql::same(
    "INSERT INTO blobs(digest, bytes, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
);
pub const GET_BLOB_SQL: Sql = Sql::same("SELECT bytes FROM blobs WHERE digest = ?1");

// ------------------------------------------------------------------ events

/// Every event takes its run's next revision, read from the last entry of the
/// `(resource_id, revision)` index (one B-tree descent, no row written to `runs`): the write
/// lock of the IMMEDIATE transaction makes max + 1 race-free, and `UNIQUE(resource_id,
/// revision)` proves one event per revision even if it were not.
///
/// SQLite: `seq` is numbered here, above both the newest `seq` and `event_seq_floor` (which
/// prune raises before it deletes the newest events), so a number is never handed out twice;
/// left to SQLite, a rowid is max + 1 and would repeat a pruned one. Both are single probes
/// (the rowid's last entry, the floor's one row), read once per statement. `VALUES` with
/// scalar subqueries, not `INSERT ... SELECT ... FROM events`: SQLite copies the rows of a
/// SELECT from the table it inserts into through a temporary B-tree first, opened and freed
/// on every append (measured: ~2 us of a 30 us reserve + finish).
///
/// PostgreSQL: `seq` is the identity sequence's. The caller holds the run's row lock
/// (`Tx::lock_run`), taken by an earlier statement, so this statement's snapshot already sees
/// the previous writer's events; the casts type the parameters, which a SELECT list does not.
pub const INSERT_EVENT_SQL: Sql = Sql::split(
    "INSERT INTO events(seq, resource_id, revision, type, actor_type,
    actor_id, generation, payload, idempotency_key, ts)
    VALUES (max(coalesce((SELECT max(seq) FROM events), 0),
        (SELECT seq FROM event_seq_floor WHERE id = 1)) + 1,
      ?1, (SELECT coalesce(max(revision), 0) + 1 FROM events WHERE resource_id = ?1),
      ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    "INSERT INTO events(resource_id, revision, type, actor_type,
    actor_id, generation, payload, idempotency_key, ts)
    SELECT CAST(?1 AS TEXT), coalesce(max(revision), 0) + 1, CAST(?2 AS TEXT),
      CAST(?3 AS TEXT), CAST(?4 AS TEXT), CAST(?5 AS BIGINT), CAST(?6 AS TEXT),
      CAST(?7 AS TEXT), CAST(?8 AS BIGINT)
    FROM events WHERE resource_id = ?1",
);
/// Every run's events in `seq` order, after the cursor `?1`. `?2 IS NULL` switches the type
/// filter off without changing the statement. ?3: the page size. ?4: the event horizon
/// ([`Store::event_horizon`](crate::store::Store::event_horizon)): only `seq` below it, or
/// NULL for all. The `seq` range is the primary key; a type filter that names a unit type reads
/// the range and keeps what matches: those types are most of the log, so a page is found within
/// about a page's worth of rows (other filters have their own statement, below).
pub const LIST_EVENTS_SQL: Sql = Sql::split(
    "SELECT seq, resource_id, revision, type, actor_type, actor_id,
    generation, payload, ts FROM events
    WHERE seq > ?1
      AND (?2 IS NULL OR type IN (SELECT value FROM json_each(?2)))
      AND (?4 IS NULL OR seq < ?4)
    ORDER BY seq LIMIT ?3",
    "SELECT seq, resource_id, revision, type, actor_type, actor_id,
    generation, payload, ts FROM events
    WHERE seq > ?1
      AND (CAST(?2 AS TEXT) IS NULL
           OR type IN (SELECT jsonb_array_elements_text(CAST(?2 AS TEXT)::jsonb)))
      AND (CAST(?4 AS BIGINT) IS NULL OR seq < ?4)
    ORDER BY seq LIMIT ?3",
);

/// Every run's events of some rare types (`?2`: none of them `unit.started` or
/// `unit.finished`), after the cursor `?1`, by the partial index `events_rare_type`: without
/// it a filter for `run.completed` walks every unit event after the cursor (two per attempt) to
/// find a few. The index leaves out the two unit types, so the reserve and finish paths write
/// no entry; the repeated `NOT IN` names the index's own condition, which is how SQLite knows
/// the index holds every row the query can return. ?3: the page size; ?4: the event horizon.
/// PostgreSQL reads a page of each type by its own range of the index (at most ?3 rows each)
/// and keeps the first ?3 of them in seq order: handed the types as one array it cannot
/// estimate, it walks the log by `seq` and filters whenever the page is small (2.5 ms to find
/// five `run.started` among 8 000 unit events, against 0.06 ms by the index).
pub const LIST_RARE_EVENTS_SQL: Sql = Sql::split(
    "SELECT seq, resource_id, revision, type, actor_type, actor_id,
    generation, payload, ts FROM events
    WHERE type IN (SELECT value FROM json_each(?2))
      AND type NOT IN ('unit.started', 'unit.finished')
      AND seq > ?1
      AND (?4 IS NULL OR seq < ?4)
    ORDER BY seq LIMIT ?3",
    "SELECT e.seq, e.resource_id, e.revision, e.type, e.actor_type, e.actor_id,
        e.generation, e.payload, e.ts
    FROM (SELECT DISTINCT t FROM json_array_elements_text(CAST(?2 AS TEXT)::json) AS t) AS k,
    LATERAL (SELECT seq, resource_id, revision, type, actor_type, actor_id,
            generation, payload, ts FROM events
        WHERE type = k.t AND type NOT IN ('unit.started', 'unit.finished')
          AND seq > ?1
          AND (CAST(?4 AS BIGINT) IS NULL OR seq < ?4)
        ORDER BY seq LIMIT ?3) AS e
    ORDER BY e.seq LIMIT ?3",
);

/// The event types every attempt writes: `LIST_RARE_EVENTS_SQL` serves every other filter.
pub const DENSE_EVENT_TYPES: [&str; 2] = ["unit.started", "unit.finished"];

/// One run's (`?2`) events after the cursor `?1`, by the `(resource_id, revision)` index, so
/// a poll costs the same however large the rest of the log is: a catch-all
/// `(?2 IS NULL OR resource_id = ?2)` in one shared statement leaves the planner only the
/// `seq` order, walking every other run's events after the cursor.
///
/// A run's writers hold its lock, so its revisions and its `seq`s rise together and
/// "after `seq` ?1" is "after the revision of event ?1". When ?1 is one of this run's events
/// (what a poller passes back), that revision starts the index range; any other cursor starts
/// at the run's first revision and `seq > ?1` keeps the right ones (exact, only slower).
pub const LIST_RUN_EVENTS_SQL: Sql = Sql::split(
    "SELECT seq, resource_id, revision, type, actor_type, actor_id,
    generation, payload, ts FROM events
    WHERE resource_id = ?2
      AND revision > coalesce(
        (SELECT revision FROM events WHERE seq = ?1 AND resource_id = ?2), 0)
      AND seq > ?1
      AND (?3 IS NULL OR type IN (SELECT value FROM json_each(?3)))
    ORDER BY revision LIMIT ?4",
    "SELECT seq, resource_id, revision, type, actor_type, actor_id,
    generation, payload, ts FROM events
    WHERE resource_id = CAST(?2 AS TEXT)
      AND revision > coalesce(
        (SELECT revision FROM events WHERE seq = CAST(?1 AS BIGINT) AND resource_id = ?2), 0)
      AND seq > ?1
      AND (CAST(?3 AS TEXT) IS NULL
           OR type IN (SELECT jsonb_array_elements_text(CAST(?3 AS TEXT)::jsonb)))
    ORDER BY revision LIMIT ?4",
);

// ------------------------------------------------------------------ runs

/// The columns of a `Run`, with params and outputs joined from their blobs.
macro_rules! run_select {
    () => {
        run_select!("runs r")
    };
    ($from:literal) => {
        concat!(
            "SELECT r.run_id, r.workflow_ref, r.workflow_name, r.scope_key, r.status,
            r.current_step_id, r.parent_run_id, r.parent_unit_id, r.invocation_key,
            r.origin_session_id, p.bytes, o.bytes,
            (SELECT coalesce(max(e.revision), 0) FROM events e WHERE e.resource_id = r.run_id),
            r.created_at, r.updated_at,
            r.completed_at, r.not_before, r.priority, r.concurrency_key
         FROM ",
            $from,
            " LEFT JOIN blobs p ON p.digest = r.params
                     LEFT JOIN blobs o ON o.digest = r.outputs "
        )
    };
}

pub const GET_RUN_SQL: Sql = Sql::same(concat!(run_select!(), "WHERE r.run_id = ?1"));
pub const RUN_STATUS_SQL: Sql = Sql::same(
    "SELECT status, current_step_id, scope_key, workflow_ref FROM runs WHERE run_id = ?1",
);
pub const RUN_EXISTS_SQL: Sql = Sql::same("SELECT 1 FROM runs WHERE run_id = ?1");

/// The start guard, read inside the IMMEDIATE transaction; the partial unique index
/// `runs_scope_guard` is what makes it race-proof for the run's own ref.
pub const START_RUN_GUARD_SQL: Sql = Sql::split(
    "SELECT run_id FROM runs
    WHERE parent_run_id IS NULL AND status = 'active' AND scope_key = ?1
      AND workflow_ref IN (SELECT value FROM json_each(?2))
    ORDER BY updated_at DESC, created_at DESC LIMIT 1",
    "SELECT run_id FROM runs
    WHERE parent_run_id IS NULL AND status = 'active' AND scope_key = ?1
      AND workflow_ref IN (SELECT jsonb_array_elements_text(CAST(?2 AS TEXT)::jsonb))
    ORDER BY updated_at DESC, created_at DESC LIMIT 1",
);
/// A run has revision 0 until its first event (`run.started`) is appended.
pub const START_RUN_INSERT_SQL: Sql = Sql::same(
    "INSERT INTO runs(run_id, workflow_ref, workflow_name,
    scope_key, guarded, status, params, plan, plan_version, current_step_id, parent_run_id,
    parent_unit_id, invocation_key, agent_harness, agent_session_id, created_at,
    updated_at, retry_policy) VALUES (?1, ?2, ?3, ?4, ?5, 'active', ?6, ?7, ?8, ?9, ?10, ?11,
    ?12, ?13, ?14, ?15, ?15, ?16)",
);
pub const START_RUN_STEP_SQL: Sql = Sql::same(
    "INSERT INTO steps(run_id, step_id, title, instructions,
    completion, sequence_index, status, retry_policy) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
);

pub const PUBLISH_CHILD_RUN_FIND_SQL: Sql = Sql::same(
    "SELECT run_id, workflow_ref FROM runs WHERE parent_run_id = ?1 AND invocation_key = ?2",
);
pub const PARENT_SCOPE_SQL: Sql = Sql::same("SELECT scope_key, status FROM runs WHERE run_id = ?1");
/// The running attempts of a run: a unit's running attempt is its latest (a new attempt is
/// made only after the last one finished, and a reclaim keeps the attempt), so the units say
/// which, through the run's own rows.
pub const RUNNING_ATTEMPTS_SQL: Sql = Sql::same(
    "SELECT u.unit_id, u.attempts, a.dispatch_id FROM units u
    JOIN attempts a ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts
    WHERE u.run_id = ?1 AND u.status = 'running' AND a.status = 'running'
    ORDER BY u.unit_id",
);

/// `%`, `_` and `\` are escaped by the caller, so the prefix matches literally.
/// Run ids in `[?1, ?2)` in byte order (see `runs::resolve_run_id`). SQLite compares text
/// bytewise, so the primary key's index serves the range; PostgreSQL compares by the database's
/// collation, where ids sharing a prefix need not be adjacent (`en_US` ignores `-` at first),
/// so it compares under `"C"` (bytewise) instead, a range of `runs_id_bytes`.
pub const RESOLVE_RUN_ID_SQL: Sql = Sql::split(
    "SELECT run_id FROM runs WHERE run_id >= ?1 AND run_id < ?2 ORDER BY run_id LIMIT 100",
    "SELECT run_id FROM runs WHERE run_id COLLATE \"C\" >= ?1 AND run_id COLLATE \"C\" < ?2
     ORDER BY run_id COLLATE \"C\" LIMIT 100",
);

/// The page of `list_runs` after the status test (see [`LIST_RUNS_SQL`]): the cursor, the
/// filters, the order and the page size, once per dialect.
macro_rules! run_page {
    (sqlite) => {
        "(r.updated_at, r.created_at, r.run_id) < (?5, ?6, ?7)
       AND (?1 = 1 OR r.scope_key IS ?2)
       AND (?3 IS NULL OR r.workflow_ref IN (SELECT value FROM json_each(?3)))
       AND (?4 = 1 OR r.parent_run_id IS NULL)
       AND r.updated_at >= ?9
     ORDER BY r.updated_at DESC, r.created_at DESC, r.run_id DESC LIMIT ?8"
    };
    (postgres) => {
        "(r.updated_at, r.created_at, r.run_id COLLATE \"C\")
             < (CAST(?5 AS BIGINT), CAST(?6 AS BIGINT), CAST(?7 AS TEXT) COLLATE \"C\")
       AND (CAST(?1 AS BIGINT) = 1 OR r.scope_key IS NOT DISTINCT FROM CAST(?2 AS TEXT))
       AND (CAST(?3 AS TEXT) IS NULL
            OR r.workflow_ref IN (SELECT jsonb_array_elements_text(CAST(?3 AS TEXT)::jsonb)))
       AND (CAST(?4 AS BIGINT) = 1 OR r.parent_run_id IS NULL)
       AND r.updated_at >= CAST(?9 AS BIGINT)
     ORDER BY r.updated_at DESC, r.created_at DESC, r.run_id COLLATE \"C\" DESC
     LIMIT CAST(?8 AS BIGINT)"
    };
}

/// Runs newest first, one page: ?1 all scopes, ?2 the scope (`IS` matches NULL too), ?3 the
/// refs (NULL = any), ?4 include children, then the cursor, the last run of the page before
/// (?5 `updated_at`, ?6 `created_at`, ?7 `run_id`; the first page passes a position above
/// every run, or `updated_before`'s), ?8 the page size and ?9 the least `updated_at` (the
/// range's other end, a bound of the same index range). The cursor is a row value compared with the order's own
/// columns, so the walk starts at the cursor's place in `runs_recent` instead of skipping
/// every run of the pages before; a catch-all "no cursor" branch would hide that range from
/// the planner. The filters are checked on the rows walked. PostgreSQL compares run ids
/// bytewise (`"C"`) as the index and SQLite do.
pub const LIST_RUNS_SQL: Sql = Sql::split(
    concat!(run_select!(), "WHERE ", run_page!(sqlite)),
    concat!(run_select!(), "WHERE ", run_page!(postgres)),
);
/// [`LIST_RUNS_SQL`] for runs of one status (?10): a range of `runs_status_recent`, already in
/// page order, so a status rare among millions of runs is found without walking the others.
/// Several statuses are one of these each, merged by the caller.
pub const LIST_RUNS_OF_STATUS_SQL: Sql = Sql::split(
    concat!(
        run_select!(),
        "WHERE r.status = ?10 AND ",
        run_page!(sqlite)
    ),
    concat!(
        run_select!(),
        "WHERE r.status = CAST(?10 AS TEXT) AND ",
        run_page!(postgres)
    ),
);
/// [`LIST_RUNS_OF_STATUS_SQL`] for runs of one workflow name (?11) too: a range of
/// `runs_name_status_recent`. A name alone is every status's range, merged by the caller (a
/// handful of short ranges), so one index serves the name with or without statuses. SQLite is
/// told the index: without statistics (a ledger is never `ANALYZE`d) it walked the status's
/// range in `runs_status_recent` instead, every active run for a name that has none.
pub const LIST_RUNS_OF_NAME_SQL: Sql = Sql::split(
    concat!(
        run_select!("runs r INDEXED BY runs_name_status_recent"),
        "WHERE r.workflow_name = ?11 AND r.status = ?10 AND ",
        run_page!(sqlite)
    ),
    concat!(
        run_select!(),
        "WHERE r.workflow_name = CAST(?11 AS TEXT) AND r.status = CAST(?10 AS TEXT) AND ",
        run_page!(postgres)
    ),
);
/// Every status's runs, each counted up to ?1, in one statement (one round trip on PostgreSQL): per
/// status a walk of at most ?1 entries of `runs_status_recent`'s range for it, so a total across
/// millions of runs costs what ?1 does (the ledger keeps no running count, which every run's every
/// move would have to write under one hot row). The statuses are spelled out, not read from the
/// runs (which would be a walk of them all); a conformance test checks that the list is every
/// status. The order is the index's own: without it PostgreSQL may count a common status by
/// scanning the table until ?1 rows match, a walk of every run when they are at its end.
macro_rules! run_counts {
    ($limit:literal, $alias:literal) => {
        concat!(
            "SELECT s.status, (SELECT count(*) FROM (SELECT 1 FROM runs r
                WHERE r.status = s.status ORDER BY r.updated_at DESC LIMIT ",
            $limit,
            ")",
            $alias,
            ")
            FROM (SELECT 'queued' AS status UNION ALL SELECT 'starting' UNION ALL
                SELECT 'active' UNION ALL SELECT 'blocked' UNION ALL SELECT 'parked' UNION ALL
                SELECT 'completed' UNION ALL SELECT 'failed' UNION ALL SELECT 'cancelled') s"
        )
    };
}
pub const RUN_COUNTS_SQL: Sql = Sql::split(
    run_counts!("?1", ""),
    run_counts!("CAST(?1 AS BIGINT)", " AS counted"),
);
/// ?3 = 0: in this scope; ?3 = 1: in any other scope or none. Two separate questions, so a
/// same-scope row can never mask another scope's run.
pub const FIND_ACTIVE_RUN_SQL: Sql = Sql::split(
    concat!(
        run_select!(),
        "WHERE r.parent_run_id IS NULL AND r.status = 'active'
       AND r.workflow_ref IN (SELECT value FROM json_each(?1))
       AND CASE WHEN ?3 = 1 THEN (r.scope_key IS NULL OR r.scope_key <> ?2)
                ELSE r.scope_key = ?2 END
     ORDER BY r.updated_at DESC, r.created_at DESC LIMIT 1"
    ),
    concat!(
        run_select!(),
        "WHERE r.parent_run_id IS NULL AND r.status = 'active'
       AND r.workflow_ref IN (SELECT jsonb_array_elements_text(CAST(?1 AS TEXT)::jsonb))
       AND CASE WHEN CAST(?3 AS BIGINT) = 1
                THEN (r.scope_key IS NULL OR r.scope_key <> CAST(?2 AS TEXT))
                ELSE r.scope_key = CAST(?2 AS TEXT) END
     ORDER BY r.updated_at DESC, r.created_at DESC LIMIT 1"
    ),
);
pub const FIND_SCOPE_OCCUPANT_SQL: Sql = Sql::same(concat!(
    run_select!(),
    "WHERE r.parent_run_id IS NULL AND r.status IN ('active', 'blocked') AND r.scope_key = ?1
     ORDER BY r.updated_at DESC, r.created_at DESC LIMIT 1"
));
pub const CHILD_RUNS_SQL: Sql = Sql::same(concat!(
    run_select!(),
    "WHERE r.parent_run_id = ?1 ORDER BY r.created_at, r.run_id"
));

/// A parent's children counted by status: the parent's range of `runs_parent`.
pub const CHILD_COUNTS_SQL: Sql =
    Sql::same("SELECT status, count(*) FROM runs WHERE parent_run_id = ?1 GROUP BY status");

pub const LIST_STEPS_SQL: Sql = Sql::same(
    "SELECT run_id, step_id, title, instructions, sequence_index,
    status, notes, evidence, summary, completed_at FROM steps WHERE run_id = ?1
    ORDER BY sequence_index",
);
pub const STEP_STATUS_SQL: Sql =
    Sql::same("SELECT status, sequence_index FROM steps WHERE run_id = ?1 AND step_id = ?2");
pub const COMPLETE_STEP_SQL: Sql = Sql::same(
    "UPDATE steps SET status = ?3, notes = ?4, evidence = ?5,
    summary = ?6, completed_at = ?7 WHERE run_id = ?1 AND step_id = ?2",
);
pub const NEXT_STEP_SQL: Sql = Sql::same(
    "SELECT step_id FROM steps WHERE run_id = ?1
    AND sequence_index > ?2 ORDER BY sequence_index LIMIT 1",
);
pub const ACTIVATE_STEP_SQL: Sql = Sql::same(
    "UPDATE steps SET status = 'active', notes = NULL,
    evidence = NULL, completed_at = NULL WHERE run_id = ?1 AND step_id = ?2",
);
pub const BLOCK_STEP_SQL: Sql =
    Sql::same("UPDATE steps SET status = 'blocked', notes = ?3 WHERE run_id = ?1 AND step_id = ?2");
/// `resume_run` reopens the current step only if it is blocked or failed: a step that is
/// active already, or finished, stays as it is.
pub const REOPEN_STEP_SQL: Sql = Sql::same(
    "UPDATE steps SET status = 'active', notes = NULL,
    evidence = NULL, completed_at = NULL
    WHERE run_id = ?1 AND step_id = ?2 AND status IN ('blocked', 'failed')",
);

/// Every status change goes through this one statement; `completed_at` follows the status so
/// the table's CHECK (terminal iff `completed_at`) holds.
pub const SET_RUN_STATUS_SQL: Sql = Sql::same(
    "UPDATE runs SET status = ?2, current_step_id = ?3,
    updated_at = ?4,
    completed_at = CASE WHEN ?2 IN ('completed', 'failed', 'cancelled') THEN CAST(?4 AS BIGINT) END
    WHERE run_id = ?1",
);
pub const SET_OUTPUTS_SQL: Sql =
    Sql::same("UPDATE runs SET outputs = ?2, updated_at = ?3 WHERE run_id = ?1");

// ------------------------------------------------------------------ attempts

/// What a judgment reads of a run (`store::rows::Part::Run`): its state and its lease's fence,
/// one primary-key probe each.
pub const SNAPSHOT_RUN_SQL: Sql = Sql::same(
    "SELECT r.run_id, r.status, r.current_step_id, r.scope_key, r.workflow_ref, l.generation,
        l.token_hash, l.expires_at, l.owner_type, l.owner_id
    FROM runs r LEFT JOIN leases l ON l.resource_id = r.run_id
    WHERE r.run_id = ?1",
);
/// A unit's latest attempt and where its unit stands under its retry policy
/// (`store::rows::Part::Latest`): the unit's row names its latest attempt (`attempts`), so two
/// primary-key probes.
pub const SNAPSHOT_LATEST_SQL: Sql = Sql::same(
    "SELECT a.run_id, a.unit_id, a.attempt, a.dispatch_id, a.status, a.step_id, a.input_hash,
        a.reclaims, a.lease_generation, u.status, u.retry_at
    FROM units u JOIN attempts a
      ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts
    WHERE u.run_id = ?1 AND u.unit_id = ?2",
);
/// A named attempt, if it still runs (`store::rows::Part::Running`): a primary-key probe. No
/// retry policy: the finish completes or cancels the attempt.
pub const SNAPSHOT_RUNNING_SQL: Sql = Sql::same(
    "SELECT run_id, unit_id, attempt, dispatch_id, step_id, phase, NULL
    FROM attempts
    WHERE run_id = ?1 AND unit_id = ?2 AND attempt = ?3 AND dispatch_id = ?4
      AND status = 'running'",
);
/// [`SNAPSHOT_RUNNING_SQL`] for a finish that fails the attempt, with the retry policy it
/// applies: its step's, else its run's (one primary-key probe each, the run's only when the
/// step has none: `coalesce` stops at its first value).
pub const SNAPSHOT_RUNNING_POLICY_SQL: Sql = Sql::same(
    "SELECT a.run_id, a.unit_id, a.attempt, a.dispatch_id, a.step_id, a.phase,
        coalesce(
            (SELECT s.retry_policy FROM steps s
             WHERE s.run_id = a.run_id AND s.step_id = a.step_id),
            (SELECT r.retry_policy FROM runs r WHERE r.run_id = a.run_id))
    FROM attempts a
    WHERE a.run_id = ?1 AND a.unit_id = ?2 AND a.attempt = ?3 AND a.dispatch_id = ?4
      AND a.status = 'running'",
);
/// A reclaim keeps the attempt number and dispatch id; it only records who holds it now, and
/// counts ?7 more reclaims (a judgment folds the reclaims of one attempt into one row). A
/// reclaim under a claim records the reclaimer's generation (the claim's epoch): the dispatch
/// id stays, and the attempt says which owner handed it out last. Guarded on `running`: the
/// judge reclaimed a running attempt, so any other is a miscount. And on the count as read
/// (?8): a write made without the run's lock (PostgreSQL's first try) must not add to a count
/// another writer changed meanwhile, since the caller is answered the count the judge saw.
pub const RECLAIM_ATTEMPT_SQL: Sql = Sql::same(
    "UPDATE attempts SET reclaims = reclaims + ?7,
    holder = coalesce(?4, holder), lease_generation = coalesce(?5, lease_generation),
    trace_context = coalesce(?6, trace_context)
    WHERE run_id = ?1 AND unit_id = ?2 AND attempt = ?3 AND status = 'running'
      AND reclaims = ?8",
);
/// Only when the holder changes: SQLite rewrites a row's page even when an UPDATE leaves every
/// value as it was, and that page is one more WAL frame for the commit.
pub const RECLAIM_UNIT_SQL: Sql = Sql::split(
    "UPDATE units SET claim_holder = ?3
    WHERE run_id = ?1 AND unit_id = ?2 AND ?3 IS NOT NULL AND claim_holder IS NOT ?3",
    "UPDATE units SET claim_holder = ?3
    WHERE run_id = ?1 AND unit_id = ?2 AND CAST(?3 AS TEXT) IS NOT NULL
      AND claim_holder IS DISTINCT FROM CAST(?3 AS TEXT)",
);
/// How a reservation overwrites a unit's projection: every column from the new attempt and the
/// previous attempt's result cleared, so the projection never shows a new attempt with an old
/// outcome. One text for the one-by-one and the set-based statements.
macro_rules! units_reserve_upsert {
    () => {
        " ON CONFLICT(run_id, unit_id) DO UPDATE SET step_id = excluded.step_id,
      node_id = excluded.node_id, parent_unit_id = excluded.parent_unit_id,
      phase = excluded.phase, runner = excluded.runner, engine = excluded.engine,
      model = excluded.model, input_hash = excluded.input_hash,
      worktree_path = excluded.worktree_path, status = 'running',
      claim_holder = excluded.claim_holder, attempts = excluded.attempts,
      started_at = excluded.started_at, result = NULL, tokens = NULL, failure_reason = NULL,
      session_id = NULL, finished_at = NULL, retry_at = NULL"
    };
}
#[cfg(feature = "postgres")]
pub(crate) use units_reserve_upsert;

/// The projection follows the newest attempt: every column is overwritten and the previous
/// attempt's result cleared (see `units_reserve_upsert`).
pub const RESERVE_ATTEMPT_UNIT_SQL: Sql = Sql::same(concat!(
    "INSERT INTO units(run_id, unit_id, step_id, node_id,
    parent_unit_id, phase, runner, engine, model, input_hash, worktree_path, status, claim_holder,
    attempts, first_started_at, started_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'running', ?12, ?13, ?14, ?14)
",
    units_reserve_upsert!()
));

pub const RESERVE_ATTEMPT_INSERT_SQL: Sql = Sql::same(
    "INSERT INTO attempts(run_id, unit_id, attempt,
    dispatch_id, step_id, node_id, phase, input_hash, status, holder, lease_generation,
    started_at, trace_context) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'running', ?9, ?10, ?11,
    ?12)",
);

/// A finish the judge found winning: still guarded as a compare-and-set (only a still-running
/// attempt with this exact dispatch id changes), so a judgment over a stale snapshot would
/// change no row and fail its count instead of finishing an attempt twice.
pub const FINISH_ATTEMPT_SQL: Sql = Sql::same(
    "UPDATE attempts SET status = ?5, result = ?6, tokens = ?7,
    failure_reason = ?8, session_id = ?9, finished_at = ?10
    WHERE run_id = ?1 AND unit_id = ?2 AND attempt = ?3 AND dispatch_id = ?4
      AND status = 'running'",
);
/// Guarded on the attempt number: the projection must still show this attempt. ?4 is the
/// unit's status: the attempt's, or `exhausted`; ?10 when a failed unit may be tried again.
pub const FINISH_ATTEMPT_UNIT_SQL: Sql = Sql::same(
    "UPDATE units SET status = ?4, result = ?5, tokens = ?6,
    failure_reason = ?7, session_id = ?8, finished_at = ?9, retry_at = ?10
    WHERE run_id = ?1 AND unit_id = ?2 AND attempts = ?3 AND status = 'running'",
);

pub const LIST_ATTEMPTS_SQL: Sql = Sql::same(
    "SELECT run_id, unit_id, attempt, dispatch_id, status, phase,
    holder, lease_generation, reclaims, result, tokens, failure_reason, started_at, finished_at,
    trace_context
    FROM attempts WHERE run_id = ?1 AND unit_id = ?2 ORDER BY attempt",
);
/// The newest ?3 attempts of each unit of run ?1 named in the JSON array ?2: per unit, the range
/// of the attempts' primary key above its attempt count less ?3. The answer is at most the
/// units times ?3 rows, so sorting it costs what it returns.
pub const UNIT_ATTEMPTS_SQL: Sql = Sql::split(
    "SELECT a.run_id, a.unit_id, a.attempt, a.dispatch_id, a.status, a.phase,
    a.holder, a.lease_generation, a.reclaims, a.result, a.tokens, a.failure_reason,
    a.started_at, a.finished_at, a.trace_context
    FROM units u JOIN attempts a
      ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt > u.attempts - ?3
    WHERE u.run_id = ?1 AND u.unit_id IN (SELECT value FROM json_each(?2))
    ORDER BY a.unit_id, a.attempt",
    "SELECT a.run_id, a.unit_id, a.attempt, a.dispatch_id, a.status, a.phase,
    a.holder, a.lease_generation, a.reclaims, a.result, a.tokens, a.failure_reason,
    a.started_at, a.finished_at, a.trace_context
    FROM units u JOIN attempts a
      ON a.run_id = u.run_id AND a.unit_id = u.unit_id
      AND a.attempt > u.attempts - CAST(?3 AS BIGINT)
    WHERE u.run_id = ?1
      AND u.unit_id = ANY (ARRAY(SELECT json_array_elements_text(CAST(?2 AS TEXT)::json)))
    ORDER BY a.unit_id COLLATE \"C\", a.attempt",
);
/// The newest event's `seq` below the horizon ?1 (NULL: none), 0 for an empty log: the
/// primary key's last entry.
pub const NEWEST_EVENT_SEQ_SQL: Sql = Sql::same(
    "SELECT coalesce(max(seq), 0) FROM events
    WHERE CAST(?1 AS BIGINT) IS NULL OR seq < CAST(?1 AS BIGINT)",
);
/// A page of a run's units in order of first reservation: ?1 the run, (?2 `first_started_at`,
/// ?3 `unit_id`) the last unit of the page before (the first page passes a position below every
/// unit), ?4 a step and ?5 a status (NULL = any), ?6 the page size. The cursor is a row value on
/// the order's own columns, a range of `units_first_started`, so page N costs what page 1
/// does; the step and status filters are checked on the units walked. PostgreSQL compares unit
/// ids bytewise (`"C"`), as its index and SQLite do, and names the run under `"C"` as that
/// index keys it (see the migration: so the index serves only this read).
pub const LIST_UNITS_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE run_id = ?1 AND (first_started_at, unit_id) > (?2, ?3)
      AND (?4 IS NULL OR step_id = ?4) AND (?5 IS NULL OR status = ?5)
    ORDER BY first_started_at, unit_id LIMIT ?6",
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE run_id COLLATE \"C\" = CAST(?1 AS TEXT)
      AND (first_started_at, unit_id COLLATE \"C\")
          > (CAST(?2 AS BIGINT), CAST(?3 AS TEXT) COLLATE \"C\")
      AND (CAST(?4 AS TEXT) IS NULL OR step_id = ?4)
      AND (CAST(?5 AS TEXT) IS NULL OR status = ?5)
    ORDER BY first_started_at, unit_id COLLATE \"C\" LIMIT CAST(?6 AS BIGINT)",
);
/// The unit statuses `units_by_status` holds: every status off a unit's usual path.
pub const OFF_PATH: [UnitStatus; 5] = [
    UnitStatus::Pending,
    UnitStatus::Failed,
    UnitStatus::TimedOut,
    UnitStatus::Cancelled,
    UnitStatus::Exhausted,
];
/// [`LIST_UNITS_SQL`] for units of one status off the usual path (?5: not `running` or
/// `completed`, see [`OFF_PATH`]): a range of `units_by_status`, already in page order, so a
/// status that only the last of half a million units have is found without walking the others.
/// The index holds only such units, which the literal `NOT IN` tells the planner (a parameter
/// cannot); SQLite is told the index, which without statistics it may pass over for the run's
/// whole range in the primary key. Running and completed units keep [`LIST_UNITS_SQL`]: they
/// are most of a run's units, and an index of them would cost every reserve and finish a
/// write.
pub const LIST_UNITS_OF_STATUS_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units INDEXED BY units_by_status
    WHERE run_id = ?1 AND status = ?5 AND status NOT IN ('running', 'completed')
      AND (first_started_at, unit_id) > (?2, ?3)
      AND (?4 IS NULL OR step_id = ?4)
    ORDER BY first_started_at, unit_id LIMIT ?6",
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE run_id = CAST(?1 AS TEXT) AND status = CAST(?5 AS TEXT)
      AND status NOT IN ('running', 'completed')
      AND (first_started_at, unit_id COLLATE \"C\")
          > (CAST(?2 AS BIGINT), CAST(?3 AS TEXT) COLLATE \"C\")
      AND (CAST(?4 AS TEXT) IS NULL OR step_id = ?4)
    ORDER BY first_started_at, unit_id COLLATE \"C\" LIMIT CAST(?6 AS BIGINT)",
);
/// Where a unit is in its run's unit order (its `first_started_at`): the cursor of `units`.
pub const UNIT_PLACE_SQL: Sql =
    Sql::same("SELECT first_started_at FROM units WHERE run_id = ?1 AND unit_id = ?2");
/// A run's units counted by status in SQL: one range of the units' primary key (the run's own
/// rows), however many units the run and the ledger hold, and no unit crosses to the caller.
pub const UNIT_COUNTS_SQL: Sql =
    Sql::same("SELECT status, count(*) FROM units WHERE run_id = ?1 GROUP BY status");
pub const GET_UNIT_SQL: Sql = Sql::same(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units WHERE run_id = ?1 AND unit_id = ?2",
);
/// The failed units of every run whose retry time has come (?1), after the cursor (?2 retry
/// time, ?3 run, ?4 unit), at most ?5: a range of `units_retry_due`, which holds the units
/// waiting for a retry and no other, in its order. PostgreSQL compares ids bytewise, as SQLite
/// does and as its index keys them, and states its index's own predicate (see the migration).
pub const DUE_UNITS_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE retry_at IS NOT NULL AND retry_at <= ?1 AND (retry_at, run_id, unit_id) > (?2, ?3, ?4)
    ORDER BY retry_at, run_id, unit_id LIMIT ?5",
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE retry_at > -9223372036854775808 AND retry_at <= CAST(?1 AS BIGINT)
      AND (retry_at, run_id COLLATE \"C\", unit_id COLLATE \"C\")
          > (CAST(?2 AS BIGINT), CAST(?3 AS TEXT) COLLATE \"C\", CAST(?4 AS TEXT) COLLATE \"C\")
    ORDER BY retry_at, run_id COLLATE \"C\", unit_id COLLATE \"C\" LIMIT ?5",
);
/// [`DUE_UNITS_SQL`] of one run (?1): due by ?2, after (?3 retry time, ?4 unit), at most ?5;
/// a range of `units_retry_due_run` (see the migration for how PostgreSQL is kept to it: the
/// ledger-wide index has a predicate this read does not state, and the run is matched in its
/// column's own collation). SQLite orders by the run first, as that index does (the run is
/// fixed, so the order is the same): ordered by retry time alone it may take the ledger-wide
/// index and pass over every other run's waiting units.
pub const DUE_UNITS_RUN_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE run_id = ?1 AND retry_at IS NOT NULL AND retry_at <= ?2
      AND (retry_at, unit_id) > (?3, ?4)
    ORDER BY run_id, retry_at, unit_id LIMIT ?5",
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE run_id = CAST(?1 AS TEXT) AND retry_at IS NOT NULL
      AND retry_at <= CAST(?2 AS BIGINT)
      AND (retry_at, unit_id COLLATE \"C\") > (CAST(?3 AS BIGINT), CAST(?4 AS TEXT) COLLATE \"C\")
    ORDER BY retry_at, unit_id COLLATE \"C\" LIMIT ?5",
);
/// The exhausted units of every run after the cursor (?1 run, ?2 unit), at most ?3: a range of
/// `units_exhausted`, which holds them and no other unit.
pub const EXHAUSTED_UNITS_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units INDEXED BY units_exhausted
    WHERE status = 'exhausted' AND (run_id, unit_id) > (?1, ?2)
    ORDER BY run_id, unit_id LIMIT ?3",
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE status = 'exhausted'
      AND (run_id COLLATE \"C\", unit_id COLLATE \"C\")
          > (CAST(?1 AS TEXT) COLLATE \"C\", CAST(?2 AS TEXT) COLLATE \"C\")
    ORDER BY run_id COLLATE \"C\", unit_id COLLATE \"C\" LIMIT ?3",
);
/// [`EXHAUSTED_UNITS_SQL`] of one run (?1), after unit ?2, at most ?3. SQLite is told the
/// index: the primary key serves the same order, and walks every unit of the run.
pub const EXHAUSTED_UNITS_RUN_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units INDEXED BY units_exhausted
    WHERE status = 'exhausted' AND run_id = ?1 AND unit_id > ?2
    ORDER BY unit_id LIMIT ?3",
    "SELECT run_id, unit_id, step_id, phase, status, attempts,
    result, tokens, failure_reason, claim_holder, retry_at FROM units
    WHERE status = 'exhausted' AND run_id COLLATE \"C\" = CAST(?1 AS TEXT)
      AND (run_id COLLATE \"C\", unit_id COLLATE \"C\")
          > (CAST(?1 AS TEXT) COLLATE \"C\", CAST(?2 AS TEXT) COLLATE \"C\")
    ORDER BY run_id COLLATE \"C\", unit_id COLLATE \"C\" LIMIT ?3",
);
/// Every unit of a run as a bulk move reads it (`unit_id, status, attempts` and the latest
/// attempt's dispatch id), in unit order: the run's range of both primary keys.
pub const UNIT_STATES_SQL: Sql = Sql::split(
    "SELECT u.unit_id, u.status, u.attempts, a.dispatch_id FROM units u
    JOIN attempts a ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts
    WHERE u.run_id = ?1 ORDER BY u.unit_id",
    "SELECT u.unit_id, u.status, u.attempts, a.dispatch_id FROM units u
    JOIN attempts a ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts
    WHERE u.run_id = ?1 ORDER BY u.unit_id COLLATE \"C\"",
);
/// One unit of a run as [`UNIT_STATES_SQL`] reads it.
pub const UNIT_STATE_SQL: Sql = Sql::same(
    "SELECT u.unit_id, u.status, u.attempts, a.dispatch_id FROM units u
    JOIN attempts a ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts
    WHERE u.run_id = ?1 AND u.unit_id = ?2",
);
/// `retry_units`: a failed, timed-out or exhausted unit becomes due at ?3, or stays due from
/// when it already was; an exhausted one takes back its last attempt's status.
pub const RETRY_UNIT_SQL: Sql = Sql::same(
    "UPDATE units SET
    status = CASE WHEN status = 'exhausted' THEN (
        SELECT a.status FROM attempts a
        WHERE a.run_id = units.run_id AND a.unit_id = units.unit_id AND a.attempt = units.attempts)
        ELSE status END,
    retry_at = CASE WHEN retry_at IS NOT NULL AND retry_at < CAST(?3 AS BIGINT) THEN retry_at
        ELSE CAST(?3 AS BIGINT) END
    WHERE run_id = ?1 AND unit_id = ?2 AND status IN ('failed', 'timed_out', 'exhausted')",
);
/// `cancel_units` on a unit with no running attempt: cancelled, no retry, the reason (?3) kept.
pub const CANCEL_UNIT_SQL: Sql = Sql::same(
    "UPDATE units SET status = 'cancelled', retry_at = NULL,
    failure_reason = coalesce(CAST(?3 AS TEXT), failure_reason),
    finished_at = coalesce(finished_at, CAST(?4 AS BIGINT))
    WHERE run_id = ?1 AND unit_id = ?2
      AND status IN ('pending', 'failed', 'timed_out', 'exhausted')",
);
/// Unfinished attempts count as attempts (each was dispatched); NULL tokens count as 0.
/// PostgreSQL sums BIGINTs into NUMERIC: cast back, the totals fit.
pub const ACCOUNTING_SQL: Sql = Sql::split(
    "SELECT count(*), coalesce(sum(tokens), 0),
    coalesce(sum(phase = 'unit'), 0), coalesce(sum(CASE WHEN phase = 'unit' THEN tokens END), 0),
    coalesce(sum(phase = 'gate'), 0), coalesce(sum(CASE WHEN phase = 'gate' THEN tokens END), 0)
    FROM attempts WHERE run_id = ?1",
    "SELECT count(*), CAST(coalesce(sum(tokens), 0) AS BIGINT),
    count(*) FILTER (WHERE phase = 'unit'),
    CAST(coalesce(sum(tokens) FILTER (WHERE phase = 'unit'), 0) AS BIGINT),
    count(*) FILTER (WHERE phase = 'gate'),
    CAST(coalesce(sum(tokens) FILTER (WHERE phase = 'gate'), 0) AS BIGINT)
    FROM attempts WHERE run_id = ?1",
);

// ------------------------------------------------------------------ leases

/// The fence of a claimed write, read inside that write's own transaction.
pub const FENCE_SQL: Sql = Sql::same(
    "SELECT generation, token_hash, expires_at, owner_type, owner_id
    FROM leases WHERE resource_id = ?1",
);
pub const LEASE_SQL: Sql = Sql::same(
    "SELECT generation, owner_id, owner_type, expires_at, heartbeat_at, takeovers,
    refused_writes FROM leases WHERE resource_id = ?1",
);
/// Runs made by `start_run` get their lease row on first claim; queued runs have it already.
pub const CREATE_LEASE_SQL: Sql =
    Sql::same("INSERT INTO leases(resource_id, generation) VALUES (?1, 0) ON CONFLICT DO NOTHING");
/// The compare-and-set of a claim: `generation = ?2` is the generation read in this same
/// transaction, so a claim that raced another (on PostgreSQL, where two can read the same row)
/// changes nothing instead of taking a generation twice. A claim is a takeover when the lease
/// still names another owner (whose claim expired: a live one is never taken); the right-hand
/// side reads the row as it was, so the count needs no statement of its own.
pub const CLAIM_SQL: Sql = Sql::same(
    "UPDATE leases SET generation = generation + 1, owner_type = ?3,
    owner_id = ?4, token_hash = ?5, acquired_at = ?6, heartbeat_at = ?6, expires_at = ?7,
    takeovers = takeovers + CASE WHEN owner_id IS NOT NULL AND owner_id <> ?4 THEN 1 ELSE 0 END
    WHERE resource_id = ?1 AND generation = ?2",
);
/// Count a fenced write the lease refused. Its own transaction: the refused write's is rolled
/// back, and the count must not depend on anything else that transaction held.
pub const REFUSED_WRITE_SQL: Sql =
    Sql::same("UPDATE leases SET refused_writes = refused_writes + 1 WHERE resource_id = ?1");
/// The fence is repeated in the statement itself (generation, token hash, unexpired), so the
/// write cannot land on a lease that moved even if the check before it were skipped.
/// A renewal the judge found live. The WHERE repeats the generation and token it judged, so a
/// lease that moved on changes no row and fails the count. Not the expiry: an earlier
/// heartbeat judged in the same transaction may be what keeps the claim live.
pub const HEARTBEAT_SQL: Sql = Sql::same(
    "UPDATE leases SET heartbeat_at = ?2, expires_at = ?3
    WHERE resource_id = ?1 AND generation = ?4 AND token_hash = ?5",
);
/// Release clears the owner and keeps the generation: the next claim takes generation + 1.
pub const RELEASE_SQL: Sql = Sql::same(
    "UPDATE leases SET owner_type = NULL, owner_id = NULL,
    token_hash = NULL, acquired_at = NULL, heartbeat_at = NULL, expires_at = NULL
    WHERE resource_id = ?1 AND generation = ?2 AND token_hash = ?3 AND expires_at > ?4",
);
/// `expires_at <= ?1` implies `expires_at IS NOT NULL`, so the partial `leases_expires` index
/// serves it; ?2 = 1 keeps only leases of `active` runs (what `fencepost doctor` reports).
pub const EXPIRED_LEASES_SQL: Sql = Sql::split(
    "SELECT l.resource_id, l.generation, l.owner_id,
    l.owner_type, l.expires_at, l.heartbeat_at, l.takeovers, l.refused_writes
    FROM leases l JOIN runs r ON r.run_id = l.resource_id
    WHERE l.expires_at <= ?1 AND r.status NOT IN ('completed', 'failed', 'cancelled')
      AND (?2 = 0 OR r.status = 'active')
    ORDER BY l.expires_at, l.resource_id",
    "SELECT l.resource_id, l.generation, l.owner_id,
    l.owner_type, l.expires_at, l.heartbeat_at, l.takeovers, l.refused_writes
    FROM leases l JOIN runs r ON r.run_id = l.resource_id
    WHERE l.expires_at <= ?1 AND r.status NOT IN ('completed', 'failed', 'cancelled')
      AND (CAST(?2 AS BIGINT) = 0 OR r.status = 'active')
    ORDER BY l.expires_at, l.resource_id",
);
/// Every run's lease in one statement, runs newest first (`list_runs`' order): a run never
/// claimed has no lease row yet and reads as generation 0 without an owner, as `lease` says.
pub const LEASES_SQL: Sql = Sql::split(
    "SELECT r.run_id, coalesce(l.generation, 0), l.owner_id, l.owner_type, l.expires_at,
    l.heartbeat_at, coalesce(l.takeovers, 0), coalesce(l.refused_writes, 0)
    FROM runs r LEFT JOIN leases l ON l.resource_id = r.run_id
    ORDER BY r.updated_at DESC, r.created_at DESC, r.run_id DESC",
    "SELECT r.run_id, coalesce(l.generation, 0), l.owner_id, l.owner_type, l.expires_at,
    l.heartbeat_at, coalesce(l.takeovers, 0), coalesce(l.refused_writes, 0)
    FROM runs r LEFT JOIN leases l ON l.resource_id = r.run_id
    ORDER BY r.updated_at DESC, r.created_at DESC, r.run_id COLLATE \"C\" DESC",
);
/// The leases of the runs named in the JSON array ?1, by run id (a run never claimed: generation
/// 0, no owner): each run and its lease a primary-key probe, for a page of runs in one read.
/// PostgreSQL joins laterally, the `LIMIT` (the key is unique) keeping the planner from
/// flattening it back into a join that hashes the whole leases table, a walk that grows with
/// the ledger.
pub const RUN_LEASES_SQL: Sql = Sql::split(
    "SELECT r.run_id, coalesce(l.generation, 0), l.owner_id, l.owner_type, l.expires_at,
    l.heartbeat_at, coalesce(l.takeovers, 0), coalesce(l.refused_writes, 0)
    FROM runs r LEFT JOIN leases l ON l.resource_id = r.run_id
    WHERE r.run_id IN (SELECT value FROM json_each(?1))
    ORDER BY r.run_id",
    "SELECT r.run_id, coalesce(l.generation, 0), l.owner_id, l.owner_type, l.expires_at,
    l.heartbeat_at, coalesce(l.takeovers, 0), coalesce(l.refused_writes, 0)
    FROM runs r LEFT JOIN LATERAL (
        SELECT * FROM leases WHERE leases.resource_id = r.run_id LIMIT 1) l ON true
    WHERE r.run_id = ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))
    ORDER BY r.run_id COLLATE \"C\"",
);
/// The leases that have an owner now, soonest to expire first: the owner columns are set and
/// cleared together, so these are exactly the rows of the partial `leases_expires` index, and
/// the read costs what the live owners do, not what the ledger's history does.
pub const OWNED_LEASES_SQL: Sql = Sql::same(
    "SELECT resource_id, generation, owner_id, owner_type, expires_at, heartbeat_at,
    takeovers, refused_writes FROM leases WHERE expires_at IS NOT NULL ORDER BY expires_at, resource_id",
);

// ------------------------------------------------------------------ queue

/// The next due queued runs for `claim_next` (priority, highest first, then due time, then run
/// id), each with its lease's generation, owner and expiry (NULL when the run has no lease
/// row): ?1 the workflow names (NULL: any), ?2 how many. A range of the partial
/// `runs_lane_due` index, which holds due queued runs only, in this order, so the read does not
/// grow with the runs that have moved on or are not due yet; each lease is a primary-key probe.
///
/// PostgreSQL locks the runs it returns and skips the ones another transaction holds
/// (`SKIP LOCKED`): concurrent claimers each get different runs without waiting, and a run that
/// stopped being queued before its lock was granted is re-checked and left out. The lease read
/// beside it is current too: a queued run's lease is only ever written together with its run
/// leaving `queued` (a claim moves it to `starting`), so a lease that changed after this
/// statement's snapshot comes with a run row the re-check drops. The lock is taken in a
/// materialized CTE and the leases are read by a `LATERAL` probe per run (see the batch
/// statements in `store/postgres/sql.rs`: a plain join may be planned as a hash join over all
/// leases on tables not analyzed yet).
///
/// SQLite is told the index: with few queued runs its costs prefer `runs_status_recent` and a
/// sort, which would sort the whole backlog on every call once it is large.
pub const NEXT_QUEUED_SQL: Sql = Sql::split(
    "SELECT r.run_id, l.generation, l.owner_id, l.expires_at, r.priority, r.due_at, NULL,
        r.status
    FROM runs r INDEXED BY runs_lane_due LEFT JOIN leases l ON l.resource_id = r.run_id
    WHERE r.status = 'queued' AND r.queue_lane = 'due'
      AND (?1 IS NULL OR r.workflow_name IN (SELECT value FROM json_each(?1)))
    ORDER BY r.priority DESC, r.due_at, r.run_id LIMIT ?2",
    "WITH q AS MATERIALIZED (
        SELECT run_id, priority, due_at FROM runs WHERE status = 'queued' AND queue_lane = 'due'
          AND (CAST(?1 AS TEXT) IS NULL
               OR workflow_name IN (SELECT jsonb_array_elements_text(CAST(?1 AS TEXT)::jsonb)))
        ORDER BY priority DESC, due_at, run_id COLLATE \"C\" LIMIT CAST(?2 AS BIGINT)
        FOR UPDATE SKIP LOCKED)
    SELECT q.run_id, l.generation, l.owner_id, l.expires_at, q.priority, q.due_at,
        CAST(NULL AS TEXT), 'queued' FROM q
    LEFT JOIN LATERAL (
        SELECT generation, owner_id, expires_at FROM leases
        WHERE resource_id = q.run_id OFFSET 0) l ON TRUE
    ORDER BY q.priority DESC, q.due_at, q.run_id COLLATE \"C\"",
);
// The keyed lane's read: each key's range narrowed by `$names` (a filter on the workflow names,
// or none) and cut at `$limit` runs (`?2`, or a constant; see `NEXT_KEYED_ONE_SQL`).
macro_rules! next_keyed {
    ($sqlite_names:literal, $postgres_names:literal, $limit:literal) => {
        Sql::split(
            concat!(
                "SELECT r.run_id, l.generation, l.owner_id, l.expires_at, r.priority, r.due_at,
                    r.concurrency_key, r.status
                FROM concurrency_limits c
                JOIN runs r ON r.run_id IN (
                    SELECT k.run_id FROM runs k INDEXED BY runs_lane_keyed
                    WHERE k.status = 'queued' AND k.queue_lane = 'keyed'
                      AND k.concurrency_key = c.concurrency_key ",
                $sqlite_names,
                " ORDER BY k.priority DESC, k.due_at, k.run_id LIMIT ",
                $limit,
                ")
                LEFT JOIN leases l ON l.resource_id = r.run_id
                WHERE c.max_live > 0"
            ),
            concat!(
                "SELECT q.run_id, l.generation, l.owner_id, l.expires_at, q.priority, q.due_at,
                    q.concurrency_key, 'queued'
                FROM concurrency_limits c
                CROSS JOIN LATERAL (
                    SELECT run_id, priority, due_at, concurrency_key FROM runs
                    WHERE status = 'queued' AND queue_lane = 'keyed'
                      AND concurrency_key = c.concurrency_key ",
                $postgres_names,
                " ORDER BY priority DESC, due_at, run_id COLLATE \"C\" LIMIT CAST(",
                $limit,
                " AS BIGINT)
                    FOR UPDATE SKIP LOCKED) q
                LEFT JOIN LATERAL (
                    SELECT generation, owner_id, expires_at FROM leases
                    WHERE resource_id = q.run_id OFFSET 0) l ON TRUE
                WHERE c.max_live > 0"
            ),
        )
    };
}
/// The keyed lane's next runs for `claim_next`, the columns of [`NEXT_QUEUED_SQL`] (which
/// reads NULL for the key, and each run's status, `queued` here too) with each run's key: for
/// every key whose limit is above 0, its first ?2 due queued runs in claim order; ?1 the
/// workflow names (NULL: any). One range of `runs_lane_keyed` per limited key (a key held at 0
/// is not read at all), so the read costs what the keys do, not what their backlogs do.
/// Whether a key has room is decided after its limit is locked ([`LOCK_KEYS_SQL`],
/// [`KEY_ROOM_SQL`]); PostgreSQL locks the runs read as the due lane does.
pub const NEXT_KEYED_SQL: Sql = next_keyed!(
    "AND (?1 IS NULL OR k.workflow_name IN (SELECT value FROM json_each(?1)))",
    "AND (CAST(?1 AS TEXT) IS NULL
         OR workflow_name IN (SELECT jsonb_array_elements_text(CAST(?1 AS TEXT)::jsonb)))",
    "?2"
);
/// [`NEXT_KEYED_SQL`] for a claim of one run of any workflow, what a worker taking work one
/// item at a time sends: each key's first run, with no parameters. PostgreSQL plans a prepared
/// statement with parameters for their values (a custom plan) until a plan made without them
/// (a generic plan) is estimated no dearer; for this read it never is (the workflow filter it
/// cannot fold away, and a `LIMIT` it cannot see, taken as a tenth of each key's runs), so with
/// parameters it is planned on every claim: 0.11 ms of its 0.17 ms on the server, limits or
/// none. A statement without parameters is planned once for the session.
pub const NEXT_KEYED_ONE_SQL: Sql = next_keyed!("", "", "1");
/// The runs `claim_next` may rescue, the columns of [`NEXT_KEYED_SQL`]: runs that have not
/// ended whose owner's lease expired at or before ?3, oldest expiry first, at most
/// [`crate::queue::MAX_NEXT`] (the caller orders them by priority among the queued runs, with
/// the expiry as due time); ?1 the workflow names (NULL: any), runs of paused workflows left
/// out. A range of `leases_rescue`, which holds the owned leases of runs that have not ended:
/// the read costs what has expired and not been rescued, not what has ever been claimed.
/// PostgreSQL locks the leases, then their runs, skipping those another transaction holds (so
/// it never waits, and cannot wait in a cycle with a claim or heartbeat, which lock the run
/// first); a lease its owner renewed after this statement's snapshot is read again under the
/// lock and left out. The leases are read first, by their index, each run then probed by its
/// key: joined, PostgreSQL may prefer a walk of every live run when many leases have expired.
pub const RESCUABLE_SQL: Sql = Sql::split(
    "SELECT r.run_id, l.generation, l.owner_id, l.expires_at, r.priority, l.expires_at,
        r.concurrency_key, r.status
    FROM leases l INDEXED BY leases_rescue JOIN runs r ON r.run_id = l.resource_id
    WHERE l.expires_at IS NOT NULL AND l.run_ended = 0 AND l.expires_at <= ?2
      AND r.status IN ('starting', 'active', 'blocked', 'parked')
      AND (?1 IS NULL OR r.workflow_name IN (SELECT value FROM json_each(?1)))
      AND NOT EXISTS (SELECT 1 FROM paused_workflows p WHERE p.workflow_name = r.workflow_name)
    ORDER BY l.expires_at, l.resource_id LIMIT 1000",
    "WITH x AS MATERIALIZED (
        SELECT resource_id, generation, owner_id, expires_at FROM leases
        WHERE expires_at IS NOT NULL AND run_ended = 0 AND expires_at <= CAST(?2 AS BIGINT)
        ORDER BY expires_at, resource_id COLLATE \"C\" LIMIT 1000
        FOR UPDATE SKIP LOCKED)
    SELECT r.run_id, x.generation, x.owner_id, x.expires_at, r.priority, x.expires_at,
        r.concurrency_key, r.status
    FROM x CROSS JOIN LATERAL (
        SELECT run_id, priority, concurrency_key, status, workflow_name FROM runs
        WHERE run_id = x.resource_id AND status IN ('starting', 'active', 'blocked', 'parked')
        FOR UPDATE SKIP LOCKED) r
    WHERE (CAST(?1 AS TEXT) IS NULL
           OR r.workflow_name IN (SELECT jsonb_array_elements_text(CAST(?1 AS TEXT)::jsonb)))
      AND NOT EXISTS (SELECT 1 FROM paused_workflows p WHERE p.workflow_name = r.workflow_name)
    ORDER BY x.expires_at, r.run_id COLLATE \"C\"",
);
/// Lock the limits of the first ?2 keys of ?1 (a JSON array, in claim order) that no other
/// transaction holds, until the transaction ends, and return the keys locked, in that order:
/// on PostgreSQL, whoever counts a key's live runs next ([`KEY_ROOM_SQL`], a statement of its
/// own, so its snapshot is taken after the lock is granted) sees every claim of that key
/// committed before, and a key another claimer holds is passed over rather than waited for (no
/// claimer waits on another, so none waits in a cycle). The locking sits under the `LIMIT`, so
/// a held key is skipped and the next one in order tried in the same statement, as a queue's
/// `ORDER BY ... LIMIT ... FOR UPDATE SKIP LOCKED` takes the first free row. A row lock, not an
/// advisory lock: it needs no key-to-number hash and holds through transaction-mode poolers
/// all the same. SQLite has one writer, so there is nothing to lock: the first ?2 keys that
/// have a limit are its own.
pub const LOCK_KEYS_SQL: Sql = Sql::split(
    "SELECT c.concurrency_key FROM json_each(?1) w
    JOIN concurrency_limits c ON c.concurrency_key = w.value
    ORDER BY w.key LIMIT ?2",
    "SELECT c.concurrency_key
    FROM jsonb_array_elements_text(CAST(?1 AS TEXT)::jsonb) WITH ORDINALITY AS w(key, n)
    JOIN concurrency_limits c ON c.concurrency_key = w.key
    ORDER BY w.n LIMIT CAST(?2 AS BIGINT)
    FOR UPDATE OF c SKIP LOCKED",
);
/// The runs of the key `c.concurrency_key` that hold live leases at ?2: out of the queue, not
/// ended, lease expiring after ?2. The key's range of `runs_key_live`, each lease a primary-key
/// probe: a count of what the key holds now, not of its history (nor of every key's live
/// leases, which PostgreSQL would walk by `leases_expires` if the subqueries were not kept
/// apart).
macro_rules! key_live {
    (sqlite) => {
        "(SELECT count(*) FROM runs r INDEXED BY runs_key_live
        JOIN leases l ON l.resource_id = r.run_id
        WHERE r.concurrency_key = c.concurrency_key
          AND r.status IN ('starting', 'active', 'blocked', 'parked') AND l.expires_at > ?2)"
    };
    (postgres) => {
        "(SELECT count(*) FROM (
            SELECT run_id FROM runs
            WHERE concurrency_key = c.concurrency_key
              AND status IN ('starting', 'active', 'blocked', 'parked') OFFSET 0) r
        JOIN LATERAL (
            SELECT 1 FROM leases
            WHERE resource_id = r.run_id AND expires_at > CAST(?2 AS BIGINT) OFFSET 0) l ON TRUE)"
    };
}
/// The room of each key in ?1 (a JSON array) that has a limit: the limit less the key's runs
/// that hold live leases at ?2 (`key_live!`).
pub const KEY_ROOM_SQL: Sql = Sql::split(
    concat!(
        "SELECT c.concurrency_key, c.max_live - ",
        key_live!(sqlite),
        " FROM concurrency_limits c WHERE c.concurrency_key IN (SELECT value FROM json_each(?1))"
    ),
    concat!(
        "SELECT c.concurrency_key, c.max_live - ",
        key_live!(postgres),
        " FROM concurrency_limits c
        WHERE c.concurrency_key IN (SELECT jsonb_array_elements_text(CAST(?1 AS TEXT)::jsonb))"
    ),
);
/// A page of the due lane (`runs_lane_due`) in claim order after the run at (?1 priority, ?2
/// due time, ?3 run id), ?4 runs; the first page starts above every priority. The order's
/// first column runs downwards and the others upwards, which one row-value comparison cannot
/// say: the page is the rest of the cursor's priority plus the lower priorities, each a range of
/// the index read in its order, so a page deep in a backlog of millions costs what the first
/// does. At most ?4 runs are sorted once they are read.
pub const QUEUED_DUE_SQL: Sql = Sql::split(
    concat!(
        run_select!(),
        "WHERE r.run_id IN (
            SELECT run_id FROM (
                SELECT run_id FROM runs INDEXED BY runs_lane_due
                WHERE status = 'queued' AND queue_lane = 'due' AND priority = ?1
                  AND (due_at, run_id) > (?2, ?3)
                ORDER BY priority DESC, due_at, run_id LIMIT ?4)
            UNION ALL
            SELECT run_id FROM (
                SELECT run_id FROM runs INDEXED BY runs_lane_due
                WHERE status = 'queued' AND queue_lane = 'due' AND priority < ?1
                ORDER BY priority DESC, due_at, run_id LIMIT ?4))
        ORDER BY r.priority DESC, r.due_at, r.run_id LIMIT ?4"
    ),
    concat!(
        run_select!(),
        "WHERE r.run_id IN (
            (SELECT run_id FROM runs
             WHERE status = 'queued' AND queue_lane = 'due' AND priority = CAST(?1 AS BIGINT)
               AND (due_at, run_id COLLATE \"C\")
                   > (CAST(?2 AS BIGINT), CAST(?3 AS TEXT) COLLATE \"C\")
             ORDER BY priority DESC, due_at, run_id COLLATE \"C\" LIMIT CAST(?4 AS BIGINT))
            UNION ALL
            (SELECT run_id FROM runs
             WHERE status = 'queued' AND queue_lane = 'due' AND priority < CAST(?1 AS BIGINT)
             ORDER BY priority DESC, due_at, run_id COLLATE \"C\" LIMIT CAST(?4 AS BIGINT)))
        ORDER BY r.priority DESC, r.due_at, r.run_id COLLATE \"C\" LIMIT CAST(?4 AS BIGINT)"
    ),
);
/// A page of the `later` lane (`runs_lane_later`), soonest due first, after the run at (?1 due
/// time, ?2 run id), ?3 runs.
pub const QUEUED_LATER_SQL: Sql = Sql::split(
    concat!(
        run_select!(),
        "WHERE r.run_id IN (
            SELECT run_id FROM runs INDEXED BY runs_lane_later
            WHERE status = 'queued' AND queue_lane = 'later' AND (due_at, run_id) > (?1, ?2)
            ORDER BY due_at, run_id LIMIT ?3)
        ORDER BY r.due_at, r.run_id LIMIT ?3"
    ),
    concat!(
        run_select!(),
        "WHERE r.run_id IN (
            SELECT run_id FROM runs
            WHERE status = 'queued' AND queue_lane = 'later'
              AND (due_at, run_id COLLATE \"C\")
                  > (CAST(?1 AS BIGINT), CAST(?2 AS TEXT) COLLATE \"C\")
            ORDER BY due_at, run_id COLLATE \"C\" LIMIT CAST(?3 AS BIGINT))
        ORDER BY r.due_at, r.run_id COLLATE \"C\" LIMIT CAST(?3 AS BIGINT)"
    ),
);
/// How many runs, counted up to ?1 and no further, `$from` holds under `$filter`: a count that
/// stops, so a dashboard's counts cost the same over a backlog of millions as over a few
/// hundred (each reads at most ?1 entries of an index).
macro_rules! count_upto {
    (sqlite, $from:literal, $filter:literal) => {
        concat!(
            "(SELECT count(*) FROM (SELECT 1 FROM ",
            $from,
            " WHERE ",
            $filter,
            " LIMIT ?1))"
        )
    };
    (postgres, $from:literal, $filter:literal) => {
        concat!(
            "(SELECT count(*) FROM (SELECT 1 FROM ",
            $from,
            " WHERE ",
            $filter,
            " LIMIT CAST(?1 AS BIGINT)) n)"
        )
    };
}
/// The queue's lanes counted up to ?1 each: due, keyed, not yet due; each a range of its lane's
/// partial index.
pub const QUEUE_COUNTS_SQL: Sql = Sql::split(
    concat!(
        "SELECT ",
        count_upto!(
            sqlite,
            "runs INDEXED BY runs_lane_due",
            "status = 'queued' AND queue_lane = 'due'"
        ),
        ", ",
        count_upto!(
            sqlite,
            "runs INDEXED BY runs_lane_keyed",
            "status = 'queued' AND queue_lane = 'keyed'"
        ),
        ", ",
        count_upto!(
            sqlite,
            "runs INDEXED BY runs_lane_later",
            "status = 'queued' AND queue_lane = 'later'"
        ),
    ),
    concat!(
        "SELECT ",
        count_upto!(postgres, "runs", "status = 'queued' AND queue_lane = 'due'"),
        ", ",
        count_upto!(
            postgres,
            "runs",
            "status = 'queued' AND queue_lane = 'keyed'"
        ),
        ", ",
        count_upto!(
            postgres,
            "runs",
            "status = 'queued' AND queue_lane = 'later'"
        ),
    ),
);
/// The keys that have a limit, in key order after ?3, at most ?4: each key's limit, its runs
/// holding live leases at ?2 (the count [`KEY_ROOM_SQL`] takes from the limit) and its queued
/// runs counted up to ?1 (a range of `runs_queued_key`).
pub const KEY_USAGE_SQL: Sql = Sql::split(
    concat!(
        "SELECT c.concurrency_key, c.max_live, ",
        key_live!(sqlite),
        ", ",
        count_upto!(
            sqlite,
            "runs q INDEXED BY runs_queued_key",
            "q.status = 'queued' AND q.concurrency_key = c.concurrency_key"
        ),
        " FROM concurrency_limits c WHERE c.concurrency_key > ?3
        ORDER BY c.concurrency_key LIMIT ?4"
    ),
    concat!(
        "SELECT c.concurrency_key, c.max_live, ",
        key_live!(postgres),
        ", ",
        count_upto!(
            postgres,
            "runs q",
            "q.status = 'queued' AND q.concurrency_key = c.concurrency_key"
        ),
        " FROM concurrency_limits c WHERE c.concurrency_key COLLATE \"C\" > CAST(?3 AS TEXT)
        ORDER BY c.concurrency_key COLLATE \"C\" LIMIT CAST(?4 AS BIGINT)"
    ),
);
/// The paused workflows in name order after ?2, at most ?3: each with when it was paused and
/// its queued runs (all held while it is paused) counted up to ?1 (a range of
/// `runs_queued_name`).
pub const PAUSED_USAGE_SQL: Sql = Sql::split(
    concat!(
        "SELECT p.workflow_name, p.paused_at, ",
        count_upto!(
            sqlite,
            "runs q INDEXED BY runs_queued_name",
            "q.status = 'queued' AND q.workflow_name = p.workflow_name"
        ),
        " FROM paused_workflows p WHERE p.workflow_name > ?2 ORDER BY p.workflow_name LIMIT ?3"
    ),
    concat!(
        "SELECT p.workflow_name, p.paused_at, ",
        count_upto!(
            postgres,
            "runs q",
            "q.status = 'queued' AND q.workflow_name = p.workflow_name"
        ),
        " FROM paused_workflows p WHERE p.workflow_name COLLATE \"C\" > CAST(?2 AS TEXT)
        ORDER BY p.workflow_name COLLATE \"C\" LIMIT CAST(?3 AS BIGINT)"
    ),
);
/// Set a key's limit (?2) at ?3.
pub const LIMIT_SET_SQL: Sql = Sql::same(
    "INSERT INTO concurrency_limits(concurrency_key, max_live, updated_at) VALUES (?1, ?2, ?3)
    ON CONFLICT (concurrency_key) DO UPDATE SET max_live = excluded.max_live,
        updated_at = excluded.updated_at",
);
pub const LIMIT_REMOVE_SQL: Sql =
    Sql::same("DELETE FROM concurrency_limits WHERE concurrency_key = ?1");
pub const LIMITS_SQL: Sql = Sql::split(
    "SELECT concurrency_key, max_live FROM concurrency_limits ORDER BY concurrency_key",
    "SELECT concurrency_key, max_live FROM concurrency_limits
    ORDER BY concurrency_key COLLATE \"C\"",
);
/// Move the key ?1's queued runs from lane ?2 to lane ?3 (a limit set: `due` to `keyed`;
/// removed: back), by the key's range of `runs_queued_key`.
pub const KEY_LANE_SQL: Sql = Sql::same(
    "UPDATE runs SET queue_lane = ?3
    WHERE status = 'queued' AND concurrency_key = ?1 AND queue_lane = ?2",
);
pub const PAUSE_SQL: Sql = Sql::same(
    "INSERT INTO paused_workflows(workflow_name, paused_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
);
pub const RESUME_SQL: Sql = Sql::same("DELETE FROM paused_workflows WHERE workflow_name = ?1");
pub const PAUSED_SQL: Sql = Sql::split(
    "SELECT workflow_name FROM paused_workflows ORDER BY workflow_name",
    "SELECT workflow_name FROM paused_workflows ORDER BY workflow_name COLLATE \"C\"",
);
/// Pausing a workflow takes its claimable queued runs out of their lanes (runs not yet due
/// stay `later`, and join `paused` when they come due), by the workflow's range of
/// `runs_queued_name`.
pub const PAUSE_LANE_SQL: Sql = Sql::same(
    "UPDATE runs SET queue_lane = 'paused'
    WHERE status = 'queued' AND workflow_name = ?1 AND queue_lane IN ('due', 'keyed')",
);
/// The lane of a queued run that is due, with workflow name `$name` and key `$key` (see
/// `0008_schedule.sql`): `paused` while its workflow is, `keyed` while its key has a limit,
/// else `due`; each a primary-key probe. The one statement of the rule: queueing a run,
/// moving the runs that come due and resuming a workflow all write it.
macro_rules! due_lane {
    ($name:literal, $key:literal) => {
        concat!(
            "CASE WHEN EXISTS (SELECT 1 FROM paused_workflows p WHERE p.workflow_name = ",
            $name,
            ") THEN 'paused' WHEN EXISTS (SELECT 1 FROM concurrency_limits c
                WHERE c.concurrency_key = ",
            $key,
            ") THEN 'keyed' ELSE 'due' END"
        )
    };
}
/// Resuming puts them back, in the lane the rule gives (the pause is gone by then).
pub const RESUME_LANE_SQL: Sql = Sql::same(concat!(
    "UPDATE runs SET queue_lane = ",
    due_lane!("runs.workflow_name", "runs.concurrency_key"),
    " WHERE status = 'queued' AND workflow_name = ?1 AND queue_lane = 'paused'"
));
pub const DEFINITION_INSERT_SQL: Sql = Sql::same(
    "INSERT INTO definitions(definition_digest,
    workflow_name, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
);
/// ?12 `not_before`, ?13 `priority`, ?14 `concurrency_key`, ?15 `due_at`, ?16 the retry policy
/// of its units. The run's lane is
/// `later` until it is due (`due_at` after now, ?11), then the lane `due_lane!` gives.
pub const RESERVE_RUN_INSERT_SQL: Sql = Sql::same(concat!(
    "INSERT INTO runs(run_id, workflow_ref, workflow_name,
    definition_digest, guarded, status, input, launch_options, source, parent_run_id,
    origin_session_id, runner_id, created_at, updated_at,
    not_before, priority, concurrency_key, due_at, retry_policy, queue_lane)
    VALUES (?1, ?2, ?3, ?4, 0, 'queued', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, ?12, ?13, ?14, ?15,
        ?16, CASE WHEN CAST(?15 AS BIGINT) > CAST(?11 AS BIGINT) THEN 'later' ELSE ",
    due_lane!("?3", "?14"),
    " END)"
));
/// The start of the statement that moves the runs that have come due into their lane.
macro_rules! promote_due {
    () => {
        concat!(
            "UPDATE runs SET queue_lane = ",
            due_lane!("runs.workflow_name", "runs.concurrency_key"),
            " WHERE run_id "
        )
    };
}
/// Move the queued runs that have come due (?1 now) out of the `later` lane into the one
/// `due_lane!` gives: a range of `runs_lane_later`, so a claim pays for what has come due since
/// the last one, not for the runs still waiting. PostgreSQL skips runs another claimer is
/// moving (it moves them, the same way) rather than wait for its commit, and is handed the ids
/// as an array: its estimate of how many runs are due by now is taken from the whole table's
/// due times (half of a backlog may be due and the other half days away), and for an `IN` of
/// that many it plans a hash join over a walk of every run, where an array is probed by the
/// primary key, one run at a time.
pub const PROMOTE_DUE_SQL: Sql = Sql::split(
    concat!(
        promote_due!(),
        "IN (SELECT run_id FROM runs INDEXED BY runs_lane_later
        WHERE status = 'queued' AND queue_lane = 'later' AND due_at <= ?1)"
    ),
    concat!(
        promote_due!(),
        "= ANY(ARRAY(SELECT run_id FROM runs
        WHERE status = 'queued' AND queue_lane = 'later' AND due_at <= CAST(?1 AS BIGINT)
        FOR UPDATE SKIP LOCKED))"
    ),
);
/// What `prepare_or_adopt` compares, plus the status (a terminal run is not adopted).
pub const PREPARATION_SQL: Sql = Sql::same(
    "SELECT workflow_name, workflow_ref, definition_digest,
    origin_session_id, parent_run_id, source, input, launch_options, status, retry_policy
    FROM runs WHERE run_id = ?1",
);
pub const CONTINUATION_PARENT_SQL: Sql =
    Sql::same("SELECT status, origin_session_id FROM runs WHERE run_id = ?1");
/// A continuation is a run with this parent that was not published as a child (children carry
/// an invocation key). Served by `runs_parent`.
pub const CONTINUATION_OF_SQL: Sql = Sql::same(
    "SELECT run_id FROM runs WHERE parent_run_id = ?1 AND invocation_key IS NULL LIMIT 1",
);
/// A claim moves a queued run to `starting`; any other status is the controller's to change.
pub const CLAIM_STARTING_SQL: Sql = Sql::same(
    "UPDATE runs SET status = 'starting', updated_at = ?2 WHERE run_id = ?1 AND status = 'queued'",
);
/// One pass over the `unit.started` events into an ephemeral index, then an anti-join: a
/// correlated lookup per attempt would rescan the run's events for each of them.
pub const ORPHAN_ATTEMPTS_SQL: Sql = Sql::split(
    "SELECT run_id, unit_id, attempt, dispatch_id
    FROM attempts WHERE dispatch_id NOT IN (
        SELECT json_extract(payload, '$.dispatch_id') FROM events WHERE type = 'unit.started')
    ORDER BY run_id, unit_id, attempt LIMIT 100",
    "SELECT run_id, unit_id, attempt, dispatch_id
    FROM attempts WHERE dispatch_id NOT IN (
        SELECT CAST(payload AS jsonb) ->> 'dispatch_id' FROM events WHERE type = 'unit.started')
    ORDER BY run_id, unit_id, attempt LIMIT 100",
);

/// A message's columns, in [`crate::messages`]' row order.
macro_rules! message_columns {
    () => {
        "run_id, seq, topic, key, payload, sent_at, consumed_at, consumed_generation"
    };
}
/// `send` with a key: the message the key already sent, if any (`messages_key`).
pub const MESSAGE_BY_KEY_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages WHERE run_id = ?1 AND topic = ?2 AND key = ?3"
));
/// `send`: the run's next message number, read under the run's lock (the primary key's last
/// entry of the run).
pub const NEXT_MESSAGE_SEQ_SQL: Sql =
    Sql::same("SELECT coalesce(max(seq), 0) + 1 FROM messages WHERE run_id = ?1");
/// `send`: the message, numbered as read above.
pub const INSERT_MESSAGE_SQL: Sql = Sql::same(
    "INSERT INTO messages(run_id, seq, topic, key, payload, sent_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
);
/// `receive`: the oldest messages of a topic not taken yet (`messages_waiting`, which holds
/// those alone).
pub const WAITING_MESSAGES_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages WHERE run_id = ?1 AND topic = ?2 AND consumed_at IS NULL
    ORDER BY seq LIMIT ?3"
));
/// `receive`: take one message, once (the condition keeps a second take from overwriting).
pub const CONSUME_MESSAGE_SQL: Sql = Sql::same(
    "UPDATE messages SET consumed_at = CAST(?3 AS BIGINT), consumed_generation = CAST(?4 AS BIGINT)
    WHERE run_id = ?1 AND seq = ?2 AND consumed_at IS NULL",
);
/// `messages`: a run's messages after a number, taken ones too (the primary key's range).
pub const RUN_MESSAGES_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    message_columns!(),
    " FROM messages WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
));
/// `messages(topic=...)`: a topic's messages after a number (`messages_topic`). SQLite is
/// told the index: where a run has few topics its statistics favour the primary key's range,
/// which walks every other topic's messages to fill a page of a rare one.
pub const TOPIC_MESSAGES_SQL: Sql = Sql::split(
    concat!(
        "SELECT ",
        message_columns!(),
        " FROM messages INDEXED BY messages_topic
        WHERE run_id = ?1 AND topic = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4"
    ),
    concat!(
        "SELECT ",
        message_columns!(),
        " FROM messages WHERE run_id = ?1 AND topic = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4"
    ),
);

/// A schedule's columns, in [`crate::schedules`]' row order, and the status of its last fire's
/// run (one probe of the runs' primary key; NULL once that run is pruned).
macro_rules! schedule_columns {
    () => {
        "name, cron, timezone, overlap, catch_up, paused, next_slot, last_slot, last_run_id,
        workflow_name, workflow_ref, source, definition_digest, definition, input,
        launch_options, runner_id, origin_session_id, priority, concurrency_key, retry_policy,
        created_at, updated_at,
        (SELECT status FROM runs WHERE runs.run_id = schedules.last_run_id)"
    };
}
/// `put_schedule`: a new schedule, or the named one replaced (its last fire and creation time
/// kept, so `overlap = 'skip'` still sees the run of its last fire, and a paused one stays paused).
pub const PUT_SCHEDULE_SQL: Sql = Sql::same(
    "INSERT INTO schedules(name, cron, timezone, overlap, catch_up, paused, next_slot,
        workflow_name, workflow_ref, source, definition_digest, definition, input,
        launch_options, runner_id, origin_session_id, priority, concurrency_key, retry_policy,
        created_at, updated_at)
    VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
        ?19, ?19)
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, timezone = excluded.timezone,
        overlap = excluded.overlap, catch_up = excluded.catch_up,
        next_slot = excluded.next_slot, workflow_name = excluded.workflow_name,
        workflow_ref = excluded.workflow_ref, source = excluded.source,
        definition_digest = excluded.definition_digest, definition = excluded.definition,
        input = excluded.input, launch_options = excluded.launch_options,
        runner_id = excluded.runner_id, origin_session_id = excluded.origin_session_id,
        priority = excluded.priority, concurrency_key = excluded.concurrency_key,
        retry_policy = excluded.retry_policy, updated_at = excluded.updated_at",
);
/// One schedule by name.
pub const SCHEDULE_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules WHERE name = ?1"
));
/// Every schedule, by name.
pub const SCHEDULES_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules ORDER BY name"
));
/// A tick's read: the names of the schedules due at ?1, the longest overdue first
/// (`schedules_due`).
pub const DUE_SCHEDULES_SQL: Sql = Sql::same(
    "SELECT name FROM schedules WHERE paused = 0 AND next_slot <= ?1 ORDER BY next_slot LIMIT ?2",
);
/// A tick's compare-and-set: the schedule moves past its fired slots only if no other tick
/// moved it since it was read (same `next_slot`) and it was not paused meanwhile.
pub const ADVANCE_SCHEDULE_SQL: Sql = Sql::same(
    "UPDATE schedules SET next_slot = CAST(?3 AS BIGINT), updated_at = CAST(?4 AS BIGINT)
    WHERE name = ?1 AND next_slot = CAST(?2 AS BIGINT) AND paused = 0",
);
/// After a tick's fires: the newest slot fired and the run it queued (if any).
pub const FIRED_SCHEDULE_SQL: Sql = Sql::same(
    "UPDATE schedules SET last_slot = CAST(?2 AS BIGINT), last_run_id = coalesce(?3, last_run_id)
    WHERE name = ?1",
);
/// Pause or resume a schedule (?2: 1 or 0).
pub const PAUSE_SCHEDULE_SQL: Sql = Sql::same(
    "UPDATE schedules SET paused = CAST(?2 AS BIGINT), updated_at = CAST(?3 AS BIGINT)
    WHERE name = ?1",
);
/// Delete a schedule.
pub const DELETE_SCHEDULE_SQL: Sql = Sql::same("DELETE FROM schedules WHERE name = ?1");

/// `event_counts`: the first event at or after position ?1 (a primary-key seek).
pub const EVENT_AT_SQL: Sql =
    Sql::same("SELECT seq, ts FROM events WHERE seq >= ?1 ORDER BY seq LIMIT 1");
/// `event_counts` over few events: their times, positions ?1 to ?2 (a primary-key range).
pub const EVENT_TIMES_SQL: Sql =
    Sql::same("SELECT ts FROM events WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq");

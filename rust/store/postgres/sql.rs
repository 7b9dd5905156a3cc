//! Statements only the PostgreSQL store runs: the run's row lock, the event cursor's floor and
//! horizon, the set-based batch statements, and what opening and migrating a schema need.
//! Placeholders are written `?N`, as in the shared statements; the transaction rewrites them to
//! `$N` when it prepares them.

use crate::store::sql::units_reserve_upsert;
use crate::store::Sql;

// ------------------------------------------------------------------ locks and events

/// The run's row lock (`Tx::lock_run`): every write on a run takes it before it reads anything
/// of the run, so writes on one run serialize and writes on different runs never wait.
///
/// A run that does not exist yet has no row to lock: its creators (two `prepare_or_adopt` of
/// one id) serialize on a transaction-scoped advisory lock of that id instead — one lock per
/// run id, never a global one — so the second sees the first's committed run and adopts it.
/// One statement for both cases, so the lock needs no answer and can be pipelined: the CTE
/// locks the row if there is one, and only when there is none is the advisory lock taken.
pub const LOCK_RUN_SQL: &str = "WITH locked AS (SELECT 1 FROM runs WHERE run_id = ?1 FOR UPDATE)
    SELECT pg_advisory_xact_lock(hashtextextended('fencepost/run/' || CAST(?1 AS TEXT), 0))
    WHERE NOT EXISTS (SELECT 1 FROM locked)";

/// The global event cursor on PostgreSQL, writer's half. `seq` comes from a sequence, so two
/// transactions on different runs can commit out of `seq` order: a reader paging every run's
/// events by `after_seq` could return `seq` 52 while 50 is still uncommitted, move its cursor
/// past 50 and never see it. So before anything else, every write transaction takes a shared
/// advisory lock whose key carries the sequence's current value — a floor under every `seq`
/// it can still allocate (shared: writers never wait for each other; the key is per schema,
/// `hashtext` of `fencepost/events/<schema>`, and the value goes in the second key modulo
/// 2^31). Held until the transaction ends, it is visible to every session in `pg_locks`.
pub const EVENT_FLOOR_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock_shared(
        hashtext('fencepost/events/' || current_schema()),
        CAST((SELECT last_value FROM events_seq_seq) % 2147483648 AS INTEGER))";

/// The reader's half: the lowest floor among the writers in flight, the full value rebuilt
/// from its 31 bits next to the sequence's current value (a floor lags it by far less than
/// 2^31), and never above that current value + 1. Read in its own statement *before* the
/// reader's snapshot: a writer seen here cannot commit anything below its floor that the
/// snapshot would miss, and a writer that committed before this read is in the snapshot.
/// Writers not seen here allocate above every `seq` allocated now, but not in commit order
/// among themselves: one may commit `seq` 61 before the snapshot while another's 60 commits
/// after it, so nothing allocated after this read is returned (the cap); the next read gets
/// it. The sequence is read first (the `FROM`), the locks after it (a subquery of each row): a
/// writer that allocated a `seq` up to the value read had taken its lock before allocating, so
/// it is either still seen holding it or committed, and in the snapshot. Readers return only
/// `seq` below the horizon. A lock of another schema that lands on the same key can only lower
/// the horizon (a later page), never skip an event.
pub const EVENT_HORIZON_SQL: &str = "SELECT least(
        (SELECT min(s.cur - (((s.cur - l.objid::bigint) % 2147483648) + 2147483648)
            % 2147483648)
        FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 2
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint
              = (hashtext('fencepost/events/' || current_schema())::bigint & 4294967295)),
        s.cur + 1)
    FROM (SELECT last_value AS cur FROM events_seq_seq) s";

// ------------------------------------------------------------------ batches

/// The judged write path's set statements (`store::postgres::rows`).
pub const SNAPSHOT_RUNS: Sql = Sql::native(GROUP_RUNS_SQL);
pub const SNAPSHOT_LATEST: Sql = Sql::native(LATEST_ATTEMPTS_GROUP_SQL);
pub const SNAPSHOT_RUNNING: Sql = Sql::native(RUNNING_ATTEMPTS_SQL);
pub const HEARTBEAT_GROUP: Sql = Sql::native(HEARTBEAT_GROUP_SQL);
pub const FINISH_GROUP: Sql = Sql::native(FINISH_GROUP_SQL);
pub const RESERVE_GROUP: Sql = Sql::native(RESERVE_GROUP_SQL);
pub const RECLAIM_GROUP: Sql = Sql::native(RECLAIM_GROUP_SQL);
pub const CLAIM_GROUP: Sql = Sql::native(CLAIM_GROUP_SQL);
pub const LOCK_RUNS_AS_READ: Sql = Sql::native(LOCK_RUNS_AS_READ_SQL);
pub const LOCK_RUN_AS_READ: Sql = Sql::native(LOCK_RUN_AS_READ_SQL);

// Why the set statements below join their JSON rows through `LATERAL` subqueries: the planner
// estimates a `json_to_recordset` at 100 rows and knows nothing of a table's growth until it
// is analyzed, and a prepared statement keeps the generic plan it made while the tables were
// small. A plain join then stays a hash join over a sequential scan of `attempts` or `events`
// for good: measured, a finish of 1000 went from 57 ms to 151 ms as the tables grew to
// 150 000 attempts (autovacuum off). A `LATERAL` subquery that cannot be pulled up (`LIMIT`,
// `OFFSET 0`, an aggregate) is run once per row, and for an equality on a key that is always an
// index probe: the cost per batch no longer depends on the size of the tables.
//
// Why `json`, not `jsonb`: the rows are read once, in order. `::jsonb` first parses the whole
// text into a binary document (about 5 ms of a 1000-row statement, measured with `auto_explain`);
// `json_to_recordset` parses the text as it walks it: ~5 us less per unit on a batch reserve
// plus finish.

/// The rest of the transaction plans its statements without their parameters' values
/// (`crate::store::Tx::plan_generic`).
pub const PLAN_GENERIC_SQL: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// Which of a judgment's finishes name a still-running attempt, with the attempt's step and
/// phase for the event (`store::rows::Part::Running`; read with or without the runs' locks, see
/// `Tx::lock_run_at_write`).
/// A finish that fails its attempt (`failing`) also reads the retry policy it applies: its
/// step's, else its run's; the others skip that part (a one-time filter on `x.failing`).
pub const RUNNING_ATTEMPTS_SQL: &str =
    "SELECT a.run_id, a.unit_id, a.attempt, a.dispatch_id, a.step_id, a.phase, p.policy
    FROM json_to_recordset(CAST(?1 AS TEXT)::json)
        AS x(run_id TEXT, unit_id TEXT, attempt BIGINT, dispatch_id TEXT, failing BOOLEAN)
    CROSS JOIN LATERAL (
        SELECT run_id, unit_id, attempt, dispatch_id, step_id, phase FROM attempts
        WHERE dispatch_id = x.dispatch_id AND run_id = x.run_id AND unit_id = x.unit_id
          AND attempt = x.attempt AND status = 'running'
        OFFSET 0) a
    LEFT JOIN LATERAL (
        SELECT coalesce(
            (SELECT s.retry_policy FROM steps s
             WHERE s.run_id = a.run_id AND s.step_id = a.step_id),
            (SELECT r.retry_policy FROM runs r WHERE r.run_id = a.run_id)) AS policy
        WHERE x.failing) p ON TRUE";

// ------------------------------------------------------------------ groups

/// What a group of calls needs to know of each of its runs, in one statement: the run's state
/// (as `RUN_STATUS_SQL` reads it), and its lease's fence (generation, token hash, expiry, owner). A run
/// without a row is missing from the answer; a run never claimed has NULL lease columns.
///
/// Each id is looked up by its own primary-key probe (`LATERAL`, see above):
/// a plain join of the ids with `runs` and `leases` is planned, on tables not analyzed yet, as
/// hash joins over sequential scans of both, a cost that grows with every run in the ledger.
pub const GROUP_RUNS_SQL: &str =
    "SELECT r.run_id, r.status, r.current_step_id, r.scope_key, r.workflow_ref, l.generation,
        l.token_hash, l.expires_at, l.owner_type, l.owner_id
    FROM json_array_elements_text(CAST(?1 AS TEXT)::json) AS x(run_id)
    CROSS JOIN LATERAL (
        SELECT run_id, status, current_step_id, scope_key, workflow_ref FROM runs
        WHERE run_id = x.run_id OFFSET 0) r
    LEFT JOIN LATERAL (
        SELECT generation, token_hash, expires_at, owner_type, owner_id FROM leases
        WHERE resource_id = x.run_id OFFSET 0) l ON TRUE";

/// The lock of each run sent, in the order sent, and a check that what the judgment's rows
/// depend on (`store::rows::RunRead`) is as it was read: the status, where one is sent, and the
/// lease's generation and token hash, where a generation is sent. What a write made without
/// the runs' locks since the read (`Tx::lock_run_at_write`) runs first, in place of
/// `LOCK_RUN_SQL`; it fails the transaction when a run changed.
///
/// The rows compared are read `FOR UPDATE`: a row so locked is its newest committed version,
/// even one committed while this statement waited for the lock (PostgreSQL re-reads it), where a
/// plain read in the same statement would see the statement's older snapshot. Every writer of a
/// lease holds its run's lock first, so the lease row's lock waits for no one the run's lock does
/// not; it is taken only where the lease is compared, since a row lock is a write of its own.
/// A lease compared existed at the read (a fence held on it), so it cannot be one created since.
pub const LOCK_RUNS_AS_READ_SQL: &str = "WITH x AS (
        SELECT * FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS t(
            run_id TEXT, status TEXT, generation BIGINT, token_hash TEXT)
    ), locked AS (
        SELECT x.status, x.generation, r.status AS now, l.held FROM x
        LEFT JOIN LATERAL (
            SELECT status FROM runs WHERE run_id = x.run_id FOR UPDATE) r ON TRUE
        LEFT JOIN LATERAL (
            SELECT generation = x.generation AND token_hash = x.token_hash AS held FROM leases
            WHERE resource_id = x.run_id AND x.generation IS NOT NULL FOR UPDATE) l ON TRUE
    )
    SELECT CAST(CASE WHEN count(*) = CAST(?2 AS BIGINT) AND count(*) FILTER (WHERE
            (status IS NOT NULL AND now IS DISTINCT FROM status)
            OR (generation IS NOT NULL AND held IS NOT TRUE)) = 0
        THEN '0' ELSE 'fencepost: a run changed between the judgment''s read and its write; \
         judged again under its lock' END AS INTEGER)
    FROM locked";

/// [`LOCK_RUNS_AS_READ_SQL`] for one run, its values as parameters (no JSON to parse: a lone
/// call's lock and check cost about what `LOCK_RUN_SQL` costs). The lease's part is planned with
/// a one-time filter on ?3, so without a generation it is neither read nor locked.
pub const LOCK_RUN_AS_READ_SQL: &str = "WITH r AS (
        SELECT status FROM runs WHERE run_id = ?1 FOR UPDATE
    ), l AS (
        SELECT generation, token_hash FROM leases
        WHERE resource_id = ?1 AND CAST(?3 AS BIGINT) IS NOT NULL FOR UPDATE
    )
    SELECT CAST(CASE WHEN EXISTS (
            SELECT 1 FROM r WHERE CAST(?2 AS TEXT) IS NULL OR r.status = CAST(?2 AS TEXT))
        AND (CAST(?3 AS BIGINT) IS NULL OR EXISTS (
            SELECT 1 FROM l
            WHERE l.generation = CAST(?3 AS BIGINT) AND l.token_hash = CAST(?4 AS TEXT)))
        THEN '0' ELSE 'fencepost: a run changed between the judgment''s read and its write; \
         judged again under its lock' END AS INTEGER)";

/// The latest attempt of each (run, unit) a judgment's reservations name, over many runs, with
/// its unit's status and retry time (`store::rows::Part::Latest`): the unit's row, then the
/// attempt it names, by primary key each.
pub const LATEST_ATTEMPTS_GROUP_SQL: &str =
    "SELECT x.run_id, x.unit_id, l.attempt, l.dispatch_id, l.status, l.step_id, l.input_hash,
        l.reclaims, l.lease_generation, l.unit_status, l.retry_at
    FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS x(run_id TEXT, unit_id TEXT)
    CROSS JOIN LATERAL (
        SELECT a.attempt, a.dispatch_id, a.status, a.step_id, a.input_hash, a.reclaims,
            a.lease_generation, u.status AS unit_status, u.retry_at
        FROM units u JOIN attempts a
          ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts
        WHERE u.run_id = x.run_id AND u.unit_id = x.unit_id OFFSET 0) l";

/// The `e` part of a set statement: one event per row of `$rows` (the statement's rows `x`, or
/// a relation of events made from them with the `x` columns the events take, and `type`), of
/// type `$type` (an SQL expression over the row, as `x`), revisions continuing per run from its
/// newest in `ord` order (what the rows' calls would take one by one in that order), inserted
/// in `ord` order so `seq` rises with them. The runs' locks are held, so no other writer takes
/// a revision meanwhile.
macro_rules! group_events {
    ($rows:literal, $type:literal) => {
        concat!(
            "), e AS (
        INSERT INTO events(resource_id, revision, type, actor_type, actor_id, generation,
            payload, ts)
        SELECT x.run_id,
            coalesce(b.r, 0) + row_number() OVER (PARTITION BY x.run_id ORDER BY x.ord),
            ",
            $type,
            ", x.actor_type, x.actor_id, x.generation, x.payload, x.ts
        FROM ",
            $rows,
            " x LEFT JOIN (
            SELECT d.run_id,
                (SELECT max(revision) FROM events WHERE resource_id = d.run_id) AS r
            FROM (SELECT DISTINCT run_id FROM x) d
        ) b ON b.run_id = x.run_id
        ORDER BY x.ord
        RETURNING 1
    )
    "
        )
    };
}

/// Every statement of a batch or group checks its own row counts and fails the transaction
/// when one differs from the rows sent (`?2`): a failing cast is plain SQL's way to raise.
/// So the statement needs no answer and rides with the commit: a group's writes cost no round
/// trip of their own, and the run locks are held one round trip less. A failure surfaces at the
/// commit and rolls everything back, as a count checked by the caller would.
macro_rules! counts_or_fail {
    ($counts:literal) => {
        concat!(
            "SELECT CAST(CASE WHEN ",
            $counts,
            " THEN '0' ELSE 'fencepost: a batch statement wrote another number of rows than \
             it was sent; nothing of the transaction was kept' END AS INTEGER)"
        )
    };
}

/// Every new attempt of a batch or group in one statement (where a statement is a round
/// trip): the rows arrive as one JSON array, each with its run, its actor, generation and time
/// (the calls of a group each have their own) and its place (`ord`, from 1), and the unit
/// projections, attempt rows and `unit.started` events are the ones the one-by-one statements
/// write. Revisions continue per run from its newest, in `ord` order, so they are the ones
/// the calls would take one by one in that order; the runs' row locks are held. No (run, unit)
/// appears twice (an upsert cannot touch one row twice in a statement): a unit's second
/// reservation in one judgment reclaims the first (see [`RECLAIM_GROUP_SQL`]). The foreign key from attempts to units
/// is checked at the end of the statement, after both inserts. Each part
/// (units, attempts, events) must write exactly the rows sent, or the transaction fails (see
/// `counts_or_fail`).
pub const RESERVE_GROUP_SQL: &str = concat!(
    "WITH x AS (
        SELECT * FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS t(
            run_id TEXT, unit_id TEXT, step_id TEXT, node_id TEXT, parent_unit_id TEXT,
            phase TEXT, runner TEXT, engine TEXT, model TEXT, input_hash TEXT,
            worktree_path TEXT, holder TEXT, attempt BIGINT, dispatch_id TEXT, payload TEXT,
            actor_type TEXT, actor_id TEXT, generation BIGINT, ts BIGINT, ord BIGINT,
            trace_context TEXT)
    ), u AS (
        INSERT INTO units(run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner,
            engine, model, input_hash, worktree_path, status, claim_holder, attempts,
            first_started_at, started_at)
        SELECT run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model,
            input_hash, worktree_path, 'running', holder, attempt, ts, ts FROM x
",
    units_reserve_upsert!(),
    "
        RETURNING 1
    ), a AS (
        INSERT INTO attempts(run_id, unit_id, attempt, dispatch_id, step_id, node_id, phase,
            input_hash, status, holder, lease_generation, started_at, trace_context)
        SELECT run_id, unit_id, attempt, dispatch_id, step_id, node_id, phase, input_hash,
            'running', holder, generation, ts, trace_context FROM x
        RETURNING 1
    ",
    group_events!("x", "'unit.started'"),
    counts_or_fail!(
        "(SELECT count(*) FROM u) = CAST(?2 AS BIGINT)
        AND (SELECT count(*) FROM a) = CAST(?2 AS BIGINT)
        AND (SELECT count(*) FROM e) = CAST(?2 AS BIGINT)"
    )
);

/// Every winning finish of a batch or group in one statement: the same compare-and-set,
/// projection update and `unit.finished` event as the one-by-one statements, each row with its
/// own actor, generation and time, revisions continuing per run in `ord` order. Each part must
/// write exactly the rows sent, or the transaction fails (see `counts_or_fail`).
///
/// Rows are found by key (`fa`, `fu`: one index probe each, see above) and
/// updated by `ctid`, a parameterized TID scan. A `ctid` is only stable while nobody else
/// updates the row: every writer of a run's attempts and units holds the run's row lock first,
/// and this statement runs under the locks of all its runs.
pub const FINISH_GROUP_SQL: &str = concat!(
    "WITH x AS (
        SELECT * FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS t(
            run_id TEXT, unit_id TEXT, attempt BIGINT, dispatch_id TEXT, status TEXT,
            result TEXT, tokens BIGINT, failure_reason TEXT, session_id TEXT, payload TEXT,
            actor_type TEXT, actor_id TEXT, generation BIGINT, ts BIGINT, ord BIGINT,
            unit_status TEXT, retry_at BIGINT, exhausted TEXT)
    ), fa AS (
        SELECT x.*, a.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM attempts
            WHERE dispatch_id = x.dispatch_id AND run_id = x.run_id AND unit_id = x.unit_id
              AND attempt = x.attempt AND status = 'running'
            OFFSET 0) a
    ), f AS (
        UPDATE attempts a SET status = fa.status, result = fa.result, tokens = fa.tokens,
            failure_reason = fa.failure_reason, session_id = fa.session_id, finished_at = fa.ts
        FROM fa WHERE a.ctid = fa.tid
        RETURNING 1
    ), fu AS (
        SELECT x.*, n.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM units
            WHERE run_id = x.run_id AND unit_id = x.unit_id AND attempts = x.attempt
              AND status = 'running'
            OFFSET 0) n
    ), u AS (
        UPDATE units n SET status = fu.unit_status, result = fu.result, tokens = fu.tokens,
            failure_reason = fu.failure_reason, session_id = fu.session_id, finished_at = fu.ts,
            retry_at = fu.retry_at
        FROM fu WHERE n.ctid = fu.tid
        RETURNING 1
    ), ev AS (
        SELECT run_id, 'unit.finished' AS type, actor_type, actor_id, generation, payload, ts,
            ord * 2 AS ord
        FROM x
        UNION ALL
        SELECT run_id, 'unit.exhausted', actor_type, actor_id, generation, exhausted, ts,
            ord * 2 + 1
        FROM x WHERE exhausted IS NOT NULL
    ",
    group_events!("ev", "x.type"),
    counts_or_fail!(
        "(SELECT count(*) FROM f) = CAST(?2 AS BIGINT)
        AND (SELECT count(*) FROM u) = CAST(?2 AS BIGINT)
        AND (SELECT count(*) FROM e) = (SELECT count(*) FROM ev)"
    )
);

/// Every renewed lease of a group in one statement, one row per run (the last heartbeat of a
/// run in the group: what one by one leaves). The WHERE repeats the generation and token the
/// caller already judged, so a row that does not match is missing from the count and the group
/// is refused. Not the expiry: an earlier heartbeat of the group may be what keeps it live.
///
/// The leases are found by a primary-key probe per row (`hl`, as `fa` in [`FINISH_GROUP_SQL`])
/// and updated by `ctid`: `UPDATE ... FROM` the rows is otherwise planned, on a table not
/// analyzed yet, as a hash join over a sequential scan of `leases`. The runs' locks are held,
/// and every writer of a lease holds its run's lock, so the `ctid` stays put.
pub const HEARTBEAT_GROUP_SQL: &str = concat!(
    "WITH x AS (
        SELECT * FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS t(
            run_id TEXT, generation BIGINT, token_hash TEXT, heartbeat_at BIGINT,
            expires_at BIGINT)
    ), hl AS (
        SELECT x.heartbeat_at, x.expires_at, l.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM leases
            WHERE resource_id = x.run_id AND generation = x.generation
              AND token_hash = x.token_hash
            OFFSET 0) l
    ), h AS (
        UPDATE leases l SET heartbeat_at = hl.heartbeat_at, expires_at = hl.expires_at
        FROM hl WHERE l.ctid = hl.tid
        RETURNING 1
    ) ",
    counts_or_fail!("(SELECT count(*) FROM h) = CAST(?2 AS BIGINT)")
);

/// Every reclaim of a judgment in one statement, one row per attempt (the judge folds an
/// attempt's reclaims into one row: `times` more, the last holder, generation and trace
/// context named), found by key and updated by `ctid` as in [`FINISH_GROUP_SQL`]. Only a
/// still-running attempt is reclaimed; each must change exactly one row, or the transaction
/// fails. The unit's holder changes only where the reclaim names a new one.
pub const RECLAIM_GROUP_SQL: &str = concat!(
    "WITH x AS (
        SELECT * FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS t(
            run_id TEXT, unit_id TEXT, attempt BIGINT, reclaims BIGINT, times BIGINT,
            holder TEXT, generation BIGINT, trace_context TEXT)
    ), ra AS (
        SELECT x.*, a.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM attempts
            WHERE run_id = x.run_id AND unit_id = x.unit_id AND attempt = x.attempt
              AND status = 'running' AND reclaims = x.reclaims
            OFFSET 0) a
    ), r AS (
        UPDATE attempts a SET reclaims = a.reclaims + ra.times,
            holder = coalesce(ra.holder, a.holder),
            lease_generation = coalesce(ra.generation, a.lease_generation),
            trace_context = coalesce(ra.trace_context, a.trace_context)
        FROM ra WHERE a.ctid = ra.tid
        RETURNING 1
    ), ru AS (
        SELECT x.holder, n.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM units
            WHERE run_id = x.run_id AND unit_id = x.unit_id AND x.holder IS NOT NULL
              AND claim_holder IS DISTINCT FROM x.holder
            OFFSET 0) n
    ), u AS (
        UPDATE units n SET claim_holder = ru.holder FROM ru WHERE n.ctid = ru.tid
        RETURNING 1
    ) ",
    counts_or_fail!("(SELECT count(*) FROM r) = CAST(?2 AS BIGINT)")
);

/// Every claim of a judgment in one statement, one row per run, written as the one-row
/// statements write a claim: the lease's compare-and-set from the generation the caller read
/// (`previous`) to the next, a queued run (`queued`) moved to `starting`, and a `lease.claimed`
/// event.
/// The runs' row locks are held (the read that found them took them), and every writer of a
/// lease holds its run's lock, so the rows and their `ctid`s stay as read; found by a probe per
/// row and updated by `ctid` (see [`HEARTBEAT_GROUP_SQL`]). Each part must write exactly the
/// rows sent, or the transaction fails (see `counts_or_fail`), so the statement rides with the
/// commit and the claim costs one round trip after the read.
pub const CLAIM_GROUP_SQL: &str = concat!(
    "WITH x AS (
        SELECT * FROM json_to_recordset(CAST(?1 AS TEXT)::json) AS t(
            run_id TEXT, previous BIGINT, generation BIGINT, actor_type TEXT, actor_id TEXT,
            token_hash TEXT, expires_at BIGINT, payload TEXT, ts BIGINT, ord BIGINT,
            queued BOOLEAN)
    ), cl AS (
        SELECT x.*, l.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM leases
            WHERE resource_id = x.run_id AND generation = x.previous
            OFFSET 0) l
    ), c AS (
        UPDATE leases l SET generation = cl.generation, owner_type = cl.actor_type,
            owner_id = cl.actor_id, token_hash = cl.token_hash, acquired_at = cl.ts,
            heartbeat_at = cl.ts, expires_at = cl.expires_at,
            takeovers = l.takeovers
                + CASE WHEN l.owner_id IS NOT NULL AND l.owner_id <> cl.actor_id THEN 1 ELSE 0 END
        FROM cl WHERE l.ctid = cl.tid
        RETURNING 1
    ), sr AS (
        SELECT x.ts, r.tid FROM x CROSS JOIN LATERAL (
            SELECT ctid AS tid FROM runs WHERE run_id = x.run_id AND status = 'queued'
            OFFSET 0) r
        WHERE x.queued
    ), s AS (
        UPDATE runs r SET status = 'starting', updated_at = sr.ts
        FROM sr WHERE r.ctid = sr.tid
        RETURNING 1
    ",
    group_events!("x", "'lease.claimed'"),
    counts_or_fail!(
        "(SELECT count(*) FROM c) = CAST(?2 AS BIGINT)
        AND (SELECT count(*) FROM s) = (SELECT count(*) FROM x WHERE x.queued)
        AND (SELECT count(*) FROM e) = CAST(?2 AS BIGINT)"
    )
);

// ------------------------------------------------------------------ opening and migrating

/// The advisory lock key the migrating transaction takes first, so that processes opening a
/// fresh database at the same time wait for the first one and then find nothing to do:
/// `fencepos` (eight bytes of ASCII) as a number. One key for every schema: migrations are rare and short.
pub const MIGRATION_LOCK: i64 = 0x6665_6e63_6570_6f73;

/// The migration ledger, in the schema the connection's `search_path` names.
pub const CREATE_LEDGER_SQL: &str = "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY,
    name TEXT NOT NULL, applied_at BIGINT NOT NULL)";

/// The session's settings as the server reports them, for `Ledger.pragmas()`: durability, the
/// lock wait, the schema version, and the connection's TLS version (or `off`).
pub const PRAGMAS_SQL: &str = "SELECT current_setting('synchronous_commit'),
    current_setting('lock_timeout'),
    (SELECT coalesce(max(version), 0) FROM schema_migrations),
    coalesce((SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl), 'off')";

/// The tables every operation uses: the integrity check makes sure each one answers.
pub const TABLES: [&str; 8] = [
    "blobs",
    "definitions",
    "runs",
    "steps",
    "units",
    "attempts",
    "leases",
    "events",
];

/// The events' sequence as it stands, outside any transaction: one row of the sequence's own
/// relation, however long the log. It moves when an event is appended, commit or not.
pub const CHANGE_MARK_SQL: &str = "SELECT last_value, is_called FROM events_seq_seq";

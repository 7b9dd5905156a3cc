-- 0001_init: the first ledger schema. Forward-only: later changes are new files.
--
-- Conventions: STRICT tables (no silent type coercion); times are INTEGER epoch milliseconds;
-- statuses are lowercase strings pinned by CHECK constraints, and terminal-time columns are tied
-- to the status by CHECKs so no row can claim to be finished without a finish time, or carry
-- one while unfinished. JSON values live either in `blobs` (by digest) or inline as canonical
-- JSON text (small per-row values: step evidence, attempt results, event payloads).
--
-- Every index is paid for on the hot path: a reserve writes its pages to the WAL on every
-- commit, and checkpoints copy them back. So the per-attempt tables are WITHOUT ROWID (the
-- primary key *is* the table, no second b-tree), and only indexes that a query needs exist.

-- Content-addressed canonical JSON. The digest is recomputed by the ledger, never trusted.
CREATE TABLE blobs (
    digest     TEXT PRIMARY KEY CHECK (digest GLOB 'sha256:*' AND length(digest) = 71),
    bytes      BLOB NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- Workflow definitions by digest (the queue issue registers them).
CREATE TABLE definitions (
    definition_digest TEXT PRIMARY KEY REFERENCES blobs(digest),
    workflow_name     TEXT NOT NULL,
    created_at        INTEGER NOT NULL
) STRICT;

CREATE TABLE runs (
    run_id            TEXT PRIMARY KEY,
    workflow_ref      TEXT NOT NULL,
    workflow_name     TEXT NOT NULL,
    definition_digest TEXT REFERENCES definitions(definition_digest),
    scope_key         TEXT,
    -- 1 when the run was started with the scope guard on (force=False); see runs_scope_guard.
    guarded           INTEGER NOT NULL DEFAULT 0 CHECK (guarded IN (0, 1)),
    status            TEXT NOT NULL CHECK (status IN
                        ('queued', 'starting', 'active', 'blocked', 'parked',
                         'completed', 'failed', 'cancelled')),
    params            TEXT REFERENCES blobs(digest),
    input             TEXT REFERENCES blobs(digest),
    launch_options    TEXT REFERENCES blobs(digest),
    source            TEXT REFERENCES blobs(digest),
    plan              TEXT REFERENCES blobs(digest),
    plan_version      INTEGER,
    current_step_id   TEXT,
    outputs           TEXT REFERENCES blobs(digest),
    parent_run_id     TEXT REFERENCES runs(run_id),
    parent_unit_id    TEXT,
    invocation_key    TEXT,
    origin_session_id TEXT,
    runner_id         TEXT,
    agent_harness     TEXT,
    agent_session_id  TEXT,
    -- No revision column: a run's revision is the revision of its newest event, read from the
    -- events(resource_id, revision) index. Storing it here would rewrite the run's page on
    -- every unit event, one more WAL frame per reserve and per finish.
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    completed_at      INTEGER,
    CHECK ((status IN ('completed', 'failed', 'cancelled')) = (completed_at IS NOT NULL))
) STRICT;

-- Child publication is idempotent by (parent, invocation key); concurrent publishers meet here.
CREATE UNIQUE INDEX runs_invocation_key ON runs(parent_run_id, invocation_key)
    WHERE parent_run_id IS NOT NULL AND invocation_key IS NOT NULL;

-- The scope guard as a constraint, not a read-then-write (two writers that both read "free"
-- cannot both insert): at most one guarded, top-level, active run per (scope, workflow ref).
-- A blocked run leaves the index, so a second run may start; resuming the first then fails on
-- this index and is reported as ActiveRunExists. Forced runs (guarded = 0) are outside it by
-- design.
CREATE UNIQUE INDEX runs_scope_guard ON runs(scope_key, workflow_ref)
    WHERE status = 'active' AND guarded = 1 AND parent_run_id IS NULL;

-- find_active_run / find_scope_occupant / list_runs(scope_key=...).
CREATE INDEX runs_scope_ref_status ON runs(scope_key, workflow_ref, status);
-- list_runs orders by recency.
CREATE INDEX runs_updated ON runs(updated_at DESC, created_at DESC);
-- child_runs.
CREATE INDEX runs_parent ON runs(parent_run_id, created_at);

CREATE TABLE steps (
    run_id         TEXT NOT NULL REFERENCES runs(run_id),
    step_id        TEXT NOT NULL,
    title          TEXT NOT NULL,
    instructions   TEXT NOT NULL,
    completion     TEXT,
    sequence_index INTEGER NOT NULL CHECK (sequence_index >= 0),
    status         TEXT NOT NULL CHECK (status IN
                     ('pending', 'active', 'completed', 'blocked', 'failed', 'skipped')),
    notes          TEXT,
    evidence       TEXT,
    summary        TEXT,
    completed_at   INTEGER,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, sequence_index)
) STRICT, WITHOUT ROWID;

-- The mutable projection of each unit: its latest attempt.
CREATE TABLE units (
    run_id           TEXT NOT NULL REFERENCES runs(run_id),
    unit_id          TEXT NOT NULL,
    step_id          TEXT,
    node_id          TEXT,
    parent_unit_id   TEXT,
    phase            TEXT NOT NULL CHECK (phase IN ('unit', 'gate')),
    runner           TEXT,
    engine           TEXT,
    model            TEXT,
    input_hash       TEXT,
    worktree_path    TEXT,
    status           TEXT NOT NULL CHECK (status IN
                       ('pending', 'running', 'completed', 'failed', 'cancelled', 'timed_out')),
    claim_holder     TEXT,
    attempts         INTEGER NOT NULL CHECK (attempts >= 0),
    result           TEXT,
    tokens           INTEGER CHECK (tokens IS NULL OR tokens >= 0),
    failure_reason   TEXT,
    session_id       TEXT,
    first_started_at INTEGER NOT NULL,
    started_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    PRIMARY KEY (run_id, unit_id)
) STRICT, WITHOUT ROWID;

-- Append-only attempt history. The finish compare-and-set matches on
-- (run_id, unit_id, attempt, dispatch_id, status = 'running').
CREATE TABLE attempts (
    run_id           TEXT NOT NULL,
    unit_id          TEXT NOT NULL,
    attempt          INTEGER NOT NULL CHECK (attempt >= 1),
    -- The at-least-once dedupe key handed to downstream systems: unique across the ledger.
    dispatch_id      TEXT NOT NULL UNIQUE,
    step_id          TEXT,
    node_id          TEXT,
    phase            TEXT NOT NULL CHECK (phase IN ('unit', 'gate')),
    input_hash       TEXT,
    status           TEXT NOT NULL CHECK (status IN
                       ('running', 'completed', 'failed', 'cancelled', 'timed_out')),
    holder           TEXT,
    lease_generation INTEGER CHECK (lease_generation IS NULL OR lease_generation >= 1),
    reclaims         INTEGER NOT NULL DEFAULT 0 CHECK (reclaims >= 0),
    result           TEXT,
    tokens           INTEGER CHECK (tokens IS NULL OR tokens >= 0),
    failure_reason   TEXT,
    session_id       TEXT,
    started_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    PRIMARY KEY (run_id, unit_id, attempt),
    FOREIGN KEY (run_id, unit_id) REFERENCES units(run_id, unit_id),
    CHECK ((status = 'running') = (finished_at IS NULL))
) STRICT, WITHOUT ROWID;

-- One lease per run (resource); generation 0 and no owner until the first claim.
CREATE TABLE leases (
    resource_id  TEXT PRIMARY KEY,
    generation   INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
    owner_type   TEXT CHECK (owner_type IN ('host', 'session')),
    owner_id     TEXT,
    token_hash   TEXT,
    acquired_at  INTEGER,
    heartbeat_at INTEGER,
    expires_at   INTEGER,
    -- The owner columns are set and cleared together.
    CHECK ((owner_id IS NULL) = (owner_type IS NULL)
       AND (owner_id IS NULL) = (token_hash IS NULL)
       AND (owner_id IS NULL) = (acquired_at IS NULL)
       AND (owner_id IS NULL) = (heartbeat_at IS NULL)
       AND (owner_id IS NULL) = (expires_at IS NULL))
) STRICT;

CREATE INDEX leases_expires ON leases(expires_at) WHERE expires_at IS NOT NULL;

-- The append-only event log. seq is the global cursor: a plain rowid, which SQLite assigns as
-- max(seq) + 1, and since rows can never be deleted (events_append_only) it is never reused.
-- AUTOINCREMENT would give the same guarantee at the price of a sqlite_sequence page written
-- on every append. (resource_id, revision) gives each revision of a run exactly one
-- event and serves events(run_id); idempotency keys make insert_once a constraint instead of a
-- scan that a concurrent writer could race. Type filters read the seq range and filter: no
-- type index to maintain on every append.
CREATE TABLE events (
    seq             INTEGER PRIMARY KEY,
    resource_id     TEXT NOT NULL,
    revision        INTEGER NOT NULL CHECK (revision >= 1),
    type            TEXT NOT NULL,
    actor_type      TEXT,
    actor_id        TEXT,
    generation      INTEGER,
    payload         TEXT NOT NULL,
    idempotency_key TEXT,
    ts              INTEGER NOT NULL,
    UNIQUE (resource_id, revision)
) STRICT;

-- Partial: most events have no key, and a NULL entry per event would cost a page per append.
CREATE UNIQUE INDEX events_idempotency_key ON events(idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Append-only is enforced by the database, not by convention: it is what keeps seq from being
-- reused and a revision from being rewritten.
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;

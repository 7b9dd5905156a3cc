-- 0001_init, PostgreSQL dialect: the same schema as rust/store/sqlite/migrations/0001_init.sql,
-- column for column, so one set of operations reads both. Forward-only: later
-- changes are new files, numbered like their SQLite twins.
--
-- Dialect notes: integers are BIGINT (the ledger binds 64-bit values everywhere; flags are
-- 0/1 BIGINTs as in SQLite rather than BOOLEAN, so rows read the same); JSON stays canonical
-- TEXT (the ledger's bytes are the digest's input, and jsonb would re-serialize them); blobs are
-- BYTEA. Tables live in the schema the connection's search_path names (`?schema=`).

CREATE TABLE blobs (
    digest     TEXT PRIMARY KEY CHECK (digest LIKE 'sha256:%' AND length(digest) = 71),
    bytes      BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE definitions (
    definition_digest TEXT PRIMARY KEY REFERENCES blobs(digest),
    workflow_name     TEXT NOT NULL,
    created_at        BIGINT NOT NULL
);

CREATE TABLE runs (
    run_id            TEXT PRIMARY KEY,
    workflow_ref      TEXT NOT NULL,
    workflow_name     TEXT NOT NULL,
    definition_digest TEXT REFERENCES definitions(definition_digest),
    scope_key         TEXT,
    guarded           BIGINT NOT NULL DEFAULT 0 CHECK (guarded IN (0, 1)),
    status            TEXT NOT NULL CHECK (status IN
                        ('queued', 'starting', 'active', 'blocked', 'parked',
                         'completed', 'failed', 'cancelled')),
    params            TEXT REFERENCES blobs(digest),
    input             TEXT REFERENCES blobs(digest),
    launch_options    TEXT REFERENCES blobs(digest),
    source            TEXT REFERENCES blobs(digest),
    plan              TEXT REFERENCES blobs(digest),
    plan_version      BIGINT,
    current_step_id   TEXT,
    outputs           TEXT REFERENCES blobs(digest),
    parent_run_id     TEXT REFERENCES runs(run_id),
    parent_unit_id    TEXT,
    invocation_key    TEXT,
    origin_session_id TEXT,
    runner_id         TEXT,
    agent_harness     TEXT,
    agent_session_id  TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    completed_at      BIGINT,
    CHECK ((status IN ('completed', 'failed', 'cancelled')) = (completed_at IS NOT NULL))
);

CREATE UNIQUE INDEX runs_invocation_key ON runs(parent_run_id, invocation_key)
    WHERE parent_run_id IS NOT NULL AND invocation_key IS NOT NULL;
-- The scope guard, as a constraint rather than a read-then-write. A second writer blocks on this index until the first
-- commits, then fails on it: the ledger reports ActiveRunExists naming the occupant.
CREATE UNIQUE INDEX runs_scope_guard ON runs(scope_key, workflow_ref)
    WHERE status = 'active' AND guarded = 1 AND parent_run_id IS NULL;
CREATE INDEX runs_scope_ref_status ON runs(scope_key, workflow_ref, status);
CREATE INDEX runs_updated ON runs(updated_at DESC, created_at DESC);
CREATE INDEX runs_parent ON runs(parent_run_id, created_at);

CREATE TABLE steps (
    run_id         TEXT NOT NULL REFERENCES runs(run_id),
    step_id        TEXT NOT NULL,
    title          TEXT NOT NULL,
    instructions   TEXT NOT NULL,
    completion     TEXT,
    sequence_index BIGINT NOT NULL CHECK (sequence_index >= 0),
    status         TEXT NOT NULL CHECK (status IN
                     ('pending', 'active', 'completed', 'blocked', 'failed', 'skipped')),
    notes          TEXT,
    evidence       TEXT,
    summary        TEXT,
    completed_at   BIGINT,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, sequence_index)
);

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
    attempts         BIGINT NOT NULL CHECK (attempts >= 0),
    result           TEXT,
    tokens           BIGINT CHECK (tokens IS NULL OR tokens >= 0),
    failure_reason   TEXT,
    session_id       TEXT,
    first_started_at BIGINT NOT NULL,
    started_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    PRIMARY KEY (run_id, unit_id)
);

CREATE TABLE attempts (
    run_id           TEXT NOT NULL,
    unit_id          TEXT NOT NULL,
    attempt          BIGINT NOT NULL CHECK (attempt >= 1),
    dispatch_id      TEXT NOT NULL UNIQUE,
    step_id          TEXT,
    node_id          TEXT,
    phase            TEXT NOT NULL CHECK (phase IN ('unit', 'gate')),
    input_hash       TEXT,
    status           TEXT NOT NULL CHECK (status IN
                       ('running', 'completed', 'failed', 'cancelled', 'timed_out')),
    holder           TEXT,
    lease_generation BIGINT CHECK (lease_generation IS NULL OR lease_generation >= 1),
    reclaims         BIGINT NOT NULL DEFAULT 0 CHECK (reclaims >= 0),
    result           TEXT,
    tokens           BIGINT CHECK (tokens IS NULL OR tokens >= 0),
    failure_reason   TEXT,
    session_id       TEXT,
    started_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    PRIMARY KEY (run_id, unit_id, attempt),
    FOREIGN KEY (run_id, unit_id) REFERENCES units(run_id, unit_id),
    CHECK ((status = 'running') = (finished_at IS NULL))
);

CREATE TABLE leases (
    resource_id  TEXT PRIMARY KEY,
    generation   BIGINT NOT NULL DEFAULT 0 CHECK (generation >= 0),
    owner_type   TEXT CHECK (owner_type IN ('host', 'session')),
    owner_id     TEXT,
    token_hash   TEXT,
    acquired_at  BIGINT,
    heartbeat_at BIGINT,
    expires_at   BIGINT,
    CHECK ((owner_id IS NULL) = (owner_type IS NULL)
       AND (owner_id IS NULL) = (token_hash IS NULL)
       AND (owner_id IS NULL) = (acquired_at IS NULL)
       AND (owner_id IS NULL) = (heartbeat_at IS NULL)
       AND (owner_id IS NULL) = (expires_at IS NULL))
);

CREATE INDEX leases_expires ON leases(expires_at) WHERE expires_at IS NOT NULL;

-- seq comes from an identity sequence: unique and increasing in allocation order. Allocation
-- happens under the run's row lock, so within one run seq order is commit order; across runs
-- two transactions may commit out of seq order (README "PostgreSQL").
CREATE TABLE events (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource_id     TEXT NOT NULL,
    revision        BIGINT NOT NULL CHECK (revision >= 1),
    type            TEXT NOT NULL,
    actor_type      TEXT,
    actor_id        TEXT,
    generation      BIGINT,
    payload         TEXT NOT NULL,
    idempotency_key TEXT,
    ts              BIGINT NOT NULL,
    UNIQUE (resource_id, revision)
);

CREATE UNIQUE INDEX events_idempotency_key ON events(idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Append-only, enforced by the database (TRUNCATE too: it bypasses row triggers).
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only';
END;
$$;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
CREATE TRIGGER events_append_only_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

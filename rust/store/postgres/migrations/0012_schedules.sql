-- 0012_schedules, PostgreSQL dialect: the same table and index as the SQLite twin (see it for
-- why they have this shape).
CREATE TABLE schedules (
    name              TEXT PRIMARY KEY,
    cron              TEXT NOT NULL,
    timezone          TEXT NOT NULL,
    overlap           TEXT NOT NULL CHECK (overlap IN ('skip', 'allow')),
    catch_up          BIGINT NOT NULL CHECK (catch_up >= 0),
    paused            BIGINT NOT NULL CHECK (paused IN (0, 1)),
    next_slot         BIGINT NOT NULL,
    last_slot         BIGINT,
    last_run_id       TEXT,
    workflow_name     TEXT NOT NULL,
    workflow_ref      TEXT NOT NULL,
    source            TEXT NOT NULL,
    definition_digest TEXT NOT NULL,
    definition        TEXT NOT NULL,
    input             TEXT NOT NULL,
    launch_options    TEXT NOT NULL,
    runner_id         TEXT NOT NULL,
    origin_session_id TEXT NOT NULL,
    priority          BIGINT NOT NULL,
    concurrency_key   TEXT,
    retry_policy      TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);

-- A tick's read: the schedules that are not paused and whose next slot has come.
CREATE INDEX schedules_due ON schedules(next_slot) WHERE paused = 0;

-- 0012_schedules, SQLite dialect: cron schedules that queue runs.
--
-- A schedule keeps what each fire queues (the `reserve_run` arguments other than the run id and
-- `not_before`: the JSON ones as canonical text, inline, so nothing a prune removes can be one
-- of them) and `next_slot`, the first slot it has not fired. A tick fires a due schedule by
-- moving `next_slot` with a compare-and-set on its old value, in the transaction that queues the
-- fires, so of any number of tickers exactly one fires each slot. `last_run_id` is the run of
-- the latest fire, which `overlap = 'skip'` checks; it is not a foreign key, since a prune may
-- remove that run (a removed run has ended).
CREATE TABLE schedules (
    name              TEXT PRIMARY KEY,
    cron              TEXT NOT NULL,
    timezone          TEXT NOT NULL,
    overlap           TEXT NOT NULL CHECK (overlap IN ('skip', 'allow')),
    catch_up          INTEGER NOT NULL CHECK (catch_up >= 0),
    paused            INTEGER NOT NULL CHECK (paused IN (0, 1)),
    next_slot         INTEGER NOT NULL,
    last_slot         INTEGER,
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
    priority          INTEGER NOT NULL,
    concurrency_key   TEXT,
    retry_policy      TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
) STRICT;

-- A tick's read: the schedules that are not paused and whose next slot has come.
CREATE INDEX schedules_due ON schedules(next_slot) WHERE paused = 0;

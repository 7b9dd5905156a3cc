-- 0009_retry, SQLite dialect: the ledger keeps the retry policy of runs and steps, and a unit
-- that failed carries when it may be tried again (`retry_at`) or is `exhausted`.
--
-- A policy is canonical JSON inline: a few dozen bytes, read only by a failing finish.
-- `retry_at` is set only while a failed unit waits for its next attempt (the next reservation,
-- an exhaustion, `retry_units` and `cancel_units` each clear or move it), so the two indexes
-- on it hold the waiting units and nothing else, and `due_units` reads only those that are
-- due. `units_exhausted` likewise holds the dead letters alone.
ALTER TABLE runs ADD COLUMN retry_policy TEXT;
ALTER TABLE steps ADD COLUMN retry_policy TEXT;
ALTER TABLE units ADD COLUMN retry_at INTEGER;

-- `exhausted` joins the unit statuses. SQLite cannot alter a CHECK constraint, and rebuilding
-- `units` would copy every unit and, with `attempts` referencing it, cannot be done in a
-- transaction with foreign keys on. A CHECK that admits one more value leaves every stored
-- row valid and the file format unchanged, which is the case SQLite's documentation allows
-- editing the stored table definition for. The edit is the last change to `units` in this
-- file: ALTER TABLE ... ADD COLUMN splices text into the stored definition at an offset taken
-- from the definition as parsed. `writable_schema = RESET` makes this connection parse the
-- schema again (and turns the edit mode off); the indexes below bump the schema cookie, so
-- every other connection parses it again too.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql,
    '(''pending'', ''running'', ''completed'', ''failed'', ''cancelled'', ''timed_out'')',
    '(''pending'', ''running'', ''completed'', ''failed'', ''cancelled'', ''timed_out'',
                        ''exhausted'')')
WHERE type = 'table' AND name = 'units';
PRAGMA writable_schema = RESET;

-- due_units across the ledger and of one run, in the order they came due.
CREATE INDEX units_retry_due ON units(retry_at, run_id, unit_id) WHERE retry_at IS NOT NULL;
CREATE INDEX units_retry_due_run ON units(run_id, retry_at, unit_id) WHERE retry_at IS NOT NULL;
-- exhausted_units across the ledger and of one run: by run, then unit.
CREATE INDEX units_exhausted ON units(run_id, unit_id) WHERE status = 'exhausted';

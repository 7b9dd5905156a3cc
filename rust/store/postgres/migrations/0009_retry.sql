-- 0009_retry, PostgreSQL dialect: the same columns and indexes as the SQLite twin (see it for
-- why each exists), ids in byte order as SQLite orders them. The status CHECK is replaced in
-- place: PostgreSQL alters constraints, so nothing else of `units` changes.
ALTER TABLE runs ADD COLUMN retry_policy TEXT;
ALTER TABLE steps ADD COLUMN retry_policy TEXT;
ALTER TABLE units ADD COLUMN retry_at BIGINT;
ALTER TABLE units DROP CONSTRAINT units_status_check,
    ADD CONSTRAINT units_status_check CHECK (status IN
        ('pending', 'running', 'completed', 'failed', 'cancelled', 'timed_out', 'exhausted'));

-- The ledger-wide index holds the same units as the run's under a predicate of its own, which
-- only the ledger-wide read states: a read of one run cannot then take it. PostgreSQL 15 walks
-- an index with a condition on a column after its first (the run), and it estimated that walk
-- of every run's waiting units cheaper than the run's own range when the table's order follows
-- the retry times. No retry time is the smallest BIGINT (it is a finish time plus a delay).
CREATE INDEX units_retry_due ON units(retry_at, run_id COLLATE "C", unit_id COLLATE "C")
    WHERE retry_at > -9223372036854775808;
-- A run's due units: the run is matched by equality alone, so it is keyed in the column's own
-- collation, which `units_first_started` (keyed under "C") cannot serve. Bounding the run with
-- row values instead made PostgreSQL count each bound as a further filter, estimate a run of a
-- thousand waiting units at ten, and fetch them all to sort.
CREATE INDEX units_retry_due_run ON units(run_id, retry_at, unit_id COLLATE "C")
    WHERE retry_at IS NOT NULL;
CREATE INDEX units_exhausted ON units(run_id COLLATE "C", unit_id COLLATE "C")
    WHERE status = 'exhausted';

-- 0013_views, PostgreSQL dialect: the same indexes as the SQLite twin (see it for the
-- reasons), with unit and run ids keyed bytewise (COLLATE "C") as the page orders compare them.
-- The run of `units_by_status` is matched by equality alone, so it is keyed in the column's
-- own collation (as `units_retry_due_run` is).
CREATE INDEX units_by_status ON units(run_id, status, first_started_at, unit_id COLLATE "C")
    WHERE status NOT IN ('running', 'completed');
CREATE INDEX runs_name_status_recent
    ON runs(workflow_name, status, updated_at, created_at, run_id COLLATE "C");

-- Run ids by prefix (`resolve_run_id`, the dashboard's search): a prefix is a range only in a
-- bytewise order, and the primary key is in the database's collation, where ids sharing a
-- prefix need not be adjacent (`en_US` ignores `-` at first).
CREATE INDEX runs_id_bytes ON runs(run_id COLLATE "C");

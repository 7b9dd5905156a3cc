-- 0013_views, SQLite dialect: the indexes a dashboard's filters read by.
--
-- A run's units of one status, in order of first reservation, for the statuses off a unit's
-- usual path (failed, timed out, cancelled, exhausted, pending): the ones an operator looks for
-- among half a million completed. A unit that is reserved and completes never enters it, so
-- it costs the usual path nothing; with `running` in it every reserve and finish paid about 5%
-- (one more page in each commit, measured), as much as an index of every unit. A run's
-- running or completed units are read by walking `units_first_started`, where they are most of
-- the rows.
CREATE INDEX units_by_status ON units(run_id, status, first_started_at, unit_id)
    WHERE status NOT IN ('running', 'completed');

-- Runs of one workflow name and status, most recently updated first: the order and cursor of
-- `runs_status_recent` behind the name. A name alone is read as one short range per status,
-- merged, so the one index serves the name with or without statuses. `updated_at` moves on a
-- run's own writes (status, steps, outputs), never on a unit's, so this costs what
-- `runs_status_recent` does.
CREATE INDEX runs_name_status_recent ON runs(workflow_name, status, updated_at, created_at, run_id);

-- 0004_reads, PostgreSQL dialect: the same indexes as the SQLite twin (see it for the
-- reasons). run_id is compared bytewise (COLLATE "C") in the page order, as SQLite compares
-- text, so both backends page in one order and the index serves the row-value cursor; so is
-- unit_id in a run's unit order.
DROP INDEX runs_updated;
CREATE INDEX runs_recent ON runs(updated_at, created_at, run_id COLLATE "C");
CREATE INDEX runs_status_recent ON runs(status, updated_at, created_at, run_id COLLATE "C");

CREATE INDEX units_first_started ON units(run_id, first_started_at, unit_id COLLATE "C");

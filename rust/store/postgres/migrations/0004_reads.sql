-- 0004_reads, PostgreSQL dialect: the same indexes as the SQLite twin (see it for the
-- reasons). run_id is compared bytewise (COLLATE "C") in the page order, as SQLite compares
-- text, so both backends page in one order and the index serves the row-value cursor; so is
-- unit_id in a run's unit order.
DROP INDEX runs_updated;
CREATE INDEX runs_recent ON runs(updated_at, created_at, run_id COLLATE "C");
CREATE INDEX runs_status_recent ON runs(status, updated_at, created_at, run_id COLLATE "C");

-- Its run_id is keyed under "C" too, and the page read names the run under "C": an index
-- that leads with a plain run_id ties with the primary key for one unit's row on a table
-- with no statistics yet, and a plan that picks it walks the whole run's units for every
-- unit looked up (the finish's update, and the foreign key check of every new attempt, which
-- no statement text can steer). Keyed under another collation it can serve only the page.
CREATE INDEX units_first_started ON units(run_id COLLATE "C", first_started_at, unit_id COLLATE "C");

-- 0004_reads, SQLite dialect: the indexes that keep the pages a dashboard or an operator
-- repeats (runs by status, newest first; a run's units in order) a walk of exactly the rows
-- returned, however many runs and units the ledger holds.
--
-- list_runs pages newest first by (updated_at, created_at, run_id) and continues after the
-- last run of a page by comparing that row value; with run_id as the last column the order is
-- total and a page boundary between two runs updated in the same millisecond loses neither.
-- SQLite walks an ascending index backwards for the descending order.
DROP INDEX runs_updated;
CREATE INDEX runs_recent ON runs(updated_at, created_at, run_id);
-- list_runs(status=...): one status is one contiguous range of this index, already in page
-- order, so a status that is rare among millions of runs costs no more than a common one.
CREATE INDEX runs_status_recent ON runs(status, updated_at, created_at, run_id);

-- units(run_id) pages in order of first reservation. first_started_at is written once, when
-- the unit is first reserved, so a unit keeps its place in this index (and a cursor naming it
-- stays valid) while its status and attempts change.
CREATE INDEX units_first_started ON units(run_id, first_started_at, unit_id);

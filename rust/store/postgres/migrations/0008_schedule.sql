-- 0008_schedule, PostgreSQL dialect: the same columns, tables and indexes as the SQLite twin
-- (see it for the lanes and why each index exists), run ids in byte order as SQLite orders
-- them. Columns with a constant default (or none) are added without rewriting the table.
ALTER TABLE runs ADD COLUMN not_before BIGINT;
ALTER TABLE runs ADD COLUMN priority BIGINT NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -1000 AND 1000);
ALTER TABLE runs ADD COLUMN concurrency_key TEXT;
ALTER TABLE runs ADD COLUMN due_at BIGINT;
ALTER TABLE runs ADD COLUMN queue_lane TEXT
    CHECK (queue_lane IN ('due', 'keyed', 'later', 'paused'));

UPDATE runs SET due_at = created_at, queue_lane = 'due' WHERE status = 'queued';

CREATE INDEX runs_lane_due ON runs(priority DESC, due_at, run_id COLLATE "C")
    WHERE status = 'queued' AND queue_lane = 'due';
CREATE INDEX runs_lane_keyed ON runs(concurrency_key, priority DESC, due_at, run_id COLLATE "C")
    WHERE status = 'queued' AND queue_lane = 'keyed';
CREATE INDEX runs_lane_later ON runs(due_at, run_id COLLATE "C")
    WHERE status = 'queued' AND queue_lane = 'later';
CREATE INDEX runs_queued_name ON runs(workflow_name, run_id COLLATE "C") WHERE status = 'queued';
CREATE INDEX runs_queued_key ON runs(concurrency_key, run_id COLLATE "C")
    WHERE status = 'queued' AND concurrency_key IS NOT NULL;
CREATE INDEX runs_key_live ON runs(concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status IN ('starting', 'active', 'blocked', 'parked');

CREATE TABLE concurrency_limits (
    concurrency_key TEXT PRIMARY KEY,
    max_live        BIGINT NOT NULL CHECK (max_live >= 0),
    updated_at      BIGINT NOT NULL
);

CREATE TABLE paused_workflows (
    workflow_name TEXT PRIMARY KEY,
    paused_at     BIGINT NOT NULL
);

-- Rescue: the same column, index and trigger as the SQLite twin (see it for why).
ALTER TABLE leases ADD COLUMN run_ended BIGINT NOT NULL DEFAULT 0 CHECK (run_ended IN (0, 1));
UPDATE leases SET run_ended = 1 WHERE resource_id IN (
    SELECT run_id FROM runs WHERE status IN ('completed', 'failed', 'cancelled'));
CREATE INDEX leases_rescue ON leases(expires_at, resource_id COLLATE "C")
    WHERE expires_at IS NOT NULL AND run_ended = 0;
CREATE FUNCTION fencepost_run_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE leases SET run_ended = 1 WHERE resource_id = NEW.run_id AND run_ended = 0;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_ended_lease AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION fencepost_run_ended();

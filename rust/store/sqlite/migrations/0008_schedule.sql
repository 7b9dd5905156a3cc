-- 0008_schedule, SQLite dialect: queued runs carry when they may start (`not_before`), which
-- goes first (`priority`) and what they count against (`concurrency_key`); the ledger keeps the
-- keys' limits and the paused workflows.
--
-- `claim_next` must cost the same whatever the backlog, and one index ordered by priority then
-- due time cannot skip the runs it may not hand out yet: a claim would walk every not-yet-due
-- run of a higher priority, every run of a paused workflow and every run of a key at its limit.
-- So a queued run sits in one lane (`queue_lane`), and each lane has an index of its own:
--   'due'     may be claimed now: `runs_lane_due`, in claim order;
--   'keyed'   due, but its key has a limit: `runs_lane_keyed`, per key in claim order, read
--             only for keys with room;
--   'later'   not yet due: `runs_lane_later`, by due time; a claim first moves the runs that
--             have become due into their lane, which costs what has come due, not the backlog;
--   'paused'  its workflow is paused: no index walked by claims; `resume_workflow` moves them
--             back (`runs_queued_name`).
-- `due_at` is `not_before`, else the time the run was queued: the claim order's second key.
-- Only queued runs have a lane; every lane index is partial on `status = 'queued'`, so a run
-- leaves them all when it is claimed.
ALTER TABLE runs ADD COLUMN not_before INTEGER;
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -1000 AND 1000);
ALTER TABLE runs ADD COLUMN concurrency_key TEXT;
ALTER TABLE runs ADD COLUMN due_at INTEGER;
ALTER TABLE runs ADD COLUMN queue_lane TEXT
    CHECK (queue_lane IN ('due', 'keyed', 'later', 'paused'));

UPDATE runs SET due_at = created_at, queue_lane = 'due' WHERE status = 'queued';

CREATE INDEX runs_lane_due ON runs(priority DESC, due_at, run_id)
    WHERE status = 'queued' AND queue_lane = 'due';
CREATE INDEX runs_lane_keyed ON runs(concurrency_key, priority DESC, due_at, run_id)
    WHERE status = 'queued' AND queue_lane = 'keyed';
CREATE INDEX runs_lane_later ON runs(due_at, run_id)
    WHERE status = 'queued' AND queue_lane = 'later';
-- Pausing and resuming a workflow, and setting or removing a key's limit, move that
-- workflow's or key's queued runs between lanes: these find them without walking the rest.
CREATE INDEX runs_queued_name ON runs(workflow_name, run_id) WHERE status = 'queued';
CREATE INDEX runs_queued_key ON runs(concurrency_key, run_id)
    WHERE status = 'queued' AND concurrency_key IS NOT NULL;
-- A key's live count: its runs that have left the queue and have not ended (the lease of each
-- is then probed for `expires_at > now`).
CREATE INDEX runs_key_live ON runs(concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status IN ('starting', 'active', 'blocked', 'parked');

-- At most `max_live` runs with the key hold live leases; 0 holds the key's runs.
CREATE TABLE concurrency_limits (
    concurrency_key TEXT PRIMARY KEY,
    max_live        INTEGER NOT NULL CHECK (max_live >= 0),
    updated_at      INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- `claim_next` hands out no run of these workflows.
CREATE TABLE paused_workflows (
    workflow_name TEXT PRIMARY KEY,
    paused_at     INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Rescue: `claim_next` also takes over runs whose owner's lease expired. A lease names its
-- owner until a claim or a release replaces it, whatever becomes of its run, so the owned
-- leases past their expiry include those of every run that ended without a release; walking
-- them would cost what the ledger's history does. `run_ended` marks a lease whose run has
-- ended (set by the trigger below on every move to a terminal status, whatever path makes
-- it), and `leases_rescue` holds the owned leases of runs that have not, by expiry: a rescue
-- reads those that have expired, which a live controller keeps few.
ALTER TABLE leases ADD COLUMN run_ended INTEGER NOT NULL DEFAULT 0 CHECK (run_ended IN (0, 1));
UPDATE leases SET run_ended = 1 WHERE resource_id IN (
    SELECT run_id FROM runs WHERE status IN ('completed', 'failed', 'cancelled'));
CREATE INDEX leases_rescue ON leases(expires_at, resource_id)
    WHERE expires_at IS NOT NULL AND run_ended = 0;
CREATE TRIGGER runs_ended_lease AFTER UPDATE OF status ON runs
WHEN NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    UPDATE leases SET run_ended = 1 WHERE resource_id = NEW.run_id AND run_ended = 0;
END;

-- 0010_fan_in, SQLite dialect: a parent hears when its children have all ended.
--
-- When a child's move to a terminal status leaves its parent no child that has not ended, the
-- parent gets a `children.settled` event in the same transaction, with the children counted by
-- status and the child whose end settled them. A trigger, not a step of each operation: a run
-- ends by `set_status`, by `complete_step`, by a cascade of `abandon_run`, by a continuation
-- completing a parked run, and whatever path is added later ends it through this column, so
-- none can forget the parent. A new child makes the parent live again, and its end settles it
-- again. Restore inserts runs (it does not update them): a restored tree writes no event.
--
-- `runs_live_children` holds the children that have not ended, so the check costs one probe
-- however many children the parent has had; the counts are read only when the last one ends.
-- The payload is written out as canonical JSON (members sorted, no spaces): once settled, every
-- child has one of the three terminal statuses, listed with their counts in key order. The
-- event is numbered as every event is (above the highest `seq` and the floor prune keeps,
-- revision after the parent's newest) and stamped with the child's update time, the ledger's
-- clock.
CREATE INDEX runs_live_children ON runs(parent_run_id)
    WHERE parent_run_id IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');

CREATE TRIGGER runs_children_settled AFTER UPDATE OF status ON runs
WHEN NEW.parent_run_id IS NOT NULL
  AND NEW.status IN ('completed', 'failed', 'cancelled')
  AND OLD.status NOT IN ('completed', 'failed', 'cancelled')
  AND NOT EXISTS (
      SELECT 1 FROM runs
      WHERE parent_run_id = NEW.parent_run_id
        AND status NOT IN ('completed', 'failed', 'cancelled'))
BEGIN
    INSERT INTO events(seq, resource_id, revision, type, payload, ts)
    SELECT max(coalesce((SELECT max(seq) FROM events), 0),
               (SELECT seq FROM event_seq_floor WHERE id = 1)) + 1,
        NEW.parent_run_id,
        (SELECT coalesce(max(revision), 0) + 1 FROM events WHERE resource_id = NEW.parent_run_id),
        'children.settled',
        '{"by_status":{' || rtrim(
            CASE WHEN c.cancelled > 0 THEN '"cancelled":' || c.cancelled || ',' ELSE '' END
            || CASE WHEN c.completed > 0 THEN '"completed":' || c.completed || ',' ELSE '' END
            || CASE WHEN c.failed > 0 THEN '"failed":' || c.failed || ',' ELSE '' END, ',')
        || '},"child_run_id":"' || NEW.run_id || '","total":' || c.total || '}',
        NEW.updated_at
    FROM (SELECT count(*) AS total,
                 sum(status = 'cancelled') AS cancelled,
                 sum(status = 'completed') AS completed,
                 sum(status = 'failed') AS failed
          FROM runs WHERE parent_run_id = NEW.parent_run_id) AS c;
END;

-- 0010_fan_in, PostgreSQL dialect: the same index and event as the SQLite twin (see it for
-- why a trigger, and for the payload). Children may end in concurrent transactions, each not
-- yet seeing the others' ends: the trigger first locks the parent's row, so they count one
-- after another, and each count (a statement of its own, with its own snapshot under READ
-- COMMITTED) sees every end committed before it. Of children ending at once, exactly the last
-- to take the lock finds none left and writes the event. A child published meanwhile takes
-- the same lock (`publish_child_run`), so it is seen too.
CREATE INDEX runs_live_children ON runs(parent_run_id)
    WHERE parent_run_id IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');

CREATE FUNCTION fencepost_children_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    PERFORM 1 FROM runs WHERE run_id = NEW.parent_run_id FOR UPDATE;
    IF EXISTS (
        SELECT 1 FROM runs
        WHERE parent_run_id = NEW.parent_run_id
          AND status NOT IN ('completed', 'failed', 'cancelled')
    ) THEN
        RETURN NULL;
    END IF;
    SELECT count(*) AS total,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE status = 'failed') AS failed
    INTO c FROM runs WHERE parent_run_id = NEW.parent_run_id;
    INSERT INTO events(resource_id, revision, type, payload, ts)
    SELECT NEW.parent_run_id, coalesce(max(revision), 0) + 1, 'children.settled',
        '{"by_status":{' || rtrim(
            CASE WHEN c.cancelled > 0 THEN '"cancelled":' || c.cancelled || ',' ELSE '' END
            || CASE WHEN c.completed > 0 THEN '"completed":' || c.completed || ',' ELSE '' END
            || CASE WHEN c.failed > 0 THEN '"failed":' || c.failed || ',' ELSE '' END, ',')
        || '},"child_run_id":"' || NEW.run_id || '","total":' || c.total || '}',
        NEW.updated_at
    FROM events WHERE resource_id = NEW.parent_run_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_children_settled AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION fencepost_children_settled();

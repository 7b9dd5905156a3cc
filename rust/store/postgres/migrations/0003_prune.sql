-- 0003_prune, PostgreSQL dialect: what `prune` needs to remove whole terminal run trees, and
-- only those (see the SQLite twin for the reasons; the same rules).
--
-- `pruning` rows are written and removed inside prune's own transaction, so no other session
-- ever sees one: another transaction cannot borrow a prune's permission. Only a terminal run
-- can be listed, checked once per run; each deleted event then costs one probe of `pruning`.
CREATE TABLE pruning (
    run_id TEXT PRIMARY KEY
);

CREATE FUNCTION pruning_terminal_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' AND EXISTS (
        SELECT 1 FROM runs
        WHERE run_id = NEW.run_id AND status IN ('completed', 'failed', 'cancelled'))
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'only a terminal run can be pruned';
END;
$$;
CREATE TRIGGER pruning_terminal_only BEFORE INSERT OR UPDATE ON pruning
    FOR EACH ROW EXECUTE FUNCTION pruning_terminal_only();

CREATE FUNCTION events_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pruning WHERE run_id = OLD.resource_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'events are append-only: only prune removes them, with their whole terminal run';
END;
$$;
DROP TRIGGER events_append_only_delete ON events;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_prune_only();

CREATE INDEX runs_prune ON runs(completed_at, run_id)
    WHERE parent_run_id IS NULL AND completed_at IS NOT NULL;

-- The referring columns of blobs and definitions: the foreign keys' checks on delete and
-- prune's own "still referred to?" are index probes, not scans of runs.
CREATE INDEX runs_definition_ref ON runs(definition_digest) WHERE definition_digest IS NOT NULL;
CREATE INDEX runs_params_ref ON runs(params) WHERE params IS NOT NULL;
CREATE INDEX runs_input_ref ON runs(input) WHERE input IS NOT NULL;
CREATE INDEX runs_launch_options_ref ON runs(launch_options) WHERE launch_options IS NOT NULL;
CREATE INDEX runs_source_ref ON runs(source) WHERE source IS NOT NULL;
CREATE INDEX runs_plan_ref ON runs(plan) WHERE plan IS NOT NULL;
CREATE INDEX runs_outputs_ref ON runs(outputs) WHERE outputs IS NOT NULL;

-- Type-filtered reads of the whole log (`events(types=["run.completed"])`) by index: every
-- type except the two each attempt writes, which are most of the log and which a filter finds
-- by reading in seq order. Leaving them out keeps the reserve and finish paths from writing an
-- entry here.
CREATE INDEX events_rare_type ON events(type, seq)
    WHERE type NOT IN ('unit.started', 'unit.finished');

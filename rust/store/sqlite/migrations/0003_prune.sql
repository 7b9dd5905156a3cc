-- 0003_prune, SQLite dialect: what `prune` needs to remove whole terminal run trees, and only
-- those.
--
-- Events stay append-only for everything else: the delete trigger lets a row go only while its
-- run is listed in `pruning`, and only a terminal run can be listed (a terminal run never
-- becomes live again). Prune lists a tree's runs inside its own transaction and empties the
-- list before it commits. A live run's events, a run not being pruned, an event whose resource
-- is no run: all still refused by the database. The status is checked once per listed run, not
-- once per deleted event: the per-event check is a single probe of this small table.
CREATE TABLE pruning (
    run_id TEXT PRIMARY KEY
) STRICT, WITHOUT ROWID;

CREATE TRIGGER pruning_terminal_only BEFORE INSERT ON pruning
WHEN NOT EXISTS (
    SELECT 1 FROM runs WHERE run_id = NEW.run_id AND status IN ('completed', 'failed', 'cancelled'))
BEGIN
    SELECT RAISE(ABORT, 'only a terminal run can be pruned');
END;
CREATE TRIGGER pruning_no_update BEFORE UPDATE ON pruning
BEGIN
    SELECT RAISE(ABORT, 'only a terminal run can be pruned');
END;

DROP TRIGGER events_append_only_delete;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
WHEN NOT EXISTS (SELECT 1 FROM pruning WHERE run_id = OLD.resource_id)
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: only prune removes them, with their whole terminal run');
END;

-- Prune's candidates: top-level terminal runs, oldest finish first. Partial: a live run is not
-- in it, and a run enters it once, when it finishes.
CREATE INDEX runs_prune ON runs(completed_at, run_id)
    WHERE parent_run_id IS NULL AND completed_at IS NOT NULL;

-- Who still refers to a blob or a definition. Deleting a blob makes the database look for rows
-- that refer to it, one lookup per referring column (the foreign keys), and prune asks the same
-- before it deletes one; without these each lookup reads the whole runs table. Partial: most
-- runs leave some of these empty. Written when a run is made (and `outputs` when it is set),
-- never on the reserve/finish path.
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

-- 0007_seq_floor, SQLite dialect: `seq` is never handed out twice, even after prune removes the
-- newest events.
--
-- `seq` is a plain rowid, and an insert that leaves it to SQLite gets max(seq) + 1: once prune
-- deletes the newest event, the next writer would take that number again, and a reader whose
-- cursor had passed it would never see the new event. AUTOINCREMENT would prevent that by
-- writing its `sqlite_sequence` row on every append (one more page per commit on the hot path)
-- and needs the events table rebuilt. Instead, prune raises this floor to the newest `seq`
-- before it deletes, and the event insert numbers a new event above both max(seq) and the
-- floor: one primary-key probe of a one-row table per append, and a write only when prune runs.
-- One row (id 1), so the read is a rowid lookup. It starts at the newest `seq` already handed
-- out.
CREATE TABLE event_seq_floor (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL CHECK (seq >= 0)
) STRICT;

INSERT INTO event_seq_floor (id, seq) VALUES (1, coalesce((SELECT max(seq) FROM events), 0));

-- The floor only rises: lowering it, or removing its row, would let a number be handed out
-- again, so the database refuses both.
CREATE TRIGGER event_seq_floor_rises BEFORE UPDATE ON event_seq_floor
WHEN NEW.seq < OLD.seq
BEGIN
    SELECT RAISE(ABORT, 'the event seq floor only rises');
END;
CREATE TRIGGER event_seq_floor_stays BEFORE DELETE ON event_seq_floor
BEGIN
    SELECT RAISE(ABORT, 'the event seq floor only rises');
END;

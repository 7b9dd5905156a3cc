-- 0011_messages, SQLite dialect: a mailbox per run. Anyone may `send` a run a message on a
-- topic; the run's current owner `receive`s it, fenced by its claim, each message once.
--
-- `seq` numbers a run's messages from 1 under the run's lock (as events' `revision`), so the
-- numbers of a run never repeat and a pruned run takes its numbers with it; restore brings
-- them back unchanged, and no other run's numbers can collide with them. `key` makes a send
-- idempotent within its run and topic (`messages_key`; a message without a key is always new).
-- `consumed_at` is set once, by the receive that takes the message, with the generation of the
-- claim it received under.
CREATE TABLE messages (
    run_id              TEXT NOT NULL REFERENCES runs(run_id),
    seq                 INTEGER NOT NULL CHECK (seq >= 1),
    topic               TEXT NOT NULL,
    key                 TEXT,
    payload             TEXT NOT NULL,
    sent_at             INTEGER NOT NULL,
    consumed_at         INTEGER,
    consumed_generation INTEGER,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;

CREATE UNIQUE INDEX messages_key ON messages(run_id, topic, key) WHERE key IS NOT NULL;
-- `receive`: the oldest messages of a topic not yet taken; a taken message leaves the index,
-- so a receive reads what it returns whatever the run's mailbox has held.
CREATE INDEX messages_waiting ON messages(run_id, topic, seq) WHERE consumed_at IS NULL;
-- `messages(topic=...)`: a topic's messages in order, taken ones too (without a topic the
-- primary key serves).
CREATE INDEX messages_topic ON messages(run_id, topic, seq);

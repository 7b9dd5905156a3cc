-- 0011_messages, PostgreSQL dialect: the same table and indexes as the SQLite twin (see it for
-- why they have this shape). A receive updates the row it takes, hence the fillfactor: the
-- update can stay on the row's page.
CREATE TABLE messages (
    run_id              TEXT NOT NULL REFERENCES runs(run_id),
    seq                 BIGINT NOT NULL CHECK (seq >= 1),
    topic               TEXT NOT NULL,
    key                 TEXT,
    payload             TEXT NOT NULL,
    sent_at             BIGINT NOT NULL,
    consumed_at         BIGINT,
    consumed_generation BIGINT,
    PRIMARY KEY (run_id, seq)
) WITH (fillfactor = 80);

CREATE UNIQUE INDEX messages_key ON messages(run_id, topic, key) WHERE key IS NOT NULL;
CREATE INDEX messages_waiting ON messages(run_id, topic, seq) WHERE consumed_at IS NULL;
CREATE INDEX messages_topic ON messages(run_id, topic, seq);

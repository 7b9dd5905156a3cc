-- 0006_fencing, PostgreSQL dialect: the same columns as the SQLite twin (see it for why).
-- A column with a constant default is added without rewriting the table.
ALTER TABLE leases ADD COLUMN takeovers BIGINT NOT NULL DEFAULT 0 CHECK (takeovers >= 0);
ALTER TABLE leases ADD COLUMN refused_writes BIGINT NOT NULL DEFAULT 0
    CHECK (refused_writes >= 0);
ALTER TABLE attempts ADD COLUMN trace_context TEXT;

-- 0006_fencing, SQLite dialect: what the fence did, kept where an operator can see it.
-- A lease counts the claims that took it from another owner whose claim had expired
-- (takeovers) and the fenced writes it refused because their claim no longer held it
-- (refused_writes, counted in a transaction of its own, since the refused write's own
-- transaction is rolled back). An attempt keeps the W3C trace context of the span that
-- reserved it, so the work done for it can be linked to that span.
ALTER TABLE leases ADD COLUMN takeovers INTEGER NOT NULL DEFAULT 0 CHECK (takeovers >= 0);
ALTER TABLE leases ADD COLUMN refused_writes INTEGER NOT NULL DEFAULT 0
    CHECK (refused_writes >= 0);
ALTER TABLE attempts ADD COLUMN trace_context TEXT;

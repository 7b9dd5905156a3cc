-- 0005_queue, PostgreSQL dialect: the same index as the SQLite twin (see it for the reason),
-- run ids in byte order as SQLite orders them. `claim_next` reads it with FOR UPDATE SKIP
-- LOCKED, so concurrent claimers walk past each other's runs instead of waiting on them.
CREATE INDEX runs_queued ON runs(created_at, run_id COLLATE "C") WHERE status = 'queued';

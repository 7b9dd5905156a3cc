-- 0005_queue, SQLite dialect: `claim_next` hands out the oldest queued runs. This index holds
-- the queued runs alone, in that order, so finding the next one reads only what is still
-- queued: a claim moves its run out of the index, and the finished runs of months are never
-- in it.
CREATE INDEX runs_queued ON runs(created_at, run_id) WHERE status = 'queued';

-- 0007_seq_floor, PostgreSQL dialect: `seq` comes from the identity sequence, which never hands a
-- number out twice, so prune needs no floor here (SQLite's twin adds one). What can leave the
-- sequence behind the events is restore: archived events keep their `seq` (OVERRIDING SYSTEM
-- VALUE, which does not move the sequence), so a tree restored into another ledger may hold
-- numbers the sequence has not reached, and new events would collide with them or be numbered
-- below them. Restore raises the sequence first; this raises it once for a ledger an earlier
-- restore left behind. The lock keeps any writer from drawing a number between the read and
-- setval (an INSERT into events holds ROW EXCLUSIVE, which SHARE ROW EXCLUSIVE excludes).
LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE;
SELECT setval('events_seq_seq', m)
FROM (SELECT max(seq) AS m FROM events) newest, events_seq_seq
WHERE m > last_value OR (m = last_value AND NOT is_called);

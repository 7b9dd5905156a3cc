-- 0002_fillfactor, PostgreSQL dialect. The two tables whose rows are updated after they are
-- written (an attempt when it finishes or is reclaimed, a unit's projection on every attempt)
-- keep half of each page free, so that such an update can be HOT: the new row version goes on
-- the same page and no index gains an entry. At the default fill (100%) every finish wrote a
-- new entry into both of attempts' indexes and units' primary key, bloat that only VACUUM
-- takes back. Half, not the usual fifth: a batch finishes every row of a page in one
-- statement, while the old versions are still live, so the page must hold two versions of
-- each row. Measured on a finish of 1000 (benches/RESULTS.md): HOT updates 0% / 26% / 99% at
-- fill 100 / 80 / 50, 33.0 / 30.9 / 26.7 us per unit; a reservation writes ~1.5 us more.
-- Pruning frees the dead versions' room for the next rows, so the tables do not stay twice
-- as large. Pages written from now on keep the room; existing full pages are left as they are.
ALTER TABLE attempts SET (fillfactor = 50);
ALTER TABLE units SET (fillfactor = 50);

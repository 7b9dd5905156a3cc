"""Forward-only migrations (``store/migrate``) on both backends: opening applies the
numbered migrations a database lacks and records each, reopening applies none; a database from a
newer fencepost is ``SchemaError`` and one that is not a fencepost ledger ``StoreError``, each
left as it was (a refused SQLite file byte for byte); ``create=False`` and the read commands
never make a schema; on PostgreSQL many processes may open a fresh schema at once."""

from __future__ import annotations

import datetime as dt
import hashlib
import pathlib
import sqlite3
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import (
    PG_URL,
    REPO,
    FakeClock,
    applied_migrations,
    cli,
    pg_connect,
    pg_schema,
    raw_db,
    schema_of,
)
from tests.processes import outcome, run_all

# ------------------------------------------------------------------ SQLite


def test_reopen_is_a_no_op_on_sqlite(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ledger.db"
    fp.Ledger.open(str(path)).close()
    before = applied_migrations(path)
    with raw_db(path) as db:
        applied = db.execute("SELECT applied_at FROM schema_migrations").fetchall()
    fp.Ledger.open(str(path)).close()
    assert applied_migrations(path) == before
    with raw_db(path) as db:
        assert db.execute("SELECT applied_at FROM schema_migrations").fetchall() == applied


def test_newer_sqlite_schema_is_refused_and_left_alone(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "newer.db"
    fp.Ledger.open(str(path)).close()
    with raw_db(path) as db:
        db.execute(
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (999, 'future', 0)"
        )
        db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = path.read_bytes()
    with pytest.raises(fp.SchemaError) as info:
        fp.Ledger.open(str(path))
    assert info.value.database_version == 999
    assert info.value.library_version == fp.SCHEMA_VERSION
    assert "upgrade fencepost" in str(info.value)
    assert applied_migrations(path)[-1] == (999, "future")
    assert path.read_bytes() == before


def test_a_schema_6_ledger_with_events_migrates_and_continues_its_seq(
    tmp_path: pathlib.Path, clock: FakeClock
) -> None:
    path = tmp_path / "six.db"
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="old", force=True)
        ledger.finish_attempt(
            "old", "u1", *attempt(ledger.reserve_attempt("old", "u1", step_id="s")),
            status="completed",
        )  # fmt: skip
        assert ledger.abandon_run("old")
        newest = ledger.events()[-1].seq
    # Back to schema 6: 0008's columns go, and 0007's table, with its triggers.
    with raw_db(path) as db:
        db.executescript(UNDO_0008_SQLITE)
        db.execute("DROP TABLE event_seq_floor")
        db.execute("DELETE FROM schema_migrations WHERE version >= 7")
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        assert ledger.pragmas()["schema_version"] == fp.SCHEMA_VERSION == 13
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="new", force=True)
        assert [e.seq for e in ledger.events(after_seq=newest)] == [newest + 1]
        # The old run's tree goes, though it held the newest event; numbering goes on above.
        assert ledger.abandon_run("new")
        newest = ledger.events()[-1].seq
        clock.advance(1000)
        assert ledger.prune(older_than=dt.timedelta(0)).runs == 2
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="next", force=True)
        assert [e.seq for e in ledger.events()] == [newest + 1]
    assert applied_migrations(path)[-7:] == [
        (7, "seq_floor"),
        (8, "schedule"),
        (9, "retry"),
        (10, "fan_in"),
        (11, "messages"),
        (12, "schedules"),
        (13, "views"),
    ]
    with raw_db(path) as db, pytest.raises(sqlite3.IntegrityError, match="only rises"):
        db.execute("UPDATE event_seq_floor SET seq = 0")


def attempt(r: fp.Reservation) -> tuple[int, str]:
    return r.attempt, r.dispatch_id


def sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def foreign_sqlite(path: pathlib.Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes(body) VALUES ('mine')")
    db.commit()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()


def newer_fencepost(path: pathlib.Path) -> None:
    fp.Ledger.open(str(path)).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (99, 'x', 0)")
    db.commit()
    db.close()


def not_sqlite(path: pathlib.Path) -> None:
    path.write_bytes(b"not a database, just some text\n" * 200)


@pytest.mark.parametrize("make", [foreign_sqlite, newer_fencepost, not_sqlite])
@pytest.mark.parametrize("create", [True, False])
def test_a_refused_file_is_left_byte_for_byte(
    tmp_path: pathlib.Path, make: Any, create: bool
) -> None:
    path = tmp_path / "other.db"
    make(path)
    before = sha(path)
    expected = fp.SchemaError if make is newer_fencepost else fp.StoreError
    with pytest.raises(expected):
        fp.Ledger.open(str(path), create=create)
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm


# ------------------------------------------------------------------ PostgreSQL


def test_open_creates_the_schema_and_records_the_migration() -> None:
    with pg_schema() as url:
        with fp.Ledger.open(url) as ledger:
            p = ledger.pragmas()
            assert p["journal_mode"] == "postgresql"
            assert p["schema_version"] == fp.SCHEMA_VERSION
            assert ledger.integrity_check() == ["ok"]
        with pg_connect(url) as conn:
            rows = conn.execute(
                "SELECT version, name FROM schema_migrations ORDER BY version"
            ).fetchall()
            assert rows == [
                (1, "init"),
                (2, "fillfactor"),
                (3, "prune"),
                (4, "reads"),
                (5, "queue"),
                (6, "fencing"),
                (7, "seq_floor"),
                (8, "schedule"),
                (9, "retry"),
                (10, "fan_in"),
                (11, "messages"),
                (12, "schedules"),
                (13, "views"),
            ]
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (schema_of(url),),
                )
            }
            assert {"runs", "events", "attempts", "leases", "units", "blobs"} <= tables
        # The public schema is untouched.
        with pg_connect(PG_URL) as conn:
            public = conn.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_name = 'runs'"
            ).fetchone()
            assert public is not None
            assert public[0] == 0


MIGRATIONS = REPO / "rust" / "store" / "postgres" / "migrations"


# What 0003_prune added, taken away again: the delete trigger back on the append-only function.
UNDO_0003 = """
DROP TRIGGER events_append_only_delete ON events;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
DROP FUNCTION events_prune_only();
DROP TABLE pruning;
DROP FUNCTION pruning_terminal_only();
DROP INDEX runs_prune, runs_definition_ref, runs_params_ref, runs_input_ref,
    runs_launch_options_ref, runs_source_ref, runs_plan_ref, runs_outputs_ref, events_rare_type;
"""
# What 0005_queue added, taken away again.
# What 0008_schedule added, taken away again: the trigger (each dialect its own way), then the
# same statements on both backends.
# What 0010_fan_in added, taken away again.
# What 0011_messages, 0012_schedules and 0013_views added, taken away again (runs_id_bytes is
# PostgreSQL's only).
UNDO_0011 = (
    "DROP INDEX units_by_status; DROP INDEX runs_name_status_recent;"
    " DROP INDEX IF EXISTS runs_id_bytes; DROP TABLE schedules; DROP TABLE messages;"
)
UNDO_0010_SQLITE = UNDO_0011 + "DROP TRIGGER runs_children_settled; DROP INDEX runs_live_children;"
UNDO_0010 = (
    UNDO_0011
    + "DROP TRIGGER runs_children_settled ON runs; DROP FUNCTION fencepost_children_settled();"
    " DROP INDEX runs_live_children;"
)
# What 0009_retry added, taken away again; on SQLite the units' status CHECK is put back as
# 0001 wrote it (the migration edits it in place), so a migration run afterwards meets the text
# a version-8 ledger holds.
_UNDO_0009 = """
DROP INDEX units_retry_due;
DROP INDEX units_retry_due_run;
DROP INDEX units_exhausted;
ALTER TABLE runs DROP COLUMN retry_policy;
ALTER TABLE steps DROP COLUMN retry_policy;
ALTER TABLE units DROP COLUMN retry_at;
"""
UNDO_0009_SQLITE = (
    UNDO_0010_SQLITE
    + _UNDO_0009
    + """
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql, ',
                        ''exhausted'')', ')')
WHERE type = 'table' AND name = 'units';
PRAGMA writable_schema = RESET;
"""
)
UNDO_0009 = (
    UNDO_0010
    + _UNDO_0009
    + """
ALTER TABLE units DROP CONSTRAINT units_status_check, ADD CONSTRAINT units_status_check CHECK (
    status IN ('pending', 'running', 'completed', 'failed', 'cancelled', 'timed_out'));
"""
)
_UNDO_0008 = """
DROP INDEX runs_lane_due;
DROP INDEX runs_lane_keyed;
DROP INDEX runs_lane_later;
DROP INDEX runs_queued_name;
DROP INDEX runs_queued_key;
DROP INDEX runs_key_live;
DROP INDEX leases_rescue;
DROP TABLE concurrency_limits;
DROP TABLE paused_workflows;
ALTER TABLE runs DROP COLUMN not_before;
ALTER TABLE runs DROP COLUMN priority;
ALTER TABLE runs DROP COLUMN concurrency_key;
ALTER TABLE runs DROP COLUMN due_at;
ALTER TABLE runs DROP COLUMN queue_lane;
ALTER TABLE leases DROP COLUMN run_ended;
"""
UNDO_0008_SQLITE = UNDO_0009_SQLITE + "DROP TRIGGER runs_ended_lease;" + _UNDO_0008
UNDO_0008 = (
    UNDO_0009
    + "DROP TRIGGER runs_ended_lease ON runs; DROP FUNCTION fencepost_run_ended();"
    + _UNDO_0008
)
UNDO_0006 = """
ALTER TABLE leases DROP COLUMN takeovers, DROP COLUMN refused_writes;
ALTER TABLE attempts DROP COLUMN trace_context;
"""
UNDO_0005 = "DROP INDEX runs_queued;"
# What 0004_reads added, taken away again: the recency index as version 1 made it.
UNDO_0004 = """
DROP INDEX runs_recent, runs_status_recent, units_first_started;
CREATE INDEX runs_updated ON runs(updated_at DESC, created_at DESC);
"""


def test_a_first_release_schema_migrates_forward_with_its_rows() -> None:
    # The schema as version 1 left it (its own migration file, run by hand), with a run and an
    # attempt in it; opening applies 0002 to 0005 and keeps every row.
    with pg_schema() as url:
        with pg_connect(PG_URL) as conn:
            conn.execute(f'CREATE SCHEMA "{schema_of(url)}"')
        with pg_connect(url) as conn:
            conn.execute(
                "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
            )
            conn.execute((MIGRATIONS / "0001_init.sql").read_text())
            conn.execute("INSERT INTO schema_migrations VALUES (1, 'init', 7)")
        with fp.Ledger.open(url) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="old", force=True)
            res = ledger.reserve_attempt("old", "u1", step_id="s")
        # Back to version 1 on paper only: the ledger row goes, the tables and rows stay.
        with pg_connect(url) as conn:
            conn.execute("DELETE FROM schema_migrations WHERE version >= 2")
            conn.execute("ALTER TABLE attempts RESET (fillfactor)")
            conn.execute("ALTER TABLE units RESET (fillfactor)")
            conn.execute(UNDO_0008)
            conn.execute(UNDO_0006)
            conn.execute(UNDO_0005)
            conn.execute(UNDO_0004)
            conn.execute(UNDO_0003)
        with fp.Ledger.open(url) as ledger:
            assert ledger.pragmas()["schema_version"] == fp.SCHEMA_VERSION == 13
            assert ledger.finish_attempt(
                "old", "u1", res.attempt, res.dispatch_id, status="completed"
            )
            assert ledger.get_run("old") is not None
        with pg_connect(url) as conn:
            rows = conn.execute(
                "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
            ).fetchall()
            assert rows[0] == (1, "init", 7)
            assert [r[:2] for r in rows[1:]] == [
                (2, "fillfactor"),
                (3, "prune"),
                (4, "reads"),
                (5, "queue"),
                (6, "fencing"),
                (7, "seq_floor"),
                (8, "schedule"),
                (9, "retry"),
                (10, "fan_in"),
                (11, "messages"),
                (12, "schedules"),
                (13, "views"),
            ]
            options = dict(
                conn.execute(
                    "SELECT relname, reloptions FROM pg_class "
                    "WHERE relnamespace = %s::regnamespace AND relname IN ('attempts', 'units')",
                    (schema_of(url),),
                ).fetchall()
            )
            assert options == {"attempts": ["fillfactor=50"], "units": ["fillfactor=50"]}


def test_a_sequence_behind_its_events_is_raised_by_the_migration() -> None:
    """A schema-6 ledger whose identity sequence lags its events, as restoring another
    ledger's archive could leave it (archived events keep their seq): 0007 moves the sequence
    past them, so a new event neither collides with one nor is numbered below it."""
    with pg_schema() as url:
        with fp.Ledger.open(url) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r", force=True)
            newest = ledger.events()[-1].seq
        with pg_connect(url) as conn:
            conn.execute("SELECT setval('events_seq_seq', 1, false)")
            conn.execute(UNDO_0008)
            conn.execute("DELETE FROM schema_migrations WHERE version >= 7")
        with fp.Ledger.open(url) as ledger:
            assert ledger.pragmas()["schema_version"] == fp.SCHEMA_VERSION == 13
            assert ledger.abandon_run("r")
            assert [e.seq for e in ledger.events(after_seq=newest)] == [newest + 1]
        with pg_connect(url) as conn:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (13,)


def test_reopen_is_a_no_op_and_the_schema_keyword_equals_the_url() -> None:
    with pg_schema() as url:
        base, schema = url.split("?schema=")
        with fp.Ledger.open(url) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        with fp.Ledger.open(base, schema=schema) as ledger:
            run = ledger.get_run("r1")
            assert run is not None
            assert run.revision == 1
        with pg_connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone() == (
                fp.SCHEMA_VERSION,
            )


def test_newer_postgresql_schema_is_refused_and_left_alone() -> None:
    with pg_schema() as url:
        fp.Ledger.open(url).close()
        with pg_connect(url) as conn:
            conn.execute(
                "INSERT INTO schema_migrations(version, name, applied_at) VALUES (999, 'f', 0)"
            )
        with pytest.raises(fp.SchemaError) as info:
            fp.Ledger.open(url)
        assert (info.value.database_version, info.value.library_version) == (
            999,
            fp.SCHEMA_VERSION,
        )
        with pg_connect(url) as conn:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (999,)


def test_a_schema_holding_other_tables_is_refused() -> None:
    with pg_schema() as url:
        schema = schema_of(url)
        with pg_connect(PG_URL) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".theirs (x int)')
        with pytest.raises(fp.StoreError, match="not a fencepost ledger"):
            fp.Ledger.open(url)
        with pg_connect(url) as conn:
            assert conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchone() == (1,)


def schema_exists(name: str) -> bool:
    with pg_connect(PG_URL) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,))
        return bool(row.fetchone()[0])


@pytest.mark.postgres
def test_create_false_and_read_commands_never_make_a_schema() -> None:
    with pg_schema() as url:
        name = schema_of(url)
        with pytest.raises(fp.StoreError, match="no fencepost ledger"):
            fp.Ledger.open(url, create=False)
        assert not schema_exists(name)
        for command in (["runs"], ["events"], ["leases"], ["doctor"], ["show", "r1"]):
            done = cli(*command, "--db", url)
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert "no fencepost ledger" in done.stderr, done.stderr
            assert not schema_exists(name), command
        fp.Ledger.open(url).close()  # create=True (the default) makes it
        assert schema_exists(name)
        assert cli("runs", "--db", url).returncode == 0


def _open_fresh(i: int, barrier: Any, queue: Any, url: str) -> None:
    barrier.wait()
    kind, got = outcome(lambda: fp.Ledger.open(url).pragmas()["schema_version"])
    queue.put((i, (kind, got if kind == "ok" else repr(got))))


def test_several_processes_open_a_fresh_schema_at_once() -> None:
    """Migrations run under an advisory lock: one process creates the schema, the others wait
    and find it migrated; nobody sees a half-made schema or a duplicate-table error."""
    with pg_schema() as url:
        results = run_all(_open_fresh, [(url,)] * 6)
        assert results == [("ok", fp.SCHEMA_VERSION)] * 6
        with pg_connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone() == (
                fp.SCHEMA_VERSION,
            )

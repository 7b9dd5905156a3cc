"""The PostgreSQL store itself (issue: "PostgreSQL backend"; DESIGN §6): opening, schemas,
migrations under an advisory lock, settings read back, connection failures named without the
password, reconnecting after the server drops the session, and the database enforcing
append-only events. The behaviour, concurrency and fencing suites run on PostgreSQL through the
`ledger` and `target` fixtures (tests/conftest.py); this file covers what only this backend has.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import psycopg
import pytest

import fencepost as fp
from tests.conftest import PG_URL, REPO, pg_connect, pg_schema
from tests.test_concurrency import _outcome, _run_all

CTX = multiprocessing.get_context("spawn")


def _schema_of(url: str) -> str:
    return url.rsplit("schema=", 1)[1]


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
            assert rows == [(1, "init"), (2, "fillfactor")]
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (_schema_of(url),),
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


def test_a_first_release_schema_migrates_forward_with_its_rows() -> None:
    # The schema as version 1 left it (its own migration file, run by hand), with a run and an
    # attempt in it; opening applies 0002 only and keeps every row.
    with pg_schema() as url:
        with pg_connect(PG_URL) as conn:
            conn.execute(f'CREATE SCHEMA "{_schema_of(url)}"')
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
            conn.execute("DELETE FROM schema_migrations WHERE version = 2")
            conn.execute("ALTER TABLE attempts RESET (fillfactor)")
            conn.execute("ALTER TABLE units RESET (fillfactor)")
        with fp.Ledger.open(url) as ledger:
            assert ledger.pragmas()["schema_version"] == fp.SCHEMA_VERSION == 2
            assert ledger.finish_attempt(
                "old", "u1", res.attempt, res.dispatch_id, status="completed"
            )
            assert ledger.get_run("old") is not None
        with pg_connect(url) as conn:
            rows = conn.execute(
                "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
            ).fetchall()
            assert rows[0] == (1, "init", 7)
            assert rows[1][:2] == (2, "fillfactor")
            options = dict(
                conn.execute(
                    "SELECT relname, reloptions FROM pg_class "
                    "WHERE relnamespace = %s::regnamespace AND relname IN ('attempts', 'units')",
                    (_schema_of(url),),
                ).fetchall()
            )
            assert options == {"attempts": ["fillfactor=50"], "units": ["fillfactor=50"]}


def test_a_batch_finish_updates_attempts_and_units_in_place() -> None:
    # Fill 50 (migration 0002) leaves each page room for a second version of every row, so a
    # batch finish is HOT: the new versions stay on their pages (same block in ctid), and no
    # index gets a new entry. A finished row is longer than a running one, so a page may lack
    # room for its last few (measured: ~1% of attempts, ~4-8% of units move); at the default
    # fill every row on a full page would move.
    with pg_schema() as url, fp.Ledger.open(url) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r", force=True)
        got = ledger.reserve_attempts(
            "r", [{"unit_id": f"u{i}", "step_id": "s"} for i in range(300)]
        )
        block = "SELECT unit_id, (ctid::text::point)[0] FROM {} ORDER BY unit_id"
        with pg_connect(url) as conn:
            before = {t: conn.execute(block.format(t)).fetchall() for t in ("attempts", "units")}
        done = ledger.finish_attempts(
            [
                {"run_id": "r", "unit_id": g.unit_id, "attempt": g.attempt,
                 "dispatch_id": g.dispatch_id, "status": "completed"}
                for g in got
            ]
        )  # fmt: skip
        assert all(done)
        with pg_connect(url) as conn:
            after = {t: conn.execute(block.format(t)).fetchall() for t in ("attempts", "units")}
            pages = conn.execute(
                "SELECT count(DISTINCT (ctid::text::point)[0]) FROM attempts"
            ).fetchone()
        assert pages is not None
        assert pages[0] > 2  # the rows span several pages, so the check means something
        for table in ("attempts", "units"):
            moved = [
                u for (u, b), (_, a) in zip(before[table], after[table], strict=True) if a != b
            ]
            assert len(moved) <= len(got) * 15 // 100, (table, moved)


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


def test_durability_and_busy_timeout_read_back() -> None:
    with pg_schema() as url:
        with fp.Ledger.open(url, durability="full", busy_timeout_ms=1234) as ledger:
            p = ledger.pragmas()
            assert (p["synchronous"], p["busy_timeout"]) == ("full", 1234)
        with fp.Ledger.open(url) as ledger:
            assert ledger.pragmas()["synchronous"] == "normal"


def test_newer_schema_is_refused_and_left_alone() -> None:
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
        schema = _schema_of(url)
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


@pytest.mark.parametrize(
    ("target", "kwargs", "argument"),
    [
        (PG_URL + "?schema=Bad-Name", {}, "schema"),
        (PG_URL + "?schema=pg_catalog", {}, "schema"),
        (PG_URL + "?schema=a", {"schema": "b"}, "schema"),
        (PG_URL, {"schema": 5}, "schema"),
        ("/tmp/x.db", {"schema": "s"}, "schema"),
    ],
)
def test_bad_schema_arguments(target: str, kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        fp.Ledger.open(target, **kwargs)
    assert info.value.argument == argument


def test_an_unreachable_server_is_named_without_the_password() -> None:
    with pytest.raises(fp.StoreError) as info:
        fp.Ledger.open("postgresql://someone:hunter2secret@127.0.0.1:1/test")
    text = str(info.value)
    assert "127.0.0.1:1" in text
    assert "check that the server is running" in text
    assert "hunter2secret" not in text
    assert "hunter2secret" not in repr(info.value)


def test_the_ledger_reconnects_after_the_server_drops_its_session() -> None:
    with pg_schema() as url, fp.Ledger.open(url) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        with pg_connect(url) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'fencepost' AND pid <> pg_backend_pid() "
                "AND datname = current_database()"
            ).fetchone()
            assert killed is not None
            assert killed[0] >= 1
        # The call that meets the dead session fails clearly (it cannot know whether a write
        # in flight committed); the next one reconnects.
        kind, err = _outcome(lambda: ledger.get_run("r1"))
        if kind != "ok":
            assert kind == "StoreError", err
            assert "lost the connection to PostgreSQL at 127.0.0.1:5432" in str(err)
        run = ledger.get_run("r1")
        assert run is not None
        assert run.run_id == "r1"
        res = ledger.reserve_attempt("r1", "u1", step_id="s")
        assert res.attempt == 1


def test_events_are_append_only_in_the_database() -> None:
    with pg_schema() as url:
        with fp.Ledger.open(url) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        with pg_connect(url) as conn:
            for statement in (
                "DELETE FROM events",
                "UPDATE events SET type = 'x'",
                "TRUNCATE events",
            ):
                with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                    conn.execute(statement)
            assert conn.execute("SELECT count(*) FROM events").fetchone() == (1,)


def _open_fresh(i: int, barrier: Any, queue: Any, url: str) -> None:
    barrier.wait()
    kind, got = _outcome(lambda: fp.Ledger.open(url).pragmas()["schema_version"])
    queue.put((i, (kind, got if kind == "ok" else repr(got))))


def test_several_processes_open_a_fresh_schema_at_once() -> None:
    """Migrations run under an advisory lock: one process creates the schema, the others wait
    and find it migrated; nobody sees a half-made schema or a duplicate-table error."""
    with pg_schema() as url:
        results = _run_all(_open_fresh, [(url,)] * 6)
        assert results == [("ok", fp.SCHEMA_VERSION)] * 6
        with pg_connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone() == (
                fp.SCHEMA_VERSION,
            )


def test_the_global_event_cursor_never_passes_an_uncommitted_event() -> None:
    # Two runs, two transactions: "slow" allocates its event seq first and stays uncommitted
    # for a second (a trigger sleeps in its event insert); "fast" commits a higher seq
    # meanwhile. A reader of every run's events must not return fast's event before slow's
    # commits, or a cursor (after_seq) would move past slow's seq and never see it. One run's
    # own events are not held back.
    with pg_schema() as url:
        with fp.Ledger.open(url) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="seed", force=True)
            seed = ledger.events()
        with pg_connect(url) as conn:
            conn.execute(
                "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.resource_id = 'slow' THEN PERFORM pg_sleep(1.5); END IF; "
                "RETURN NEW; END $$"
            )
            conn.execute(
                "CREATE TRIGGER slow_insert BEFORE INSERT ON events "
                "FOR EACH ROW EXECUTE FUNCTION slow_insert()"
            )

        def start(run_id: str) -> None:
            with fp.Ledger.open(url) as own:
                own.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id=run_id, force=True)

        slow = threading.Thread(target=start, args=("slow",))
        slow.start()
        time.sleep(0.5)  # slow's seq is allocated; its transaction sleeps in the trigger
        start("fast")
        with fp.Ledger.open(url) as reader:
            fast_events = reader.events("fast")
            assert [e.type for e in fast_events] == ["run.started"]
            with pg_connect(url) as conn:
                in_flight = conn.execute(
                    "SELECT count(*) FROM events WHERE resource_id = 'slow'"
                ).fetchone()
            assert in_flight == (0,), "slow's event must still be uncommitted here"
            held_back = reader.events(after_seq=seed[-1].seq)
            assert held_back == [], "fast's event was returned while slow's lower seq was open"
            slow.join(10)
            after = reader.events(after_seq=seed[-1].seq)
        assert [e.resource_id for e in after] == ["slow", "fast"]
        assert after[0].seq < after[1].seq == fast_events[0].seq

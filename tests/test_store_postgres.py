"""The PostgreSQL store (``store/postgres``): what only this backend has. Settings read back,
schema arguments, connection failures and targets shown without the password, reconnecting
after the server drops the session, batch finishes that update rows in place, and a global
event cursor that never passes an uncommitted event. The behaviour, concurrency and fencing
suites run on PostgreSQL too, through the ``ledger`` and ``target`` fixtures
(tests/conftest.py); its migrations are tested in test_store_migrate.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fencepost as fp
from fencepost.ledger import redact_target
from tests.conftest import PG_URL, cli, pg_connect, pg_schema


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


def test_durability_and_busy_timeout_read_back() -> None:
    with pg_schema() as url:
        with fp.Ledger.open(url, durability="full", busy_timeout_ms=1234) as ledger:
            p = ledger.pragmas()
            assert (p["synchronous"], p["busy_timeout"]) == ("full", 1234)
        with fp.Ledger.open(url) as ledger:
            assert ledger.pragmas()["synchronous"] == "normal"


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
        # The call that meets the dead session had sent no COMMIT, so it runs again on a new
        # session (tests/test_store_postgres_failover.py covers a session lost after one).
        run = ledger.get_run("r1")
        assert run is not None
        assert run.run_id == "r1"
        res = ledger.reserve_attempt("r1", "u1", step_id="s")
        assert res.attempt == 1


def wait_for_sleeping_event_insert(url: str, deadline_s: float = 10.0) -> None:
    """Wait until another session is asleep in the trigger while inserting into this schema's
    events: its event's seq is allocated by then (an identity default is computed before the
    BEFORE ROW trigger runs) and its transaction is still open. The session is found by the
    lock its INSERT holds on this schema's events table, so tests running beside this one on
    the same server never match."""
    end = time.monotonic() + deadline_s
    with pg_connect(url) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                "WHERE l.relation = 'events'::regclass AND l.mode = 'RowExclusiveLock' "
                "AND a.wait_event = 'PgSleep' AND a.pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            assert time.monotonic() < end, "the slow session never reached its event insert"
            time.sleep(0.01)


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
        wait_for_sleeping_event_insert(url)  # slow's seq is allocated, its transaction open
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


# ------------------------------------------------------------------ passwords stay hidden


SECRET = "s3cret-Pw"


def with_password(url: str) -> str:
    """``url`` with a password in its user part (the local server trusts, so it connects)."""
    scheme, rest = url.split("://", 1)
    user, at, host = rest.partition("@")
    assert at, "FENCEPOST_PG_URL names a user"
    return f"{scheme}://{user.split(':')[0]}:{SECRET}@{host}"


@pytest.mark.parametrize(
    ("shown", "hidden"),
    [
        ("postgresql://u:pw@h:5432/db?schema=s", "postgresql://u:***@h:5432/db?schema=s"),
        ("postgres://u:p:w@h/db", "postgres://u:***@h/db"),
        ("postgresql://h/db?user=u&password=pw&sslmode=disable",
         "postgresql://h/db?user=u&password=***&sslmode=disable"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("ledger.db", "ledger.db"),
    ],
)  # fmt: skip
def test_redact_target(shown: str, hidden: str) -> None:
    assert redact_target(shown) == hidden


@pytest.mark.postgres
def test_a_password_is_never_shown() -> None:
    with pg_schema() as url:
        secret_url = with_password(url)
        with fp.Ledger.open(secret_url) as ledger:
            shown = [repr(ledger), ledger.target, str(ledger.pragmas())]
            assert all(SECRET not in s for s in shown), shown
            assert ledger.target.startswith("postgresql://postgres@")
        for args in (["doctor", "--db", secret_url], ["doctor", "--json", "--db", secret_url]):
            done = cli(*args)
            assert done.returncode == 0, done.stderr
            assert SECRET not in done.stdout + done.stderr
            assert "postgres@127.0.0.1" in done.stdout
        # A URL fencepost cannot parse, and a server it cannot reach: the errors keep it too.
        for bad in (
            secret_url.replace(":5432", ":notaport"),
            secret_url.replace(":5432", ":1") + "&connect_timeout=2",
        ):
            with pytest.raises(fp.LedgerError) as info:
                fp.Ledger.open(bad)
            assert SECRET not in str(info.value)

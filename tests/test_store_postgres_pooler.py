"""PostgreSQL behind PgBouncer in transaction mode (tests/pgbouncer.py): the ledger's
``?pooler=transaction``. The core suite's PostgreSQL tests also run through a pooler (the
``pgbouncer`` backend of ``POOLED_MODULES`` in conftest.py); here a pool of one server session,
which every client shares, makes the mode's promise exact. Two ledgers interleave every kind of
call on that one session, each with its own durability, and another client then finds the
session as the server made it: no prepared statement, no setting. Two processes without the
mode, on the same pool, fail with an error that names the cure."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import fencepost as fp
from tests.conftest import PG_URL, FakeClock, pg_schema, schema_of
from tests.pgbouncer import bouncer

FORK = multiprocessing.get_context("fork")
SETTINGS = (
    "SELECT current_setting('search_path'), current_setting('lock_timeout'), "
    "current_setting('synchronous_commit'), current_setting('jit'), "
    "current_setting('default_transaction_isolation')"
)


@pytest.fixture(scope="module")
def one_session() -> Iterator[str]:
    """PgBouncer in transaction mode with a pool of one server session."""
    with bouncer(PG_URL.partition("?")[0], pool_size=1) as url:
        yield url


@pytest.fixture
def schema() -> Iterator[str]:
    with pg_schema() as url:
        yield schema_of(url)


def test_two_ledgers_share_one_server_session_and_leave_nothing_on_it(
    one_session: str, schema: str
) -> None:
    url = f"{one_session}?schema={schema}&pooler=transaction"
    clock = FakeClock()
    with (
        fp.Ledger.open(url, clock=clock) as a,
        fp.Ledger.open(url, clock=clock, durability="full", busy_timeout_ms=7000) as b,
    ):
        assert a.target.endswith("&pooler=transaction")
        run_id = a.start_run("wf/pooled", scope_key="s", steps=[{"id": "s"}]).run_id
        # Reservations and finishes, one at a time, alternating ledgers on one server session.
        for i in range(20):
            mine, other = (a, b) if i % 2 else (b, a)
            r = mine.reserve_attempt(run_id, f"u{i}", step_id="s")
            assert other.finish_attempt(
                run_id, f"u{i}", r.attempt, r.dispatch_id, status="completed"
            )
        # A batch, and a duplicate finish answered False.
        rs = b.reserve_attempts(run_id, [{"unit_id": f"v{i}", "step_id": "s"} for i in range(30)])
        done = a.finish_attempts(
            [{"run_id": run_id, "unit_id": r.unit_id, "attempt": r.attempt,
              "dispatch_id": r.dispatch_id, "status": "completed"} for r in rs],
        )  # fmt: skip
        assert done == [True] * 30
        assert not b.finish_attempt(
            run_id, "v0", rs[0].attempt, rs[0].dispatch_id, status="completed"
        )
        # Fencing: a claim taken over after expiry is refused on its next write.
        first = a.claim(run_id, "ctl-a", lease_ms=1000)
        assert first is not None
        clock.advance(2000)
        second = b.claim(run_id, "ctl-b", lease_ms=1000)
        assert second is not None
        assert second.generation == first.generation + 1
        with pytest.raises(fp.LeaseLost):
            a.heartbeat(first, lease_ms=1000)
        b.heartbeat(second, lease_ms=1000)
        # Each ledger's settings hold in its own transactions, though they share the session.
        assert a.pragmas()["synchronous"] == "normal"
        assert b.pragmas()["synchronous"] == "full"
        assert a.pragmas()["busy_timeout"] == 5000
        assert b.pragmas()["busy_timeout"] == 7000
        # Reads outside the operations' transactions, and waiting without LISTEN.
        assert a.integrity_check() == ["ok"]
        a.vacuum()
        seq = a.newest_event_seq()
        assert seq > 0
        assert [e.seq for e in b.events(run_id)][-1] == seq
        began = time.monotonic()
        assert b.wait_events(run_id, after_seq=seq, timeout_s=0.3) == []
        assert time.monotonic() - began >= 0.3
        woke: list[Any] = []
        waiter = threading.Thread(
            target=lambda: woke.extend(b.wait_events(run_id, after_seq=seq, timeout_s=10))
        )
        waiter.start()
        time.sleep(0.1)
        a.reserve_attempt(run_id, "late", step_id="s")
        waiter.join(15)
        assert [e.type for e in woke] == ["unit.started"]
        assert a.run_counts()["active"] == 1
    # The one server session as anybody else is handed it: as a fresh session is.
    with (
        psycopg.connect(one_session, autocommit=True, prepare_threshold=None) as pooled,
        psycopg.connect(PG_URL.partition("?")[0], autocommit=True) as fresh,
    ):
        assert pooled.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
        assert pooled.execute(SETTINGS).fetchone() == fresh.execute(SETTINGS).fetchone()


def _open_and_hold(url: str, ready: Any, done: Any, queue: Any) -> None:
    """Open a ledger on ``url``, reserve an attempt, then hold the ledger open until ``done``;
    what happened goes to ``queue``."""
    try:
        with fp.Ledger.open(url) as ledger:
            run_id = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True).run_id
            ledger.reserve_attempt(run_id, "u", step_id="s")
            ready.set()
            done.wait(30)
        queue.put(("ok", ""))
    except fp.LedgerError as e:
        ready.set()
        queue.put((type(e).__name__, str(e)))
    except Exception as e:  # a raw error must never reach a caller
        ready.set()
        queue.put(("RAW " + type(e).__name__, repr(e)))


def _two_processes(url: str) -> list[tuple[str, str]]:
    """Two processes forked from one state (so their driver names statements alike), each
    opening a ledger on ``url`` while the other holds its own open: their outcomes."""
    queue, done = FORK.Queue(), FORK.Event()
    procs, outcomes = [], []
    for _ in range(2):
        ready = FORK.Event()
        proc = FORK.Process(target=_open_and_hold, args=(url, ready, done, queue))
        proc.start()
        procs.append(proc)
        assert ready.wait(60)
    done.set()
    for proc in procs:
        outcomes.append(queue.get(timeout=60))
        proc.join(30)
    return sorted(outcomes)


def test_without_the_mode_a_shared_session_fails_naming_the_cure(
    one_session: str, schema: str
) -> None:
    # Named statements: the second process names its first statement as the first did, on
    # the session they share.
    plain = _two_processes(f"{one_session}?schema={schema}")
    assert ("ok", "") in plain, plain
    kind, message = next(o for o in plain if o != ("ok", ""))
    assert kind == "StoreError", plain
    assert "pooler=transaction" in message, message
    assert "already exists" in message, message
    # The same two processes in the pooler mode both succeed.
    assert _two_processes(f"{one_session}?schema={schema}&pooler=transaction") == [("ok", "")] * 2


def test_an_unknown_pooler_mode_is_refused_naming_the_argument(schema: str) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        fp.Ledger.open(f"{PG_URL.partition('?')[0]}?schema={schema}&pooler=statement")
    assert info.value.argument == "target"
    assert "pooler=transaction" in str(info.value)
    with psycopg.connect(PG_URL.partition("?")[0], autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchone()
    assert found == (0,)


def test_a_failed_read_outside_a_transaction_leaves_the_shared_session_usable(
    one_session: str, schema: str
) -> None:
    url = f"{one_session}?schema={schema}&pooler=transaction"
    with fp.Ledger.open(url) as ledger:
        run_id = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True).run_id
        with psycopg.connect(PG_URL.partition("?")[0], autocommit=True) as direct:
            direct.execute(f'ALTER TABLE "{schema}".blobs RENAME TO blobs_away')
            try:
                # The integrity check's probes run in a transaction of their own; one fails.
                with pytest.raises(fp.StoreError, match="blobs"):
                    ledger.integrity_check()
            finally:
                direct.execute(f'ALTER TABLE "{schema}".blobs_away RENAME TO blobs')
        # The one server session is not left in the failed transaction: the next calls run.
        assert ledger.get_run(run_id) is not None
        assert ledger.integrity_check() == ["ok"]

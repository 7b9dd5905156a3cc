"""``wait_events``: waiting for events instead of polling, on both backends. It returns what is
already there at once, ``[]`` at its timeout, wakes within 50 ms (p99) of a commit made by
another process, and a reader paging with ``after_seq`` through its wake-ups while 4 processes
commit sees every event exactly once, in order. Bad arguments are ``InvalidArgument``."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest

import fencepost as fp
from fencepost.aio import AsyncLedger
from tests.conftest import pg_connect, pg_schema
from tests.processes import SPAWN
from tests.wakeups import wake_latencies

STEPS = [{"id": "s"}]


@pytest.fixture
def ledger_target(target: str) -> str:
    """A SQLite file and PostgreSQL: the writers below are other processes."""
    return target


def _run(ledger: fp.Ledger, run_id: str) -> None:
    ledger.start_run("wf", scope_key=None, steps=STEPS, run_id=run_id, force=True)


def test_returns_at_once_what_is_there_and_nothing_at_the_timeout(ledger: fp.Ledger) -> None:
    _run(ledger, "r1")
    started = time.monotonic()
    got = ledger.wait_events("r1", timeout_s=5)
    assert [e.type for e in got] == ["run.started"]
    assert time.monotonic() - started < 1
    started = time.monotonic()
    assert ledger.wait_events("r1", after_seq=got[-1].seq, timeout_s=0.2) == []
    waited = time.monotonic() - started
    assert 0.2 <= waited < 2
    # Its own writes wake it too (the same connection commits them).
    ledger.block_run("r1", notes="x")
    again = ledger.wait_events("r1", after_seq=got[-1].seq, timeout_s=5, types=["run.status"])
    assert [e.payload["to"] for e in again] == ["blocked"]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"timeout_s": -1}, "timeout_s"),
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"timeout_s": "1"}, "timeout_s"),
        ({"timeout_s": 1, "limit": 0}, "limit"),
        ({"timeout_s": 1, "types": 3}, "types"),
    ],
)
def test_bad_arguments(ledger: fp.Ledger, kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.wait_events(**kwargs)
    assert info.value.argument == argument


WRITES = 200


def test_wakes_within_50_ms_of_another_process_commit(
    ledger: fp.Ledger, ledger_target: str
) -> None:
    latencies = wake_latencies(ledger, ledger_target, WRITES, 0.015)
    p99 = latencies[int(WRITES * 0.99) - 1]
    assert p99 < 0.050, (f"p50 {latencies[WRITES // 2] * 1000:.1f} ms", f"p99 {p99 * 1000:.1f} ms")


def _burst(i: int, target: str, start: Any) -> None:
    with fp.Ledger.open(target) as ledger:
        start.wait()
        for n in range(100):
            ledger.reserve_attempt(f"b{i}", f"u{n:03d}", step_id="s")


def test_paging_through_wake_ups_sees_every_event_once(
    ledger: fp.Ledger, ledger_target: str
) -> None:
    for i in range(4):
        _run(ledger, f"b{i}")
    after = max(e.seq for e in ledger.events())
    start = SPAWN.Event()
    procs = [SPAWN.Process(target=_burst, args=(i, ledger_target, start)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    seen: list[fp.Event] = []
    deadline = time.monotonic() + 60
    while len(seen) < 400 and time.monotonic() < deadline:
        got = ledger.wait_events(after_seq=after, timeout_s=5, types=["unit.started"], limit=7)
        assert len(got) <= 7
        seen.extend(got)
        if got:
            after = got[-1].seq
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seqs = [e.seq for e in seen]
    assert seqs == sorted(set(seqs)), "every event once, in seq order"
    assert {(e.resource_id, e.payload["unit_id"]) for e in seen} == {
        (f"b{i}", f"u{n:03d}") for i in range(4) for n in range(100)
    }


# ------------------------------------------------------------------ what an idle waiter costs


def _waiting(ledger: fp.Ledger, seconds: float) -> tuple[threading.Thread, list[list[fp.Event]]]:
    """A thread waiting ``seconds`` for events after the newest one; its result lands in the
    list."""
    after = max((e.seq for e in ledger.events(limit=10_000)), default=0)
    out: list[list[fp.Event]] = []
    thread = threading.Thread(
        target=lambda: out.append(ledger.wait_events(after_seq=after, timeout_s=seconds))
    )
    thread.start()
    return thread, out


def _fencepost_sessions(url: str) -> dict[int, tuple[Any, str]]:
    """Every fencepost session on the database: its last statement's start and text."""
    with pg_connect(url) as conn:
        rows = conn.execute(
            "SELECT pid, query_start, query FROM pg_stat_activity "
            "WHERE application_name = 'fencepost' AND datname = current_database()"
        ).fetchall()
    return {pid: (start, query) for pid, start, query in rows}


@pytest.mark.parametrize("listen", [True, False])
def test_an_idle_waiter_on_postgresql_sends_nothing_while_listening(listen: bool) -> None:
    """With ``listen`` (the default) an idle wait costs the server no statement at all: no
    fencepost session starts one while it waits (its listening session's last statement is
    the LISTEN). With ``listen=False`` it polls, and the server sees it."""
    with pg_schema() as url, fp.Ledger.open(url, listen=listen) as ledger:
        _run(ledger, "r")
        thread, out = _waiting(ledger, 2.5)
        time.sleep(0.5)
        before = _fencepost_sessions(url)
        stats = ledger._core.wait_stats()
        time.sleep(1.5)
        after = _fencepost_sessions(url)
        idle = {k: ledger._core.wait_stats()[k] - stats[k] for k in stats}
        thread.join()
        assert out == [[]]
    listening = [q for _, q in after.values() if q.startswith("LISTEN fencepost_")]
    if listen:
        assert len(listening) == 1, after
        assert after == before, "no session ran a statement while the waiter was idle"
        assert idle == {"queries": 0, "checks": 0, "wakeups": 0}
    else:
        assert not listening
        assert after != before
        assert idle["checks"] > 100
        assert idle["queries"] >= 1


def test_an_idle_waiter_on_sqlite_queries_at_most_once_a_second(tmp_path: Any) -> None:
    """SQLite has nothing to push: the waiter reads the database's change counter (no table)
    every 5 ms, and runs its events query only when it moved, or every 2 seconds."""
    with fp.Ledger.open(str(tmp_path / "idle.db")) as ledger:
        _run(ledger, "r")
        thread, out = _waiting(ledger, 3.0)
        thread.join()
        assert out == [[]]
        stats = ledger._core.wait_stats()
    assert stats["queries"] <= 3, stats
    assert stats["checks"] > 100, stats


def test_a_commit_in_another_schema_does_not_wake_a_waiter() -> None:
    """Each schema has its own channel: a busy neighbour costs an idle waiter nothing."""
    with (
        pg_schema() as url,
        pg_schema() as other,
        fp.Ledger.open(url) as ledger,
        fp.Ledger.open(other) as neighbour,
    ):
        _run(ledger, "r")
        thread, out = _waiting(ledger, 1.5)
        time.sleep(0.3)
        for n in range(20):
            _run(neighbour, f"n{n}")
        thread.join()
        assert out == [[]]
        assert ledger._core.wait_stats()["wakeups"] == 0
        # The same commits in its own schema wake it.
        thread, out = _waiting(ledger, 5)
        time.sleep(0.3)
        with fp.Ledger.open(url) as mine:
            _run(mine, "mine")
        thread.join()
        assert [e.resource_id for e in out[0]] == ["mine"]
        assert ledger._core.wait_stats()["wakeups"] >= 1


def test_a_lost_listening_connection_is_replaced_and_no_commit_is_missed() -> None:
    """Killing the listening session: the waiter polls meanwhile (a commit still wakes it),
    the ledger listens again on a new session, and waiting is quiet again after that."""
    with pg_schema() as url, fp.Ledger.open(url) as ledger, fp.Ledger.open(url) as writer:
        _run(ledger, "r")
        thread, out = _waiting(ledger, 10)
        time.sleep(0.3)
        with pg_connect(url) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'fencepost' AND query LIKE 'LISTEN fencepost_%'"
            ).fetchone()[0]
        assert killed == 1
        time.sleep(0.05)
        begun = time.monotonic()
        _run(writer, "after-kill")
        thread.join()
        assert [e.resource_id for e in out[0]] == ["after-kill"]
        assert time.monotonic() - begun < 1.0
        # Listening again within the reconnection pause, then quiet.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(q.startswith("LISTEN") for _, q in _fencepost_sessions(url).values()):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the ledger did not listen again")
        thread, out = _waiting(ledger, 1.5)
        time.sleep(0.3)
        stats = ledger._core.wait_stats()
        thread.join()
        assert ledger._core.wait_stats()["checks"] == stats["checks"]
        thread, out = _waiting(ledger, 5)
        time.sleep(0.2)
        _run(writer, "relistened")
        thread.join()
        assert [e.resource_id for e in out[0]] == ["relistened"]


# ------------------------------------------------------------------ asyncio


def test_async_waiters_hold_no_thread_each(target: str) -> None:
    """200 coroutines waiting on one AsyncLedger: the ledger's other calls still answer at once
    (no worker thread is taken by a waiter), one commit wakes all of them, and each ran its
    query twice (once at the start, once when woken), not on a timer."""

    async def main() -> None:
        async with await AsyncLedger.open(target) as aledger:
            await aledger.start_run("wf", scope_key=None, steps=STEPS, run_id="r", force=True)
            after = (await aledger.events("r"))[-1].seq
            threads = threading.active_count()
            waiters = [
                asyncio.ensure_future(aledger.wait_events("r", after_seq=after, timeout_s=30))
                for _ in range(200)
            ]
            await asyncio.sleep(0.5)
            assert not any(w.done() for w in waiters)
            assert threading.active_count() <= threads + 12
            t0 = time.monotonic()
            assert (await aledger.get_run("r")) is not None
            assert time.monotonic() - t0 < 1.0
            before = aledger.ledger._core.wait_stats()["queries"]
            await aledger.reserve_attempt("r", "u1", step_id="s")
            woken = await asyncio.wait_for(asyncio.gather(*waiters), 10)
            assert all([e.type for e in got] == ["unit.started"] for got in woken)
            assert aledger.ledger._core.wait_stats()["queries"] - before <= 200 + 20
            # A cancelled waiter leaves nothing: the next wait still times out cleanly.
            lone = asyncio.ensure_future(aledger.wait_events("r", after_seq=10**9, timeout_s=30))
            await asyncio.sleep(0.1)
            lone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await lone
            assert await aledger.wait_events("r", after_seq=10**9, timeout_s=0.2) == []

    asyncio.run(main())

"""``wait_events``: how fast a waiter wakes after another process commits, what an idle waiter
costs, and what the commits' ``NOTIFY`` costs the writers.

- Wake-up latency, p50 and p99 over 150 commits made by another process (one every 10-30 ms),
  from the start of the writer's call to the waiter's return: SQLite (change counter read every
  5 ms), PostgreSQL with ``LISTEN`` (the default) and with ``listen=False`` (polling the
  events' sequence), beside the floor of the same server: a bare psycopg ``LISTEN`` woken by a
  bare ``NOTIFY`` in its own autocommit transaction, the least any waiter there can do.
- An idle follower: for 3 s nothing is committed; the statements its waiting cost after the
  call's own first query (events queries, change-mark reads) per second, from ``wait_stats``.
- PostgreSQL writers with 0 and 8 waiting listeners (8 ``wait_events`` on other runs, woken by
  every commit): 4 dispatcher processes x 16 callers, reserve + finish per unit, at both
  durabilities. The ``NOTIFY`` goes in a transaction of its own after each commit, so it
  must not serialize the commits even when every commit waits for its flush (``full``).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest
from tests.conftest import pg_connect, pg_schema
from tests.wakeups import wake_latencies

import fencepost as fp
from benches.conftest import label, plaintext
from benches.dispatch import dispatch_throughput

CTX = multiprocessing.get_context("spawn")
WRITES = 150
IDLE_S = 3.0


def _notifier(url: str, start: Any, queue: Any) -> None:
    """The floor's writer: a bare NOTIFY per 10-30 ms, each its own transaction."""
    conn = pg_connect(url)
    begun: list[float] = []
    start.wait()
    for n in range(WRITES):
        time.sleep(0.010 + (n % 5) * 0.005)
        begun.append(time.time())
        conn.execute(f"NOTIFY fp_floor, '{n}'")
    conn.close()
    queue.put(begun)


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
    }


def _fencepost_wakeups(target: str, listen: bool) -> dict[str, float]:
    with fp.Ledger.open(target, listen=listen) as ledger:
        return _percentiles(wake_latencies(ledger, target, WRITES, 0.010))


def _floor_wakeups(url: str) -> dict[str, float]:
    conn = pg_connect(url)
    conn.execute("LISTEN fp_floor")
    start, queue = CTX.Event(), CTX.Queue()
    proc = CTX.Process(target=_notifier, args=(url, start, queue))
    proc.start()
    woke: dict[int, float] = {}
    start.set()
    for note in conn.notifies(timeout=120, stop_after=WRITES):
        woke[int(note.payload)] = time.time()
    begun = queue.get(timeout=120)
    proc.join(60)
    conn.close()
    assert len(woke) == WRITES
    return _percentiles([woke[n] - begun[n] for n in range(WRITES)])


WAYS = ["sqlite", "postgres-listen", "postgres-poll", "postgres-floor"]


@pytest.mark.parametrize("way", WAYS)
def bench_wait_wakeup(benchmark: Any, way: str, tmp_path: Any) -> None:
    """Commit-to-wake latency of a waiter in another process (see the module docs)."""
    label(benchmark, "wait_events: wake after another process commits", way, WRITES)
    out: dict[str, float] = {}

    def go() -> None:
        if way == "sqlite":
            out.update(_fencepost_wakeups(str(tmp_path / "wait.db"), True))
            return
        with pg_schema() as url:
            if way == "postgres-floor":
                out.update(_floor_wakeups(url))
            else:
                out.update(_fencepost_wakeups(plaintext(url), way == "postgres-listen"))

    benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(wake=out)


@pytest.mark.parametrize("way", WAYS[:3])
def bench_wait_idle(benchmark: Any, way: str, tmp_path: Any) -> None:
    """What a waiter costs while nothing happens: statements per second over IDLE_S."""
    label(benchmark, "wait_events: an idle follower", way, 1)
    rates: dict[str, float] = {}

    def idle(target: str, listen: bool) -> None:
        with fp.Ledger.open(target, listen=listen) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="w", force=True)
            after = ledger.events("w")[-1].seq
            # The first wait opens what it needs (PostgreSQL: the listening connection).
            ledger.wait_events("w", after_seq=after, timeout_s=0.3)
            before = ledger._core.wait_stats()
            assert ledger.wait_events("w", after_seq=after, timeout_s=IDLE_S) == []
            spent = ledger._core.wait_stats()
        # The wait's own first query is the call, not its waiting: what follows it is the cost.
        rates["queries_per_s"] = round((spent["queries"] - before["queries"] - 1) / IDLE_S, 2)
        rates["checks_per_s"] = round((spent["checks"] - before["checks"]) / IDLE_S, 2)

    def go() -> None:
        if way == "sqlite":
            idle(str(tmp_path / "idle.db"), True)
        else:
            with pg_schema() as url:
                idle(plaintext(url), way == "postgres-listen")

    benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(idle=rates)


def _listeners(url: str, n: int, stop: threading.Event, woke: list[int]) -> threading.Thread:
    """``n`` waiters on one Ledger, each on a run nobody writes: every commit wakes them, none
    finds anything."""

    def body() -> None:
        with fp.Ledger.open(url) as ledger:
            runs = [f"quiet-{i}" for i in range(n)]
            for run in runs:
                ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id=run, force=True)
            after = max(e.seq for e in ledger.events(limit=10_000))

            def wait(run: str) -> None:
                while not stop.is_set():
                    ledger.wait_events(run, after_seq=after, timeout_s=0.5)

            ts = [threading.Thread(target=wait, args=(r,)) for r in runs]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            woke.append(ledger._core.wait_stats()["wakeups"])

    thread = threading.Thread(target=body)
    thread.start()
    return thread


@pytest.mark.parametrize("durability", ["normal", "full"])
@pytest.mark.parametrize("listeners", [0, 8])
def bench_pg_writers_beside_listeners(benchmark: Any, durability: str, listeners: int) -> None:
    """Reserve + finish throughput of 4 dispatcher processes x 16 callers while ``listeners``
    waiters are woken by every commit."""
    group = f"postgres {durability}: writers beside waiting listeners"
    label(benchmark, group, f"fencepost {durability}, {listeners} listeners", 4 * 16 * 60)
    out: dict[str, Any] = {}
    with pg_schema() as schema_url:
        url = plaintext(schema_url)
        stop, woke = threading.Event(), list[int]()
        waiting = _listeners(url, listeners, stop, woke) if listeners else None
        time.sleep(0.5)

        def go() -> None:
            out.update(dispatch_throughput(url, 4, 16, 60, durability=durability))

        try:
            benchmark.pedantic(go, rounds=1, iterations=1)
        finally:
            stop.set()
            if waiting is not None:
                waiting.join(30)
    benchmark.extra_info.update(
        writer_units_per_s=round(out["units"] / out["wall"]),
        cpu_busy=out["cpu_busy"],
        listener_wakeups=woke[0] if woke else 0,
    )

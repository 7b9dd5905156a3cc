"""The dispatcher's hot path: fencepost (SQLite and PostgreSQL) beside huey's SQLite queue
(benches/peer_huey.py) and the raw SQLite commit floor, in one run. Each round times N
operations on fresh units; ratios are per operation (benches/ratios.py divides by
extra_info["ops"]).

What is compared with what: reserving an attempt ~ huey's enqueue of a task (one durable
insert); finishing it ~ a huey consumer taking the next task, running it and storing its result;
the reserve + finish cycle ~ a task's whole life in huey (enqueue, dequeue, execute). fencepost
does more per call (events, revisions, the unit projection, the finish compare-and-set).
"""

from __future__ import annotations

import itertools
import pathlib
import sqlite3
from typing import Any

import fencepost as fp
from benches.conftest import Clock, label
from benches.peer_huey import enqueue, open_huey, take_and_run

N = 200
ROUNDS = 15
STEPS = [{"id": "s"}]
_ids = itertools.count()

Backend = tuple[str, fp.Ledger, Clock]


def _fresh(ledger: fp.Ledger, n: int = N) -> tuple[str, list[str]]:
    """A new run (made outside the timing) and n unit ids."""
    run = ledger.start_run(
        "bench", scope_key=None, steps=STEPS, run_id=f"run-{next(_ids)}", force=True
    )
    return run.run_id, [f"unit-{i:05d}" for i in range(n)]


def bench_reserve(benchmark: Any, backend: Backend) -> None:
    name, ledger, _ = backend
    label(benchmark, "reserve_attempt (new attempt)", name, N)

    def go(run: str, units: list[str]) -> None:
        for u in units:
            ledger.reserve_attempt(run, u, step_id="s", holder="w1")

    benchmark.pedantic(go, setup=lambda: (_fresh(ledger), {}), rounds=ROUNDS)


def bench_reclaim(benchmark: Any, backend: Backend) -> None:
    """fencepost only: huey has no reclaim of a running task in place."""
    name, ledger, _ = backend
    run, units = _fresh(ledger)
    for u in units:
        ledger.reserve_attempt(run, u, step_id="s", holder="w1")
    label(benchmark, "reserve_attempt (reclaim in place)", name, N)

    def go() -> None:
        for u in units:
            assert ledger.reserve_attempt(run, u, step_id="s", holder="w2").kind == "reclaimed"

    benchmark.pedantic(go, rounds=ROUNDS)


def bench_finish(benchmark: Any, backend: Backend) -> None:
    name, ledger, _ = backend
    label(benchmark, "finish_attempt (CAS ok)", name, N)

    def setup() -> tuple[tuple[str, list[fp.Reservation]], dict[str, Any]]:
        run, units = _fresh(ledger)
        return (run, [ledger.reserve_attempt(run, u, step_id="s") for u in units]), {}

    def go(run: str, got: list[fp.Reservation]) -> None:
        for r in got:
            assert ledger.finish_attempt(
                run, r.unit_id, r.attempt, r.dispatch_id, status="completed"
            )

    benchmark.pedantic(go, setup=setup, rounds=ROUNDS)


def bench_reserve_finish_cycle(benchmark: Any, backend: Backend) -> None:
    name, ledger, _ = backend
    label(benchmark, "reserve+finish cycle (2 tx)", name, N)

    def go(run: str, units: list[str]) -> None:
        for u in units:
            r = ledger.reserve_attempt(run, u, step_id="s", holder="w1")
            ledger.finish_attempt(run, u, r.attempt, r.dispatch_id, status="completed")

    benchmark.pedantic(go, setup=lambda: (_fresh(ledger), {}), rounds=ROUNDS)


def bench_batch_reserve(benchmark: Any, backend: Backend) -> None:
    """fencepost only: huey enqueues one task per transaction."""
    name, ledger, _ = backend
    label(benchmark, "reserve_attempts (1000 per tx, per unit)", name, 1000)

    def go(run: str, units: list[str]) -> None:
        got = ledger.reserve_attempts(run, [{"unit_id": u, "step_id": "s"} for u in units])
        assert len(got) == 1000

    benchmark.pedantic(go, setup=lambda: (_fresh(ledger, 1000), {}), rounds=ROUNDS)


def bench_huey_enqueue(benchmark: Any, tmp_path: pathlib.Path) -> None:
    huey, work = open_huey(str(tmp_path / "huey.db"))
    label(benchmark, "reserve_attempt (new attempt)", "huey enqueue", N)

    rounds = itertools.count(1)

    def go() -> None:
        next(rounds)
        enqueue(work, N)

    benchmark.pedantic(go, rounds=ROUNDS)
    assert huey.pending_count() == N * (next(rounds) - 1)


def bench_huey_take_and_run(benchmark: Any, tmp_path: pathlib.Path) -> None:
    huey, work = open_huey(str(tmp_path / "huey.db"))
    label(benchmark, "finish_attempt (CAS ok)", "huey dequeue+execute", N)

    rounds = itertools.count(1)

    def go(_queued: None) -> None:
        next(rounds)
        for _ in range(N):
            take_and_run(huey)

    benchmark.pedantic(go, setup=lambda: ((enqueue(work, N),), {}), rounds=ROUNDS)
    assert huey.pending_count() == 0
    assert huey.result_count() == N * (next(rounds) - 1)


def bench_huey_cycle(benchmark: Any, tmp_path: pathlib.Path) -> None:
    huey, work = open_huey(str(tmp_path / "huey.db"))
    label(benchmark, "reserve+finish cycle (2 tx)", "huey enqueue+dequeue+execute", N)

    rounds = itertools.count(1)

    def go() -> None:
        next(rounds)
        for i in range(N):
            work(i)
            take_and_run(huey)

    benchmark.pedantic(go, rounds=ROUNDS)
    assert huey.result_count() == N * (next(rounds) - 1)


def bench_commit_floor(benchmark: Any, tmp_path: pathlib.Path) -> None:
    """BEGIN IMMEDIATE + one INSERT + COMMIT through the stdlib driver: the floor every
    single-transaction write pays on this machine (WAL, synchronous=NORMAL)."""
    db = sqlite3.connect(tmp_path / "floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    label(benchmark, "raw commit floor", "sqlite3", N)
    ex = db.execute

    def go() -> None:
        for _ in range(N):
            ex("BEGIN IMMEDIATE")
            ex("INSERT INTO t(v) VALUES (?)", ("x" * 64,))
            ex("COMMIT")

    benchmark.pedantic(go, rounds=ROUNDS)
    db.close()

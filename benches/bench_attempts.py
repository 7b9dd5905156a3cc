"""The dispatcher's hot path, fencepost vs the pure-Python reference ledger
(shared/reference/ref_ledger.py) through the same function names (benches/ref_adapter.py), plus
the raw SQLite commit floor, side by side in one run. Each round times N operations on fresh
units; ratios are per operation (benches/ratios.py divides by extra_info["ops"])."""

from __future__ import annotations

import itertools
import pathlib
import sqlite3
from typing import Any

from benches.conftest import label

N = 200
ROUNDS = 15
_ids = itertools.count()


def _fresh(name: str, handle: Any, n: int = N) -> tuple[str, list[str]]:
    run = f"run-{next(_ids)}"
    if name.startswith("fencepost"):
        handle.run(run)  # create the run outside the timed region
    return run, [f"unit-{i:05d}" for i in range(n)]


def bench_reserve(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "reserve_attempt (new attempt)", name, N)

    def go(run: str, units: list[str]) -> None:
        for u in units:
            L.reserve_attempt(h, run, u, "w1")

    benchmark.pedantic(go, setup=lambda: (_fresh(name, h), {}), rounds=ROUNDS)


def bench_reclaim(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    run, units = _fresh(name, h)
    for u in units:
        L.reserve_attempt(h, run, u, "w1")
    label(benchmark, "reserve_attempt (reclaim in place)", name, N)

    def go() -> None:
        for u in units:
            assert L.reserve_attempt(h, run, u, "w2")[2]

    benchmark.pedantic(go, rounds=ROUNDS)


def bench_finish(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "finish_attempt (CAS ok)", name, N)

    def setup() -> tuple[tuple[str, list[tuple[str, int, str]]], dict[str, Any]]:
        run, units = _fresh(name, h)
        got = [(u, *L.reserve_attempt(h, run, u, "w1")[:2]) for u in units]
        return (run, got), {}

    def go(run: str, got: list[tuple[str, int, str]]) -> None:
        for u, a, d in got:
            assert L.finish_attempt(h, run, u, a, d, "completed")

    benchmark.pedantic(go, setup=setup, rounds=ROUNDS)


def bench_reserve_finish_cycle(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "reserve+finish cycle (2 tx)", name, N)

    def go(run: str, units: list[str]) -> None:
        for u in units:
            a, d, _ = L.reserve_attempt(h, run, u, "w1")
            L.finish_attempt(h, run, u, a, d, "completed")

    benchmark.pedantic(go, setup=lambda: (_fresh(name, h), {}), rounds=ROUNDS)


def bench_batch_reserve(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "reserve_attempts (1000 per tx, per unit)", name, 1000)

    def go(run: str, units: list[str]) -> None:
        assert len(L.reserve_attempts_batch(h, run, units, "w1")) == 1000

    benchmark.pedantic(go, setup=lambda: (_fresh(name, h, 1000), {}), rounds=ROUNDS)


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

"""Reads and writes as the ledger grows: the same calls on a ledger of 10 000 attempts and on a
large one (100 000 by default, so the benches' CI pass stays quick; ``scripts/bench`` passes
``FENCEPOST_BENCH_ATTEMPTS=1000000``), SQLite, side by side in one run. The ratio column of
``benches/ratios.py`` is the large ledger's time over the small one's.

Each ledger holds: one run with half of the attempts as units (the run summary case), and runs
of 1 000 attempts each for the rest, three in four of them finished 40 days ago (what a prune
removes) and the others live. What is timed: an empty poll of a finished run's events, the
first page of a live run's events, a rare-type filter over the whole log, a status-filtered
page of runs, the big run's unit summary, a page of its units from the middle, the owned
leases, every run's lease (per run), a batch of 1 000 reserves and finishes on a fresh run,
and the prune of the old runs (attempts removed per second, the longest transaction, the file
before and after). Both ledgers also hold 60 recently cancelled runs and 10 claimed ones, so
the status page and the owned leases are the same size in both.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

import fencepost as fp
from benches.bench_claims import queued
from benches.conftest import Clock, label

SMALL = 10_000
BIG = int(os.environ.get("FENCEPOST_BENCH_ATTEMPTS", "100000"))
PER_RUN = 1_000
BATCH = 1_000
OWNED = 10
DAY_MS = 86_400_000


@dataclass
class Built:
    """A built ledger file and the runs the benches read."""

    path: pathlib.Path
    attempts: int
    big_run: str
    finished_run: str
    finished_last_seq: int
    live_run: str


def _size_name(attempts: int) -> str:
    return "fencepost" if attempts == SMALL else f"fencepost @{attempts // 1000}k"


def fill(
    ledger: fp.Ledger,
    run_id: str,
    units: int,
    offset: int = 0,
    *,
    clock: Clock | None = None,
    tick_ms: int = 0,
    worked: bool = False,
) -> None:
    """``units`` attempts in batches: reserved, then finished (one in 50 failed, the last batch
    of a big run left running). ``clock`` moves by ``tick_ms`` per batch (events spread over
    time); ``worked`` gives each unit a holder and tokens, as a dashboard shows them."""

    def holder(i: int) -> dict[str, str]:
        return {"holder": f"worker-{i % 8}"} if worked else {}

    for start in range(0, units, BATCH):
        if clock is not None and clock.now_ms is not None:
            clock.now_ms += tick_ms
        got = ledger.reserve_attempts(
            run_id,
            [{"unit_id": f"u{offset + i:07d}", "step_id": "s", **holder(i)}
             for i in range(start, min(units, start + BATCH))],
        )  # fmt: skip
        if units > PER_RUN and start + BATCH >= units:
            return
        ledger.finish_attempts(
            [{"run_id": run_id, "unit_id": r.unit_id, "attempt": r.attempt,
              "dispatch_id": r.dispatch_id, **({"tokens": 3} if worked else {}),
              "status": "failed" if i % 50 == 0 else "completed", "result": {"n": i}}
             for i, r in enumerate(got)]
        )  # fmt: skip


def build(path: pathlib.Path, attempts: int) -> Built:
    """The ledger described in the module's docstring, built with a clock 40 days back for
    the runs a prune will remove, then now for the rest. Progress goes to stderr."""
    clock = Clock()
    now = time.time_ns() // 1_000_000
    clock.now_ms = now - 40 * DAY_MS
    started = time.monotonic()
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        small_runs = (attempts // 2) // PER_RUN
        finished: list[str] = []
        live: list[str] = []
        for i in range(small_runs):
            run_id = f"run-{i:05d}"
            old = i % 4 != 3
            clock.now_ms = now - 40 * DAY_MS if old else now - DAY_MS
            ledger.start_run("bench", scope_key=None, steps=[{"id": "s"}], run_id=run_id,
                             force=True)  # fmt: skip
            fill(ledger, run_id, PER_RUN)
            if old:
                ledger.abandon_run(run_id)
                finished.append(run_id)
            else:
                live.append(run_id)
            if i % max(1, small_runs // 10) == 0:
                sys.stderr.write(f"\rbuilding {path.name}: run {i + 1} of {small_runs}\x1b[K")
        clock.now_ms = now - DAY_MS
        # The same small populations in both ledgers, so that their pages are the same size:
        # 60 recently cancelled runs (a page of 50 of them) and 10 runs claimed by a controller.
        for i in range(60):
            ledger.start_run("bench", scope_key=None, steps=[{"id": "s"}], run_id=f"gone-{i:02d}",
                             force=True)  # fmt: skip
            ledger.abandon_run(f"gone-{i:02d}")
        for i in range(OWNED):
            ledger.reserve_run(f"ctl-{i:02d}", **queued())
            ledger.claim(f"ctl-{i:02d}", "controller-1", lease_ms=DAY_MS)
        ledger.start_run("bench", scope_key=None, steps=[{"id": "s"}], run_id="big", force=True)
        fill(ledger, "big", attempts - small_runs * PER_RUN)
        last_seq = ledger.events(finished[0], limit=10_000)[-1].seq
        clock.now_ms = None
        ledger.start_run("bench", scope_key=None, steps=[{"id": "s"}], run_id="now", force=True)
    took = time.monotonic() - started
    sys.stderr.write(f"\rbuilt {path.name}: {attempts} attempts in {took:.0f} s\x1b[K\n")
    return Built(path, attempts, "big", finished[0], last_seq, live[-1])


@pytest.fixture(scope="module", params=[SMALL, BIG], ids=["10k", "big"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    attempts = int(request.param)
    return build(tmp_path_factory.mktemp("scale") / f"scale-{attempts}.db", attempts)


@pytest.fixture
def ledger(built: Built) -> Any:
    with fp.Ledger.open(str(built.path)) as opened:
        yield opened


def bench_scale_empty_poll(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: empty poll of one run's events", _size_name(built.attempts), 1)
    result = benchmark(ledger.events, built.finished_run, after_seq=built.finished_last_seq)
    assert result == []


def bench_scale_first_page(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: first page of a run's events", _size_name(built.attempts), 1)
    page = benchmark(ledger.events, built.live_run, limit=100)
    assert len(page) == 100


def bench_scale_rare_types(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: events(types=[run.started])", _size_name(built.attempts), 1)
    # Five: both ledgers have at least that many, so both pages are the same size.
    page = benchmark(ledger.events, types=["run.started"], limit=5)
    assert len(page) == 5
    assert all(e.type == "run.started" for e in page)


def bench_scale_list_runs(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: list_runs(status, limit=50)", _size_name(built.attempts), 1)
    page = benchmark(ledger.list_runs, status="cancelled", limit=50)
    assert len(page) == 50


def bench_scale_run_summary(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: unit_counts of the big run", _size_name(built.attempts), 1)
    counts = benchmark(ledger.unit_counts, built.big_run)
    assert sum(counts.values()) == built.attempts - (built.attempts // 2 // PER_RUN) * PER_RUN
    benchmark.extra_info["units"] = sum(counts.values())


def bench_scale_units_page(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: a page of the big run's units", _size_name(built.attempts), 1)
    # From the middle of the run: a cursor's page costs what the first one does.
    middle = f"u{(built.attempts // 4):07d}"
    page = benchmark(ledger.units, built.big_run, limit=100, after=middle)
    assert len(page) == 100
    assert page[0].unit_id > middle


def bench_scale_owned_leases(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: leases(owned_only=True)", _size_name(built.attempts), 1)
    leases = benchmark(ledger.leases, owned_only=True)
    assert len(leases) == OWNED


def bench_scale_leases(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    """Every run's lease: a listing as long as the runs, so timed per run."""
    runs = len(ledger.list_runs(include_children=True, limit=10_000))
    label(benchmark, "scale: every run's lease (per run)", _size_name(built.attempts), runs)
    leases = benchmark(ledger.leases)
    assert len(leases) == runs


def bench_scale_batch_write(benchmark: Any, built: Built, ledger: fp.Ledger) -> None:
    label(benchmark, "scale: reserve + finish 1 000 (per unit)", _size_name(built.attempts), BATCH)
    runs = iter(range(10**6))

    def setup() -> tuple[tuple[str], dict[str, Any]]:
        run_id = f"write-{next(runs)}"
        ledger.start_run("bench", scope_key=None, steps=[{"id": "s"}], run_id=run_id, force=True)
        return (run_id,), {}

    benchmark.pedantic(lambda run_id: fill(ledger, run_id, BATCH), setup=setup, rounds=30)


def bench_scale_prune(benchmark: Any, built: Built, tmp_path: pathlib.Path) -> None:
    """One round on a copy: the old runs' attempts removed per second (the freed pages given
    back to the file system included), the longest transaction, the file before and after."""
    label(benchmark, "scale: prune the old runs (per attempt)", _size_name(built.attempts), 1)
    copy = tmp_path / "prune.db"
    shutil.copy(built.path, copy)
    before = copy.stat().st_size
    reports: list[fp.PruneReport] = []

    def prune() -> None:
        with fp.Ledger.open(str(copy)) as ledger:
            reports.append(ledger.prune(older_than=dt.timedelta(days=30)))

    started = time.perf_counter()
    benchmark.pedantic(prune, rounds=1, iterations=1)
    took = time.perf_counter() - started
    report = reports[0]
    small_runs = built.attempts // 2 // PER_RUN
    assert report.runs == small_runs - small_runs // 4  # every old run, none of the live
    benchmark.extra_info.update(
        ops=report.attempts,
        pruned_attempts=report.attempts,
        attempts_per_s=round(report.attempts / took),
        longest_transaction_ms=report.longest_transaction_ms,
        transactions=report.transactions,
        file_before=before,
        file_after=copy.stat().st_size,
    )

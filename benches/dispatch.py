"""Dispatcher processes on one run, for the benches that measure them (bench_postgres.py,
bench_concurrency.py, bench_wait.py). Spawned children import this module to find their
target, so it imports fencepost and the standard library only: a child starts in a tenth of
the time it took to import a bench module (pytest, pgqueuer, asyncpg), which at 8 processes
on 2 CPUs was seconds per round."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid
from typing import Any

import fencepost as fp

CTX = multiprocessing.get_context("spawn")


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def batch_round(ledger: fp.Ledger, run_id: str, unit_ids: list[str]) -> list[bool]:
    """Reserve ``unit_ids`` in one call, then finish every reservation in one call: the batch
    path's unit of work; the finishes' outcomes."""
    got = ledger.reserve_attempts(run_id, [{"unit_id": u, "step_id": "s"} for u in unit_ids])
    return ledger.finish_attempts(
        [
            {"run_id": run_id, "unit_id": r.unit_id, "attempt": r.attempt,
             "dispatch_id": r.dispatch_id, "status": "completed"}
            for r in got
        ]
    )  # fmt: skip


def dispatcher(
    i: int,
    url: str,
    run_id: str,
    threads: int,
    per: int,
    start: Any,
    queue: Any,
    durability: str = "normal",
) -> None:
    """One dispatcher process: ``threads`` threads on one Ledger, each reserving and finishing
    its own units one at a time; puts its group_stats and CPU seconds on the queue."""
    with fp.Ledger.open(url, durability=durability) as ledger:  # type: ignore[arg-type]
        failed: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for k in range(per):
                    unit = f"p{i}-t{t}-{k}"
                    r = ledger.reserve_attempt(run_id, unit, step_id="s")
                    assert ledger.finish_attempt(
                        run_id, unit, r.attempt, r.dispatch_id, status="completed"
                    )
            except BaseException as e:  # reported to the bench below
                failed.append(e)

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        start.wait()
        cpu = time.process_time()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        cpu = time.process_time() - cpu
        stats = ledger._core.group_stats()
    queue.put((i, repr(failed[0]) if failed else None, stats, cpu))


def dispatch_throughput(
    url: str, procs: int, threads: int, per: int, durability: str = "normal"
) -> dict[str, Any]:
    """Units/s of ``procs`` processes x ``threads`` callers reserving and finishing units in
    one run, from the common start to the last process's end, the machine's CPU busy share and
    the processes' share of it, and each process's writer figures: calls per group, and the
    time a group spends in its transaction (which on one run is the time it holds, or waits
    for, the run's lock). ``url`` is a PostgreSQL URL or a SQLite file."""
    with fp.Ledger.open(url) as ledger:
        run_id = ledger.start_run(
            "bench",
            scope_key=None,
            steps=[{"id": "s"}],
            run_id=f"run-{uuid.uuid4().hex[:8]}",
            force=True,
        ).run_id
    start = CTX.Barrier(procs + 1)
    queue = CTX.Queue()
    ps = [
        CTX.Process(
            target=dispatcher, args=(i, url, run_id, threads, per, start, queue, durability)
        )
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    start.wait()
    t0 = time.monotonic()
    busy0, total0 = cpu_ticks()
    results = sorted(queue.get(timeout=120) for _ in ps)
    wall = time.monotonic() - t0
    busy1, total1 = cpu_ticks()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert [r[1] for r in results] == [None] * procs, results
    units = procs * threads * per
    with fp.Ledger.open(url) as ledger:
        assert ledger.accounting(run_id).total_attempts == units
    per_proc = []
    for _, _, stats, cpu in results:
        groups = max(1, stats["groups"])
        assert stats["calls"] == 2 * threads * per  # every reserve and finish went through
        per_proc.append(
            {
                "mean_group": round(stats["calls"] / groups, 2),
                "max_group": stats["max_group"],
                "hold_us_mean": round(stats["hold_us_total"] / groups),
                "hold_us_max": stats["hold_us_max"],
                "cpu_s": round(cpu, 3),
            }
        )
    busy_s = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
    client_s = sum(p["cpu_s"] for p in per_proc)
    return {
        "wall": wall,
        "units": units,
        "cpu_busy": round((busy1 - busy0) / max(1, total1 - total0), 3),
        "client_cpu_share": round(min(1.0, client_s / busy_s), 3) if busy_s else 0.0,
        "per_process": per_proc,
    }

"""Several dispatcher processes on one SQLite file, watching its write-ahead log.

Each writer process reserves and finishes attempts (one, or a batch, per transaction, and reads
its run's units now and then, as a dispatcher does) until the deadline; the parent samples the
``-wal`` file's size meanwhile. Prints one JSON line: the largest WAL seen, its size after the
writers stopped, the slowest single call and the number of calls.

Usage: python -m tests.wal_writers DB PROCESSES SECONDS
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import time

import fencepost as fp


def writer(db: str, worker: int, deadline: float, out: multiprocessing.Queue[object]) -> None:
    slowest, calls, n, over = 0.0, 0, 0, 0
    with fp.Ledger.open(db) as ledger:
        run = ledger.start_run(
            "wal", scope_key=None, steps=[{"id": "s"}], run_id=f"w{worker}", force=True
        )
        while time.monotonic() < deadline:
            started = time.monotonic()
            if n % 10 == 9:
                units = [{"unit_id": f"b{n}-{i}", "step_id": "s"} for i in range(50)]
                got = ledger.reserve_attempts(run.run_id, units)
                ledger.finish_attempts([
                    {"run_id": r.run_id, "unit_id": r.unit_id, "attempt": r.attempt,
                     "dispatch_id": r.dispatch_id, "status": "completed", "result": {"n": n}}
                    for r in got
                ])  # fmt: skip
            elif n % 10 == 5:
                ledger.events(run.run_id, after_seq=max(0, n * 3 - 100), limit=50)
            else:
                r = ledger.reserve_attempt(run.run_id, f"u{n}", step_id="s", holder="h")
                ledger.finish_attempt(
                    run.run_id, r.unit_id, r.attempt, r.dispatch_id, status="completed"
                )
            took = time.monotonic() - started
            slowest = max(slowest, took)
            over += took > 0.1
            calls += 1
            n += 1
    out.put((slowest, calls, over))


def main() -> int:
    db, processes, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    fp.Ledger.open(db).close()
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[object] = ctx.Queue()
    deadline = time.monotonic() + seconds + 2.0  # the spawn takes a moment
    procs = [ctx.Process(target=writer, args=(db, w, deadline, out)) for w in range(processes)]
    for p in procs:
        p.start()
    wal = db + "-wal"
    largest, next_report = 0, time.monotonic() + 5
    while any(p.is_alive() for p in procs):
        with contextlib.suppress(FileNotFoundError):
            largest = max(largest, os.path.getsize(wal))
        if time.monotonic() >= next_report:
            left = max(0.0, deadline - time.monotonic())
            sys.stderr.write(f"wal_writers: {left:.0f} s left, largest WAL {largest} bytes\n")
            next_report += 5
        time.sleep(0.05)
    results: list[tuple[float, int, int]] = [out.get(timeout=10) for _ in procs]  # type: ignore[misc]
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        print(json.dumps({"error": [p.exitcode for p in procs]}))
        return 1
    after = os.path.getsize(wal) if os.path.exists(wal) else 0
    report = {
        "largest_wal": largest,
        "wal_after": after,
        "slowest_call_s": max(r[0] for r in results),
        "calls": sum(r[1] for r in results),
        "calls_over_100ms": sum(r[2] for r in results),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

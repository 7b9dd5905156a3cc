"""Wake-up latency of ``wait_events`` against commits made by another process, shared by
tests/test_wait_events.py (which bounds it) and benches/bench_wait.py (which reports it)."""

from __future__ import annotations

import time
from typing import Any

import fencepost as fp
from tests.processes import SPAWN


def _writer(target: str, writes: int, gap_s: float, start: Any, queue: Any) -> None:
    """Append one event every ``gap_s`` to ``gap_s`` + 20 ms; report when each write began."""
    begun: list[float] = []
    with fp.Ledger.open(target) as ledger:
        start.wait()
        for n in range(writes):
            time.sleep(gap_s + (n % 5) * 0.005)
            begun.append(time.time())
            ledger.reserve_attempt("w", f"u{n:03d}", step_id="s")
    queue.put(begun)


def wake_latencies(ledger: fp.Ledger, target: str, writes: int, gap_s: float) -> list[float]:
    """Seconds from the start of each of another process's ``writes`` commits on run ``w``
    (made here) to the return of this ledger's ``wait_events`` that saw it, sorted."""
    ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="w", force=True)
    after = ledger.events("w")[-1].seq
    start, queue = SPAWN.Event(), SPAWN.Queue()
    proc = SPAWN.Process(target=_writer, args=(target, writes, gap_s, start, queue))
    proc.start()
    woke: dict[str, float] = {}
    start.set()
    deadline = time.monotonic() + 120
    while len(woke) < writes and time.monotonic() < deadline:
        got = ledger.wait_events("w", after_seq=after, timeout_s=5, types=["unit.started"])
        now = time.time()
        for e in got:
            woke.setdefault(e.payload["unit_id"], now)
        if got:
            after = got[-1].seq
    begun = queue.get(timeout=120)
    proc.join(60)
    assert proc.exitcode == 0
    assert len(woke) == writes
    return sorted(woke[f"u{n:03d}"] - begun[n] for n in range(writes))

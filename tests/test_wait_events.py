"""``wait_events``: waiting for events instead of polling, on both backends. It returns what is
already there at once, ``[]`` at its timeout, wakes within 50 ms (p99) of a commit made by
another process, and a reader paging with ``after_seq`` through its wake-ups while 4 processes
commit sees every event exactly once, in order. Bad arguments are ``InvalidArgument``."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

import fencepost as fp
from tests.processes import SPAWN

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


def _writer(target: str, start: Any, queue: Any) -> None:
    """Append one event every 15-35 ms; report when each write began."""
    begun: list[float] = []
    with fp.Ledger.open(target) as ledger:
        start.wait()
        for n in range(WRITES):
            time.sleep(0.015 + (n % 5) * 0.005)
            begun.append(time.time())
            ledger.reserve_attempt("w", f"u{n:03d}", step_id="s")
    queue.put(begun)


def test_wakes_within_50_ms_of_another_process_commit(
    ledger: fp.Ledger, ledger_target: str
) -> None:
    _run(ledger, "w")
    after = ledger.events("w")[-1].seq
    start = SPAWN.Event()
    queue = SPAWN.Queue()
    proc = SPAWN.Process(target=_writer, args=(ledger_target, start, queue))
    proc.start()
    woke: dict[str, float] = {}
    start.set()
    deadline = time.monotonic() + 60
    while len(woke) < WRITES and time.monotonic() < deadline:
        got = ledger.wait_events("w", after_seq=after, timeout_s=5, types=["unit.started"])
        now = time.time()
        for e in got:
            woke.setdefault(e.payload["unit_id"], now)
        if got:
            after = got[-1].seq
    begun = queue.get(timeout=60)
    proc.join(30)
    assert proc.exitcode == 0
    assert len(woke) == WRITES
    latencies = sorted(woke[f"u{n:03d}"] - begun[n] for n in range(WRITES))
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

"""Helpers for the tests that race real processes on one ledger: start them behind a barrier,
report each call's outcome without raising, and check a ledger's invariants afterwards."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import fencepost as fp
from tests.conftest import raw_db

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")


def run_all(target: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    """Start one process per args tuple behind a barrier; return their results in order.
    ``target(i, barrier, queue, *args)`` puts ``(i, result)`` on the queue."""
    barrier = SPAWN.Barrier(len(args))
    queue = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(i, barrier, queue, *a)) for i, a in enumerate(args)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [results[i] for i in range(len(args))]


def kill_mid_flight(target: Any, args: tuple[Any, ...], pause_s: float) -> None:
    """Fork a process running ``target(*args, ready)``, wait until it sets ``ready``, let it
    work for ``pause_s``, then ``kill -9`` it and check that the signal is what ended it."""
    ready = FORK.Event()
    proc = FORK.Process(target=target, args=(*args, ready))
    proc.start()
    assert ready.wait(30)
    time.sleep(pause_s)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def outcome(fn: Any) -> tuple[str, Any]:
    """``("ok", value)``, or the fencepost error's class name and the error; anything else is
    marked ``RAW`` (a raw database error must never reach a caller)."""
    try:
        return "ok", fn()
    except fp.LedgerError as e:
        return type(e).__name__, e
    except Exception as e:
        return "RAW " + type(e).__name__, repr(e)


def check_invariants(path: str) -> int:
    """Return the number of attempts after asserting every invariant on the ledger: the
    database's own integrity check, a ``unit.started`` event for every attempt, one
    ``unit.finished`` for every finished attempt and none for a running one, and each unit
    matching its latest attempt (or exhausted after it)."""
    with raw_db(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        attempts = db.execute(
            "SELECT run_id, unit_id, attempt, dispatch_id, status FROM attempts"
        ).fetchall()
        started = db.execute(
            "SELECT json_extract(payload, '$.dispatch_id'), count(*) FROM events "
            "WHERE type = 'unit.started' GROUP BY 1"
        ).fetchall()
        finished = db.execute(
            "SELECT json_extract(payload, '$.dispatch_id'), count(*) FROM events "
            "WHERE type = 'unit.finished' GROUP BY 1"
        ).fetchall()
        latest = db.execute(
            "SELECT u.unit_id, u.attempts, u.status, a.status FROM units u JOIN attempts a "
            "ON a.run_id = u.run_id AND a.unit_id = u.unit_id AND a.attempt = u.attempts"
        ).fetchall()
        unit_count = db.execute("SELECT count(*) FROM units").fetchone()[0]
        max_attempts = db.execute(
            "SELECT count(*) FROM units u WHERE u.attempts <> (SELECT max(attempt) "
            "FROM attempts a WHERE a.run_id = u.run_id AND a.unit_id = u.unit_id)"
        ).fetchone()[0]
    started_by = dict(started)
    finished_by = dict(finished)
    for _, _, _, dispatch_id, status in attempts:
        assert started_by.get(dispatch_id) == 1, f"attempt {dispatch_id} lacks its started event"
        want = 0 if status == "running" else 1
        assert finished_by.get(dispatch_id, 0) == want, f"finished events of {dispatch_id}"
    assert len(started_by) == len(attempts)
    assert set(finished_by) <= set(started_by)
    assert len(latest) == unit_count
    assert max_attempts == 0
    # A unit shows its latest attempt's status, or `exhausted` when that attempt failed and
    # was the last its retry policy allows.
    assert all(
        unit_status == attempt_status
        or (unit_status == "exhausted" and attempt_status in ("failed", "timed_out"))
        for _, _, unit_status, attempt_status in latest
    )
    return len(attempts)


_HOLD_SQLITE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


@contextlib.contextmanager
def held_by_script(script: str, *args: str, ready: str) -> Iterator[None]:
    """Run ``script`` with ``args`` in another Python process until it prints ``ready``, run
    the body, then send it a line (it ends what it holds) and wait for it to exit cleanly.
    SQLite's locks are held this way, from another process: POSIX locks never conflict within
    one, and a second SQLite library in this process would not see fencepost's."""
    with subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline().strip() == ready
        yield
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(10) == 0


@contextlib.contextmanager
def held_write_lock(target: str, run_id: str) -> Iterator[None]:
    """Hold the write lock a ledger's calls on ``run_id`` need while the body runs: SQLite's one
    write lock (from another process: POSIX locks never conflict within one), or the run's
    row on PostgreSQL. Calls made meanwhile queue behind it, so they land in one group."""
    if target.startswith("postgresql://"):
        with raw_db(target) as db:
            db.execute("BEGIN")
            db.execute("SELECT 1 FROM runs WHERE run_id = ? FOR UPDATE", (run_id,))
            yield
            db.execute("ROLLBACK")
        return
    with held_by_script(_HOLD_SQLITE, target, ready="locked"):
        yield

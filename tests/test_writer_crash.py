"""Crash safety of group commit: a process whose 16 threads share one ``Ledger`` (reserving,
finishing, batch-reserving and heartbeating a claimed run, so their calls coalesce into groups)
is killed with ``kill -9`` at random moments, on both backends. After every kill the ledger
invariants of the single-threaded crash suite hold, and every call that *returned* success is in
the database: a group is committed whole or not at all, and no caller is answered before its
commit.

Each thread appends what a call returned to the process's log right after it returns, one
``os.write`` per line on an ``O_APPEND`` file: a kill lands between whole lines (a line not yet
written is a success the test cannot know of, never a false one)."""

from __future__ import annotations

import os
import pathlib
import random
import threading
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import queued, raw_db
from tests.processes import check_invariants, kill_mid_flight

THREADS = 16
LEASE_MS = 3_600_000
STATUSES = ("completed", "failed", "timed_out")


def _log(fd: int, *fields: object) -> None:
    # One write per line: O_APPEND writes of a few bytes land whole, even with 16 writers.
    os.write(fd, ("\t".join(str(f) for f in fields) + "\n").encode())


def _thread(ledger: fp.Ledger, claim: fp.Claim, t: int, seed: int, fd: int, ready: Any) -> None:
    rnd = random.Random(seed * 100 + t)
    run_id = claim.run_id
    try:
        while True:
            # A small pool shared by all threads: reclaims in place and lost finish races too.
            unit = f"u{rnd.randrange(120)}"
            res = ledger.reserve_attempt(run_id, unit, step_id="build", claim=claim)
            _log(fd, "R", unit, res.attempt, res.dispatch_id)
            ready.set()
            if rnd.random() < 0.8:
                status = rnd.choice(STATUSES)
                ok = ledger.finish_attempt(
                    run_id, unit, res.attempt, res.dispatch_id, status=status, claim=claim
                )
                _log(fd, "F", unit, res.attempt, res.dispatch_id, status, int(ok))
            if rnd.random() < 0.05:
                names = {f"b{rnd.randrange(300)}" for _ in range(8)}
                batch = [{"unit_id": n, "step_id": "build"} for n in sorted(names)]
                for r in ledger.reserve_attempts(run_id, batch, claim=claim):
                    _log(fd, "R", r.unit_id, r.attempt, r.dispatch_id)
            if t == 0:
                # One heartbeating thread, so its expiries only grow: the stored one is never
                # below the last it logged.
                beat = ledger.heartbeat(claim, lease_ms=LEASE_MS)
                _log(fd, "H", round(beat.expires_at.timestamp() * 1000))
                _log(fd, "S", ledger._core.group_stats()["max_group"])
    except BaseException as e:  # a call that raised: the parent fails the test on this line
        _log(fd, "E", t, repr(e).replace("\n", " "))


def _worker(target: str, claim: fp.Claim, seed: int, log_path: str, ready: Any) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ledger = fp.Ledger.open(target)
    threads = [
        threading.Thread(target=_thread, args=(ledger, claim, t, seed, fd, ready), daemon=True)
        for t in range(THREADS)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


class _Seen:
    """What the killed workers' logs say was returned, accumulated over all rounds."""

    def __init__(self) -> None:
        self.finished_true: set[str] = set()
        self.expires_ms = 0
        self.max_group = 0
        self.lines = 0

    def check(self, target: str, run_id: str, log_path: pathlib.Path) -> None:
        text = log_path.read_text() if log_path.exists() else ""
        lines = [line.split("\t") for line in text.split("\n")[:-1]]  # only whole lines
        self.lines += len(lines)
        with raw_db(target) as db:
            rows = {
                d: (u, a, s)
                for u, a, d, s in db.execute(
                    "SELECT unit_id, attempt, dispatch_id, status FROM attempts WHERE run_id = ?",
                    (run_id,),
                ).fetchall()
            }
            stored_expiry = db.execute(
                "SELECT expires_at FROM leases WHERE resource_id = ?", (run_id,)
            ).fetchone()[0]
        for f in lines:
            kind = f[0]
            assert kind != "E", f"a call raised: {f}"
            if kind == "R":
                unit, attempt, dispatch_id = f[1], int(f[2]), f[3]
                got = rows.get(dispatch_id)
                assert got is not None, f"returned reservation {f} is not in the database"
                assert got[:2] == (unit, attempt), (f, got)
            elif kind == "F":
                unit, attempt, dispatch_id, status, ok = f[1], int(f[2]), f[3], f[4], f[5]
                got = rows[dispatch_id]
                assert got[:2] == (unit, attempt), (f, got)
                if ok == "1":
                    assert got[2] == status, f"finish {f} returned True, stored {got}"
                    assert dispatch_id not in self.finished_true, f"second True finish {f}"
                    self.finished_true.add(dispatch_id)
                else:
                    assert got[2] != "running", f"finish {f} returned False on a running attempt"
            elif kind == "H":
                self.expires_ms = max(self.expires_ms, int(f[1]))
            elif kind == "S":
                self.max_group = max(self.max_group, int(f[1]))
            else:
                raise AssertionError(f"unknown log line {f}")
        assert stored_expiry >= self.expires_ms, "a returned heartbeat is not in the database"


def _kill_cycles(target: str, tmp_path: pathlib.Path, kills: int, seed: int) -> None:
    run_id = "crash"
    with fp.Ledger.open(target) as ledger:
        ledger.reserve_run(run_id, **queued(run_id))
        claim = ledger.claim(run_id, "host-a", lease_ms=LEASE_MS)
        assert claim is not None
        ledger.set_status(run_id, "active", claim=claim)
    rnd = random.Random(seed)
    seen = _Seen()
    grown = 0
    for k in range(kills):
        log_path = tmp_path / f"returned-{k}.log"
        kill_mid_flight(
            _worker, (target, claim, seed * 1000 + k, str(log_path)), rnd.uniform(0.01, 0.12)
        )
        seen.check(target, run_id, log_path)
        count = check_invariants(target)
        assert count >= grown
        grown = count
    assert grown > kills  # the workers made progress between kills
    assert seen.lines > kills
    # The threads' calls really shared transactions (their groups were what got killed).
    assert seen.max_group > 1, "no round coalesced calls into a group"
    # After all the kills the claim still holds and the ledger still works normally.
    with fp.Ledger.open(target) as ledger:
        res = ledger.reserve_attempt(run_id, "u0", step_id="build", claim=claim)
        assert res.kind in ("reserved", "reclaimed")
        stats = ledger._core.group_stats()
    # One group of one call: its time in the transaction is the whole total and the maximum.
    assert (stats["groups"], stats["calls"]) == (1, 1)
    assert 0 < stats["hold_us_total"] == stats["hold_us_max"]


@pytest.mark.crash
def test_sigkill_mid_group(target: str, tmp_path: pathlib.Path) -> None:
    _kill_cycles(target, tmp_path, kills=10, seed=17)


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_mid_group_soak(target: str, tmp_path: pathlib.Path) -> None:
    _kill_cycles(target, tmp_path, kills=100, seed=23)

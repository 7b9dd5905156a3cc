"""Crash safety of the SQLite store: a worker reserving and finishing attempts is killed with
``kill -9`` at random moments, and after every kill the file passes `PRAGMA integrity_check`
and the ledger invariants hold — every attempt has its `unit.started` event, every finished
attempt exactly one `unit.finished`, running attempts none, and each unit projection matches
its latest attempt."""

from __future__ import annotations

import os
import pathlib
import random
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import STEPS
from tests.processes import check_invariants, kill_mid_flight


def _worker(path: str, run_id: str, seed: int, ready: Any) -> None:
    rnd = random.Random(seed)
    with fp.Ledger.open(path) as ledger:
        ready.set()
        while True:
            unit = f"u{rnd.randrange(40)}"
            res = ledger.reserve_attempt(run_id, unit, step_id="build", holder=str(os.getpid()))
            if rnd.random() < 0.8:
                status = rnd.choice(["completed", "failed", "timed_out"])
                ledger.finish_attempt(
                    run_id, unit, res.attempt, res.dispatch_id, status=status, tokens=1
                )
            if rnd.random() < 0.1:
                batch = [
                    {"unit_id": f"b{rnd.randrange(200)}", "step_id": "build"} for _ in range(20)
                ]
                ledger.reserve_attempts(run_id, list({u["unit_id"]: u for u in batch}.values()))


def _kill_cycles(tmp_path: pathlib.Path, kills: int, seed: int) -> None:
    path = str(tmp_path / "crash.db")
    with fp.Ledger.open(path) as ledger:
        run_id = ledger.start_run("wf/crash", scope_key="s", steps=STEPS).run_id
    rnd = random.Random(seed)
    grown = 0
    for k in range(kills):
        kill_mid_flight(_worker, (path, run_id, seed * 1000 + k), rnd.uniform(0.005, 0.08))
        count = check_invariants(path)
        assert count >= grown
        grown = count
    assert grown > kills  # the workers made progress between kills
    # After all the kills the ledger still works normally and reclaims in place.
    with fp.Ledger.open(path) as ledger:
        res = ledger.reserve_attempt(run_id, "u0", step_id="build")
        assert res.kind in ("reserved", "reclaimed")


@pytest.mark.crash
def test_sigkill_during_reserve_and_finish(tmp_path: pathlib.Path) -> None:
    _kill_cycles(tmp_path, kills=50, seed=5)


@pytest.mark.crash
@pytest.mark.slow
# Each cycle re-reads the whole (growing) ledger for the invariants: quadratic, minutes.
@pytest.mark.timeout(900)
def test_sigkill_soak(tmp_path: pathlib.Path) -> None:
    _kill_cycles(tmp_path, kills=300, seed=11)

"""Dispatchers racing as real processes on one ledger (a SQLite file or a PostgreSQL
schema): four processes reserving and finishing disjoint and shared units lose and duplicate no
attempt, and every attempt has exactly one winning finish, with default settings, no StoreBusy
and no raw database error surfacing."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import fencepost as fp
from tests.conftest import STEPS, raw_db
from tests.processes import outcome, run_all

PROCS = 4


def _dispatch(i: int, barrier: Any, queue: Any, path: str, run_id: str, units: list[str]) -> None:
    rnd = random.Random(i)
    order = units[:]
    rnd.shuffle(order)
    log: list[tuple[str, int, str, bool]] = []
    errors: list[str] = []
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        for unit in order:
            kind, res = outcome(
                lambda u=unit: ledger.reserve_attempt(run_id, u, step_id="build", holder=f"p{i}")
            )
            if kind != "ok":
                errors.append(f"reserve {unit}: {kind} {res}")
                continue
            kind, ok = outcome(
                lambda r=res, u=unit: ledger.finish_attempt(
                    run_id, u, r.attempt, r.dispatch_id, status="completed", tokens=1
                )
            )
            if kind != "ok":
                errors.append(f"finish {unit}: {kind} {ok}")
                continue
            log.append((unit, res.attempt, res.dispatch_id, ok))
    queue.put((i, (log, errors)))


def _check_attempt_invariants(path: str, run_id: str, logs: list[Any]) -> None:
    wins = Counter((u, a) for log in logs for u, a, _, ok in log if ok)
    seen = {(u, a) for log in logs for u, a, _, _ in log}
    assert all(n == 1 for n in wins.values()), "two winning finishes for one attempt"
    assert set(wins) == seen, "an attempt nobody finished"
    with raw_db(path) as db:
        rows = db.execute(
            "SELECT unit_id, attempt, dispatch_id, status FROM attempts WHERE run_id = ?",
            (run_id,),
        ).fetchall()
        started = db.execute(
            "SELECT count(*) FROM events WHERE type = 'unit.started' AND resource_id = ?",
            (run_id,),
        ).fetchone()[0]
        finished = db.execute(
            "SELECT count(*) FROM events WHERE type = 'unit.finished' AND resource_id = ?",
            (run_id,),
        ).fetchone()[0]
    assert {(u, a) for u, a, _, _ in rows} == seen  # no lost and no phantom attempt
    assert all(status == "completed" for *_, status in rows)
    dispatch = {(u, a): d for u, a, d, _ in rows}
    assert all(dispatch[u, a] == d for log in logs for u, a, d, _ in log)
    assert started == len(rows)
    assert finished == len(rows)


def test_disjoint_and_overlapping_dispatchers(target: str) -> None:
    path = target
    with fp.Ledger.open(path) as ledger:
        run_id = ledger.start_run("wf/fan", scope_key="s", steps=STEPS).run_id
    disjoint = [[f"d{p}-{k}" for k in range(150)] for p in range(PROCS)]
    shared = [f"shared-{k}" for k in range(150)]
    results = run_all(_dispatch, [(path, run_id, disjoint[p] + shared) for p in range(PROCS)])
    errors = [e for _, errs in results for e in errs]
    assert errors == []  # no StoreBusy, no raw error, under default settings
    logs = [log for log, _ in results]
    _check_attempt_invariants(path, run_id, logs)
    with fp.Ledger.open(path) as ledger:
        acc = ledger.accounting(run_id)
        assert acc.total_attempts == acc.total_tokens  # every attempt finished exactly once
        assert acc.total_attempts >= PROCS * 150 + 150

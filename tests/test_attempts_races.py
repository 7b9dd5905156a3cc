"""Races between real processes on one SQLite file (issue: ledger core "Concurrency"): the same
child for concurrent publishers, exactly one active run per guarded scope, no lost or duplicated
attempt and exactly one winning finish per attempt — with default settings, no StoreBusy and no
raw database error surfacing."""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter
from typing import Any

import fencepost as fp
from tests.conftest import STEPS, raw_db

PROCS = 4
CTX = multiprocessing.get_context("spawn")


def _run_all(target: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    """Start one process per args tuple behind a barrier; return their results in order."""
    barrier = CTX.Barrier(len(args))
    queue = CTX.Queue()
    procs = [CTX.Process(target=target, args=(i, barrier, queue, *a)) for i, a in enumerate(args)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [results[i] for i in range(len(args))]


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except fp.LedgerError as e:
        return type(e).__name__, e
    except Exception as e:
        return "RAW " + type(e).__name__, repr(e)


def _publish(i: int, barrier: Any, queue: Any, path: str, parent: str) -> None:
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        out = _outcome(
            lambda: (
                ledger.publish_child_run(
                    parent,
                    parent_unit_id=f"u{i}",
                    invocation_key="same-key",
                    workflow_ref="wf/child",
                    steps=[{"id": "s"}],
                    run_id=f"candidate-{i}",
                ).run_id
            )
        )
    queue.put((i, out))


def test_concurrent_publishers_get_the_same_child(target: str) -> None:
    path = target
    with fp.Ledger.open(path) as ledger:
        parent = ledger.start_run("wf/p", scope_key="s", steps=STEPS).run_id
    for _ in range(3):  # a few rounds with fresh keys would be the same race; repeat the file
        results = _run_all(_publish, [(path, parent)] * PROCS)
        assert all(kind == "ok" for kind, _ in results), results
        ids = {child for _, child in results}
        assert len(ids) == 1
    with fp.Ledger.open(path) as ledger:
        children = ledger.child_runs(parent)
        assert [c.run_id for c in children] == list(ids)
        assert len(ledger.events(children[0].run_id, types=["run.started"])) == 1


def _start(i: int, barrier: Any, queue: Any, path: str) -> None:
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        out = _outcome(
            lambda: ledger.start_run("wf/guarded", scope_key="scope-1", steps=STEPS).run_id
        )
    if out[0] == "ActiveRunExists":
        out = (out[0], out[1].occupant_run_id)
    queue.put((i, out))


def test_concurrent_starts_in_one_scope_make_one_active_run(target: str) -> None:
    path = target
    fp.Ledger.open(path).close()
    results = _run_all(_start, [(path,)] * PROCS)
    kinds = Counter(kind for kind, _ in results)
    assert kinds == {"ok": 1, "ActiveRunExists": PROCS - 1}, results
    winner = next(v for k, v in results if k == "ok")
    assert all(v == winner for k, v in results if k == "ActiveRunExists")
    with fp.Ledger.open(path) as ledger:
        assert [r.run_id for r in ledger.list_runs(active_only=True)] == [winner]


def _dispatch(i: int, barrier: Any, queue: Any, path: str, run_id: str, units: list[str]) -> None:
    rnd = random.Random(i)
    order = units[:]
    rnd.shuffle(order)
    log: list[tuple[str, int, str, bool]] = []
    errors: list[str] = []
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        for unit in order:
            kind, res = _outcome(
                lambda u=unit: ledger.reserve_attempt(run_id, u, step_id="build", holder=f"p{i}")
            )
            if kind != "ok":
                errors.append(f"reserve {unit}: {kind} {res}")
                continue
            kind, ok = _outcome(
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
    results = _run_all(_dispatch, [(path, run_id, disjoint[p] + shared) for p in range(PROCS)])
    errors = [e for _, errs in results for e in errs]
    assert errors == []  # no StoreBusy, no raw error, under default settings
    logs = [log for log, _ in results]
    _check_attempt_invariants(path, run_id, logs)
    with fp.Ledger.open(path) as ledger:
        acc = ledger.accounting(run_id)
        assert acc.total_attempts == acc.total_tokens  # every attempt finished exactly once
        assert acc.total_attempts >= PROCS * 150 + 150

"""Runs raced by real processes on one ledger (a SQLite file or a PostgreSQL schema):
concurrent publishers of one child all get the same child, and concurrent starts in one guarded
scope make exactly one active run, with default settings, no StoreBusy and no raw database
error surfacing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import fencepost as fp
from tests.conftest import STEPS
from tests.processes import outcome, run_all

PROCS = 4


def _publish(i: int, barrier: Any, queue: Any, path: str, parent: str) -> None:
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        out = outcome(
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
        results = run_all(_publish, [(path, parent)] * PROCS)
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
        out = outcome(
            lambda: ledger.start_run("wf/guarded", scope_key="scope-1", steps=STEPS).run_id
        )
    if out[0] == "ActiveRunExists":
        out = (out[0], out[1].occupant_run_id)
    queue.put((i, out))


def test_concurrent_starts_in_one_scope_make_one_active_run(target: str) -> None:
    path = target
    fp.Ledger.open(path).close()
    results = run_all(_start, [(path,)] * PROCS)
    kinds = Counter(kind for kind, _ in results)
    assert kinds == {"ok": 1, "ActiveRunExists": PROCS - 1}, results
    winner = next(v for k, v in results if k == "ok")
    assert all(v == winner for k, v in results if k == "ActiveRunExists")
    with fp.Ledger.open(path) as ledger:
        assert [r.run_id for r in ledger.list_runs(active_only=True)] == [winner]

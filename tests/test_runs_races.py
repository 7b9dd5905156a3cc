"""Runs raced by real processes on one ledger (a SQLite file or a PostgreSQL schema):
concurrent publishers of one child all get the same child, concurrent starts in one guarded
scope make exactly one active run, with default settings, no StoreBusy and no raw database
error surfacing; and a cascading cancel killed with kill -9 at random moments leaves its tree
whole or untouched, never half cancelled."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import fencepost as fp
from tests.conftest import STEPS, raw_db
from tests.processes import check_invariants, kill_mid_flight, outcome, run_all

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


# ------------------------------------------------------------------ cancel a tree, kill -9

UNITS_PER_RUN = 150


def _tree(ledger: fp.Ledger, tag: str) -> list[str]:
    """A tree of three levels (a root, two children, a grandchild under each), every run with
    ``UNITS_PER_RUN`` running attempts: the runs' ids, root first."""
    root = ledger.start_run("wf/root", scope_key=None, steps=[{"id": "s"}], force=True).run_id
    ids = [root]
    for c in range(2):
        child = ledger.publish_child_run(
            root, parent_unit_id="u", invocation_key=f"{tag}-c{c}", workflow_ref="wf/c",
            steps=[{"id": "s"}],
        ).run_id  # fmt: skip
        grandchild = ledger.publish_child_run(
            child, parent_unit_id="u", invocation_key=f"{tag}-g{c}", workflow_ref="wf/g",
            steps=[{"id": "s"}],
        ).run_id  # fmt: skip
        ids += [child, grandchild]
    for run_id in ids:
        ledger.reserve_attempts(
            run_id, [{"unit_id": f"u{n}", "step_id": "s"} for n in range(UNITS_PER_RUN)]
        )
    return ids


def _abandon_then_die(target: str, root: str, ready: Any) -> None:
    with fp.Ledger.open(target) as ledger:
        ready.set()
        ledger.abandon_run(root, reason="kill test")
        time.sleep(60)  # killed before this ends


def _tree_state(target: str, ids: list[str]) -> tuple[set[str], set[str]]:
    """The statuses of the tree's runs and of their attempts, read behind the API."""
    marks = ",".join("?" * len(ids))
    with raw_db(target) as db:
        runs = {r[0] for r in db.execute(f"SELECT status FROM runs WHERE run_id IN ({marks})", ids)}
        attempts = {
            r[0]
            for r in db.execute(
                f"SELECT DISTINCT status FROM attempts WHERE run_id IN ({marks})", ids
            )
        }
    return runs, attempts


def _kill_mid_cancel(target: str, rounds: int) -> None:
    """``rounds`` kills at random moments of a cascading cancel, then more (at most as many
    again) until both ends were reached. The moments are drawn up to twice what one cancel
    took here, timed first on a tree of its own: how long the cancel takes depends on the
    backend and on how busy the machine is, and fixed pauses ended every kill before the
    commit on a loaded one."""
    rng = random.Random(7)
    outcomes: Counter[str] = Counter()
    with fp.Ledger.open(target) as ledger:
        probe = _tree(ledger, "probe")
    with fp.Ledger.open(target) as ledger:
        began = time.monotonic()
        ledger.abandon_run(probe[0], reason="timing")
        span = 2 * (time.monotonic() - began)
    with fp.Ledger.open(target) as ledger:
        ids = _tree(ledger, "t0")
    n = 0
    while n < rounds or (n < 2 * rounds and len(outcomes) < 2):
        kill_mid_flight(_abandon_then_die, (target, ids[0]), rng.uniform(0, span))
        runs, attempts = _tree_state(target, ids)
        # The whole tree or nothing: never a cancelled parent above a live child, never a
        # cancelled run with a running attempt, never a live run with a cancelled one.
        if runs == {"cancelled"}:
            assert attempts == {"cancelled"}, attempts
            outcomes["whole"] += 1
            with fp.Ledger.open(target) as ledger:
                ids = _tree(ledger, f"t{n + 1}")
        else:
            assert (runs, attempts) == ({"active"}, {"running"}), (runs, attempts)
            outcomes["none"] += 1
        n += 1
    check_invariants(target)
    # Both ends were reached: some kills landed before the commit, some after.
    assert outcomes["whole"] > 0, (outcomes, span)
    assert outcomes["none"] > 0, (outcomes, span)


def test_kill_mid_cancel_never_leaves_half_a_tree(target: str) -> None:
    _kill_mid_cancel(target, rounds=20)

"""Prune beside real processes: a dispatcher writing other runs while trees go, and kill -9 of
a pruning process at random moments. A tree is always whole or gone, and a gone tree is always
in the archive."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import random
import shutil
import time
from collections import Counter
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, fresh_target, raw_db
from tests.processes import SPAWN, check_invariants, kill_mid_flight

DAY_MS = 86_400_000
RUN_TABLES = {"runs": "run_id", "steps": "run_id", "units": "run_id", "attempts": "run_id",
              "leases": "resource_id", "events": "resource_id"}  # fmt: skip


def build_trees(target: str, clock: FakeClock, trees: int, units: int = 5) -> None:
    """``trees`` finished trees (a root and one child, ``units`` attempts each) 40 days ago,
    then one live run holding the newest event."""
    with fp.Ledger.open(target, clock=clock) as ledger:
        for t in range(trees):
            root = f"t{t:03d}"
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id=root, force=True)
            ledger.publish_child_run(
                root, parent_unit_id="u0", invocation_key="c", workflow_ref="child",
                steps=[{"id": "s"}], run_id=f"{root}-c",
            )  # fmt: skip
            for run_id in (f"{root}-c", root):
                got = ledger.reserve_attempts(
                    run_id, [{"unit_id": f"u{i}", "step_id": "s"} for i in range(units)]
                )
                ledger.finish_attempts(
                    [{"run_id": run_id, "unit_id": r.unit_id, "attempt": r.attempt,
                      "dispatch_id": r.dispatch_id, "status": "completed"} for r in got]
                )  # fmt: skip
                assert ledger.abandon_run(run_id)
        clock.advance(40 * DAY_MS)
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="newest", force=True)


def rows_by_run(target: str) -> Counter[tuple[str, str]]:
    """(table, run) -> rows, over every per-run table."""
    out: Counter[tuple[str, str]] = Counter()
    with raw_db(target) as db:
        for table, key in RUN_TABLES.items():
            for run_id, n in db.execute(f"SELECT {key}, count(*) FROM {table} GROUP BY {key}"):
                out[(table, run_id)] = n
    return out


def archived_roots(path: pathlib.Path) -> set[str]:
    """The roots of the archive's complete tree lines (a killed prune may leave half a line)."""
    roots = set()
    if not path.exists():
        return roots
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        doc = json.loads(line)
        if "tree" in doc:
            roots.add(doc["tree"])
    return roots


def check_whole_or_gone(
    target: str, full: Counter[tuple[str, str]], archive: pathlib.Path
) -> tuple[int, int]:
    """Every tree whole (its rows exactly as before) or gone (no row left, and archived);
    returns (whole, gone)."""
    now = rows_by_run(target)
    roots = sorted({run for _, run in full if run.startswith("t") and not run.endswith("-c")})
    archived = archived_roots(archive)
    whole = gone = 0
    for root in roots:
        mine = {k: n for k, n in full.items() if k[1] in (root, f"{root}-c")}
        left = {k: now[k] for k in mine if now[k]}
        if left == mine:
            whole += 1
        else:
            assert not left, f"half of tree {root} is left: {left} of {mine}"
            assert root in archived, f"tree {root} is gone but not in the archive"
            gone += 1
    return whole, gone


# ------------------------------------------------------------------ beside a dispatcher


def dispatch(target: str, stop_path: str, log_path: str) -> None:
    """Reserve and finish units of its own live runs until told to stop; log each success."""
    with fp.Ledger.open(target) as ledger, open(log_path, "a") as log:
        runs = [f"live{i}" for i in range(4)]
        for run_id in runs:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id=run_id, force=True)
        i = 0
        while not os.path.exists(stop_path) or i < 50:
            run_id = runs[i % len(runs)]
            r = ledger.reserve_attempt(run_id, f"u{i}", step_id="s")
            assert ledger.finish_attempt(run_id, r.unit_id, r.attempt, r.dispatch_id,
                                         status="completed")  # fmt: skip
            log.write(f"{run_id}\n")
            log.flush()
            i += 1


def test_prune_beside_a_dispatcher(target: str, clock: FakeClock, tmp_path: pathlib.Path) -> None:
    build_trees(target, clock, trees=120)
    before = rows_by_run(target)
    stop, log = tmp_path / "stop", tmp_path / "dispatched"
    proc = SPAWN.Process(target=dispatch, args=(target, str(stop), str(log)))
    proc.start()
    archive = tmp_path / "pruned.jsonl"
    try:
        deadline = time.monotonic() + 60
        while not log.exists() or log.stat().st_size == 0:
            assert time.monotonic() < deadline, "the dispatcher never started"
            time.sleep(0.01)
        with fp.Ledger.open(target, clock=clock) as ledger, open(archive, "xb") as out:
            total = 0
            # Small steps, so many prune transactions interleave with the dispatcher's.
            while step := ledger.prune(older_than=dt.timedelta(days=30), limit=5,
                                       archive=out).runs:  # fmt: skip
                total += step
        assert total == 240
    finally:
        stop.touch()
        proc.join(60)
    assert proc.exitcode == 0
    whole, gone = check_whole_or_gone(target, before, archive)
    assert (whole, gone) == (0, 120)
    dispatched = Counter(log.read_text().split())
    after = rows_by_run(target)
    for run_id, n in dispatched.items():
        assert after[("attempts", run_id)] == n, run_id
    assert after[("runs", "newest")] == 1
    check_invariants(target)


# ------------------------------------------------------------------ kill -9


def prune_then_die(target: str, now_ms: int, archive: str, ready: Any) -> None:
    ledger = fp.Ledger.open(target, clock=lambda: now_ms)
    with open(archive, "xb") as out:
        ready.set()
        # One tree per transaction: a kill lands between, or inside, one of many commits.
        while ledger.prune(older_than=dt.timedelta(days=30), limit=1, archive=out).runs:
            pass
    time.sleep(60)  # killed before this ends


def kill_rounds(kind: str, tmp_path: pathlib.Path, rounds: int, trees: int, pause_s: float) -> None:
    template = tmp_path / "template.db"
    full: Counter[tuple[str, str]] = Counter()
    if kind == "sqlite":
        build_trees(str(template), FakeClock(), trees=trees)
        full = rows_by_run(str(template))
    rng = random.Random(7)
    mid_way = 0
    for n in range(rounds):
        with fresh_target(kind, tmp_path / f"r{n}") as target:
            if kind == "sqlite":
                os.makedirs(tmp_path / f"r{n}", exist_ok=True)
                shutil.copy(template, target)
            else:
                build_trees(target, FakeClock(), trees=trees)
                full = rows_by_run(target)
            archive = tmp_path / f"r{n}.jsonl"
            now = FakeClock()() + 40 * DAY_MS
            kill_mid_flight(prune_then_die, (target, now, str(archive)), rng.uniform(0, pause_s))
            _, gone = check_whole_or_gone(target, full, archive)
            mid_way += 0 < gone < trees
            check_invariants(target)
    print(f"{kind}: {mid_way} of {rounds} kills landed mid-prune")
    # The kills must land inside prunes, not only before or after them.
    assert mid_way >= rounds // 5, f"only {mid_way} of {rounds} kills landed mid-prune"


def test_kill_mid_prune_sqlite(tmp_path: pathlib.Path) -> None:
    # 200 trees prune in about 0.1 s on SQLite, 40 in about as long on PostgreSQL.
    kill_rounds("sqlite", tmp_path, rounds=50, trees=200, pause_s=0.1)


def test_kill_mid_prune_postgres(tmp_path: pathlib.Path) -> None:
    kill_rounds("postgres", tmp_path, rounds=10, trees=40, pause_s=0.25)


@pytest.mark.slow
def test_kill_mid_prune_postgres_soak(tmp_path: pathlib.Path) -> None:
    kill_rounds("postgres", tmp_path, rounds=50, trees=40, pause_s=0.25)

"""Several hosts on one PostgreSQL ledger, fenced by their leases (``leases``): 8 processes,
each with its own connection, claim and work disjoint and shared runs under short leases while
two of them are killed with SIGKILL mid-loop. From the database afterwards: exactly one winner
per (run, generation), no fenced write that carries a generation already superseded when it
committed, revisions gap-free, every attempt with its `unit.started`, stale writers refused,
nothing a killed process committed lost — and after expiry another process takes over every
run and finishes what the dead left running, in place."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from typing import Any

import fencepost as fp
from tests.conftest import pg_schema, queued, raw_db
from tests.processes import check_invariants

PROCS = 8
SHARED = [f"shared-{k}" for k in range(4)]
LEASE_MS = 60
SECONDS = 4.0
FORK = multiprocessing.get_context("fork")


def _host(i: int, url: str, queue: Any, ready: Any) -> None:
    """One host: claims its own run or a shared one, activates it, reserves and finishes a
    few units under the claim; now and then it stalls past its lease and checks that its stale
    claim is refused."""
    rnd = random.Random(i)
    wins = stale_refused = stale_accepted = lost = 0
    with fp.Ledger.open(url) as ledger:
        ready.set()
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            run_id = f"home-{i}" if rnd.random() < 0.4 else rnd.choice(SHARED)
            claim = ledger.claim(run_id, f"host-{i}", lease_ms=LEASE_MS)
            if claim is None:
                continue
            wins += 1
            try:
                if ledger.get_run(run_id).status == "starting":  # type: ignore[union-attr]
                    ledger.set_status(run_id, "active", claim=claim)
                for _ in range(rnd.randrange(1, 4)):
                    unit = f"u{rnd.randrange(20)}"
                    res = ledger.reserve_attempt(run_id, unit, step_id="s", claim=claim)
                    if rnd.random() < 0.8:
                        ledger.finish_attempt(
                            run_id,
                            unit,
                            res.attempt,
                            res.dispatch_id,
                            status="completed",
                            claim=claim,
                        )
            except fp.LeaseLost:
                lost += 1  # taken over mid-work: the write was refused, nothing written
                continue
            if rnd.random() < 0.1:
                time.sleep(LEASE_MS / 1000 + 0.02)
                try:
                    ledger.reserve_attempt(run_id, "late", step_id="s", claim=claim)
                    stale_accepted += 1
                except fp.LeaseLost:
                    stale_refused += 1
    queue.put((i, (wins, lost, stale_refused, stale_accepted)))


def _check_fencing(url: str) -> dict[str, int]:
    """Walk each run's events in revision order: returns the newest generation per run."""
    with raw_db(url) as db:
        rows = db.execute(
            "SELECT resource_id, revision, type, generation, payload FROM events "
            "ORDER BY resource_id, revision"
        ).fetchall()
    newest: dict[str, int] = {}
    revisions: dict[str, list[int]] = defaultdict(list)
    winners: set[tuple[str, int]] = set()
    for run_id, revision, kind, generation, payload in rows:
        revisions[run_id].append(revision)
        if kind == "lease.claimed":
            assert (run_id, generation) not in winners, f"two winners: {run_id} gen {generation}"
            assert generation == newest.get(run_id, 0) + 1, "a generation was skipped"
            assert json.loads(payload)["generation"] == generation
            winners.add((run_id, generation))
            newest[run_id] = generation
        elif generation is not None:
            # A fenced write: its generation was the live one when it committed.
            assert generation == newest.get(run_id), (
                f"{kind} at revision {revision} of {run_id} carries generation {generation}, "
                f"superseded by {newest.get(run_id)}"
            )
    for run_id, revs in revisions.items():
        assert revs == list(range(1, len(revs) + 1)), f"revision gap in {run_id}"
    return newest


def test_eight_hosts_with_kills_keep_one_owner_per_generation() -> None:
    with pg_schema() as url:
        with fp.Ledger.open(url) as ledger:
            for run_id in [f"home-{i}" for i in range(PROCS)] + SHARED:
                ledger.reserve_run(run_id, **queued(run_id))
        queue = FORK.Queue()
        procs = []
        for i in range(PROCS):
            ready = FORK.Event()
            p = FORK.Process(target=_host, args=(i, url, queue, ready))
            p.start()
            assert ready.wait(30)
            procs.append(p)
        victims = random.Random(8).sample(range(PROCS), 2)
        for v in victims:
            time.sleep(random.uniform(0.5, 1.5))
            os.kill(procs[v].pid, signal.SIGKILL)  # type: ignore[arg-type]
        results = dict(queue.get(timeout=120) for _ in range(PROCS - len(victims)))
        for i, p in enumerate(procs):
            p.join(60)
            assert p.exitcode == (-signal.SIGKILL if i in victims else 0)
        assert set(results) == set(range(PROCS)) - set(victims)
        assert sum(r[0] for r in results.values()) > 100  # runs changed hands many times
        assert sum(r[2] for r in results.values()) > 0  # stale claims were tried...
        assert all(r[3] == 0 for r in results.values())  # ...and every one was refused

        # Nothing is half-written, whatever the kills interrupted (the server rolled back).
        check_invariants(url)
        newest = _check_fencing(url)
        assert set(SHARED) <= set(newest)

        # After expiry another host takes every run over and finishes what was left running.
        time.sleep(LEASE_MS / 1000 + 0.05)
        with fp.Ledger.open(url) as ledger:
            for run_id, generation in newest.items():
                claim = ledger.claim(run_id, "host-final", lease_ms=60_000)
                assert claim is not None
                assert claim.generation == generation + 1
                if ledger.get_run(run_id).status == "starting":  # type: ignore[union-attr]
                    ledger.set_status(run_id, "active", claim=claim)
                for unit in ledger.units(run_id):
                    if unit.status != "running":
                        continue
                    before = ledger.attempts(run_id, unit.unit_id)[-1]
                    res = ledger.reserve_attempt(run_id, unit.unit_id, step_id="s", claim=claim)
                    assert (res.kind, res.dispatch_id) == ("reclaimed", before.dispatch_id)
                    assert ledger.finish_attempt(
                        run_id, unit.unit_id, res.attempt, res.dispatch_id,
                        status="completed", claim=claim,
                    )  # fmt: skip
                assert all(u.status != "running" for u in ledger.units(run_id))
        check_invariants(url)
        _check_fencing(url)

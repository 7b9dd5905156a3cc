"""Claims between real processes (``leases``) on a SQLite file and on PostgreSQL: exactly one
winner per (run, generation) under contention, one `claimed` and the rest `adopted` for a
prepare_or_adopt race, and kill -9 of a claimed worker mid-loop: the file stays consistent, the
dead owner's lease blocks others until it expires, then another process takes over at the next
generation and reclaims the in-flight attempts in place. These use the real clock (several
processes cannot share an injected one), with leases of milliseconds."""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import queued, raw_db
from tests.processes import check_invariants, kill_mid_flight, outcome, run_all

RUNS = 12


def _claimer(i: int, barrier: Any, queue: Any, path: str, seconds: float) -> None:
    rnd = random.Random(i)
    wins: list[tuple[str, int, str]] = []
    refused = errors = 0
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            run_id = f"run-{rnd.randrange(RUNS)}"
            kind, got = outcome(lambda run_id=run_id: ledger.claim(run_id, f"host-{i}", lease_ms=1))
            if kind != "ok":
                errors += 1
            elif got is None:
                refused += 1
            else:
                wins.append(
                    (run_id, got.generation, hashlib.sha256(got.token.encode()).hexdigest())
                )
    queue.put((i, (wins, refused, errors)))


def test_one_winner_per_generation_under_contention(target: str) -> None:
    path = target
    with fp.Ledger.open(path) as ledger:
        for r in range(RUNS):
            ledger.reserve_run(f"run-{r}", **queued(f"run-{r}"))
    results = run_all(_claimer, [(path, 1.5)] * 4)
    winner: dict[tuple[str, int], tuple[int, str]] = {}
    for proc, (wins, _, errors) in enumerate(results):
        assert errors == 0  # no StoreBusy and no raw error under contention
        for run_id, generation, token_hash in wins:
            assert (run_id, generation) not in winner, f"two winners for {run_id} gen {generation}"
            winner[run_id, generation] = (proc, token_hash)
    assert len(winner) > RUNS * 4  # every run changed hands many times
    assert sum(refused for _, refused, _ in results) > 0  # and live leases were refused
    with raw_db(path) as db:
        final = db.execute("SELECT resource_id, generation, owner_id, token_hash FROM leases")
        for run_id, generation, owner, token_hash in final.fetchall():
            assert all((run_id, g) in winner for g in range(1, generation + 1)), "gap"
            proc, won_hash = winner[run_id, generation]
            assert (owner, token_hash) == (f"host-{proc}", won_hash)
        claimed = db.execute("SELECT count(*) FROM events WHERE type = 'lease.claimed'")
        assert claimed.fetchone()[0] == len(winner)


def _prepare(i: int, barrier: Any, queue: Any, path: str, run_id: str) -> None:
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        kind, got = outcome(
            lambda: ledger.prepare_or_adopt(
                run_id, **queued(run_id, runner_id=f"host-{i}"), lease_ms=60_000
            )
        )
    queue.put((i, (kind, None if kind != "ok" else (got.state, got.claim is not None))))


def test_prepare_or_adopt_race_has_one_claimer(target: str) -> None:
    path = target
    fp.Ledger.open(path).close()
    for round_ in range(3):
        run_id = f"contested-{round_}"
        results = run_all(_prepare, [(path, run_id)] * 4)
        assert sorted(results) == [
            ("ok", ("adopted", False)), ("ok", ("adopted", False)),
            ("ok", ("adopted", False)), ("ok", ("claimed", True)),
        ]  # fmt: skip
        with fp.Ledger.open(path) as ledger:
            assert ledger.lease(run_id).generation == 1
            assert [e.type for e in ledger.events(run_id)] == ["run.queued", "lease.claimed"]


# ------------------------------------------------------------------ kill -9 of a claimed worker

LEASE_MS = 250


def _worker(path: str, seed: int, ready: Any) -> None:
    rnd = random.Random(seed)
    with fp.Ledger.open(path) as ledger:
        claim = None
        while claim is None:  # the previous owner's lease has to lapse first
            claim = ledger.claim("work", f"host-{os.getpid()}", lease_ms=LEASE_MS)
            time.sleep(0.005)
        ready.set()
        last_beat = time.monotonic()
        while True:
            unit = f"u{rnd.randrange(60)}"
            res = ledger.reserve_attempt("work", unit, step_id="s", claim=claim)
            if rnd.random() < 0.7:
                ledger.finish_attempt(
                    "work", unit, res.attempt, res.dispatch_id, status="completed", claim=claim
                )
            if time.monotonic() - last_beat > LEASE_MS / 4000:
                claim = ledger.heartbeat(claim, lease_ms=LEASE_MS)
                last_beat = time.monotonic()


@pytest.mark.crash
def test_sigkill_of_a_claimed_worker_then_takeover(target: str) -> None:
    path = target
    with fp.Ledger.open(path) as ledger:
        ledger.reserve_run("work", **queued("work"))
        first = ledger.claim("work", "host-setup", lease_ms=60_000)
        assert first is not None
        ledger.set_status("work", "active", claim=first)
        ledger.release(first)
    rnd = random.Random(3)
    generations = [1]
    for k in range(12):
        kill_mid_flight(_worker, (path, k), rnd.uniform(0.01, 0.1))
        check_invariants(path)
        with fp.Ledger.open(path) as ledger:
            lease = ledger.lease("work")
            generations.append(lease.generation)
            # The dead owner still holds an unexpired lease: nobody else may claim yet...
            if lease.expires_at is not None and lease.expires_at.timestamp() > time.time() + 0.05:
                assert ledger.claim("work", "host-observer", lease_ms=10) is None
    assert generations == sorted(generations)
    assert len(set(generations)) == len(generations)
    # ...and after expiry a new owner takes over, reclaims what the dead ones left running
    # (same dispatch ids, its own generation), and finishes it.
    time.sleep(LEASE_MS / 1000 + 0.05)
    with fp.Ledger.open(path) as ledger:
        claim = ledger.claim("work", "host-final", lease_ms=60_000)
        assert claim is not None
        assert claim.generation == generations[-1] + 1
        running = [u for u in ledger.units("work") if u.status == "running"]
        for unit in running:
            before = ledger.attempts("work", unit.unit_id)[-1]
            res = ledger.reserve_attempt("work", unit.unit_id, step_id="s", claim=claim)
            assert (res.kind, res.dispatch_id) == ("reclaimed", before.dispatch_id)
            assert res.lease_generation == claim.generation
            assert ledger.finish_attempt(
                "work", unit.unit_id, res.attempt, res.dispatch_id, status="completed",
                claim=claim,
            )  # fmt: skip
        assert all(u.status != "running" for u in ledger.units("work"))
        # Filtered by the ledger, not after a page: the workers write thousands of unit events,
        # and on a fast machine the first 10 000 ended before the last claims.
        claimed = ledger.events("work", types=["lease.claimed"], limit=10_000)
        assert [e.generation for e in claimed] == list(range(1, claim.generation + 1))
    check_invariants(path)

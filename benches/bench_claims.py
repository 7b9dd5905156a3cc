"""The controller's path: claim (new generation, refused, expired takeover), heartbeat and
prepare_or_adopt with a ~2 KB definition (new and adopt) on fencepost's SQLite and PostgreSQL,
and claim contention of 4 processes on one SQLite file. The SQLite peer is huey
(benches/peer_huey.py): taking a task off its queue is the nearest thing it has to a claim, and
it has no leases, generations or fencing. Per-operation figures (extra_info["ops"]); the raw
commit floor is in bench_attempts."""

from __future__ import annotations

import itertools
import multiprocessing
import pathlib
import random
import time
from typing import Any

import fencepost as fp
from benches.conftest import Clock, label
from benches.documents import definition
from benches.peer_huey import enqueue, open_huey

N = 200
ROUNDS = 15
T0 = 1_000_000_000
CTX = multiprocessing.get_context("spawn")
_ids = itertools.count()

Backend = tuple[str, fp.Ledger, Clock]
DEFINITION = definition(2048, 1)
OPTIONS = {"scope_key": "tenant-1", "max_parallel": 8, "retries": 3}


def queued(definition: Any = None, input: Any = None, options: Any = None) -> dict[str, Any]:
    """reserve_run / prepare_or_adopt keywords, with the digest computed as a caller does."""
    definition = {} if definition is None else definition
    return {
        "workflow_name": "bench",
        "workflow_ref": "bench",
        "source": {"kind": "builtin", "id": "bench"},
        "definition_digest": fp.digest(definition),
        "definition": definition,
        "input": input,
        "launch_options": options,
        "runner_id": "host-bench",
        "origin_session_id": "bench-session",
    }


def _runs(ledger: fp.Ledger, clock: Clock, owner: str | None = None) -> list[str]:
    """N fresh queued runs (claimed by ``owner`` at T0 for 30 s), made outside the timing."""
    batch = next(_ids)
    ids = [f"c{batch}-{i:04d}" for i in range(N)]
    clock.now_ms = T0
    for run_id in ids:
        ledger.reserve_run(run_id, **queued())
        if owner is not None:
            assert ledger.claim(run_id, owner, lease_ms=30_000) is not None
    return ids


def bench_claim_new_generation(benchmark: Any, backend: Backend) -> None:
    name, ledger, clock = backend
    label(benchmark, "claim (free lease, new generation)", name, N)

    def go(ids: list[str]) -> None:
        for run_id in ids:
            assert ledger.claim(run_id, "o1", lease_ms=30_000) is not None

    benchmark.pedantic(go, setup=lambda: ((_runs(ledger, clock),), {}), rounds=ROUNDS)


def bench_claim_refused(benchmark: Any, backend: Backend) -> None:
    name, ledger, clock = backend
    label(benchmark, "claim (refused, held)", name, N)
    ids = _runs(ledger, clock, "o1")
    clock.now_ms = T0 + 1000

    def go() -> None:
        for run_id in ids:
            assert ledger.claim(run_id, "o2", lease_ms=30_000) is None

    benchmark.pedantic(go, rounds=ROUNDS)


def bench_claim_takeover(benchmark: Any, backend: Backend) -> None:
    name, ledger, clock = backend
    label(benchmark, "claim (expired takeover)", name, N)

    def setup() -> tuple[tuple[list[str]], dict[str, Any]]:
        ids = _runs(ledger, clock, "o1")
        clock.now_ms = T0 + 60_000
        return (ids,), {}

    def go(ids: list[str]) -> None:
        for run_id in ids:
            assert ledger.claim(run_id, "o2", lease_ms=30_000) is not None

    benchmark.pedantic(go, setup=setup, rounds=ROUNDS)


def bench_huey_dequeue(benchmark: Any, tmp_path: pathlib.Path) -> None:
    """huey's nearest thing to a claim: take the next task off the queue."""
    huey, work = open_huey(str(tmp_path / "huey.db"))
    label(benchmark, "claim (free lease, new generation)", "huey dequeue", N)

    def go(_queued: None) -> None:
        for _ in range(N):
            assert huey.dequeue() is not None

    benchmark.pedantic(go, setup=lambda: ((enqueue(work, N),), {}), rounds=ROUNDS)


def bench_heartbeat(benchmark: Any, backend: Backend) -> None:
    """fencepost only: huey has no leases to extend."""
    name, ledger, clock = backend
    label(benchmark, "heartbeat (fenced)", name, N)
    claims = []
    for run_id in _runs(ledger, clock):
        claim = ledger.claim(run_id, "host-1", lease_ms=3_600_000)
        assert claim is not None
        claims.append(claim)

    def go() -> None:
        for claim in claims:
            ledger.heartbeat(claim, lease_ms=3_600_000)

    benchmark.pedantic(go, rounds=ROUNDS)


def bench_prepare_new(benchmark: Any, backend: Backend) -> None:
    name, ledger, _ = backend
    label(benchmark, "prepare_or_adopt (new -> claimed), 2 KB definition", name, N)

    def go(ids: list[str]) -> None:
        for i, run_id in enumerate(ids):
            prep = ledger.prepare_or_adopt(
                run_id, **queued(DEFINITION, {"i": i}, OPTIONS), lease_ms=30_000
            )
            assert prep.state == "claimed"

    def setup() -> tuple[tuple[list[str]], dict[str, Any]]:
        batch = next(_ids)
        return ([f"e{batch}-{i}" for i in range(N)],), {}

    benchmark.pedantic(go, setup=setup, rounds=ROUNDS)


def bench_prepare_adopt(benchmark: Any, backend: Backend) -> None:
    name, ledger, _ = backend
    label(benchmark, "prepare_or_adopt (adopt), 2 KB definition", name, N)
    batch = next(_ids)
    ids = [f"a{batch}-{i}" for i in range(N)]
    for i, run_id in enumerate(ids):
        ledger.prepare_or_adopt(run_id, **queued(DEFINITION, {"i": i}, OPTIONS), lease_ms=30_000)

    def go() -> None:
        for i, run_id in enumerate(ids):
            prep = ledger.prepare_or_adopt(
                run_id, **queued(DEFINITION, {"i": i}, OPTIONS), lease_ms=30_000
            )
            assert prep.state == "adopted"

    benchmark.pedantic(go, rounds=ROUNDS)


# ------------------------------------------------------------------ 4 processes on one file

PROCESSES = 4
SECONDS = 2.0
RESOURCES = 200


def _fencepost_claimer(db: str, seed: int, deadline: float) -> dict[str, int]:
    """Claim random runs with 1 ms leases until the deadline (most are lapsed: takeovers)."""
    rnd = random.Random(seed)
    tally = {"claims": 0, "refused": 0, "busy": 0}
    with fp.Ledger.open(db) as ledger:
        while time.monotonic() < deadline:
            try:
                claim = ledger.claim(f"r{rnd.randrange(RESOURCES)}", f"p{seed}", lease_ms=1)
            except fp.StoreBusy:
                tally["busy"] += 1
                continue
            tally["claims" if claim is not None else "refused"] += 1
    return tally


def _huey_taker(db: str, deadline: float) -> list[str]:
    """Take tasks off the shared queue until it is empty (or the deadline, a safety bound);
    returns their ids."""
    huey, _ = open_huey(db)
    taken = []
    while time.monotonic() < deadline and (task := huey.dequeue()) is not None:
        taken.append(task.id)
    return taken


def _ready(_: int) -> None:
    """Run once in each pool process first, so that importing fencepost and huey there is not
    counted in the timed window."""


def _fan_out(
    target: Any, args: list[tuple[Any, ...]], seconds: float = SECONDS
) -> tuple[list[Any], float]:
    """Run ``target(*args[i], deadline)`` in one process each, the deadline ``seconds`` away;
    (results, wall time)."""
    with CTX.Pool(len(args)) as pool:
        pool.map(_ready, range(len(args)))
        started = time.monotonic()
        out = pool.starmap(target, [(*a, started + seconds) for a in args])
        return out, time.monotonic() - started


def bench_contention_fencepost(benchmark: Any, tmp_path: pathlib.Path) -> None:
    """4 processes x 200 runs, 1 ms leases, 2 s: per winning claim, wall time. Afterwards every
    run's claims are read back: one winner per generation, generations gap-free."""
    db = str(tmp_path / "contention.db")
    with fp.Ledger.open(db) as ledger:
        for i in range(RESOURCES):
            ledger.reserve_run(f"r{i}", **queued())
    tally = {"claims": 0, "refused": 0, "busy": 0}
    rep = itertools.count()

    def go() -> None:
        r = next(rep)
        out, wall = _fan_out(
            _fencepost_claimer, [(db, r * PROCESSES + p) for p in range(PROCESSES)]
        )
        for t in out:
            for k in tally:
                tally[k] += t[k]
        benchmark.extra_info["claims_per_s"] = sum(t["claims"] for t in out) / wall

    benchmark.group = "claim contention, 4 processes (per winning claim)"
    benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(impl="fencepost", ops=tally["claims"], **tally)
    assert tally["busy"] == 0
    with fp.Ledger.open(db) as ledger:
        generations: dict[str, list[int]] = {}
        after = 0
        while page := ledger.events(after_seq=after, limit=10_000, types=["lease.claimed"]):
            for e in page:
                assert e.generation is not None
                generations.setdefault(e.resource_id, []).append(e.generation)
            after = page[-1].seq
    assert sum(len(g) for g in generations.values()) == tally["claims"]
    for gens in generations.values():
        assert gens == list(range(1, len(gens) + 1))


def bench_contention_huey(benchmark: Any, tmp_path: pathlib.Path) -> None:
    """The same 4 processes draining one huey queue of 20 000 tasks: per task taken, wall time.
    Each task must be taken exactly once."""
    db = str(tmp_path / "huey.db")
    _, work = open_huey(db)
    tasks = 20_000
    enqueue(work, tasks)
    taken: list[str] = []

    def go() -> None:
        out, wall = _fan_out(_huey_taker, [(db,) for _ in range(PROCESSES)], seconds=60.0)
        for ids in out:
            taken.extend(ids)
        benchmark.extra_info["claims_per_s"] = len(taken) / wall

    benchmark.group = "claim contention, 4 processes (per winning claim)"
    benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(impl="huey dequeue", ops=len(taken))
    assert sorted(set(taken)) == sorted(taken)
    assert len(taken) == tasks

"""The controller's path, fencepost vs the pure-Python reference through the same function
names (benches/ref_adapter.py): claim (new generation, refused, expired takeover), heartbeat,
prepare_or_adopt with a ~2 KB definition (new and adopt), and 4-process claim contention run by
shared/reference/bench.py's own `contention_rep` (one winner per generation verified there).
Per-operation figures (extra_info["ops"]); the raw commit floor is in bench_attempts."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import bench  # shared/reference, put on sys.path by conftest
import pytest
from bench import nested_doc

import fencepost as fp
from benches import ref_adapter
from benches.conftest import label

N = 200
ROUNDS = 15
T0 = 1_000_000
_ids = itertools.count()


def _resources(L: Any, h: Any, owner: str | None = None) -> list[str]:
    """N fresh resources, created (and claimed by ``owner`` at T0, 30 s) outside the timing."""
    batch = next(_ids)
    rids = [f"c{batch}-{i:04d}" for i in range(N)]
    for rid in rids:
        if owner is None:
            if L is ref_adapter:  # the reference creates its lease row on first claim
                ref_adapter.claim_lease(h, rid, "o0", 1, T0 - 10_000)
        else:
            assert L.claim_lease(h, rid, owner, 30_000, T0) is not None
    return rids


def bench_claim_new_generation(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "claim (free lease, new generation)", name, N)

    def go(rids: list[str]) -> None:
        for rid in rids:
            assert L.claim_lease(h, rid, "o1", 30_000, T0) is not None

    benchmark.pedantic(go, setup=lambda: ((_resources(L, h),), {}), rounds=ROUNDS)


def bench_claim_refused(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "claim (refused, held)", name, N)
    rids = _resources(L, h, "o1")

    def go() -> None:
        for rid in rids:
            assert L.claim_lease(h, rid, "o2", 30_000, T0 + 1000) is None

    benchmark.pedantic(go, rounds=ROUNDS)


def bench_claim_takeover(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "claim (expired takeover)", name, N)

    def go(rids: list[str]) -> None:
        for rid in rids:
            assert L.claim_lease(h, rid, "o2", 30_000, T0 + 60_000) is not None

    benchmark.pedantic(go, setup=lambda: ((_resources(L, h, "o1"),), {}), rounds=ROUNDS)


def bench_heartbeat(benchmark: Any, tmp_path: pathlib.Path) -> None:
    """fencepost only: the reference has no heartbeat."""
    label(benchmark, "heartbeat (fenced)", "fencepost", N)
    with fp.Ledger.open(str(tmp_path / "hb.db")) as ledger:
        claims = []
        for i in range(N):
            ledger.reserve_run(f"hb-{i}", **ref_adapter._queued({}, None, {}))
            claim = ledger.claim(f"hb-{i}", "host-1", lease_ms=3_600_000)
            assert claim is not None
            claims.append(claim)

        def go() -> None:
            for claim in claims:
                ledger.heartbeat(claim, lease_ms=3_600_000)

        benchmark.pedantic(go, rounds=ROUNDS)


DEFINITION = nested_doc(2048, 1)
OPTIONS = {"scope_key": "tenant-1", "max_parallel": 8, "retries": 3}


def bench_prepare_new(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "prepare_or_adopt (new -> claimed), 2 KB definition", name, N)

    def go(ids: list[str]) -> None:
        for i, run_id in enumerate(ids):
            assert L.prepare_or_adopt(h, run_id, DEFINITION, {"i": i}, OPTIONS) == "claimed"

    def setup() -> tuple[tuple[list[str]], dict[str, Any]]:
        batch = next(_ids)
        return ([f"e{batch}-{i}" for i in range(N)],), {}

    benchmark.pedantic(go, setup=setup, rounds=ROUNDS)


def bench_prepare_adopt(benchmark: Any, impl: tuple[str, Any, Any]) -> None:
    name, L, h = impl
    label(benchmark, "prepare_or_adopt (adopt), 2 KB definition", name, N)
    batch = next(_ids)
    ids = [f"a{batch}-{i}" for i in range(N)]
    for i, run_id in enumerate(ids):
        assert L.prepare_or_adopt(h, run_id, DEFINITION, {"i": i}, OPTIONS) == "claimed"

    def go() -> None:
        for i, run_id in enumerate(ids):
            assert L.prepare_or_adopt(h, run_id, DEFINITION, {"i": i}, OPTIONS) == "adopted"

    benchmark.pedantic(go, rounds=ROUNDS)


@pytest.mark.parametrize("name", ["benches.ref_adapter", "ref_ledger"])
def bench_contention_4_processes(benchmark: Any, tmp_path: pathlib.Path, name: str) -> None:
    """4 spawned processes x 200 resources, 1 ms leases, 2 s: per winning claim, wall time.
    bench.contention_rep asserts one winner per (resource, generation) and gap-free generations.
    """
    impl = "fencepost" if name.startswith("benches") else "reference"
    tally: dict[str, int] = {}
    rep = itertools.count()

    def go() -> None:
        out = bench.contention_rep(name, str(tmp_path), next(rep), 2.0, 4, 200, tally)
        claims, wall = out["claim_lease contention: winning claims"]
        benchmark.extra_info["claims_per_s"] = claims / wall

    benchmark.group = "claim contention, 4 processes (per winning claim)"
    benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(
        impl=impl, ops=tally["claims"], busy=tally["busy"], refused=tally["refused"],
        calls=tally["calls"],
    )  # fmt: skip
    assert tally["busy"] == 0

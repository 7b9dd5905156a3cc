"""Fixtures for the pytest-benchmark suites (run: bash scripts/bench)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost as fp
from benches.documents import definition


@pytest.fixture(scope="session", params=[2048, 100 * 1024], ids=["2KB", "100KB"])
def document(request: pytest.FixtureRequest) -> Any:
    """A workflow-definition-like document of ~2 KB or ~100 KB (benches/documents.py)."""
    return definition(request.param, 7)


class Clock:
    """The ledger's injected clock: the system's, or a time a bench sets (lease expiry)."""

    def __init__(self) -> None:
        self.now_ms: int | None = None

    def __call__(self) -> int:
        import time

        return time.time_ns() // 1_000_000 if self.now_ms is None else self.now_ms


@pytest.fixture(params=["fencepost", "fencepost-postgres"])
def backend(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[tuple[str, fp.Ledger, Clock]]:
    """(impl name, ledger, its clock): fencepost on a fresh SQLite file or a fresh PostgreSQL
    schema (plaintext, like the PostgreSQL peer), each timed by the same loops."""
    from tests.conftest import pg_schema

    clock = Clock()
    name = str(request.param)
    if name == "fencepost-postgres":
        with pg_schema() as url, fp.Ledger.open(plaintext(url), clock=clock) as ledger:
            yield name, ledger, clock
        return
    with fp.Ledger.open(str(tmp_path / "bench.db"), clock=clock) as ledger:
        yield name, ledger, clock


def plaintext(url: str) -> str:
    """A ledger URL with TLS off. fencepost negotiates TLS by default (``sslmode=prefer``, as
    libpq), and the local server offers it; the benches compare transports like for like, so
    both fencepost and the pgqueuer peer (``benches/peer_pg.py``) talk plaintext over loopback
    unless a bench says otherwise (``bench_pg_cycle_fencepost_tls`` measures TLS)."""
    return url + ("&" if "?" in url else "?") + "sslmode=disable"


def label(benchmark: Any, group: str, name: str, ops: int) -> None:
    """Group a benchmark and record its implementation and operations per round (ratios.py
    divides by ``ops``)."""
    benchmark.group = group
    benchmark.extra_info.update(impl=name, ops=ops)

"""Fixtures for the pytest-benchmark suites (run: bash scripts/bench)."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("FENCEPOST_SHARED", REPO.parent / "shared"))
REFERENCE = SHARED / "reference"
if not (REFERENCE / "bench.py").is_file():
    raise RuntimeError(f"shared/reference not found at {REFERENCE}; set FENCEPOST_SHARED")
sys.path.insert(0, str(REFERENCE))

from bench import nested_doc  # noqa: E402 - needs the path above


@pytest.fixture(scope="session", params=[2048, 100 * 1024], ids=["2KB", "100KB"])
def document(request: pytest.FixtureRequest) -> Any:
    """The reference benchmark's workflow-definition-like documents (seed 7, as bench.py)."""
    return nested_doc(request.param, 7)


@pytest.fixture(params=["fencepost", "reference", "fencepost-postgres"])
def impl(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[tuple[str, Any, Any]]:
    """(name, module, handle): fencepost through benches/ref_adapter.py on a fresh SQLite file
    or a fresh PostgreSQL schema, or the reference ledger on its own file; all expose
    shared/reference/ref_ledger.py's names, so the same loops time all three."""
    import ref_ledger
    from tests.conftest import pg_schema

    from benches import ref_adapter

    name = request.param
    module: Any = ref_ledger if name == "reference" else ref_adapter
    if name == "fencepost-postgres":
        with pg_schema() as url:
            handle = module.connect(plaintext(url))
            yield name, module, handle
            module.close(handle)
        return
    handle = module.connect(str(tmp_path / f"{name}.db"))
    yield name, module, handle
    module.close(handle)


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

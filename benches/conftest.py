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


@pytest.fixture(params=["fencepost", "reference"])
def impl(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[tuple[str, Any, Any]]:
    """(name, module, handle): fencepost through benches/ref_adapter.py, or the reference
    ledger, each on its own fresh file; both expose shared/reference/ref_ledger.py's names."""
    import ref_ledger

    from benches import ref_adapter

    name = request.param
    module: Any = ref_adapter if name == "fencepost" else ref_ledger
    handle = module.connect(str(tmp_path / f"{name}.db"))
    yield name, module, handle
    module.close(handle)


def label(benchmark: Any, group: str, name: str, ops: int) -> None:
    """Group a benchmark and record its implementation and operations per round (ratios.py
    divides by ``ops``)."""
    benchmark.group = group
    benchmark.extra_info.update(impl=name, ops=ops)

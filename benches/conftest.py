"""Fixtures for the pytest-benchmark suites (run: bash scripts/bench)."""

from __future__ import annotations

import os
import pathlib
import sys
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

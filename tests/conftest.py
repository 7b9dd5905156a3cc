"""Shared fixtures and settings for the fencepost test suite."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

REPO = pathlib.Path(__file__).resolve().parents[1]


def shared_dir() -> pathlib.Path:
    """The project's shared/ folder: a sibling of the checkout, or $FENCEPOST_SHARED.

    It holds the RFC 8785 vectors and the reference ledger. Missing it is a set-up error, not a
    reason to skip: the vectors are part of the contract.
    """
    path = pathlib.Path(os.environ.get("FENCEPOST_SHARED", REPO.parent / "shared"))
    if not (path / "vectors" / "jcs").is_dir():
        raise RuntimeError(
            f"shared/ not found at {path}; clone the repo next to shared/ or set FENCEPOST_SHARED"
        )
    return path


# Hypothesis profiles: "ci" (default) is thorough and deterministic, "dev" is quick.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("FENCEPOST_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def jcs_dir() -> pathlib.Path:
    return shared_dir() / "vectors" / "jcs"


class FakeClock:
    """An injectable clock (DESIGN §2: `Ledger.open(..., clock=...)`): epoch ms, moved by hand."""

    def __init__(self, start_ms: int = 1_764_720_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["file", "memory"])
def ledger(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, clock: FakeClock
) -> Iterator[Any]:
    """A fresh ledger on each backend, with the injected clock."""
    import fencepost as fp

    target = str(tmp_path / "ledger.db") if request.param == "file" else ":memory:"
    with fp.Ledger.open(target, clock=clock) as opened:
        yield opened


STEPS = [
    {"id": "plan", "title": "Plan", "instructions": "Write the plan"},
    {"id": "build", "title": "Build", "instructions": "Build it", "completion": {"kind": "auto"}},
    {"id": "ship", "title": "Ship"},
]


@contextlib.contextmanager
def raw_db(path: str | os.PathLike[str]) -> Iterator[sqlite3.Connection]:
    """Python's own sqlite3 on a ledger file, for reading behind the API's back: committed and
    *closed* on exit. A connection of a second SQLite library left open in this process would
    see the file through stale shared-memory state once fencepost closes it (POSIX locks are
    per process, so fencepost's last connection cannot see it and removes the -wal/-shm files).
    """
    db = sqlite3.connect(path)
    try:
        yield db
        db.commit()
    finally:
        db.close()

"""Shared fixtures and settings for the fencepost test suite."""

from __future__ import annotations

import os
import pathlib

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

"""fencepost: a durable run ledger for workflow orchestrators and high-fanout dispatchers.

The hot path is Rust (``fencepost._core``); this package is its typed facade.
"""

from __future__ import annotations

from fencepost import errors
from fencepost._core import MAX_DEPTH, __version__, canonical_json, digest
from fencepost.errors import (
    ActiveRunExists,
    AmbiguousRunId,
    CanonicalJsonError,
    ContinuationRefused,
    InvalidArgument,
    LeaseLost,
    LedgerError,
    NotFound,
    PreparationConflict,
    RunNotActive,
    RunNotFound,
    SchemaError,
    StoreBusy,
    StoreError,
)

__all__ = [
    "MAX_DEPTH",
    "ActiveRunExists",
    "AmbiguousRunId",
    "CanonicalJsonError",
    "ContinuationRefused",
    "InvalidArgument",
    "LeaseLost",
    "LedgerError",
    "NotFound",
    "PreparationConflict",
    "RunNotActive",
    "RunNotFound",
    "SchemaError",
    "StoreBusy",
    "StoreError",
    "__version__",
    "canonical_json",
    "digest",
    "errors",
]

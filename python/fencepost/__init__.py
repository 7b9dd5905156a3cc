"""fencepost: a durable run ledger for workflow orchestrators and high-fanout dispatchers.

The hot path is Rust (``fencepost._core``); this package is its typed facade.
"""

from __future__ import annotations

from fencepost import errors, models
from fencepost._core import MAX_DEPTH, SCHEMA_VERSION, __version__, canonical_json, digest
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
from fencepost.ledger import ALL_SCOPES, Ledger
from fencepost.models import (
    Accounting,
    Attempt,
    Claim,
    Event,
    Lease,
    Preparation,
    Reservation,
    Run,
    Step,
    Unit,
)

__all__ = [
    "ALL_SCOPES",
    "MAX_DEPTH",
    "SCHEMA_VERSION",
    "Accounting",
    "ActiveRunExists",
    "AmbiguousRunId",
    "Attempt",
    "CanonicalJsonError",
    "Claim",
    "ContinuationRefused",
    "Event",
    "InvalidArgument",
    "Lease",
    "LeaseLost",
    "Ledger",
    "LedgerError",
    "NotFound",
    "Preparation",
    "PreparationConflict",
    "Reservation",
    "Run",
    "RunNotActive",
    "RunNotFound",
    "SchemaError",
    "Step",
    "StoreBusy",
    "StoreError",
    "Unit",
    "__version__",
    "canonical_json",
    "digest",
    "errors",
    "models",
]

"""Immutable records returned by the ledger (DESIGN §8 "Attributes").

Timestamps are stored as integer epoch milliseconds and returned as timezone-aware UTC
``datetime`` values; JSON fields (``params``, ``outputs``, ``result``, ``payload``) are returned
decoded, never as digests.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, overload

__all__ = [
    "Accounting",
    "Attempt",
    "Claim",
    "Event",
    "Lease",
    "Preparation",
    "Reservation",
    "Run",
    "Step",
    "Unit",
    "from_ms",
    "to_ms",
]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


@overload
def from_ms(ms: int) -> _dt.datetime: ...
@overload
def from_ms(ms: None) -> None: ...
@overload
def from_ms(ms: int | None) -> _dt.datetime | None: ...
def from_ms(ms: int | None) -> _dt.datetime | None:
    """Epoch milliseconds -> aware UTC datetime (exact: no float rounding)."""
    return None if ms is None else _EPOCH + _dt.timedelta(milliseconds=ms)


def to_ms(value: _dt.datetime) -> int:
    """Aware datetime -> epoch milliseconds (naive datetimes are refused by the callers)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


@dataclass(frozen=True, slots=True)
class Run:
    """One workflow run (DESIGN §2 ``runs``)."""

    run_id: str
    workflow_ref: str
    workflow_name: str
    scope_key: str | None
    status: str
    current_step_id: str | None
    parent_run_id: str | None
    parent_unit_id: str | None
    invocation_key: str | None
    origin_session_id: str | None
    params: Any
    outputs: Any
    revision: int
    created_at: _dt.datetime
    updated_at: _dt.datetime
    completed_at: _dt.datetime | None


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a run, in plan order."""

    run_id: str
    step_id: str
    title: str
    instructions: str
    sequence_index: int
    status: str
    notes: str | None
    evidence: Any
    summary: str | None
    completed_at: _dt.datetime | None


@dataclass(frozen=True, slots=True)
class Unit:
    """The current projection of a unit: its latest attempt's state."""

    run_id: str
    unit_id: str
    step_id: str | None
    phase: str
    status: str
    attempts: int
    result: Any
    tokens: int | None
    failure_reason: str | None
    claim_holder: str | None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One dispatch attempt of a unit (append-only history)."""

    run_id: str
    unit_id: str
    attempt: int
    dispatch_id: str
    status: str
    phase: str
    holder: str | None
    lease_generation: int | None
    reclaims: int
    result: Any
    tokens: int | None
    failure_reason: str | None
    started_at: _dt.datetime
    finished_at: _dt.datetime | None


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``reserve_attempt`` hands the dispatcher: ``kind`` is "reserved" or "reclaimed"."""

    run_id: str
    unit_id: str
    kind: str
    attempt: int
    dispatch_id: str
    reclaims: int
    lease_generation: int | None


@dataclass(frozen=True, slots=True)
class Accounting:
    """Attempt and token totals of a run, split by phase (``unit`` = dispatch, ``gate``)."""

    total_attempts: int
    total_tokens: int
    dispatch_attempts: int
    dispatch_tokens: int
    gate_attempts: int
    gate_tokens: int


@dataclass(frozen=True, slots=True)
class Claim:
    """A live claim on a run: ``token`` is the secret (only its SHA-256 is stored), so it is
    left out of ``repr()``: logging a claim (or a ``Preparation`` holding one) must not leak
    it. The attribute itself is there to use."""

    run_id: str
    generation: int
    token: str = field(repr=False)
    owner_id: str
    expires_at: _dt.datetime


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease row of a run; generation 0 and no owner until first claimed."""

    run_id: str
    generation: int
    owner_id: str | None
    owner_type: str | None
    expires_at: _dt.datetime | None
    heartbeat_at: _dt.datetime | None


@dataclass(frozen=True, slots=True)
class Preparation:
    """``prepare_or_adopt``'s answer: ``state`` "claimed" (with ``claim``) or "adopted"."""

    state: str
    run: Run
    claim: Claim | None


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the append-only event log."""

    seq: int
    resource_id: str
    revision: int
    type: str
    actor_type: str | None
    actor_id: str | None
    generation: int | None
    payload: Any
    ts: _dt.datetime

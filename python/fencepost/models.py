"""Immutable records returned by the ledger.

The compiled core builds these records by name (``rust/py/records.rs``): it sets each field
the way a frozen dataclass's ``__init__`` does (``object.__setattr__``), without running
``__init__``. A field's name here is the whole contract between the two, with no positional
order to keep in step; the classes must stay plain slotted dataclasses (no ``__post_init__``),
which the core checks on first use.

Timestamps are stored as integer epoch milliseconds and returned as timezone-aware UTC
``datetime`` values; JSON fields (``params``, ``outputs``, ``evidence``, ``result``,
``payload``) are returned decoded, never as digests.

Statuses are ``Literal`` types naming every value the ledger writes, so a type checker catches
a misspelt status and narrows on a comparison.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, overload

if TYPE_CHECKING:
    # A TypeVar default (PEP 696) lets a bare ``Preparation`` annotation mean "either state".
    # Type checkers read it from typing_extensions; at run time (Python 3.11 has no TypeVar
    # defaults, and the package has no dependencies) only type checkers need the default, so
    # it is dropped.
    from typing_extensions import TypeVar
else:
    import typing

    def TypeVar(name: str, *, default: object = None, **kwargs: Any) -> Any:
        return typing.TypeVar(name, **kwargs)


__all__ = [
    "Accounting",
    "AdoptedPreparation",
    "Attempt",
    "AttemptStatus",
    "ChildSummary",
    "Claim",
    "ClaimedPreparation",
    "Event",
    "EventCounts",
    "KeyUsage",
    "Lease",
    "Message",
    "Overlap",
    "PausedWorkflow",
    "Preparation",
    "PreparationState",
    "PruneReport",
    "QueueOverview",
    "Reservation",
    "ReservationKind",
    "Run",
    "RunStatus",
    "Schedule",
    "Step",
    "StepStatus",
    "Unit",
    "UnitStatus",
    "from_ms",
    "to_ms",
]

RunStatus: TypeAlias = Literal[
    "queued", "starting", "active", "blocked", "parked", "completed", "failed", "cancelled"
]
"""A run's place in its lifecycle: ``queued -> starting -> active <-> blocked``, ``active ->
parked -> completed`` (waiting for a continuation), ``active -> completed | failed``, and any
non-terminal status -> ``cancelled`` or ``failed``. Terminal: completed, failed, cancelled."""

StepStatus: TypeAlias = Literal["pending", "active", "completed", "blocked", "failed", "skipped"]
"""A step's status: ``pending`` until it is the current step, then ``active``."""

AttemptStatus: TypeAlias = Literal["running", "completed", "failed", "cancelled", "timed_out"]
"""An attempt is ``running`` until finished with one of the four terminal statuses."""

UnitStatus: TypeAlias = Literal[
    "running", "completed", "failed", "cancelled", "timed_out", "exhausted"
]
"""A unit's status is its latest attempt's, except ``exhausted``: the latest attempt failed or
timed out and was the last its retry policy allows."""

ReservationKind: TypeAlias = Literal["reserved", "reclaimed"]
"""``reserved``: a new attempt; ``reclaimed``: the running latest attempt, taken over in place."""

PreparationState: TypeAlias = Literal["claimed", "adopted"]
"""``claimed``: the run was reserved and claimed by this call; ``adopted``: it existed already."""

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
    """One workflow run."""

    run_id: str
    workflow_ref: str
    workflow_name: str
    scope_key: str | None
    status: RunStatus
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
    # Scheduling, set by reserve_run / prepare_or_adopt (see claim_next).
    not_before: _dt.datetime | None = None
    priority: int = 0
    concurrency_key: str | None = None

    @property
    def due_at(self) -> _dt.datetime:
        """When ``claim_next`` counts the run due, and orders it by: ``not_before``, else
        the time it was queued."""
        return self.not_before if self.not_before is not None else self.created_at


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a run, in plan order."""

    run_id: str
    step_id: str
    title: str
    instructions: str
    sequence_index: int
    status: StepStatus
    notes: str | None
    evidence: Any
    summary: str | None
    completed_at: _dt.datetime | None


@dataclass(frozen=True, slots=True)
class ChildSummary:
    """A parent's children counted by status (``Ledger.child_summary``). ``settled``: none of
    them is still live (or there are none), which is when ``children.settled`` is written."""

    total: int
    by_status: dict[str, int]
    settled: bool


@dataclass(frozen=True, slots=True)
class Unit:
    """The current projection of a unit: its latest attempt's state."""

    run_id: str
    unit_id: str
    step_id: str | None
    phase: str
    status: UnitStatus
    attempts: int
    result: Any
    tokens: int | None
    failure_reason: str | None
    claim_holder: str | None
    retry_at: _dt.datetime | None = None
    """When a failed unit may be reserved again under its retry policy; ``None`` unless it
    waits for a retry (``due_units`` lists those whose time has come)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One dispatch attempt of a unit (append-only history)."""

    run_id: str
    unit_id: str
    attempt: int
    dispatch_id: str
    status: AttemptStatus
    phase: str
    holder: str | None
    lease_generation: int | None
    reclaims: int
    result: Any
    tokens: int | None
    failure_reason: str | None
    started_at: _dt.datetime
    finished_at: _dt.datetime | None
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``reserve_attempt`` hands the dispatcher: ``kind`` is "reserved" or "reclaimed"."""

    run_id: str
    unit_id: str
    kind: ReservationKind
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
    it. The attribute itself is there to use.

    ``taken_from`` names the owner whose expired claim this one took over (a takeover); it is
    ``None`` when the lease had no owner or was this runner's own, and on the claims
    ``heartbeat`` returns."""

    run_id: str
    generation: int
    token: str = field(repr=False)
    owner_id: str
    expires_at: _dt.datetime
    taken_from: str | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease row of a run; generation 0 and no owner until first claimed.

    What the fence did on it: ``takeovers`` counts the claims that took the lease from another
    owner whose claim had expired, ``refused_writes`` the fenced writes it refused because
    their claim no longer held it (stale owners, released or superseded claims, wrong tokens).
    """

    run_id: str
    generation: int
    owner_id: str | None
    owner_type: str | None
    expires_at: _dt.datetime | None
    heartbeat_at: _dt.datetime | None
    takeovers: int = 0
    refused_writes: int = 0


_State = TypeVar("_State", bound=PreparationState, default=PreparationState, covariant=True)
_Claim = TypeVar("_Claim", bound="Claim | None", default="Claim | None", covariant=True)


@dataclass(frozen=True, slots=True)
class Preparation(Generic[_State, _Claim]):
    """``prepare_or_adopt``'s answer: ``state`` "claimed" (with ``claim``) or "adopted" (``claim``
    is ``None``).

    ``prepare_or_adopt`` is typed to return ``ClaimedPreparation | AdoptedPreparation``, so
    checking ``state`` narrows ``claim``::

        prep = ledger.prepare_or_adopt(run_id, ...)
        if prep.state == "claimed":
            token = prep.claim.token  # a Claim here, never None
    """

    state: _State
    run: Run
    claim: _Claim


ClaimedPreparation: TypeAlias = Preparation[Literal["claimed"], Claim]
"""A ``Preparation`` that reserved and claimed the run: ``claim`` is the new claim."""

AdoptedPreparation: TypeAlias = Preparation[Literal["adopted"], None]
"""A ``Preparation`` that found the run already there, with the same inputs: no claim."""


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


@dataclass(frozen=True, slots=True)
class Message:
    """A message sent to a run (``Ledger.send``). ``seq`` numbers the run's messages from 1 in
    the order sent; ``key`` is the sender's idempotency key. ``consumed_at`` is when a
    ``receive`` took it (``None`` while it waits), under the lease generation
    ``consumed_generation``."""

    seq: int
    run_id: str
    topic: str
    key: str | None
    payload: Any
    sent_at: _dt.datetime
    consumed_at: _dt.datetime | None
    consumed_generation: int | None


Overlap: TypeAlias = Literal["skip", "allow"]
"""What a schedule's fire does while its last fired run has not ended."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron schedule (``Ledger.put_schedule``). ``template`` holds the ``reserve_run``
    keywords each fire queues its run with (all of them, defaults filled in); ``next_slot`` is
    the first slot not fired yet (``None`` if the cron has none left), ``last_slot`` the newest
    fired, ``last_run_id`` the run of the newest fire that queued one and ``last_run_status``
    its status, read with the schedule (``None`` once that run is pruned). ``paused``
    schedules are passed over by ``tick_schedules``."""

    name: str
    cron: str
    workflow_name: str
    timezone: str
    overlap: Overlap
    catch_up: int
    template: dict[str, Any]
    paused: bool
    next_slot: _dt.datetime | None
    last_slot: _dt.datetime | None
    last_run_id: str | None
    last_run_status: RunStatus | None
    created_at: _dt.datetime
    updated_at: _dt.datetime


@dataclass(frozen=True, slots=True)
class EventCounts:
    """Events per minute (``Ledger.event_counts``): ``minutes`` holds each minute's start and
    how many events were written in it, oldest first. ``exact``: counted event by event (a
    range of at most 5 000 events); otherwise counted by position in the log, to within a
    fraction of a percent of the average minute."""

    minutes: list[tuple[_dt.datetime, int]]
    exact: bool

    @property
    def total(self) -> int:
        """Every minute's events together."""
        return sum(count for _, count in self.minutes)


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """A concurrency key that has a limit: ``live`` counts its runs holding live leases now,
    ``queued`` its queued runs, due or not (counted up to ``QueueOverview.count_max``)."""

    concurrency_key: str
    limit: int
    live: int
    queued: int


@dataclass(frozen=True, slots=True)
class PausedWorkflow:
    """A paused workflow: when it was paused, and its queued runs (all of them held while it is
    paused; counted up to ``QueueOverview.count_max``)."""

    workflow_name: str
    paused_at: _dt.datetime
    queued: int


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """The queue at a glance (``Ledger.queue_overview``), read in one transaction.

    ``due`` counts the runs ``claim_next`` may take now (no key limit, workflow not paused);
    ``keyed`` the due runs of keys with a limit (claimed while their key has room); ``later``
    the runs not yet due (as the last claim saw them). Each count stops at ``count_max``: a
    count equal to it means that many or more. ``keys`` are the keys with a limit, in key
    order, and ``paused`` the paused workflows, by name; each list holds at most the
    overview's ``limit``."""

    due: int
    keyed: int
    later: int
    keys: list[KeyUsage]
    paused: list[PausedWorkflow]
    count_max: int


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What ``Ledger.prune`` removed (on a dry run: what it would remove).

    ``runs`` counts children too; ``blobs`` counts the blobs no remaining run or definition
    referred to (a dry run counts them batch by batch, so a blob shared by runs of two batches
    is not counted there). ``archived_bytes`` is what the archive received (on a dry run with an
    archive: what it would receive). ``reclaimed_bytes`` is what a SQLite file with incremental
    auto-vacuum gave back to the file system afterwards (0 on PostgreSQL, on a dry run and on
    an older file; see ``Ledger.vacuum``). ``transactions`` and ``longest_transaction_ms`` say
    how the work was split: each batch of whole trees, and each step of giving pages back, is
    one transaction, sized to stay short."""

    runs: int
    attempts: int
    events: int
    blobs: int
    archived_bytes: int
    dry_run: bool
    reclaimed_bytes: int = 0
    transactions: int = 0
    longest_transaction_ms: float = 0.0

"""The fencepost exception hierarchy.

Every error derives from :class:`LedgerError`, carries its structured fields as attributes and
a ``message`` that says what to do next. The Rust core raises these classes by calling them with
keyword fields, so the text of every message lives here, in one place.

Instances pickle across processes (``multiprocessing`` workers re-raise them intact): the base
exception pickles ``args`` (the message) and ``__dict__`` (the fields), and every field has a
default, so ``cls(message)`` followed by restoring ``__dict__`` rebuilds the same error.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Literal

__all__ = [
    "ActiveRunExists",
    "AmbiguousRunId",
    "CanonicalJsonError",
    "ContinuationRefused",
    "InvalidArgument",
    "LeaseLost",
    "LedgerError",
    "NotFound",
    "PreparationConflict",
    "RetryNotDue",
    "RunNotActive",
    "RunNotFound",
    "SchemaError",
    "StoreBusy",
    "StoreError",
    "UnitExhausted",
]


class LedgerError(Exception):
    """Root of every fencepost error. ``message`` says what happened and what to do next."""

    message: str

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class StoreError(LedgerError):
    """The database could not be used: not a fencepost/SQLite database, unreadable, or an
    unexpected database failure. ``operation`` names what fencepost was doing."""

    def __init__(self, message: str | None = None, *, operation: str = "") -> None:
        self.operation = operation
        super().__init__(
            message or f"the database failed while {operation or 'working'}; run `fencepost doctor`"
        )


class NotFound(LedgerError, LookupError):
    """Something looked up by key does not exist (``kind`` is e.g. ``"blob"``)."""

    def __init__(self, message: str | None = None, *, kind: str = "", key: str = "") -> None:
        self.kind = kind
        self.key = key
        super().__init__(
            message
            or f"no {kind or 'record'} {key!r}; check the key (it may never have been stored)"
        )


class RunNotFound(NotFound):
    """No run has this id (or prefix)."""

    def __init__(self, message: str | None = None, *, run_id: str = "") -> None:
        self.run_id = run_id
        super().__init__(
            message
            or f"run {run_id!r} not found; list runs with `fencepost runs` or ledger.list_runs()",
            kind="run",
            key=run_id,
        )


class AmbiguousRunId(LedgerError, LookupError):
    """A run id prefix matches more than one run; ``matches`` lists them."""

    def __init__(
        self, message: str | None = None, *, prefix: str = "", matches: Sequence[str] = ()
    ) -> None:
        self.prefix = prefix
        self.matches = list(matches)
        super().__init__(
            message
            or f"run id prefix {prefix!r} is ambiguous; it matches {', '.join(self.matches)}. "
            "Give more characters."
        )


class InvalidArgument(LedgerError, ValueError):
    """An argument is malformed or not allowed; ``argument`` names it."""

    def __init__(self, message: str | None = None, *, argument: str = "") -> None:
        self.argument = argument
        super().__init__(message or f"invalid value for {argument!r}; see the API docs")


class CanonicalJsonError(InvalidArgument):
    """A value cannot be written as RFC 8785 canonical JSON. ``path`` locates the offending
    value (``$.a[3].b``) inside the argument, ``reason`` says what is wrong with it."""

    def __init__(
        self,
        message: str | None = None,
        *,
        argument: str = "value",
        path: str = "$",
        reason: str = "",
    ) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            message or f"{argument} is not canonical JSON at {path}: {reason}",
            argument=argument,
        )


class ActiveRunExists(LedgerError):
    """The scope guard refused a second active top-level run in ``scope_key``."""

    def __init__(
        self, message: str | None = None, *, scope_key: str = "", occupant_run_id: str = ""
    ) -> None:
        self.scope_key = scope_key
        self.occupant_run_id = occupant_run_id
        super().__init__(
            message
            or f"scope {scope_key!r} already has an active run {occupant_run_id!r}; resume it, "
            "abandon it (ledger.abandon_run), or pass force=True to start another"
        )


class RunNotActive(LedgerError):
    """The operation needs an ``active`` run; ``status`` is what the run is instead."""

    def __init__(self, message: str | None = None, *, run_id: str = "", status: str = "") -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            message
            or f"run {run_id!r} is {status}, not active; only active runs accept this "
            "(resume a blocked run with ledger.resume_run, or claim and activate a queued one)"
        )


class PreparationConflict(LedgerError):
    """prepare_or_adopt found the run with different inputs; ``fields`` names them."""

    def __init__(
        self, message: str | None = None, *, run_id: str = "", fields: Sequence[str] = ()
    ) -> None:
        self.run_id = run_id
        self.fields = list(fields)
        super().__init__(
            message
            or f"run {run_id!r} already exists with a different {', '.join(self.fields)}; "
            "use a new run id or pass the original values"
        )


class ContinuationRefused(LedgerError):
    """A continuation of ``parent_run_id`` is not allowed; ``reason`` says why."""

    def __init__(
        self, message: str | None = None, *, parent_run_id: str = "", reason: str = ""
    ) -> None:
        self.parent_run_id = parent_run_id
        self.reason = reason
        super().__init__(message or f"cannot continue run {parent_run_id!r}: {reason}")


LostReason = Literal["superseded", "expired", "released", "token"]
"""Why a claim no longer holds its run's lease (``LeaseLost.reason``)."""


class LeaseLost(LedgerError):
    """A fenced write used a claim that no longer holds the run's lease; nothing was written.

    ``reason`` says what happened: ``"superseded"`` (another claim took generation
    ``actual_generation``), ``"expired"`` (no heartbeat in time; nobody has claimed the run
    since), ``"released"`` (the claim was given up with ``release``) or ``"token"`` (the token
    is not the one ``claim`` returned for this generation)."""

    def __init__(
        self,
        message: str | None = None,
        *,
        run_id: str = "",
        expected_generation: int = 0,
        actual_generation: int = 0,
        reason: LostReason = "superseded",
    ) -> None:
        self.run_id = run_id
        self.expected_generation = expected_generation
        self.actual_generation = actual_generation
        self.reason: LostReason = reason
        super().__init__(
            message or _lost_message(run_id, expected_generation, actual_generation, reason)
        )


def _lost_message(run_id: str, expected: int, actual: int, reason: str) -> str:
    lead = f"lease on run {run_id!r} lost"
    if reason == "expired":
        return (
            f"{lead}: this claim (generation {expected}) expired without a heartbeat in time; "
            "stop working on the run, and claim it again to go on (heartbeat more often than "
            "lease_ms)"
        )
    if reason == "released":
        return (
            f"{lead}: this claim (generation {expected}) was released; claim the run again "
            "before writing to it"
        )
    if reason == "token":
        return (
            f"{lead}: the token is not the one claim() returned for generation {expected}; pass "
            "the Claim that claim() returned"
        )
    return (
        f"{lead}: this claim holds generation {expected}, another claim took generation "
        f"{actual}; stop working on the run: its new owner carries on"
    )


class RetryNotDue(LedgerError):
    """A reservation came before the failed unit's ``retry_at``; nothing was written. Reserve
    again from ``retry_at`` on (``due_units`` lists the units that are due), or pass
    ``force=True`` to reserve now."""

    def __init__(
        self,
        message: str | None = None,
        *,
        run_id: str = "",
        unit_id: str = "",
        retry_at: _dt.datetime | None = None,
    ) -> None:
        self.run_id = run_id
        self.unit_id = unit_id
        self.retry_at = retry_at
        when = retry_at.isoformat() if retry_at is not None else "its retry time"
        super().__init__(
            message
            or f"unit {unit_id!r} of run {run_id!r} failed and may be retried from {when}; "
            "reserve it then, or pass force=True to reserve it now"
        )


class UnitExhausted(LedgerError):
    """A reservation named a unit that has used every attempt its retry policy allows; nothing
    was written. ``retry_units`` gives it one more attempt."""

    def __init__(
        self, message: str | None = None, *, run_id: str = "", unit_id: str = "", attempts: int = 0
    ) -> None:
        self.run_id = run_id
        self.unit_id = unit_id
        self.attempts = attempts
        super().__init__(
            message
            or f"unit {unit_id!r} of run {run_id!r} is exhausted after {attempts} attempts; "
            "ledger.retry_units(run_id, [unit_id]) gives it one more, force=True does not"
        )


class StoreBusy(LedgerError, TimeoutError):
    """The database stayed locked past the busy timeout and every retry."""

    def __init__(self, message: str | None = None, *, waited_ms: int = 0, retries: int = 0) -> None:
        self.waited_ms = waited_ms
        self.retries = retries
        super().__init__(
            message
            or f"the database stayed locked for {waited_ms} ms over {retries} retries; "
            "retry later or raise busy_timeout_ms"
        )


class SchemaError(LedgerError):
    """The database was written by a newer fencepost than this one."""

    def __init__(
        self,
        message: str | None = None,
        *,
        database_version: int = 0,
        library_version: int = 0,
    ) -> None:
        self.database_version = database_version
        self.library_version = library_version
        super().__init__(
            message
            or f"the database schema is version {database_version}, this fencepost supports up "
            f"to {library_version}; upgrade fencepost (schemas only move forward)"
        )

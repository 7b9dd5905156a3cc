"""The typed ``Ledger`` facade over the Rust core.

The facade holds the public signatures (keyword names, defaults, docstrings) and shapes a few
arguments (target parsing, one ``str`` or an iterable as a list); it forwards everything else
by name: a method with many keywords passes them as one dict, which ``_core.pyi`` types key by
key. Every operation runs in Rust as one transaction with the GIL released, and the core
returns the models of :mod:`fencepost.models` ready-made.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal, cast

from fencepost import _archive, _core, _hooks, _observe
from fencepost.errors import InvalidArgument
from fencepost.models import (
    Accounting,
    AdoptedPreparation,
    Attempt,
    AttemptStatus,
    ChildSummary,
    Claim,
    ClaimedPreparation,
    Event,
    EventCounts,
    KeyUsage,
    Lease,
    Message,
    Overlap,
    PausedWorkflow,
    PruneReport,
    QueueOverview,
    Reservation,
    Run,
    RunStatus,
    Schedule,
    Step,
    StepStatus,
    Unit,
    UnitStatus,
    from_ms,
    to_ms,
)

__all__ = ["ALL_SCOPES", "Ledger", "redact_target"]


class _AllScopes:
    """The type of :data:`ALL_SCOPES`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "fencepost.ALL_SCOPES"


ALL_SCOPES: Final = _AllScopes()
"""Sentinel for ``list_runs(scope_key=ALL_SCOPES)``: every scope (``None`` means "no scope")."""

Durability = Literal["normal", "full"]


def _refs(value: str | Iterable[str] | None, argument: str) -> list[str] | None:
    """One str or an iterable of them as a list (the core checks each item's content).

    Every argument that takes names (refs, statuses, event types) comes through here, so each
    item is checked to be a str here too: bytes are iterable, and ``list(b"ab")`` is a list of
    ints, which the core could only call "not a str" with no word of the bytes given."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    expected = f"{argument} must be a str or an iterable of str"
    if isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(
            f"{expected}, not {type(value).__name__}: decode it first", argument=argument
        )
    try:
        items = list(value)
    except TypeError:
        raise InvalidArgument(
            f"{expected}, not {type(value).__name__}", argument=argument
        ) from None
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidArgument(
                f"{expected}; item {index} is of type {type(item).__name__}", argument=argument
            )
    return items


def _after_run(after: object) -> tuple[int, int, str] | None:
    """``list_runs``' cursor: the position (updated, created, run id) of the ``Run`` given."""
    if after is None:
        return None
    what = "after must be the last Run of the page before"
    if not isinstance(after, Run):
        raise InvalidArgument(f"{what}, not {type(after).__name__}", argument="after")
    for field in ("updated_at", "created_at"):
        value = getattr(after, field)
        if not isinstance(value, _dt.datetime) or value.utcoffset() is None:
            shown = "a naive datetime" if isinstance(value, _dt.datetime) else repr(value)
            raise InvalidArgument(
                f"{what}: its {field} is {shown}, not an aware datetime; pass a Run the "
                "ledger returned (its times are UTC)",
                argument="after",
            )
    if not isinstance(after.run_id, str):
        raise InvalidArgument(
            f"{what}: its run_id is of type {type(after.run_id).__name__}, not str",
            argument="after",
        )
    return to_ms(after.updated_at), to_ms(after.created_at), after.run_id


def _aware(value: object, argument: str) -> _dt.datetime:
    """``value`` if it is an aware datetime; ``InvalidArgument`` naming ``argument`` if not."""
    if not isinstance(value, _dt.datetime) or value.utcoffset() is None:
        raise InvalidArgument(
            f"must be an aware datetime (datetime.now(UTC)), not {value!r}", argument=argument
        )
    return value


def _not_before(not_before: object) -> tuple[int | None, int | None]:
    """``(at_ms, after_ms)`` of ``not_before``: an aware datetime is an instant, a timedelta a
    delay read against the ledger's clock when the run is queued (the core refuses a negative
    one)."""
    if not_before is None:
        return None, None
    if isinstance(not_before, _dt.datetime):
        if not_before.utcoffset() is None:
            raise InvalidArgument(
                "not_before is a naive datetime, which names no instant; pass an aware one "
                "(datetime.now(UTC) + timedelta(minutes=5)) or a timedelta",
                argument="not_before",
            )
        return to_ms(not_before), None
    if isinstance(not_before, _dt.timedelta):
        return None, not_before // _dt.timedelta(milliseconds=1)
    raise InvalidArgument(
        f"not_before must be an aware datetime (an instant) or a timedelta (a delay), not "
        f"{type(not_before).__name__}",
        argument="not_before",
    )


def _unit_cursor(after: object) -> Unit:
    """``after=`` of a unit page: a ``Unit`` of the page before."""
    if not isinstance(after, Unit):
        raise InvalidArgument(
            f"after must be a Unit from the page before, not {type(after).__name__}",
            argument="after",
        )
    return after


def _queued_run(run_id: str, fields: dict[str, Any]) -> _core._QueuedRun:
    """The core's keywords of ``reserve_run`` and ``prepare_or_adopt``."""
    at_ms, after_ms = _not_before(fields.pop("not_before"))
    return cast(
        "_core._QueuedRun",
        {"run_id": run_id, **fields, "not_before_ms": at_ms, "not_before_after_ms": after_ms},
    )


_TEMPLATE_KEYS = (
    "workflow_ref", "source", "definition_digest", "definition", "input", "launch_options",
    "runner_id", "origin_session_id", "priority", "concurrency_key", "retry",
)  # fmt: skip
"""The ``reserve_run`` keywords a schedule's template holds."""
_TEMPLATE_REQUIRED = _TEMPLATE_KEYS[:4] + _TEMPLATE_KEYS[6:8]


def _schedule_template(workflow_name: str, template: Mapping[str, Any]) -> _core._QueuedRun:
    """The core's ``reserve_run`` keywords of a schedule's fires (the run id a placeholder);
    ``InvalidArgument`` naming ``template`` for a key it may not or must hold."""
    if not isinstance(template, Mapping):
        raise InvalidArgument(
            f"must be a mapping of reserve_run keywords, not {type(template).__name__}",
            argument="template",
        )
    own = {"run_id", "workflow_name", "not_before"}
    for key in template:
        if key in own:
            raise InvalidArgument(
                f"{key!r} is the schedule's own (each fire sets it); leave it out",
                argument="template",
            )
        if key not in _TEMPLATE_KEYS:
            raise InvalidArgument(
                f"{key!r} is not a reserve_run keyword a schedule takes; use "
                + ", ".join(_TEMPLATE_KEYS),
                argument="template",
            )
    missing = [k for k in _TEMPLATE_REQUIRED if k not in template]
    if missing:
        raise InvalidArgument(f"needs {', '.join(missing)}", argument="template")
    fields: dict[str, Any] = {
        "input": None, "launch_options": None, "priority": 0, "concurrency_key": None,
        "retry": None, **template, "workflow_name": workflow_name, "parent_run_id": None,
        "not_before": None,
    }  # fmt: skip
    return _queued_run("schedule", fields)


def redact_target(target: str) -> str:
    """``target`` fit to show: a PostgreSQL URL's password (in the user part or a
    ``password=`` query parameter) becomes ``***``; paths are returned as they are."""
    if not target.startswith(("postgresql://", "postgres://")):
        return target
    scheme, rest = target.split("://", 1)
    base, sep, query = rest.partition("?")
    authority, slash, path = base.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    pairs = [
        "password=***" if pair.split("=", 1)[0].lower() == "password" else pair
        for pair in query.split("&")
    ]
    return f"{scheme}://{userinfo}{at}{hostport}{slash}{path}{sep}{'&'.join(pairs)}"


_TARGET_FORMS = "a path, 'sqlite:///path', ':memory:' or 'postgresql://user@host:port/db'"
"""The targets ``Ledger.open`` takes, as its errors name them."""

# The start of a URL of a scheme this library reads, written almost right (one slash, no
# colon): read as a path it would create a file with the URL's name instead of connecting.
_MISTYPED_URL = re.compile(r"(?i)(postgres(?:ql)?|sqlite)(:|//)")


def _parse_target(target: object) -> tuple[str | None, str | None]:
    """A path, ``sqlite:///path`` (SQLAlchemy style: ``sqlite:////abs/path``), ``:memory:`` or
    ``postgresql://user@host:port/db[?schema=name]``; returns ``(file path, None)`` (path
    ``None`` for an in-memory database) or ``(None, PostgreSQL URL)``. A target that begins
    like one of these URLs but is not one (``postgresql:/db``, ``postgres//db``,
    ``sqlite:db``) is refused rather than taken for a file name."""
    if not isinstance(target, str) or not target:
        raise InvalidArgument(
            f"target must be a non-empty str ({_TARGET_FORMS}), not {target!r}",
            argument="target",
        )
    if target.startswith("sqlite:///"):
        target = target[len("sqlite:///") :]
        if not target:
            raise InvalidArgument("target 'sqlite:///' names no file", argument="target")
    elif target.startswith(("postgresql://", "postgres://")):
        return None, target
    elif mistyped := _MISTYPED_URL.match(target):
        # Only the scheme is quoted: the rest of a mistyped URL may hold a password.
        raise InvalidArgument(
            f"target beginning {mistyped[0]!r} is not a valid URL; use {_TARGET_FORMS} "
            "('postgres://' also works)",
            argument="target",
        )
    elif "://" in target:
        scheme = target.split("://", 1)[0]
        raise InvalidArgument(
            f"unsupported target scheme {scheme!r}; use {_TARGET_FORMS}",
            argument="target",
        )
    return (None if target == ":memory:" else target), None


class Ledger:
    """A durable run ledger on one database. Safe to share between threads; each process
    opens its own. Use as a context manager, or call :meth:`close` (idempotent)."""

    __slots__ = ("_core",)

    def __init__(self, core: _core.Ledger) -> None:
        self._core = core

    @classmethod
    def open(
        cls,
        target: str = "fencepost.db",
        *,
        clock: Callable[[], int] | None = None,
        durability: Durability = "normal",
        busy_timeout_ms: int = 5000,
        create: bool = True,
        schema: str | None = None,
        group_commit: bool = True,
        listen: bool = True,
    ) -> Ledger:
        """Open (creating and migrating if needed) the ledger at ``target``.

        ``create=False`` refuses a missing file with ``StoreError`` instead of creating an
        empty ledger (inspection tools use it).

        ``clock`` returns epoch milliseconds and replaces the system clock everywhere (tests use
        it to exercise expiry without sleeping). ``durability="full"`` makes every commit
        fsync (``synchronous=FULL``); the default ``"normal"`` is WAL's crash-safe setting that
        may lose the last commits on power loss, never consistency.

        A ``postgresql://user@host:port/db`` target opens the PostgreSQL backend: the same API
        and guarantees. ``schema`` (or ``?schema=`` in the URL) picks the schema the ledger's
        tables live in (default ``public``), so tests and tenants can share one database.
        There ``durability="normal"`` is ``synchronous_commit=off`` and ``"full"`` is ``on``;
        ``busy_timeout_ms`` is the session's ``lock_timeout`` and the retry budget.

        ``group_commit`` (default on): reserves, finishes, heartbeats, claims, status moves and
        step completions made concurrently from several threads (or coroutines) on this ledger
        share one transaction (one commit, one sync), each call keeping its own outcome; a call
        returns after its group commits. ``False`` runs every call in a transaction of its own.

        ``listen`` (PostgreSQL, default on): ``wait_events`` is woken by ``LISTEN``/``NOTIFY``
        on a connection of its own, opened by the first wait, and sends nothing while idle.
        ``False`` makes it poll instead, for a server reached through a pooler in transaction
        mode, which cannot keep a ``LISTEN``. Commits announce themselves either way.
        """
        path, url = _parse_target(target)
        if schema is not None and not isinstance(schema, str):
            raise InvalidArgument(
                f"schema must be a str or None, not {schema!r}", argument="schema"
            )
        if durability not in ("normal", "full"):
            raise InvalidArgument(
                f"durability must be 'normal' or 'full', not {durability!r}",
                argument="durability",
            )
        if (
            not isinstance(busy_timeout_ms, int)
            or isinstance(busy_timeout_ms, bool)
            or not 0 <= busy_timeout_ms <= 3_600_000
        ):
            raise InvalidArgument(
                f"busy_timeout_ms must be an int from 0 to 3600000, not {busy_timeout_ms!r}",
                argument="busy_timeout_ms",
            )
        if clock is not None and not callable(clock):
            raise InvalidArgument(
                f"clock must be a callable returning epoch milliseconds, not {clock!r}",
                argument="clock",
            )
        return cls(
            _core.Ledger(
                path,
                url,
                schema,
                durability=durability,
                busy_timeout_ms=busy_timeout_ms,
                clock=clock,
                create=bool(create),
                group_commit=bool(group_commit),
                listen=bool(listen),
            )
        )

    @property
    def target(self) -> str:
        """What this ledger is open on, fit to show: the file path, ``:memory:``, or the
        PostgreSQL URL as ``postgresql://user@host:port/db?schema=name`` (never the
        password)."""
        return self._core.target()

    def __repr__(self) -> str:
        return f"<fencepost.Ledger {self.target}>"

    def close(self) -> None:
        """Close the database connection. Idempotent; later calls raise ``LedgerError``. In a
        forked child it closes nothing: the connection is the parent's."""
        self._core.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def pragmas(self) -> dict[str, Any]:
        """The connection settings read back from the database (``fencepost doctor`` shows
        them): ``journal_mode``, ``synchronous``, ``busy_timeout``, ``foreign_keys``,
        ``schema_version``, and ``tls`` (PostgreSQL: the connection's TLS version, or ``"off"``;
        SQLite: ``None``)."""
        return dict(self._core.pragmas())

    # ------------------------------------------------------------------ health

    @_hooks.operation
    def integrity_check(self, *, quick: bool = False) -> list[str]:
        """SQLite's ``PRAGMA integrity_check``: ``["ok"]`` for a sound file, else the problems.
        ``quick=True`` runs ``PRAGMA quick_check`` instead, which skips matching every index
        against its table: one pass over the file, minutes less on a large ledger. On
        PostgreSQL (which checks its own pages) both check the ledger's schema and tables."""
        return self._core.integrity_check(quick=quick)

    @_hooks.operation
    def orphan_attempts(self) -> list[tuple[str, str, int, str]]:
        """Attempts lacking their ``unit.started`` event, as (run_id, unit_id, attempt,
        dispatch_id), at most 100. Always empty for a ledger only fencepost wrote."""
        return self._core.orphan_attempts()

    # ------------------------------------------------------------------ blobs

    @_hooks.operation
    def put_json(self, value: object) -> str:
        """Store ``value`` as canonical JSON; returns its digest (idempotent)."""
        return self._core.put_json(value)

    @_hooks.operation
    def get_json(self, digest: str) -> Any:
        """The value stored under ``digest``; ``NotFound`` if there is none."""
        return json.loads(self._core.get_json(digest))

    # ------------------------------------------------------------------ runs and steps

    @_hooks.operation
    def start_run(
        self,
        workflow_ref: str,
        *,
        scope_key: str | None,
        steps: Sequence[Mapping[str, Any]],
        params: Any = None,
        plan: Any = None,
        run_id: str | None = None,
        title: str | None = None,
        guard_refs: Iterable[str] | None = None,
        force: bool = False,
        agent_harness: str | None = None,
        agent_session_id: str | None = None,
        retry: Mapping[str, Any] | None = None,
    ) -> Run:
        """Start a top-level run: run, steps, plan and ``run.started`` in one transaction.

        Unless ``force``, refuses with ``ActiveRunExists`` while another top-level run of any of
        ``guard_refs`` (default ``[workflow_ref]``) is ``active`` in ``scope_key``; the database
        enforces it, so racing processes cannot both win. ``params`` defaults to ``{}``.

        ``retry`` is the retry policy of the run's units (a step's ``"retry"`` overrides it for
        that step's units): ``{"max_attempts": int >= 1, "initial_ms": int >= 0, "factor":
        float >= 1 (2), "max_ms": int (one hour), "jitter": 0..1 (0)}``. A failed or timed-out
        finish then sets the unit's ``retry_at``, or makes it ``exhausted`` after
        ``max_attempts``; see ``docs/retries.md``.
        """
        return self._core.start_run(
            {
                "workflow_ref": workflow_ref,
                "scope_key": scope_key,
                "steps": steps,
                "params": params,
                "plan": plan,
                "run_id": run_id,
                "title": title,
                "guard_refs": _refs(guard_refs, "guard_refs"),
                "force": force,
                "agent_harness": agent_harness,
                "agent_session_id": agent_session_id,
                "retry": retry,
            },
        )

    @_hooks.operation
    def publish_child_run(
        self,
        parent_run_id: str,
        *,
        parent_unit_id: str,
        invocation_key: str,
        workflow_ref: str,
        steps: Sequence[Mapping[str, Any]],
        params: Any = None,
        plan: Any = None,
        run_id: str | None = None,
        retry: Mapping[str, Any] | None = None,
    ) -> Run:
        """Publish the child of ``parent_run_id`` for ``invocation_key``, or return the one
        already published (idempotent; concurrent publishers all get the same child).
        ``retry`` is the retry policy of the child's units, as for ``start_run``."""
        return self._core.publish_child_run(
            {
                "parent_run_id": parent_run_id,
                "parent_unit_id": parent_unit_id,
                "invocation_key": invocation_key,
                "workflow_ref": workflow_ref,
                "steps": steps,
                "params": params,
                "plan": plan,
                "run_id": run_id,
                "retry": retry,
            },
        )

    @_hooks.operation
    def get_run(self, run_id: str) -> Run | None:
        """The run, or ``None``."""
        return self._core.get_run(run_id)

    @_hooks.operation
    def resolve_run_id(self, prefix: str) -> str:
        """The one run id starting with ``prefix`` (``%``, ``_`` and ``\\`` are literal);
        ``AmbiguousRunId`` lists the matches, ``RunNotFound`` if there are none."""
        return self._core.resolve_run_id(prefix)

    @_hooks.operation
    def list_runs(
        self,
        *,
        scope_key: str | _AllScopes | None = ALL_SCOPES,
        workflow_refs: Iterable[str] | None = None,
        active_only: bool = False,
        include_children: bool = False,
        status: RunStatus | Iterable[RunStatus] | None = None,
        limit: int | None = None,
        after: Run | None = None,
        workflow_name: str | None = None,
        updated_after: _dt.datetime | None = None,
        updated_before: _dt.datetime | None = None,
    ) -> list[Run]:
        """Runs, most recently updated first. ``active_only`` means exactly ``active`` (not
        ``blocked``); ``status`` keeps runs in that status (or any of several); children are
        left out unless ``include_children``; ``workflow_name`` keeps runs of that workflow
        (any version); ``updated_after`` / ``updated_before`` (aware datetimes) keep runs last
        updated in ``[updated_after, updated_before)``. ``limit`` (1 to 10 000) makes it a page:
        pass the page's last run as ``after`` for the next one (an empty page is the end). Each
        page is read by index (a status, a name, a name with statuses, a time range: each its
        own index range), so page 1 000 costs what page 1 does."""
        cursor = _after_run(after)
        lower = None if updated_after is None else to_ms(_aware(updated_after, "updated_after"))
        upper = None if updated_before is None else to_ms(_aware(updated_before, "updated_before"))
        return self._core.list_runs(
            {
                "all_scopes": isinstance(scope_key, _AllScopes),
                "scope_key": None if isinstance(scope_key, _AllScopes) else scope_key,
                "workflow_refs": _refs(workflow_refs, "workflow_refs"),
                "active_only": active_only,
                "include_children": include_children,
                "statuses": _refs(status, "status"),
                "limit": limit,
                "after_updated_ms": None if cursor is None else cursor[0],
                "after_created_ms": None if cursor is None else cursor[1],
                "after_run_id": None if cursor is None else cursor[2],
                "workflow_name": workflow_name,
                "updated_after_ms": lower,
                "updated_before_ms": upper,
            }
        )

    @_hooks.operation
    def find_active_run(self, workflow_refs: str | Iterable[str], scope_key: str) -> Run | None:
        """The newest top-level ``active`` run of these refs in ``scope_key``."""
        refs = _refs(workflow_refs, "workflow_refs")
        return self._core.find_active_run(refs, scope_key, False)

    @_hooks.operation
    def find_active_run_outside_scope(
        self, workflow_refs: str | Iterable[str], scope_key: str
    ) -> Run | None:
        """The newest top-level ``active`` run of these refs in any *other* scope (or none)."""
        refs = _refs(workflow_refs, "workflow_refs")
        return self._core.find_active_run(refs, scope_key, True)

    @_hooks.operation
    def find_scope_occupant(self, scope_key: str) -> Run | None:
        """The newest top-level ``active`` or ``blocked`` run in ``scope_key``."""
        return self._core.find_scope_occupant(scope_key)

    @_hooks.operation
    def child_runs(self, parent_run_id: str) -> list[Run]:
        """Children of a run, oldest first."""
        return self._core.child_runs(parent_run_id)

    @_hooks.operation
    def child_summary(self, parent_run_id: str) -> ChildSummary:
        """The parent's children counted by status (statuses with none left out), by the
        database: one indexed read of the parent's children, no records built. ``settled`` when
        none is live (none queued, starting, active, blocked or parked; or there are none).

        The fan-in: when a child's end leaves its parent no live child, the parent gets a
        ``children.settled`` event in the same transaction (payload ``by_status``, ``total``,
        ``child_run_id``), whatever ended it, and again each time a new child ends the same
        way; ``wait_events(parent_run_id, types=["children.settled"])`` waits for it.
        ``RunNotFound`` for an unknown parent."""
        by_status = dict(self._core.child_summary(parent_run_id))
        live = sum(n for s, n in by_status.items() if s not in ("completed", "failed", "cancelled"))
        return ChildSummary(total=sum(by_status.values()), by_status=by_status, settled=not live)

    @_hooks.operation
    def run_counts(self, *, count_max: int = 10_000) -> dict[RunStatus, int]:
        """Every run (children included) counted by status, every status in lifecycle order (0
        where none). Each count stops at ``count_max`` (0 to 1 000 000): a count equal to it
        means at least that many. One read; each status costs a walk of at most ``count_max``
        entries of its index, however many runs the ledger holds (a dashboard's totals)."""
        return {cast("RunStatus", s): n for s, n in self._core.run_counts(count_max)}

    @_hooks.operation
    def steps(self, run_id: str) -> list[Step]:
        """The run's steps in plan order; ``RunNotFound`` for an unknown run."""
        return self._core.steps(run_id)

    @_hooks.operation
    def complete_step(
        self,
        run_id: str,
        step_id: str,
        *,
        status: StepStatus = "completed",
        notes: str | None = None,
        evidence: Any = None,
        summary: str | None = None,
        claim: Claim | None = None,
    ) -> Run:
        """Finish the current step. ``completed``/``skipped`` advance to the next step (the last
        one completes the run); ``blocked`` and ``failed`` block the run until ``resume_run``."""
        return self._core.complete_step(
            run_id,
            step_id,
            {
                "status": status,
                "notes": notes,
                "evidence": evidence,
                "summary": summary,
            },
            claim,
        )

    @_hooks.operation
    def block_run(self, run_id: str, *, notes: str | None = None) -> Run:
        """``active`` -> ``blocked``; the current step is marked blocked with ``notes``."""
        return self._core.block_run(run_id, notes)

    @_hooks.operation
    def resume_run(self, run_id: str) -> Run:
        """``blocked`` -> ``active``, reopening the current step (notes and evidence cleared).
        Refused with ``ActiveRunExists`` if the scope gained an active run meanwhile."""
        return self._core.resume_run(run_id)

    @_hooks.operation
    def abandon_run(self, run_id: str, *, reason: str | None = None, cascade: bool = True) -> bool:
        """Cancel a non-terminal run; ``False`` if it was already terminal. Its running attempts
        are finished as ``cancelled`` (each with its ``unit.finished`` event; a late finish of
        one then returns ``False``), and with ``cascade`` every live run below it is cancelled
        too, all in one transaction. ``reason`` is recorded in the ``run.status`` events and as
        the cancelled attempts' ``failure_reason``."""
        return self._core.abandon_run(run_id, reason, cascade)

    @_hooks.operation
    def set_outputs(self, run_id: str, outputs: Any, *, claim: Claim | None = None) -> None:
        """Record the run's resolved outputs (stored as a canonical JSON blob)."""
        self._core.set_outputs(run_id, outputs, claim)

    # ------------------------------------------------------------------ attempts

    @_hooks.operation
    def reserve_attempt(
        self,
        run_id: str,
        unit_id: str,
        *,
        step_id: str,
        node_id: str | None = None,
        phase: str = "unit",
        runner: str | None = None,
        engine: str | None = None,
        model: str | None = None,
        input_hash: str | None = None,
        worktree_path: str | None = None,
        parent_unit_id: str | None = None,
        holder: str | None = None,
        claim: Claim | None = None,
        trace_context: str | None = None,
        force: bool = False,
    ) -> Reservation:
        """Reserve attempt n+1 of a unit, or reclaim its still-running latest attempt in place
        (same number and ``dispatch_id``; refused if ``step_id``/``input_hash`` changed).

        Under a retry policy a failed unit is refused with ``RetryNotDue`` before its
        ``retry_at`` (``force=True`` reserves it anyway) and an exhausted one with
        ``UnitExhausted`` (``retry_units`` gives it one more attempt); nothing is written.

        ``trace_context`` is a W3C ``traceparent`` kept on the attempt (a reclaim keeps the
        reclaimer's), so whoever does the attempt's work can link its span to the one that
        handed it out; :mod:`fencepost.otel` fills it in from the current span."""
        return self._core.reserve_attempt(
            run_id,
            {
                "unit_id": unit_id,
                "step_id": step_id,
                "node_id": node_id,
                "phase": phase,
                "runner": runner,
                "engine": engine,
                "model": model,
                "input_hash": input_hash,
                "worktree_path": worktree_path,
                "parent_unit_id": parent_unit_id,
                "holder": holder,
                "trace_context": trace_context,
                "force": force,
            },
            claim,
        )

    @_hooks.operation
    def reserve_attempts(
        self,
        run_id: str,
        units: Sequence[Mapping[str, Any]],
        *,
        claim: Claim | None = None,
        force: bool = False,
    ) -> list[Reservation]:
        """``reserve_attempt`` for many units in one transaction (all or nothing: one unit
        refused with ``RetryNotDue`` or ``UnitExhausted`` refuses the call). Each dict takes
        ``unit_id`` plus the keywords of ``reserve_attempt``; ``force`` applies to every unit."""
        return self._core.reserve_attempts(run_id, units, claim, force=force)

    @_hooks.operation
    def finish_attempt(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        dispatch_id: str,
        *,
        status: AttemptStatus,
        result: Any = None,
        tokens: int | None = None,
        failure_reason: str | None = None,
        session_id: str | None = None,
        claim: Claim | None = None,
    ) -> bool:
        """Record the terminal result of a running attempt (compare-and-set on run, unit,
        attempt, ``dispatch_id`` and ``running``). ``False``, and nothing written, for a
        duplicate, late or unknown finish."""
        return self._core.finish_attempt(
            {
                "run_id": run_id,
                "unit_id": unit_id,
                "attempt": attempt,
                "dispatch_id": dispatch_id,
                "status": status,
                "result": result,
                "tokens": tokens,
                "failure_reason": failure_reason,
                "session_id": session_id,
            },
            claim,
        )

    @_hooks.operation
    def finish_attempts(
        self, finishes: Sequence[Mapping[str, Any]], *, claim: Claim | None = None
    ) -> list[bool]:
        """``finish_attempt`` for many attempts in one transaction; each dict takes ``run_id``,
        ``unit_id``, ``attempt``, ``dispatch_id`` plus the keywords of ``finish_attempt``."""
        return self._core.finish_attempts(finishes, claim)

    @_hooks.operation
    def attempts(self, run_id: str, unit_id: str) -> list[Attempt]:
        """Every attempt of a unit, oldest first."""
        return self._core.attempts(run_id, unit_id)

    @_hooks.operation
    def unit_attempts(
        self, run_id: str, unit_ids: Iterable[str], *, latest: int = 10
    ) -> dict[str, list[Attempt]]:
        """The newest ``latest`` attempts (1 to 10 000) of each of ``unit_ids`` (at most
        10 000; a page of ``units``), oldest first per unit, in one read: what a view of a
        page of units shows, without an ``attempts`` call per unit. A unit the run does not
        have (or that has no attempt) maps to ``[]``."""
        ids = _refs(unit_ids, "unit_ids") or []
        found: dict[str, list[Attempt]] = {u: [] for u in ids}
        for attempt in self._core.unit_attempts(run_id, ids, latest):
            found[attempt.unit_id].append(attempt)
        return found

    @_hooks.operation
    def units(
        self,
        run_id: str,
        *,
        step_id: str | None = None,
        status: UnitStatus | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[Unit]:
        """The run's unit projections, in order of first reservation, optionally of one step
        and one status. ``limit`` (1 to 10 000) makes it a page: pass the ``unit_id`` of the
        page's last unit as ``after`` for the next one (an empty page is the end). A unit keeps
        its place for good, so the cursor holds while the run goes on. A status off the usual
        path (``pending``, ``failed``, ``timed_out``, ``cancelled``, ``exhausted``) is read by an
        index of its own, so its page costs the same however many of the run's units completed;
        ``running`` and ``completed`` are checked on the run's units as they are walked in
        order (an index of them would cost every reserve and finish a write)."""
        return self._core.units(run_id, step_id, status=status, limit=limit, after=after)

    @_hooks.operation
    def unit_counts(self, run_id: str) -> dict[str, int]:
        """How many of the run's units are in each unit status, every status listed (0 where
        none are), counted by the database: a run of a million units costs one indexed read,
        not a million records. ``RunNotFound`` for an unknown run."""
        counts = dict.fromkeys(_core.UNIT_STATUSES, 0)
        counts.update(self._core.unit_counts(run_id))
        return counts

    @_hooks.operation
    def unit(self, run_id: str, unit_id: str) -> Unit | None:
        """One unit projection, or ``None``."""
        return self._core.unit(run_id, unit_id)

    # ------------------------------------------------------------------ retries

    @_hooks.operation
    def due_units(
        self, run_id: str | None = None, *, limit: int = 100, after: Unit | None = None
    ) -> list[Unit]:
        """The failed units whose ``retry_at`` has come, of one run or of every run, soonest
        first (then by run and unit id): what a dispatcher reserves next. Read by an index of
        the waiting units alone, so a page costs the same however many units the ledger holds.
        ``after`` is the last unit of the page before; ``limit`` is 1 to 10 000."""
        cursor = None
        if after is not None:
            after = _unit_cursor(after)
            if after.retry_at is None:
                raise InvalidArgument(
                    "after must be a Unit from the page before (it has a retry_at), not one "
                    "waiting for no retry",
                    argument="after",
                )
            cursor = (to_ms(after.retry_at), after.run_id, after.unit_id)
        return self._core.due_units(run_id, limit, cursor)

    @_hooks.operation
    def exhausted_units(
        self, run_id: str | None = None, *, limit: int = 100, after: Unit | None = None
    ) -> list[Unit]:
        """The units that used every attempt their retry policy allows (the dead letters), of
        one run or of every run, by run and unit id, read by their own index. ``after`` is the
        last unit of the page before; ``limit`` is 1 to 10 000."""
        cursor = None
        if after is not None:
            after = _unit_cursor(after)
            cursor = (after.run_id, after.unit_id)
        return self._core.exhausted_units(run_id, limit, cursor)

    @_hooks.operation
    def retry_units(
        self, run_id: str, unit_ids: Iterable[str] | None = None, *, claim: Claim | None = None
    ) -> int:
        """Make the run's failed, timed-out and exhausted units (those in ``unit_ids``, or all)
        due now: reservable at once and listed by ``due_units``. An exhausted unit gets exactly
        one more attempt. Returns how many units were taken; each gets a ``unit.retried``
        event. Fenced by ``claim`` when given; ``NotFound`` for a unit the run does not have,
        ``RunNotActive`` for a run that has ended (nothing is written)."""
        return self._core.retry_units(run_id, _refs(unit_ids, "unit_ids"), claim)

    @_hooks.operation
    def cancel_units(
        self,
        run_id: str,
        unit_ids: Iterable[str] | None = None,
        *,
        reason: str | None = None,
        claim: Claim | None = None,
    ) -> int:
        """Cancel the run's units (those in ``unit_ids``, or all) that are not completed or
        cancelled: a running attempt is finished as ``cancelled`` (its ``unit.finished``
        event; a late finish of it then loses), a failed, timed-out or exhausted unit becomes
        ``cancelled`` and waits for no retry. Returns how many units changed; each gets a
        ``unit.cancelled`` event. Fenced by ``claim`` when given; ``NotFound`` for a unit the
        run does not have, ``RunNotActive`` for a run that has ended (nothing is written)."""
        return self._core.cancel_units(run_id, _refs(unit_ids, "unit_ids"), reason, claim)

    # ------------------------------------------------------------------ schedules

    @_hooks.operation
    def put_schedule(
        self,
        name: str,
        *,
        cron: str,
        workflow_name: str,
        template: Mapping[str, Any],
        timezone: str = "UTC",
        overlap: Overlap = "skip",
        catch_up: int = 0,
    ) -> Schedule:
        """Create or replace the schedule ``name``: at each slot of ``cron`` (5 fields: minute
        hour day-of-month month day-of-week; ``*``, lists, ranges, steps, names such as ``MON``
        and ``JAN``; day-of-month and day-of-week OR'd when both are restricted), read as wall
        time in ``timezone`` (an IANA name), ``tick_schedules`` queues a run with
        ``reserve_run(run_id=f"{name}:{slot:%Y-%m-%dT%H:%MZ}", workflow_name=workflow_name,
        not_before=slot, **template)``. ``template`` holds ``reserve_run``'s other keywords
        (``workflow_ref``, ``source``, ``definition_digest``, ``definition``, ``runner_id`` and
        ``origin_session_id`` are required; ``parent_run_id`` is not allowed).

        The first slot is the first after now (also when replacing; a replaced schedule keeps
        whether it is paused and its last fire). ``overlap="skip"`` uses a slot up without a
        run while the last fired run has not ended; ``"allow"`` fires anyway. After downtime a
        tick fires the newest due slot plus at most ``catch_up`` (0 to 1000) missed ones.

        Wall times that a daylight-saving change skips or repeats resolve as Python's
        ``fold=0``: a slot in a spring-forward gap fires once, shifted by the gap (02:30 becomes
        03:30 EDT); a repeated wall time fires once, at its first occurrence. Bad input is
        ``InvalidArgument`` naming ``cron``, ``timezone``, ``name``, ``overlap``, ``catch_up``
        or ``template``; nothing is written."""
        run = _schedule_template(workflow_name, template)
        try:
            schedule = self._core.put_schedule(name, cron, timezone, overlap, catch_up, run)
        except InvalidArgument as e:
            if e.argument in _TEMPLATE_KEYS:
                raise InvalidArgument(f"template: {e}", argument="template") from None
            raise
        _observe.schedule_changed("put", name)
        return schedule

    @_hooks.operation
    def schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        return self._core.schedules()

    @_hooks.operation
    def pause_schedule(self, name: str) -> None:
        """Stop firing ``name`` until ``resume_schedule``; ``NotFound`` for an unknown name."""
        self._core.pause_schedule(name)
        _observe.schedule_changed("paused", name)

    @_hooks.operation
    def resume_schedule(self, name: str) -> None:
        """Fire ``name`` again: the next tick fires its newest due slot and at most
        ``catch_up`` of the slots missed while it was paused. ``NotFound`` for an unknown
        name."""
        self._core.resume_schedule(name)
        _observe.schedule_changed("resumed", name)

    @_hooks.operation
    def delete_schedule(self, name: str) -> None:
        """Delete ``name`` (the runs it queued stay); ``NotFound`` for an unknown name."""
        self._core.delete_schedule(name)
        _observe.schedule_changed("deleted", name)

    @_hooks.operation
    def tick_schedules(self) -> list[Run]:
        """Fire every due slot of every schedule that is not paused, exactly once however many
        processes tick at once: each fire is a ``reserve_run`` (queued, due at its slot) under
        a run id made of the schedule's name and the slot, and the schedule's next slot moves
        by compare-and-set in the same transaction. Returns the runs this call queued. Call it
        from a loop or a timer (``fencepost tick --every 1s``); a slot fires at the first tick
        at or after it."""
        runs = self._core.tick_schedules()
        _observe.fired(runs)
        return runs

    # ------------------------------------------------------------------ messages

    @_hooks.operation
    def send(self, run_id: str, topic: str, payload: Any, *, key: str | None = None) -> Message:
        """Send the run a message on ``topic``: anyone may send, no claim needed. The message
        is numbered in the run's mailbox (``Message.seq``, from 1) and a ``message.sent`` event
        (``run_id``, ``seq``, ``topic``, ``key``) is written with it, which wakes
        ``wait_events``. With ``key`` the send is idempotent: a key the run's topic has seen
        answers the first message, whatever this payload, and writes nothing (so a sender may
        retry freely). ``RunNotFound`` for an unknown run; ``RunNotActive`` for a run that has
        ended (nobody could receive it), unless the key was sent before."""
        message = self._core.send(run_id, topic, payload, key)
        _observe.message_sent(message)
        return message

    @_hooks.operation
    def receive(self, run_id: str, topic: str, *, claim: Claim, limit: int = 1) -> list[Message]:
        """Take the oldest messages of ``topic`` that nobody has received (at most ``limit``,
        1 to 10 000; none waiting is ``[]``). Fenced by ``claim`` as every write is: only the
        run's current owner receives, and each message is taken exactly once, however many
        receivers try at once. A taken message stays listed by ``messages`` with its
        ``consumed_at``; receiving writes no event. ``LeaseLost`` under a stale claim,
        ``RunNotActive`` for a run that has ended (nothing is taken)."""
        taken = self._core.receive(run_id, topic, claim, limit)
        _observe.messages_received(run_id, topic, taken)
        return taken

    @_hooks.operation
    def messages(
        self, run_id: str, *, topic: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> list[Message]:
        """The run's messages, received or not, oldest first: of one ``topic`` or all, after
        ``after_seq`` (page on with the last one's ``seq``), at most ``limit`` (1 to 10 000).
        A read: no claim, nothing taken. An unknown run has none."""
        return self._core.messages(run_id, topic, after_seq, limit)

    @_hooks.operation
    def accounting(self, run_id: str) -> Accounting:
        """Attempt and token totals, split by phase; unfinished attempts count as attempts."""
        return self._core.accounting(run_id)

    # ------------------------------------------------------------------ queue and claims

    @_hooks.operation
    def reserve_run(
        self,
        run_id: str,
        *,
        workflow_name: str,
        workflow_ref: str,
        source: Any,
        definition_digest: str,
        definition: Any,
        input: Any = None,
        launch_options: Any = None,
        runner_id: str,
        origin_session_id: str,
        parent_run_id: str | None = None,
        not_before: _dt.datetime | _dt.timedelta | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        retry: Mapping[str, Any] | None = None,
    ) -> Run:
        """Queue a run for a controller (status ``queued``, lease generation 0, no owner).
        ``definition_digest`` must equal ``fencepost.digest(definition)``: it is recomputed,
        never trusted. With ``parent_run_id`` the run continues a ``parked`` parent of the same
        ``origin_session_id``, which becomes ``completed``.

        Scheduling, for ``claim_next``: ``not_before`` (an aware datetime, or a timedelta from
        the ledger's clock) keeps the run queued and passed over until then; ``priority``
        (-1000..1000) orders it, higher first; ``concurrency_key`` counts it against the key's
        limit (``set_concurrency_limit``) while it holds a live lease. ``retry`` is the retry
        policy of the run's units, as for ``start_run``."""
        return self._core.reserve_run(
            _queued_run(
                run_id,
                {
                    "workflow_name": workflow_name,
                    "workflow_ref": workflow_ref,
                    "source": source,
                    "definition_digest": definition_digest,
                    "definition": definition,
                    "input": input,
                    "launch_options": launch_options,
                    "runner_id": runner_id,
                    "origin_session_id": origin_session_id,
                    "parent_run_id": parent_run_id,
                    "not_before": not_before,
                    "priority": priority,
                    "concurrency_key": concurrency_key,
                    "retry": retry,
                },
            )
        )

    @_hooks.operation
    def prepare_or_adopt(
        self,
        run_id: str,
        *,
        workflow_name: str,
        workflow_ref: str,
        source: Any,
        definition_digest: str,
        definition: Any,
        input: Any = None,
        launch_options: Any = None,
        runner_id: str,
        origin_session_id: str,
        parent_run_id: str | None = None,
        lease_ms: int,
        claim_token: str | None = None,
        not_before: _dt.datetime | _dt.timedelta | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        retry: Mapping[str, Any] | None = None,
    ) -> ClaimedPreparation | AdoptedPreparation:
        """One transaction: adopt the run if it exists with these exact inputs (no writes),
        raise ``PreparationConflict`` naming the fields that differ, or reserve and claim it
        for ``runner_id`` (``state="claimed"`` with the claim). Checking ``state`` narrows
        ``claim`` for a type checker. The scheduling keywords are ``reserve_run``'s; they are
        stored with a new run and are not compared when adopting (how a run is scheduled is
        not what it is), and the claim is taken at once whatever ``not_before`` says: the
        caller asked for the run now. ``retry`` is compared (``"retry"`` among the fields):
        how a run's units are retried is part of what the run does."""
        return self._core.prepare_or_adopt(
            _queued_run(
                run_id,
                {
                    "workflow_name": workflow_name,
                    "workflow_ref": workflow_ref,
                    "source": source,
                    "definition_digest": definition_digest,
                    "definition": definition,
                    "input": input,
                    "launch_options": launch_options,
                    "runner_id": runner_id,
                    "origin_session_id": origin_session_id,
                    "parent_run_id": parent_run_id,
                    "not_before": not_before,
                    "priority": priority,
                    "concurrency_key": concurrency_key,
                    "retry": retry,
                },
            ),
            lease_ms,
            claim_token,
        )

    @_hooks.operation
    def claim(
        self, run_id: str, runner_id: str, *, lease_ms: int, token: str | None = None
    ) -> Claim | None:
        """Take the run's lease at the next generation, or ``None`` if the run is terminal or
        another owner's lease is unexpired. Re-claiming your own live lease also takes a new
        generation, and the old token stops working. A queued run becomes ``starting``."""
        return self._core.claim(run_id, runner_id, lease_ms, token)

    @_hooks.operation
    def claim_next(
        self,
        runner_id: str,
        *,
        lease_ms: int,
        workflow_names: str | Iterable[str] | None = None,
        limit: int = 1,
        token: str | None = None,
        rescue: bool = True,
    ) -> list[Claim]:
        """Claim the next due queued runs, at most ``limit`` (1 to 1 000), optionally only of
        ``workflow_names``: each as ``claim`` does (the next generation, ``starting``, a
        ``lease.claimed`` event), all in one transaction. The order is ``priority`` (higher
        first), then due time (``not_before``, else the time the run was queued), then
        ``run_id``. Runs not yet due, runs of paused workflows (``pause_workflow``) and runs
        whose ``concurrency_key`` is at its limit (``set_concurrency_limit``; this call's own
        claims count) are passed over. Two controllers never get the same run, and on
        PostgreSQL neither waits for the other's runs: each skips the runs another holds (a
        key's limit is counted under a lock of that key). ``[]`` when nothing is due.
        ``token`` is for a single claim (``limit=1``); otherwise each claim gets its own.

        ``rescue`` (on by default) also takes over runs that have not ended whose owner's
        lease has expired (a released lease is not rescued), in the same order with the expiry
        as due time, obeying paused workflows and key limits: the run keeps its status, the
        generation goes up by one (the old owner's writes are refused from then on),
        ``Claim.taken_from`` names the old owner when it was another runner, and
        ``Lease.takeovers`` counts it."""
        names = _refs(workflow_names, "workflow_names")
        return self._core.claim_next(runner_id, lease_ms, names, limit, token, rescue)

    @_hooks.operation
    def set_concurrency_limit(self, concurrency_key: str, limit: int | None) -> None:
        """At most ``limit`` runs with ``concurrency_key`` hold live leases (``0`` holds the
        key's queued runs; ``None`` removes the limit). Counted by ``claim_next``: a live
        lease is one of a run that has left the queue and not ended, expiring after now, so an
        expired or released lease frees its slot. Lowering a limit takes no lease away."""
        self._core.set_concurrency_limit(concurrency_key, limit)

    @_hooks.operation
    def concurrency_limits(self) -> dict[str, int]:
        """Every key's limit."""
        return dict(self._core.concurrency_limits())

    @_hooks.operation
    def pause_workflow(self, workflow_name: str) -> None:
        """``claim_next`` hands out no run of ``workflow_name`` until ``resume_workflow``
        (claims already taken stand). A workflow with no runs yet may be paused."""
        self._core.pause_workflow(workflow_name)

    @_hooks.operation
    def resume_workflow(self, workflow_name: str) -> None:
        """Undo ``pause_workflow``; a workflow not paused is left as it is."""
        self._core.resume_workflow(workflow_name)

    @_hooks.operation
    def paused_workflows(self) -> list[str]:
        """The paused workflows, by name."""
        return self._core.paused_workflows()

    @_hooks.operation
    def queued_runs(
        self, *, lane: Literal["due", "later"] = "due", limit: int = 50, after: Run | None = None
    ) -> list[Run]:
        """A page of the queue, read by its index (a page deep in a backlog of millions costs
        what the first does). ``lane="due"``: the due runs ``claim_next`` takes next, in its
        order (priority, higher first, then due time, then ``run_id``), leaving out runs whose
        key has a limit (``queue_overview`` counts them by key) and runs of paused workflows.
        ``lane="later"``: the runs not yet due, soonest first; a run whose time has come stays
        here until the next ``claim_next`` moves it. ``after`` is the last run of the page
        before (its place in the order as that page saw it); ``limit`` is 1 to 10 000."""
        cursor = None
        if after is not None:
            if not isinstance(after, Run):
                raise InvalidArgument(
                    f"after must be a Run from the page before, not {type(after).__name__}",
                    argument="after",
                )
            cursor = (after.priority, to_ms(after.due_at), after.run_id)
        return self._core.queued_runs(lane, limit, cursor)

    @_hooks.operation
    def queue_overview(
        self, *, count_max: int = 10_000, limit: int = 100, after_key: str | None = None
    ) -> QueueOverview:
        """The queue's counts by lane (see :class:`QueueOverview`), the keys with limits with
        their live and queued runs, and the paused workflows with their queued runs, in one
        transaction. Every count stops at ``count_max`` (1 to 1 000 000), so the overview
        costs the same over a backlog of millions; ``limit`` (1 to 10 000) bounds each list,
        and ``after_key`` pages through the keys (the last key of the page before)."""
        due, keyed, later, keys, paused = self._core.queue_overview(count_max, limit, after_key)
        return QueueOverview(
            due=due,
            keyed=keyed,
            later=later,
            keys=[KeyUsage(k, n, live, queued) for k, n, live, queued in keys],
            paused=[PausedWorkflow(w, from_ms(at), queued) for w, at, queued in paused],
            count_max=count_max,
        )

    @_hooks.operation
    def heartbeat(self, claim: Claim, *, lease_ms: int) -> Claim:
        """Extend a live claim to ``lease_ms`` from now; ``LeaseLost`` if it is stale."""
        return self._core.heartbeat(claim, lease_ms)

    @_hooks.operation
    def release(self, claim: Claim) -> None:
        """Give the lease up (owner cleared, generation kept); ``LeaseLost`` if stale."""
        self._core.release(claim)

    @_hooks.operation
    def set_status(self, run_id: str, status: RunStatus, *, claim: Claim) -> Run:
        """Move a claimed run along its lifecycle (see :data:`fencepost.RunStatus` for the
        moves); an illegal move is ``InvalidArgument`` naming both statuses, a stale claim
        ``LeaseLost``."""
        return self._core.set_status(run_id, status, claim)

    @_hooks.operation
    def lease(self, run_id: str) -> Lease:
        """The run's lease: generation 0 and no owner if it was never claimed."""
        return self._core.lease(run_id)

    @_hooks.operation
    def expired_leases(self, *, active_only: bool = False) -> list[Lease]:
        """Owned leases whose expiry has passed (ledger clock) on runs that are not terminal
        (with ``active_only``, on ``active`` runs), soonest-expired first."""
        return self._core.expired_leases(active_only)

    @_hooks.operation
    def leases(
        self, *, owned_only: bool = False, run_ids: Iterable[str] | None = None
    ) -> list[Lease]:
        """Every run's lease in one read, runs newest first (a run never claimed has
        generation 0 and no owner). With ``owned_only``, only the leases that have an owner
        now, soonest to expire first: a read that costs what the live owners do, however long
        the ledger's history. With ``run_ids`` (at most 10 000: a page of runs), the leases of
        those runs, by run id, in one read of primary-key probes (unknown runs left out;
        ``owned_only`` does not apply)."""
        return self._core.leases(owned_only, _refs(run_ids, "run_ids"))

    # ------------------------------------------------------------------ events

    @_hooks.operation
    def event_counts(
        self, *, since: _dt.datetime | None = None, minutes: int = 60, exact_max: int = 5_000
    ) -> EventCounts:
        """Events per minute for ``minutes`` minutes (1 to 1 440) from the minute ``since``
        falls in (an aware datetime), by default the last ``minutes`` minutes by the ledger's
        clock, the current one included. Counted without reading the range through: the
        minutes' boundaries are found by probes of the log's primary key (a few hundred for
        millions of events, in one read), or, when the range holds at most ``exact_max``
        events (0 to 100 000), by reading them (``EventCounts.exact``)."""
        first = None if since is None else to_ms(_aware(since, "since"))
        start, counts, exact = self._core.event_counts(first, minutes, exact_max)
        return EventCounts(
            minutes=[(from_ms(start + i * 60_000), c) for i, c in enumerate(counts)],
            exact=exact,
        )

    @_hooks.operation
    def newest_event_seq(self) -> int:
        """The newest event's ``seq`` (0 for an empty log) such that no event below it is still
        to be committed: ``events(after_seq=...)`` from it misses nothing. One probe of the
        log's primary key, whatever its size (a live tail or a dashboard starts from it)."""
        return self._core.newest_event_seq()

    @_hooks.operation
    def events(
        self,
        run_id: str | None = None,
        *,
        after_seq: int = 0,
        limit: int = 1000,
        types: Iterable[str] | None = None,
    ) -> list[Event]:
        """Events in commit order (``seq``), optionally of one run and of some ``types``;
        page with ``after_seq`` (the last ``seq`` you saw)."""
        wanted = _refs(types, "types")
        return self._core.events(run_id, after_seq, limit, wanted)

    @_hooks.operation
    def wait_events(
        self,
        run_id: str | None = None,
        *,
        after_seq: int = 0,
        timeout_s: float,
        types: Iterable[str] | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """``events(...)``, but waiting: returns as soon as a matching event with ``seq >
        after_seq`` is committed (by this process or any other), or ``[]`` after ``timeout_s``
        seconds. Page on with ``after_seq=`` the last ``seq`` returned. The query runs only
        when something may have been committed. PostgreSQL: every commit that wrote to a run
        sends a ``NOTIFY``, which the ledger's own ``LISTEN``ing connection (opened by the first
        wait) turns into a wake-up, so an idle wait sends the database nothing. SQLite (and
        PostgreSQL opened with ``listen=False``): the database's change counter (SQLite's
        ``data_version``; the events' sequence) is read every 5 ms without reading a table,
        and the query also runs every 2 seconds. Ctrl-C interrupts the wait."""
        wanted = _refs(types, "types")
        return self._core.wait_events(run_id, after_seq, timeout_s, wanted, limit)

    # ------------------------------------------------------------------ retention

    @_hooks.operation
    def prune(
        self,
        *,
        older_than: _dt.timedelta | _dt.datetime,
        statuses: RunStatus | Iterable[RunStatus] = ("completed", "failed", "cancelled"),
        limit: int | None = None,
        dry_run: bool = False,
        archive: _archive.Archive | None = None,
        progress: Callable[[PruneReport], None] | None = None,
    ) -> PruneReport:
        """Remove whole terminal run trees that finished before ``older_than`` (a timedelta:
        an age, read against the ledger's clock; or an aware datetime), with their steps,
        units, attempts, events and leases, and the blobs and definitions nothing else refers
        to. A tree goes only when every run in it (children, continuations) is terminal, has
        one of ``statuses`` and is old enough; ``limit`` caps the number of trees. Each batch
        of trees is one short transaction. ``archive`` (a new path, gzip when it ends in
        ``.gz``, or a binary file) receives each tree as one JSON line, flushed before the tree
        is deleted; ``restore`` reads it back. ``dry_run`` changes and writes nothing and
        reports what would go. ``progress`` is called with the totals after every batch. Event
        numbers (``seq``) of pruned events are never handed out again, so a follower paging
        with ``after_seq`` misses nothing. SQLite files give the freed pages back to the file
        system."""
        cutoff_ms, age_ms = _archive.cutoff(older_than)
        wanted = _refs(statuses, "statuses") or []
        report = None if progress is None else (lambda d: progress(PruneReport(**d)))
        if archive is None:
            done = self._core.prune(
                cutoff_ms=cutoff_ms, age_ms=age_ms, statuses=wanted, limit=limit,
                dry_run=dry_run, sink=None, progress=report,
            )  # fmt: skip
        else:
            with _archive.writer(archive, dry_run=dry_run) as sink:
                done = self._core.prune(
                    cutoff_ms=cutoff_ms, age_ms=age_ms, statuses=wanted, limit=limit,
                    dry_run=dry_run, sink=sink, progress=report,
                )  # fmt: skip
        pruned = PruneReport(**done)
        _observe.pruned(
            runs=pruned.runs,
            attempts=pruned.attempts,
            events=pruned.events,
            dry_run=dry_run,
            archive=os.fspath(archive) if isinstance(archive, str | os.PathLike) else None,
            older_than=str(older_than),
        )
        return pruned

    @_hooks.operation
    def restore(
        self,
        archive: _archive.Archive,
        *,
        progress: Callable[[int], None] | None = None,
        max_line_bytes: int = _archive.MAX_LINE_BYTES,
    ) -> int:
        """Put back the run trees of an archive ``prune`` wrote (a path or a binary file, gzip
        or not); the number of runs restored.

        All or nothing: the whole archive is checked first, with the rules the API applies
        to what it writes (canonical JSON, text, timestamps, statuses with their finish times,
        gap-free revisions, references within each tree) and against the ledger (a run id,
        event seq, dispatch id or idempotency key it holds already), then every tree is
        inserted in one transaction. Any refusal is ``InvalidArgument`` naming the line, the
        tree and the field, and leaves the ledger exactly as it was; so does a crash or
        ``kill -9`` part way (the transaction never commits). On SQLite the write lock is held
        while the trees are inserted. Rows come back exactly as they were, events with their
        ``seq``. An archive written before a column was added restores with the value the
        schema's migration gave older rows (0 for a lease's counts, no trace context); one
        written by a newer schema is refused. Lines (one run tree each) are read up to
        ``max_line_bytes`` (64 MiB by default). ``progress`` is called with the runs inserted
        so far (every few hundred, and once with the total after the commit)."""
        return self._core.restore(_archive.reader(archive, max_line_bytes), progress=progress)

    @_hooks.operation
    def vacuum(self) -> None:
        """Rewrite the database compactly: SQLite ``VACUUM`` (which also turns on the
        incremental auto-vacuum that lets ``prune`` shrink the file, for a file made by an older
        fencepost), PostgreSQL ``VACUUM (ANALYZE)``. Holds the write lock while it runs."""
        self._core.vacuum()

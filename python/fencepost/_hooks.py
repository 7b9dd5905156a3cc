"""The one place every ledger operation passes, and the one table of operations.

Every public :class:`fencepost.Ledger` method that is an operation is decorated with
:func:`operation`, and every :class:`fencepost.aio.AsyncLedger` coroutine is made by
:func:`async_operation`; both read the module's :data:`hook` on each call. Without a hook (the
default) the call goes straight through, one global read later; :mod:`fencepost.otel` sets a
hook that wraps each call in a span and counts it. Nothing patches the classes.

:data:`OPERATIONS` is the list every other list is checked against (``tests/test_hooks.py``):
the decorated ``Ledger`` methods, the ``AsyncLedger`` coroutines, the compiled core's methods
(``_core.pyi``) and the operations :mod:`fencepost.otel` counts.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, ParamSpec, Protocol, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")

OPERATIONS: Final = (
    "put_json", "get_json", "start_run", "publish_child_run", "get_run", "resolve_run_id",
    "list_runs", "find_active_run", "find_active_run_outside_scope", "find_scope_occupant",
    "child_runs", "steps", "complete_step", "block_run", "resume_run", "abandon_run",
    "set_outputs", "reserve_attempt", "reserve_attempts", "finish_attempt", "finish_attempts",
    "attempts", "units", "unit_counts", "unit", "accounting", "reserve_run", "prepare_or_adopt",
    "claim", "claim_next", "heartbeat", "release", "set_status", "lease", "expired_leases",
    "leases", "events", "wait_events", "prune", "restore", "vacuum", "integrity_check",
    "orphan_attempts", "set_concurrency_limit", "concurrency_limits", "pause_workflow",
    "resume_workflow", "paused_workflows", "queued_runs", "queue_overview", "due_units",
    "exhausted_units", "retry_units", "cancel_units", "child_summary", "run_counts",
    "send", "receive", "messages", "put_schedule", "schedules", "pause_schedule",
    "resume_schedule", "delete_schedule", "tick_schedules", "unit_attempts", "newest_event_seq",
    "event_counts",
)  # fmt: skip
"""Every operation of a ledger: what telemetry spans and counts."""

NOT_OPERATIONS: Final = ("open", "close", "pragmas")
"""The public ``Ledger`` methods that are not operations: opening and closing a handle, and
reading the connection's settings back."""

FACADE_ONLY: Final = ("find_active_run_outside_scope",)
"""Operations the facade makes of another core method (``find_active_run(outside=True)``)."""


class Hook(Protocol):
    """What :mod:`fencepost.otel` (or a test) puts around every operation."""

    def call(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` (``args[0]`` is the ledger) for operation ``name``."""
        ...

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Await ``fn(*args, **kwargs)`` (``args[0]`` is the async ledger) for ``name``."""
        ...


hook: Hook | None = None
"""Set by :func:`fencepost.otel.instrument`, cleared by ``uninstrument``."""


def operation(fn: Callable[P, R]) -> Callable[P, R]:
    """Mark a ``Ledger`` method as the operation of its name: each call passes :data:`hook`."""
    name = fn.__name__

    @functools.wraps(fn)
    def op(*args: P.args, **kwargs: P.kwargs) -> R:
        h = hook
        if h is None:
            return fn(*args, **kwargs)
        result: R = h.call(name, fn, args, kwargs)
        return result

    op.__fencepost_operation__ = name  # type: ignore[attr-defined]
    return op


def async_operation(
    name: str, fn: Callable[P, Coroutine[Any, Any, R]]
) -> Callable[P, Coroutine[Any, Any, R]]:
    """The coroutine function of ``AsyncLedger``'s operation ``name``: each call passes
    :data:`hook` (its ``acall``), around the whole await."""

    @functools.wraps(fn)
    async def op(*args: P.args, **kwargs: P.kwargs) -> R:
        h = hook
        if h is None:
            return await fn(*args, **kwargs)
        result: R = await h.acall(name, fn, args, kwargs)
        return result

    op.__name__ = name
    op.__qualname__ = f"AsyncLedger.{name}"
    op.__fencepost_operation__ = name  # type: ignore[attr-defined]
    return op


def unwrapped(method: Callable[P, R]) -> Callable[P, R]:
    """The method an :func:`operation` wraps (the method itself if it wraps none): what an
    ``AsyncLedger`` coroutine runs, so that its hook, not a second one, sees the call."""
    if getattr(method, "__fencepost_operation__", None) is None:
        return method
    return cast("Callable[P, R]", method.__wrapped__)  # type: ignore[attr-defined]


def async_form(
    method: Callable[..., Any], call: Callable[P, Coroutine[Any, Any, R]]
) -> Callable[P, Coroutine[Any, Any, R]]:
    """``call``, the coroutine form of ``Ledger`` ``method``, named and documented as it is,
    and passing :data:`hook` when ``method`` is an operation."""
    name = method.__name__
    call.__name__ = name
    call.__qualname__ = f"AsyncLedger.{name}"
    call.__doc__ = method.__doc__
    if getattr(method, "__fencepost_operation__", None) is None:
        return call
    return async_operation(name, call)

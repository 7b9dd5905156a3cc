"""OpenTelemetry for fencepost: a span per operation and the ledger's metrics.

Install the extra (``pip install 'fencepost[otel]'``, which brings ``opentelemetry-api``
alone) and call :func:`instrument` once at start-up, as with any OpenTelemetry
instrumentation. It uses the application's tracer and meter providers (the global ones unless
others are passed), so the SDK, exporters and sampling stay the application's choice::

    import fencepost.otel
    fencepost.otel.instrument()

Every :class:`fencepost.Ledger` and :class:`fencepost.aio.AsyncLedger` operation then runs in
a span (kind ``CLIENT``, named after the operation, ``error.type`` set when it raises) and
records these instruments:

========================================  =========  =========================================
``fencepost.operations``                  counter    calls, by ``operation`` and ``outcome``
``fencepost.operation.duration``          histogram  seconds per call, same attributes
``fencepost.fence.rejections``            counter    stale writes refused, by ``reason``
``fencepost.lease.takeovers``             counter    claims that took an expired lease over
``fencepost.attempt.reclaims``            counter    running attempts reserved again
``fencepost.commit.group_size``           histogram  calls per group-commit transaction
``fencepost.store.busy_retries``          counter    contended writes tried again
``fencepost.units.exhausted``             counter    units a failed attempt exhausted
``fencepost.schedules.fired``             counter    runs queued by schedules' fires
========================================  =========  =========================================

``outcome`` is ``ok``, ``refused`` (the ledger said no: a ``LedgerError`` other than the
two below), ``error`` (``StoreError``, ``StoreBusy``, anything not from fencepost) or
``cancelled`` (the caller stopped waiting: a cancelled coroutine, an interrupt; the call may
still have committed, so its span is not marked as failed).

A reservation made inside a span records that span's W3C ``traceparent`` on the attempt
(``Attempt.trace_context``) unless the caller passed ``trace_context=`` itself; the process
that does the attempt's work links its span to the reservation with :func:`link`.

Until a provider is set, an instrumented call checks for one and runs uninstrumented (two
type checks); not instrumented, fencepost's calls are exactly as they were.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.metrics import _internal as _metrics_internal
    from opentelemetry.trace import Link, SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:  # the core wheel has no dependencies; the extra brings the API
    raise ImportError(
        "fencepost.otel needs the OpenTelemetry API: pip install 'fencepost[otel]'"
    ) from e

from fencepost import _core, _hooks, _observe
from fencepost.errors import LedgerError, StoreBusy, StoreError
from fencepost.ledger import Ledger
from fencepost.models import Attempt, Reservation, Run

__all__ = ["INSTRUMENTS", "OPERATIONS", "instrument", "is_instrumented", "link", "uninstrument"]

OPERATIONS: Final = _hooks.OPERATIONS
"""The operations that get a span and count in ``fencepost.operations``."""

INSTRUMENTS: Final = (
    ("fencepost.operations", "counter", "{operation}", "Ledger operations"),
    ("fencepost.operation.duration", "histogram", "s", "Time a ledger operation took"),
    ("fencepost.fence.rejections", "counter", "{write}",
     "Fenced writes refused because their claim no longer held the lease"),
    ("fencepost.lease.takeovers", "counter", "{claim}",
     "Claims that took a lease over from an owner whose claim had expired"),
    ("fencepost.attempt.reclaims", "counter", "{attempt}",
     "Running attempts reserved again (same attempt and dispatch id)"),
    ("fencepost.commit.group_size", "histogram", "{call}",
     "Calls committed together in one group-commit transaction"),
    ("fencepost.store.busy_retries", "counter", "{retry}", "Contended writes tried again"),
    ("fencepost.units.exhausted", "counter", "{unit}",
     "Units whose failed attempt was the last their retry policy allows"),
    ("fencepost.schedules.fired", "counter", "{run}", "Runs queued by schedules' fires"),
)  # fmt: skip
"""Every instrument: name, kind, unit, description."""

_SCOPE: Final = "fencepost"
_MISSING: Final = object()
_PROPAGATOR: Final = TraceContextTextMapPropagator()
# What each operation is to a messaging system: reservations hand work out, claims take it,
# finishes settle it; everything else reads or manages the ledger.
_KINDS: Final[Mapping[str, str]] = {
    "reserve_attempt": "send", "reserve_attempts": "send", "reserve_run": "send",
    "start_run": "create", "publish_child_run": "create",
    "claim": "receive", "claim_next": "receive", "prepare_or_adopt": "receive",
    "finish_attempt": "settle", "finish_attempts": "settle", "release": "settle",
    "wait_events": "receive",
}  # fmt: skip


class _Telemetry:
    """The instruments and tracer of one :func:`instrument` call."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        version = _core.__version__
        self._live = False
        self.tracer = trace.get_tracer(_SCOPE, version, tracer_provider)
        meter = metrics.get_meter(_SCOPE, version, meter_provider=meter_provider)
        counters = {
            name: meter.create_counter(name, unit=unit, description=description)
            for name, kind, unit, description in INSTRUMENTS
            if kind == "counter"
        }
        histograms = {
            name: meter.create_histogram(name, unit=unit, description=description)
            for name, kind, unit, description in INSTRUMENTS
            if kind == "histogram"
        }
        self.operations: Counter = counters["fencepost.operations"]
        self.duration: Histogram = histograms["fencepost.operation.duration"]
        self.rejections: Counter = counters["fencepost.fence.rejections"]
        self.takeovers: Counter = counters["fencepost.lease.takeovers"]
        self.reclaims: Counter = counters["fencepost.attempt.reclaims"]
        self.group_size: Histogram = histograms["fencepost.commit.group_size"]
        self.retries: Counter = counters["fencepost.store.busy_retries"]
        self.exhaustions: Counter = counters["fencepost.units.exhausted"]
        self.fires: Counter = counters["fencepost.schedules.fired"]

    def live(self) -> bool:
        """Whether a provider is set (once one is, it stays: OpenTelemetry refuses to replace
        it, so the answer is kept)."""
        if self._live:
            return True
        if self._tracer_provider is None and self._meter_provider is None and _unset():
            return False
        tracer_provider = self._tracer_provider or trace.get_tracer_provider()
        meter_provider = self._meter_provider or metrics.get_meter_provider()
        traced = not isinstance(
            tracer_provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
        )
        # The API's stand-in before a provider is set has no public name to test against.
        metered = not isinstance(meter_provider, metrics.NoOpMeterProvider) and (
            type(meter_provider).__name__ != "_ProxyMeterProvider"
        )
        self._live = traced or metered
        _core.observe_groups(self._live)
        return self._live

    # The sink of fencepost._observe: counts reported by the core.
    def takeover(self) -> None:
        self.takeovers.add(1)

    def refused(self, reason: str) -> None:
        self.rejections.add(1, {"reason": reason})

    def busy_retries(self, count: int) -> None:
        self.retries.add(count)

    def groups(self, sizes: Sequence[int]) -> None:
        for size in sizes:
            self.group_size.record(size)

    def exhausted(self) -> None:
        self.exhaustions.add(1)

    def fired(self, count: int) -> None:
        self.fires.add(count)

    def start(self, name: str, run_id: str | None) -> trace.Span:
        attributes: dict[str, str] = {
            "messaging.system": _SCOPE,
            "messaging.operation.name": name,
            "messaging.operation.type": _KINDS.get(name, "process"),
        }
        if run_id is not None:
            attributes["fencepost.run_id"] = run_id
        return self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)

    def end(
        self,
        name: str,
        span: trace.Span,
        started_ns: int,
        result: object,
        error: BaseException | None,
    ) -> None:
        outcome = _outcome(error)
        attributes = {"operation": name, "outcome": outcome}
        if outcome == "cancelled":
            # The caller stopped waiting; the call itself may still have committed.
            span.set_attribute("fencepost.cancelled", True)
        elif error is not None:
            error_type = type(error).__qualname__
            attributes["error.type"] = error_type
            span.set_attribute("error.type", error_type)
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, str(error))
        if error is None:
            reclaimed = _reclaims(result)
            if isinstance(result, Run):  # start_run and the like: the run they made
                span.set_attribute("fencepost.run_id", result.run_id)
            if reclaimed:
                self.reclaims.add(reclaimed)
            if isinstance(result, Reservation):
                span.set_attribute("messaging.message.id", result.dispatch_id)
        self.operations.add(1, attributes)
        self.duration.record((time.perf_counter_ns() - started_ns) / 1e9, attributes)
        span.end()


def _unset() -> bool:
    """Whether neither global provider has been set: the check every instrumented call makes
    until one is. The API's public getters read the environment on each call (about 0.8 us
    each, measured), so the module globals they guard are read directly; on an API version
    without them the getters answer instead. ``instrument`` calls the getters once, so a
    provider named by ``OTEL_PYTHON_*_PROVIDER`` is made before the first check."""
    tracer = getattr(trace, "_TRACER_PROVIDER", _MISSING)
    meter = getattr(_metrics_internal, "_METER_PROVIDER", _MISSING)
    if tracer is _MISSING or meter is _MISSING:
        return False  # the getters decide, in live()
    return tracer is None and meter is None


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    if isinstance(error, asyncio.CancelledError | GeneratorExit | KeyboardInterrupt):
        return "cancelled"
    if isinstance(error, LedgerError) and not isinstance(error, StoreError | StoreBusy):
        return "refused"
    return "error"


def _reclaims(result: object) -> int:
    if isinstance(result, Reservation):
        return int(result.kind == "reclaimed")
    if isinstance(result, list) and result and isinstance(result[0], Reservation):
        return sum(r.kind == "reclaimed" for r in result)
    return 0


def _traceparent(span: trace.Span) -> str | None:
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _with_trace_context(
    name: str, span: trace.Span, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A reservation's arguments with the span's traceparent on every unit that has none."""
    tp = _traceparent(span)
    if tp is None:
        return args, kwargs
    if name == "reserve_attempt" and kwargs.get("trace_context") is None:
        kwargs = {**kwargs, "trace_context": tp}
    elif name == "reserve_attempts":
        units = kwargs["units"] if "units" in kwargs else args[1] if len(args) > 1 else None
        if isinstance(units, Sequence):
            marked = [
                {**u, "trace_context": tp}
                if isinstance(u, Mapping) and u.get("trace_context") is None
                else u
                for u in units
            ]
            if "units" in kwargs:
                kwargs = {**kwargs, "units": marked}
            else:
                args = (args[0], marked, *args[2:])
    return args, kwargs


_RESERVES: Final = frozenset({"reserve_attempt", "reserve_attempts"})


def _run_param(fn: Callable[..., Any]) -> str | None:
    """The parameter that names the run an operation is about: its first one, when that is
    ``run_id``, ``parent_run_id`` or a ``claim``; ``None`` for the operations about no single
    run (their first argument is a workflow ref, a runner, a prefix...)."""
    first = list(inspect.signature(fn).parameters)[1:2]
    return first[0] if first and first[0] in ("run_id", "parent_run_id", "claim") else None


def _run_id(param: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if param is None:
        return None
    found = args[0] if args else kwargs.get(param)
    if param == "claim":
        found = getattr(found, "run_id", None)
    return found if isinstance(found, str) else None


@functools.cache
def _param_of(name: str) -> str | None:
    return _run_param(getattr(Ledger, name))


class _Hook:
    """The hook :func:`instrument` sets (``fencepost._hooks``): a span and the operation's
    counts around each call, once a provider is set."""

    def __init__(self, telemetry: _Telemetry) -> None:
        self.t = telemetry

    def call(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        t = self.t
        if not (t._live or t.live()):
            return fn(*args, **kwargs)
        ledger, rest = args[0], args[1:]
        span = t.start(name, _run_id(_param_of(name), rest, kwargs))
        started = time.perf_counter_ns()
        with trace.use_span(span, end_on_exit=False, record_exception=False):
            if name in _RESERVES:
                rest, kwargs = _with_trace_context(name, span, rest, kwargs)
            try:
                result = fn(ledger, *rest, **kwargs)
            except BaseException as e:
                t.end(name, span, started, None, e)
                raise
        t.end(name, span, started, result, None)
        return result

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        t = self.t
        if not (t._live or t.live()):
            return await fn(*args, **kwargs)
        ledger, rest = args[0], args[1:]
        span = t.start(name, _run_id(_param_of(name), rest, kwargs))
        started = time.perf_counter_ns()
        with trace.use_span(span, end_on_exit=False, record_exception=False):
            if name in _RESERVES:
                rest, kwargs = _with_trace_context(name, span, rest, kwargs)
            try:
                result = await fn(ledger, *rest, **kwargs)
            except BaseException as e:
                t.end(name, span, started, None, e)
                raise
        t.end(name, span, started, result, None)
        return result


_state: _Telemetry | None = None


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Instrument every ``Ledger`` and ``AsyncLedger`` of the process (open or not): every
    operation passes one hook (``fencepost._hooks``), which this sets. The providers default
    to the global ones, read when a call first finds them set; calling again replaces the
    providers."""
    global _state
    uninstrument()
    _state = _Telemetry(tracer_provider, meter_provider)
    _hooks.hook = _Hook(_state)
    _observe.sink = _state
    # Made now if the environment names them, so that _unset() sees them.
    trace.get_tracer_provider()
    metrics.get_meter_provider()
    _state.live()


def uninstrument() -> None:
    """Take the hook away; nothing is emitted afterwards."""
    global _state
    if _state is None:
        return
    _hooks.hook = None
    _observe.sink = None
    _core.observe_groups(False)
    _state = None


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in force."""
    return _state is not None


def link(attempt: Attempt | str | None) -> Link | None:
    """A span link to the span that reserved ``attempt`` (an :class:`Attempt` or its
    ``trace_context``), for the span of the work done for it; ``None`` when it has none::

        with tracer.start_as_current_span("work", links=[l for l in [link(a)] if l]):
            ...
    """
    tp = attempt.trace_context if isinstance(attempt, Attempt) else attempt
    if not tp:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": tp})).get_span_context()
    return Link(context) if context.is_valid else None

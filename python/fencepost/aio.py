"""``AsyncLedger``: every ``Ledger`` method as a coroutine, for asyncio programs.

Results, models and errors are exactly the synchronous ones, and the event loop keeps running
while the database works:

- ``reserve_attempt(s)``, ``finish_attempt(s)``, ``heartbeat``, ``set_status`` and
  ``complete_step`` check their arguments at once (a bad one raises before anything is
  queued), then queue on the ledger's group-commit writer and await an asyncio future,
  resolved after the commit. No thread is taken per call: calls in flight together share
  transactions, and thousands of coroutines cost thousands of futures. At most 1024 such
  calls per ``AsyncLedger`` are queued at a time; the others wait their turn in the event
  loop.
- ``wait_events`` holds no thread while it waits: one thread per ``AsyncLedger`` (and event
  loop) waits for every waiting coroutine and wakes them when the events may have changed
  (on PostgreSQL, by ``LISTEN``); each then runs its query briefly in a worker thread.
- Every other method runs the blocking method in a worker thread (``asyncio.to_thread``); the
  Rust core releases the GIL for the whole database transaction. ``claim`` is among them: it
  still shares transactions with the others (its thread queues on the same writer), and its
  thread lets a cancelled claim wait for its outcome and release the lease it took.

    async with await fencepost.aio.AsyncLedger.open("fencepost.db") as ledger:
        run = await ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)

Calls on one ``AsyncLedger`` share its connection, as threads sharing a ``Ledger`` do:
concurrent reserves, finishes, heartbeats, claims, status moves and step completions share
transactions (group commit); the other writes run one transaction at a time. ``close`` lets
the queued calls run (within the busy timeout) and fails any still queued with
``StoreError``: no awaiting coroutine is left hanging.

Cancellation (``task.cancel()``, ``asyncio.wait_for`` or ``asyncio.timeout`` running out)
cancels the *wait*, not the work. A call already handed to the ledger runs to its end and
commits or rolls back exactly as it would have; the cancelled caller just does not see the
outcome. So a cancelled write **may have committed**, and every write has a way back:

- ``claim``, ``claim_next`` and ``prepare_or_adopt`` take leases whose tokens only the call's
  result carries. When one of them is cancelled, the cancellation waits for the transaction to
  end and releases the leases it took (if any) before ``CancelledError`` (or
  ``TimeoutError``) reaches the caller, so no lease is left that nobody can use or give back.
  ``open`` likewise closes the ledger it opened.
- ``reserve_attempt(s)``: call it again with the same units; attempts the cancelled call
  reserved come back ``kind="reclaimed"`` with the same attempt numbers and dispatch ids.
- ``finish_attempt(s)`` is a compare-and-set: calling it again returns ``False`` for a finish
  that already landed, and nothing is written twice.
- ``start_run(run_id=...)``, ``publish_child_run`` (by ``invocation_key``) and
  ``prepare_or_adopt`` are idempotent by key; ``get_run``/``events`` show what happened.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from fencepost import _core, _hooks
from fencepost.errors import LedgerError
from fencepost.ledger import Durability, Ledger
from fencepost.models import Claim, Event

__all__ = ["AsyncLedger"]

P = ParamSpec("P")
R = TypeVar("R")

# The synchronous method as defined, kept apart from whatever later wraps ``Ledger``'s
# attribute (fencepost.otel): each of this wait's queries is part of one call, not a call.
_QUERY_EVENTS = _hooks.unwrapped(Ledger.wait_events)

IN_FLIGHT = 1024
"""The most writer calls one ``AsyncLedger`` has queued at a time, per event loop."""


class _SubmitCore:
    """The core as a ``Ledger`` facade sees it, except that every call passes ``future=``: the
    facade's own methods then shape the arguments, and the core queues the call to resolve
    ``future`` instead of waiting for it."""

    __slots__ = ("_core", "_future")

    def __init__(self, core: _core.Ledger, future: asyncio.Future[Any]) -> None:
        self._core = core
        self._future = future

    def __getattr__(self, name: str) -> Callable[..., None]:
        return functools.partial(getattr(self._core, name), future=self._future)


class _Gate:
    """At most ``size`` queued calls at a time on one event loop; the callers beyond wait, in
    the order they came, and a place given back goes straight to the first of them.

    ``asyncio.Semaphore`` leaves a woken waiter in its queue until that waiter runs, and each
    release looks past every such waiter again: a group's answers give back their places
    together, so with thousands of callers waiting that was quadratic (10 000 coroutines: most
    of the event loop's time)."""

    __slots__ = ("_dead", "_free", "_loop", "_waiters")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self._free = size
        self._loop = loop
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Waiters cancelled before their turn, still queued (done): passed over by `release`,
        # and swept out when they outnumber the live ones, so callers that give up again and
        # again while the store stalls (`wait_for` in a loop) do not pile up.
        self._dead = 0

    def take(self) -> bool:
        """Take a place if one is free and nobody waits for it (no await needed)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def wait(self) -> None:
        """Wait for a place, handed over by ``release``."""
        handed: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(handed)
        try:
            await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled():
                self.release()  # handed over as the caller was cancelled: pass it on
            else:
                self._dead += 1
                if self._dead > 64 and 2 * self._dead > len(self._waiters):
                    self._waiters = collections.deque(w for w in self._waiters if not w.done())
                    self._dead = 0
            raise

    def release(self) -> None:
        """Give a place back: to the first caller still waiting, else to the free ones. A
        cancelled waiter's future stays queued, done, and is passed over here once."""
        while self._waiters:
            handed = self._waiters.popleft()
            if not handed.done():
                handed.set_result(None)
                return
            # Not below zero: a waiter cancelled whose `wait` has not yet counted it may be
            # passed over first (it is then counted once too many, until the next sweep).
            self._dead = max(0, self._dead - 1)
        self._free += 1


class _Answer(asyncio.Future[Any]):
    """The future a queued call's caller awaits, with the gate its call holds a place in.

    The core resolves it after the commit (``_resolve_many``). A cancelled caller cancels this
    future, and only it: the call stays queued and runs, the answer finds the future done and
    is dropped, and the call's place in the gate is given back when the answer comes, not when
    the caller gave up, so the gate bounds the calls queued, cancelled or not."""

    __slots__ = ("gate",)

    def __init__(self, loop: asyncio.AbstractEventLoop, gate: _Gate) -> None:
        super().__init__(loop=loop)
        # `None` once the place was given back otherwise (see `_queued`).
        self.gate: _Gate | None = gate


def _resolve_many(
    items: list[tuple[asyncio.Future[Any], bool, Any]],
    settled: Callable[[], None] | None = None,
) -> None:
    """Resolve futures with ``(future, failed, result or exception)``: called on their loop, once
    per group the writer committed. A future whose caller gave up (cancelled) is left alone.
    ``settled`` is called once the callers woken here have run up to their next wait (it is
    scheduled behind them), so the writer may form its next group with the calls they make."""
    try:
        for future, failed, value in items:
            if isinstance(future, _Answer) and future.gate is not None:
                future.gate.release()
            if future.done():
                continue
            if failed:
                future.set_exception(value)
            else:
                future.set_result(value)
    finally:
        if settled is not None:
            # Behind the callers just woken: a future wakes its task one callback later.
            asyncio.get_running_loop().call_soon(settled)


def _queued(
    method: Callable[Concatenate[Ledger, P], R],
) -> Callable[Concatenate[AsyncLedger, P], Coroutine[Any, Any, R]]:
    """The coroutine form of a ``Ledger`` method the writer groups: queued with a future, no
    thread. Cancelled, the caller stops waiting; the call still runs (see the module docs and
    ``_Answer``). No ``asyncio.shield``: the future is the core's only link to the caller, so
    nothing else needs protecting from the cancellation, and each call spares the shield's
    second future and the two callbacks a resolution then takes."""
    operation = method
    method = _hooks.unwrapped(method)

    async def call(self: AsyncLedger, /, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        gate = self._gate_on(loop)
        if not gate.take():
            await gate.wait()
        future = _Answer(loop, gate)
        try:
            method(
                Ledger(cast(_core.Ledger, _SubmitCore(self.ledger._core, future))), *args, **kwargs
            )
        except BaseException:
            # Refused before it was queued, or (an exception from a signal) perhaps just after:
            # the place comes back now, and an answer that still comes gives back nothing and
            # finds its future done.
            future.gate = None
            future.cancel()
            gate.release()
            raise
        # Answered as the caller is cancelled, the task still takes the outcome from the
        # future before it raises CancelledError: a failure is never left unretrieved.
        result: R = await future
        return result

    return _hooks.async_form(operation, call)


def _in_thread(
    method: Callable[Concatenate[Ledger, P], R],
    *,
    lease: Callable[[R], Iterable[Claim | None]] | None = None,
) -> Callable[Concatenate[AsyncLedger, P], Coroutine[Any, Any, R]]:
    """The coroutine form of a ``Ledger`` method, with the same signature and docstring.

    ``lease`` picks the claims out of the method's result, for the methods that take leases:
    cancelled, the coroutine releases them (see the module docs)."""
    operation = method
    method = _hooks.unwrapped(method)

    async def call(self: AsyncLedger, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if lease is None:
            return await asyncio.to_thread(method, self.ledger, *args, **kwargs)
        ledger = self.ledger

        def release(result: R) -> None:
            for taken in lease(result):
                if taken is not None:
                    ledger.release(taken)

        return await _undo_on_cancel(functools.partial(method, ledger, *args, **kwargs), release)

    return _hooks.async_form(operation, call)


async def _wait_out(fut: asyncio.Future[Any]) -> None:
    """Wait until ``fut`` is done, through any further cancellation of the caller: the work in
    its thread ends on its own, and what it did must be known."""
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([fut])


async def _undo_on_cancel(work: Callable[[], R], undo: Callable[[R], None]) -> R:
    """Run ``work`` in a thread. If the caller is cancelled meanwhile, wait for ``work`` to end
    and run ``undo`` on what it returned (in a thread too) before re-raising the cancellation:
    what ``work`` took is given back, since the cancelled caller never receives it."""
    inner = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        await _wait_out(inner)
        if not inner.cancelled() and inner.exception() is None:
            done = asyncio.ensure_future(asyncio.to_thread(undo, inner.result()))
            await _wait_out(done)
            if not done.cancelled():
                # A lease that lapsed or was taken over meanwhile needs no release.
                with contextlib.suppress(LedgerError):
                    done.result()
        raise


class _Watcher:
    """Waits for new events on behalf of every coroutine in ``wait_events`` on one event loop.

    One thread, started by the first waiter and ending a moment after the last one leaves,
    blocks in the core's pacer (``_core.Watch``: on PostgreSQL the ledger's ``LISTEN``ing
    connection, elsewhere the store's change mark, exactly as the blocking ``wait_events``
    waits) and, each time the events may have changed, resolves the future every waiter is
    awaiting. So a waiting coroutine holds no thread: a thousand of them cost one thread, and
    each runs its query (briefly, in a worker thread) only when woken.

    A waiter takes the current future *before* each query, so a commit that lands while the
    query runs resolves it and is seen by the next query; the pacer reads its mark before the
    first waiter's first query (``ready``)."""

    LINGER_S = 1.0
    """How long the thread goes on waiting after the last waiter left (a follower that pages
    on comes straight back)."""

    def __init__(self, core: _core.Ledger, loop: asyncio.AbstractEventLoop) -> None:
        self._core = core
        self._loop = loop
        self._lock = threading.Lock()
        self._waiters = 0
        self._running = False
        self._ready: asyncio.Future[None] = loop.create_future()
        self._moved: asyncio.Future[None] = loop.create_future()

    def join(self) -> asyncio.Future[None]:
        """Count a waiter in (starting the thread if none runs); the future that says the
        pacer is ready."""
        with self._lock:
            self._waiters += 1
            if self._running:
                return self._ready
            self._running = True
            if self._ready.done():
                self._ready = self._loop.create_future()
        threading.Thread(target=self._run, name="fencepost-wait", daemon=True).start()
        return self._ready

    def leave(self) -> None:
        with self._lock:
            self._waiters -= 1

    def moved(self) -> asyncio.Future[None]:
        """The future the next "may have changed" resolves."""
        return self._moved

    def _settle(self, fut: asyncio.Future[None], error: BaseException | None) -> None:
        if fut.done():
            return
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)

    def _pulse(self, error: BaseException | None = None) -> None:
        """On the loop: resolve the current future (or fail it) and start a new one."""
        fut, self._moved = self._moved, self._loop.create_future()
        self._settle(fut, error)

    def _post(self, call: Callable[..., None], *args: Any) -> bool:
        """Run ``call`` on the loop; ``False`` once the loop is closed."""
        try:
            self._loop.call_soon_threadsafe(call, *args)
        except RuntimeError:
            return False
        return True

    def _stop(self) -> None:
        with self._lock:
            self._running = False

    def _run(self) -> None:
        ready = self._ready
        try:
            watch = self._core.watch()
        except BaseException as exc:
            self._stop()
            self._post(self._settle, ready, exc)
            return
        if not self._post(self._settle, ready, None):
            self._stop()
            return
        last_seen = time.monotonic()
        while True:
            with self._lock:
                now = time.monotonic()
                if self._waiters:
                    last_seen = now
                elif now - last_seen >= self.LINGER_S:
                    self._running = False
                    return
            try:
                moved = watch.next(0.25)
            except BaseException as exc:
                # The store failed (or was closed): every waiter hears it; the next one starts
                # afresh.
                self._stop()
                self._post(self._pulse, exc)
                return
            if moved and not self._post(self._pulse):
                self._stop()
                return


class AsyncLedger:
    """The asyncio face of a :class:`fencepost.Ledger` (``ledger`` is the synchronous one)."""

    __slots__ = ("_gate", "_gate_loop", "_watcher", "ledger")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._gate: _Gate | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._watcher: _Watcher | None = None

    def _watcher_on(self, loop: asyncio.AbstractEventLoop) -> _Watcher:
        """The loop's watcher (see ``_Watcher``); a later ``asyncio.run`` gets its own."""
        if self._watcher is None or self._watcher._loop is not loop:
            self._watcher = _Watcher(self.ledger._core, loop)
        return self._watcher

    async def _wait_events(
        self,
        run_id: str | None = None,
        *,
        after_seq: int = 0,
        timeout_s: float,
        types: Iterable[str] | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """``Ledger.wait_events`` for asyncio: the same arguments, checks and results, but a
        waiting coroutine holds no thread. One thread per ``AsyncLedger`` and event loop waits
        for every waiter (on PostgreSQL on the ledger's ``LISTEN``ing connection) and wakes
        them when the events may have changed; each query then runs briefly in a worker
        thread. Cancelling the wait leaves nothing behind."""
        timeout = _core.wait_timeout(timeout_s)
        # Before the watcher: in a forked child its thread and lock are the parent's.
        self.ledger._core.check_process()

        def query() -> list[Event]:
            return _QUERY_EVENTS(
                self.ledger, run_id, after_seq=after_seq, timeout_s=0, types=types, limit=limit
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if timeout == 0:
            return await asyncio.to_thread(query)
        watcher = self._watcher_on(loop)
        ready = watcher.join()
        try:
            await asyncio.shield(ready)
            while True:
                moved = watcher.moved()
                found = await asyncio.to_thread(query)
                left = deadline - loop.time()
                if found or left <= 0:
                    return found
                await asyncio.wait([moved], timeout=left)
                if moved.done():
                    moved.result()
        finally:
            watcher.leave()

    wait_events = _hooks.async_operation("wait_events", _wait_events)

    def _gate_on(self, loop: asyncio.AbstractEventLoop) -> _Gate:
        """The bound on queued writer calls, made on the loop that uses it (a gate's futures
        belong to one loop; a later ``asyncio.run`` gets its own)."""
        if self._gate is None or self._gate_loop is not loop:
            self._gate = _Gate(IN_FLIGHT, loop)
            self._gate_loop = loop
        return self._gate

    @classmethod
    async def open(
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
    ) -> AsyncLedger:
        """``Ledger.open`` in a worker thread (opening migrates, which may take a moment); the
        same keywords. Cancelled, it closes the ledger it opened."""

        def work() -> Ledger:
            return Ledger.open(
                target,
                clock=clock,
                durability=durability,
                busy_timeout_ms=busy_timeout_ms,
                create=create,
                schema=schema,
                group_commit=group_commit,
                listen=listen,
            )

        return cls(await _undo_on_cancel(work, Ledger.close))

    async def close(self) -> None:
        """Close the ledger; idempotent."""
        await asyncio.to_thread(self.ledger.close)

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncLedger({self.ledger!r})"

    pragmas = _in_thread(Ledger.pragmas)
    integrity_check = _in_thread(Ledger.integrity_check)
    orphan_attempts = _in_thread(Ledger.orphan_attempts)
    put_json = _in_thread(Ledger.put_json)
    get_json = _in_thread(Ledger.get_json)
    start_run = _in_thread(Ledger.start_run)
    publish_child_run = _in_thread(Ledger.publish_child_run)
    get_run = _in_thread(Ledger.get_run)
    resolve_run_id = _in_thread(Ledger.resolve_run_id)
    list_runs = _in_thread(Ledger.list_runs)
    find_active_run = _in_thread(Ledger.find_active_run)
    find_active_run_outside_scope = _in_thread(Ledger.find_active_run_outside_scope)
    find_scope_occupant = _in_thread(Ledger.find_scope_occupant)
    child_runs = _in_thread(Ledger.child_runs)
    child_summary = _in_thread(Ledger.child_summary)
    run_counts = _in_thread(Ledger.run_counts)
    steps = _in_thread(Ledger.steps)
    complete_step = _queued(Ledger.complete_step)
    block_run = _in_thread(Ledger.block_run)
    resume_run = _in_thread(Ledger.resume_run)
    abandon_run = _in_thread(Ledger.abandon_run)
    set_outputs = _in_thread(Ledger.set_outputs)
    reserve_attempt = _queued(Ledger.reserve_attempt)
    reserve_attempts = _queued(Ledger.reserve_attempts)
    finish_attempt = _queued(Ledger.finish_attempt)
    finish_attempts = _queued(Ledger.finish_attempts)
    attempts = _in_thread(Ledger.attempts)
    unit_attempts = _in_thread(Ledger.unit_attempts)
    units = _in_thread(Ledger.units)
    unit_counts = _in_thread(Ledger.unit_counts)
    unit = _in_thread(Ledger.unit)
    accounting = _in_thread(Ledger.accounting)
    due_units = _in_thread(Ledger.due_units)
    exhausted_units = _in_thread(Ledger.exhausted_units)
    retry_units = _in_thread(Ledger.retry_units)
    cancel_units = _in_thread(Ledger.cancel_units)
    send = _in_thread(Ledger.send)
    newest_event_seq = _in_thread(Ledger.newest_event_seq)
    event_counts = _in_thread(Ledger.event_counts)
    receive = _in_thread(Ledger.receive)
    messages = _in_thread(Ledger.messages)
    put_schedule = _in_thread(Ledger.put_schedule)
    schedules = _in_thread(Ledger.schedules)
    pause_schedule = _in_thread(Ledger.pause_schedule)
    resume_schedule = _in_thread(Ledger.resume_schedule)
    delete_schedule = _in_thread(Ledger.delete_schedule)
    tick_schedules = _in_thread(Ledger.tick_schedules)
    reserve_run = _in_thread(Ledger.reserve_run)
    claim = _in_thread(Ledger.claim, lease=lambda claim: [claim])
    claim_next = _in_thread(Ledger.claim_next, lease=lambda claims: claims)
    set_concurrency_limit = _in_thread(Ledger.set_concurrency_limit)
    concurrency_limits = _in_thread(Ledger.concurrency_limits)
    pause_workflow = _in_thread(Ledger.pause_workflow)
    resume_workflow = _in_thread(Ledger.resume_workflow)
    paused_workflows = _in_thread(Ledger.paused_workflows)
    queued_runs = _in_thread(Ledger.queued_runs)
    queue_overview = _in_thread(Ledger.queue_overview)
    prepare_or_adopt = _in_thread(Ledger.prepare_or_adopt, lease=lambda prep: [prep.claim])
    heartbeat = _queued(Ledger.heartbeat)
    release = _in_thread(Ledger.release)
    set_status = _queued(Ledger.set_status)
    lease = _in_thread(Ledger.lease)
    expired_leases = _in_thread(Ledger.expired_leases)
    leases = _in_thread(Ledger.leases)
    events = _in_thread(Ledger.events)
    prune = _in_thread(Ledger.prune)
    restore = _in_thread(Ledger.restore)
    vacuum = _in_thread(Ledger.vacuum)

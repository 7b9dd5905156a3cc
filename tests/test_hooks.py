"""The one table of operations (``fencepost._hooks.OPERATIONS``) and the one hook every
operation passes: the ``Ledger`` methods, the ``AsyncLedger`` coroutines, the compiled core's
stubs and the operations ``fencepost.otel`` counts are each checked against the table, and a
hook sees each call once, sync or async, with nothing patched."""

from __future__ import annotations

import ast
import asyncio
import inspect
import pathlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import fencepost as fp
from fencepost import _hooks
from fencepost.aio import AsyncLedger

PACKAGE = pathlib.Path(fp.__file__).parent
# Methods of the compiled core that are not operations of their own: the handle's lifecycle
# and diagnostics the facade reads (``Ledger.target``, ``group_stats``, ``wait_stats``, the
# fork check, the watch a waiting coroutine shares).
CORE_ONLY = {"check_process", "close", "group_stats", "pragmas", "target", "wait_stats", "watch"}


def public(cls: type) -> set[str]:
    return {n for n, m in inspect.getmembers(cls) if not n.startswith("_") and callable(m)}


def test_every_ledger_method_is_an_operation_of_the_table_or_named_as_not_one() -> None:
    assert len(set(_hooks.OPERATIONS)) == len(_hooks.OPERATIONS)
    assert public(fp.Ledger) - set(_hooks.NOT_OPERATIONS) == set(_hooks.OPERATIONS)
    for name in _hooks.OPERATIONS:
        assert getattr(fp.Ledger, name).__fencepost_operation__ == name, name
    for name in _hooks.NOT_OPERATIONS:
        assert not hasattr(getattr(fp.Ledger, name), "__fencepost_operation__"), name


def test_every_operation_has_a_coroutine_that_passes_the_hook() -> None:
    assert public(AsyncLedger) - set(_hooks.NOT_OPERATIONS) == set(_hooks.OPERATIONS)
    for name in _hooks.OPERATIONS:
        method = getattr(AsyncLedger, name)
        assert inspect.iscoroutinefunction(method), name
        assert method.__fencepost_operation__ == name, name
        assert method.__name__ == name


def test_the_core_stubs_hold_every_operation() -> None:
    tree = ast.parse((PACKAGE / "_core.pyi").read_text(encoding="utf-8"))
    [ledger] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Ledger"]
    stubbed = {
        n.name for n in ledger.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    }
    operations = set(_hooks.OPERATIONS) - set(_hooks.FACADE_ONLY)
    assert operations <= stubbed, operations - stubbed
    assert stubbed - operations == CORE_ONLY


def test_otel_counts_the_table_and_patches_nothing() -> None:
    otel = pytest.importorskip("fencepost.otel", reason="the otel extra is not installed")
    assert otel.OPERATIONS is _hooks.OPERATIONS
    assert "setattr" not in (PACKAGE / "otel.py").read_text(encoding="utf-8")


class Recorder:
    """A hook that records each call and passes it on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def call(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.calls.append(("sync", name))
        return fn(*args, **kwargs)

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        self.calls.append(("async", name))
        return await fn(*args, **kwargs)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    assert _hooks.hook is None
    _hooks.hook = hook = Recorder()
    try:
        yield hook
    finally:
        _hooks.hook = None


def test_a_hook_sees_each_call_once(recorder: Recorder, tmp_path: pathlib.Path) -> None:
    target = str(tmp_path / "h.db")
    with fp.Ledger.open(target) as ledger:
        run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        res = ledger.reserve_attempt(run.run_id, "u", step_id="s")
        assert ledger.finish_attempt(
            run.run_id, "u", res.attempt, res.dispatch_id, status="completed"
        )
        with pytest.raises(fp.RunNotFound):
            ledger.steps("nope")
        ledger.pragmas()
    assert recorder.calls == [
        ("sync", "start_run"),
        ("sync", "reserve_attempt"),
        ("sync", "finish_attempt"),
        ("sync", "steps"),
    ]
    recorder.calls.clear()

    async def main() -> None:
        async with await AsyncLedger.open(target) as aledger:
            got = await aledger.get_run(run.run_id)
            assert got is not None
            # A grouped call (queued with a future) and a thread's call alike.
            r = await aledger.reserve_attempt(run.run_id, "v", step_id="s")
            assert r.kind == "reserved"
            assert await aledger.wait_events(run.run_id, timeout_s=0) != []

    asyncio.run(main())
    assert recorder.calls == [
        ("async", "get_run"),
        ("async", "reserve_attempt"),
        ("async", "wait_events"),
    ]


def test_without_a_hook_a_call_goes_straight_through() -> None:
    assert _hooks.hook is None
    with fp.Ledger.open(":memory:") as ledger:
        assert ledger.list_runs() == []
    assert fp.Ledger.list_runs.__wrapped__.__name__ == "list_runs"  # type: ignore[attr-defined]

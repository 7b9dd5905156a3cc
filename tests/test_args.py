"""Input a hostile or careless caller sends (``py/args`` and the text rules every operation
applies), on every backend: text means the same on SQLite and PostgreSQL, keys have one length
limit, JSON values keep what text arguments may not hold, and every refusal of a bad Python
value or clock is a ``fencepost`` error naming the argument, with nothing written."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import STEPS, FakeClock

# ------------------------------------------------------------------ text on both backends


def running(ledger: fp.Ledger) -> tuple[Any, Any]:
    run = ledger.start_run("wf", scope_key="s", steps=STEPS, run_id="r1")
    return run, ledger.reserve_attempt(run.run_id, "u1", step_id="build", holder="w1")


def test_nul_in_text_is_refused_the_same_everywhere(ledger: fp.Ledger) -> None:
    run, res = running(ledger)
    before = ledger.events(run.run_id)
    refusals = [
        ("failure_reason", lambda: ledger.finish_attempt(
            run.run_id, "u1", res.attempt, res.dispatch_id, status="failed",
            failure_reason="bad\x00byte")),
        ("failure_reason", lambda: ledger.finish_attempts([{
            "run_id": run.run_id, "unit_id": "u1", "attempt": res.attempt,
            "dispatch_id": res.dispatch_id, "status": "failed", "failure_reason": "\x00"}])),
        ("holder", lambda: ledger.reserve_attempt(run.run_id, "u2", step_id="build",
                                                   holder="w\x00")),
        ("notes", lambda: ledger.complete_step(run.run_id, "plan", notes="n\x00")),
        ("run_id", lambda: ledger.get_run("r1\x00")),
        ("run_id", lambda: ledger.events("r1\x00")),
        ("scope_key", lambda: ledger.start_run("wf2", scope_key="s\x00", steps=STEPS)),
        ("title", lambda: ledger.start_run("wf3", scope_key=None, force=True, steps=STEPS,
                                           title="t\x00")),
        ("steps", lambda: ledger.start_run("wf4", scope_key=None, force=True,
                                           steps=[{"id": "a", "title": "t\x00"}])),
    ]  # fmt: skip
    for argument, call in refusals:
        with pytest.raises(fp.InvalidArgument) as info:
            call()
        assert info.value.argument == argument
        assert "NUL" in str(info.value)
    # Nothing was written: the attempt still runs, no run or event was added.
    assert ledger.attempts(run.run_id, "u1")[0].status == "running"
    assert ledger.unit(run.run_id, "u2") is None
    assert [r.run_id for r in ledger.list_runs()] == ["r1"]
    assert ledger.events(run.run_id) == before
    # The worker with an odd failure reason can still finish that attempt once it cleans it.
    assert ledger.finish_attempt(
        run.run_id, "u1", res.attempt, res.dispatch_id, status="failed", failure_reason="bad"
    )


def test_keys_have_one_length_limit_everywhere(ledger: fp.Ledger) -> None:
    longest = "k" * 1024
    ledger.start_run("wf", scope_key=longest, steps=STEPS, run_id="r1")
    assert ledger.find_scope_occupant(longest).run_id == "r1"
    for argument, call in [
        ("scope_key", lambda: ledger.start_run("wf", scope_key="k" * 10_000, steps=STEPS)),
        ("scope_key", lambda: ledger.find_scope_occupant("é" * 513)),  # 1026 bytes
        (
            "workflow_ref",
            lambda: ledger.start_run("w" * 1025, scope_key=None, force=True, steps=STEPS),
        ),
    ]:
        with pytest.raises(fp.InvalidArgument, match="at most 1024 bytes") as info:
            call()
        assert info.value.argument == argument
    assert len(ledger.list_runs()) == 1
    # Free text is not bounded.
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, title="t" * 50_000)
    assert run.workflow_name == "t" * 50_000


def test_json_strings_keep_nul_on_every_backend(ledger: fp.Ledger) -> None:
    value = {"a\x00b": ["\x00", "x\x00y"], "n": 1}
    digest = ledger.put_json(value)
    assert digest == fp.digest(value)
    assert ledger.get_json(digest) == value
    run, res = running(ledger)
    assert (
        ledger.start_run("wf2", scope_key=None, force=True, steps=STEPS, params=value).params
        == value
    )
    assert ledger.finish_attempt(
        run.run_id, "u1", res.attempt, res.dispatch_id, status="completed", result=value
    )
    [r2] = ledger.reserve_attempts(run.run_id, [{"unit_id": "u2", "step_id": "build"}])
    assert ledger.finish_attempts([{
        "run_id": run.run_id, "unit_id": "u2", "attempt": r2.attempt,
        "dispatch_id": r2.dispatch_id, "status": "completed", "result": value,
    }]) == [True]  # fmt: skip
    assert ledger.unit(run.run_id, "u1").result == value
    assert ledger.unit(run.run_id, "u2").result == value


# ------------------------------------------------------------------ Python-level input


class RaisingEqKey(str):
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("hostile __eq__")


def test_bad_python_values_are_invalid_arguments(ledger: fp.Ledger) -> None:
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
    cases: list[tuple[str, Any, str]] = [
        ("force", lambda: ledger.start_run("wf", scope_key="s", steps=STEPS, force=1),
         "True or False"),
        ("force", lambda: ledger.start_run("wf", scope_key="s", steps=STEPS, force=None),
         "True or False"),
        ("active_only", lambda: ledger.list_runs(active_only=0), "True or False"),
        ("include_children", lambda: ledger.list_runs(include_children=None), "True or False"),
        ("guard_refs", lambda: ledger.start_run("wf", scope_key=None, force=True, steps=STEPS,
                                                guard_refs=5), "iterable of str"),
        ("workflow_refs", lambda: ledger.list_runs(workflow_refs=5), "iterable of str"),
        ("workflow_refs", lambda: ledger.find_active_run(5, "s"), "iterable of str"),
        ("types", lambda: ledger.events(types=5), "iterable of str"),
        ("run_id", lambda: ledger.get_run("r\ud800"), "lone surrogate"),
        ("after_seq", lambda: ledger.events(after_seq=2**70), "64-bit"),
        ("target", lambda: fp.Ledger.open("led\ud800.db"), "lone surrogate"),
        ("target", lambda: fp.Ledger.open("led\x00.db"), "NUL"),
    ]  # fmt: skip
    for argument, call, says in cases:
        with pytest.raises(fp.InvalidArgument, match=says) as info:
            call()
        assert info.value.argument == argument, (argument, info.value)
        # Never the self-contradicting "must be a str, not str" / "must be an int, not int".
        assert "a str, not str" not in str(info.value)
        assert "an int, not int" not in str(info.value)
    assert [r.run_id for r in ledger.list_runs()] == [run.run_id]
    # A str subclass whose __eq__ raises is read as the str it is: no key lookup calls it.
    [res] = ledger.reserve_attempts(
        run.run_id, [{RaisingEqKey("unit_id"): "u1", RaisingEqKey("step_id"): "build"}]
    )
    assert (res.unit_id, res.kind) == ("u1", "reserved")
    with pytest.raises(fp.InvalidArgument, match='unknown key "bogus"') as info:
        ledger.reserve_attempts(run.run_id, [{"unit_id": "u2", RaisingEqKey("bogus"): 1}])
    assert info.value.argument == "units"
    with pytest.raises(fp.InvalidArgument, match="unknown key of type int"):
        ledger.reserve_attempts(run.run_id, [{"unit_id": "u2", 7: 1}])


def test_names_as_bytes_or_other_items_are_refused_naming_the_argument(
    ledger: fp.Ledger,
) -> None:
    """Every argument that takes one name or several (refs, statuses, event types) refuses
    bytes (iterable, but of ints) and an item that is not a str, saying which argument and
    what it takes: never "must be a str, not int" for bytes it was given."""
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
    before = ledger.events()
    calls: dict[str, Any] = {
        "guard_refs": lambda v: ledger.start_run("wf2", scope_key="s", steps=STEPS, guard_refs=v),
        "workflow_refs": lambda v: ledger.list_runs(workflow_refs=v),
        "status": lambda v: ledger.list_runs(status=v),
        "workflow_names": lambda v: ledger.claim_next("c", lease_ms=1000, workflow_names=v),
        "types": lambda v: ledger.events(types=v),
    }
    also = [
        ("workflow_refs", lambda v: ledger.find_active_run(v, "s")),
        ("workflow_refs", lambda v: ledger.find_active_run_outside_scope(v, "s")),
        ("types", lambda v: ledger.wait_events(types=v, timeout_s=0)),
        ("statuses", lambda v: ledger.prune(older_than=dt.timedelta(0), statuses=v)),
    ]
    for argument, call in [*calls.items(), *also]:
        for bad, says in [
            (b"x", "not bytes: decode it first"),
            (bytearray(b"x"), "not bytearray: decode it first"),
            (memoryview(b"x"), "not memoryview: decode it first"),
            ([b"completed"], "item 0 is of type bytes"),
            (("a", 1), "item 1 is of type int"),
        ]:
            with pytest.raises(fp.InvalidArgument) as info:
                call(bad)
            assert info.value.argument == argument, (argument, bad, info.value)
            message = str(info.value)
            assert message.startswith(f"{argument} must be a str or an iterable of str"), message
            assert says in message, message
    assert [r.run_id for r in ledger.list_runs()] == [run.run_id]
    assert ledger.events() == before


def test_a_page_cursor_with_naive_or_foreign_times_is_refused(ledger: fp.Ledger) -> None:
    """``list_runs(after=)`` takes the last Run of a page; one built by hand with times that
    name no instant is an InvalidArgument on ``after``, not a TypeError from the arithmetic."""
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
    naive = run.updated_at.replace(tzinfo=None)
    bad_runs = [
        (dataclasses.replace(run, updated_at=naive), "updated_at is a naive datetime"),
        (dataclasses.replace(run, created_at=naive), "created_at is a naive datetime"),
        (dataclasses.replace(run, updated_at=run.updated_at.isoformat()), "updated_at is '"),
        (dataclasses.replace(run, run_id=7), "run_id is of type int, not str"),
    ]
    for bad, says in bad_runs:
        with pytest.raises(fp.InvalidArgument, match="after must be the last Run") as info:
            ledger.list_runs(after=bad, limit=10)
        assert info.value.argument == "after"
        assert says in str(info.value), str(info.value)
    # The same cursor with aware times in any zone pages as the ledger's own Run does.
    elsewhere = dt.timezone(dt.timedelta(hours=5))
    moved = dataclasses.replace(
        run,
        updated_at=run.updated_at.astimezone(elsewhere),
        created_at=run.created_at.astimezone(elsewhere),
    )
    assert ledger.list_runs(after=moved, limit=10) == ledger.list_runs(after=run, limit=10) == []


@pytest.mark.parametrize("bad", [2**62, -(10**15), -1, 253_402_300_799_999])
def test_a_clock_outside_the_datetime_range_writes_nothing(bad: int, target: str) -> None:
    clock = FakeClock()
    with fp.Ledger.open(target, clock=clock) as ledger:
        run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
        events = ledger.events(run.run_id)
        good = clock.now
        clock.now = bad
        with pytest.raises(fp.InvalidArgument, match="outside the epoch milliseconds") as info:
            ledger.claim(run.run_id, "c1", lease_ms=1000)
        assert info.value.argument == "clock"
        with pytest.raises(fp.InvalidArgument):
            ledger.reserve_attempt(run.run_id, "u1", step_id="build")
        clock.now = good
        lease = ledger.lease(run.run_id)  # still readable: nothing out of range was stored
        assert (lease.generation, lease.owner_id) == (0, None)
        assert ledger.events(run.run_id) == events
        assert ledger.claim(run.run_id, "c1", lease_ms=1000) is not None
    clock.now = bad
    with pytest.raises(fp.InvalidArgument, match="clock"):
        fp.Ledger.open(target, clock=clock)

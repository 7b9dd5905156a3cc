"""Uses the public API the way a user would; `mypy --strict` checks this file (STYLE §5), and its
asserts also run as a smoke test."""

from __future__ import annotations

import datetime as dt
import pathlib

import fencepost as fp


def test_public_surface_types() -> None:
    body: bytes = fp.canonical_json({"b": [1, 2.5, None], "a": True})
    digest: str = fp.digest(("x", {"y": 1}))
    version: str = fp.__version__
    depth: int = fp.MAX_DEPTH
    assert body == b'{"a":true,"b":[1,2.5,null]}'
    assert digest.startswith("sha256:")
    assert len(digest) == 71
    assert version.count(".") == 2
    assert depth == 512


def test_errors_are_typed() -> None:
    try:
        fp.canonical_json(float("nan"))
    except fp.CanonicalJsonError as err:
        path: str = err.path
        reason: str = err.reason
        argument: str = err.argument
        assert (path, argument) == ("$", "value")
        assert reason
    else:
        raise AssertionError("NaN was accepted")
    lost = fp.LeaseLost(run_id="r", expected_generation=1, actual_generation=2)
    generations: tuple[int, int] = (lost.expected_generation, lost.actual_generation)
    assert generations == (1, 2)
    busy: TimeoutError = fp.StoreBusy(waited_ms=1, retries=2)
    assert isinstance(busy, fp.LedgerError)


def test_ledger_is_typed(tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(str(tmp_path / "typed.db")) as ledger:
        run: fp.Run = ledger.start_run("wf", scope_key="s", steps=[{"id": "a"}])
        started: dt.datetime = run.created_at
        res: fp.Reservation = ledger.reserve_attempt(run.run_id, "u", step_id="a")
        ok: bool = ledger.finish_attempt(
            run.run_id, "u", res.attempt, res.dispatch_id, status="completed", tokens=3
        )
        acc: fp.Accounting = ledger.accounting(run.run_id)
        events: list[fp.Event] = ledger.events(run.run_id)
        steps: list[fp.Step] = ledger.steps(run.run_id)
        units: list[fp.Unit] = ledger.units(run.run_id)
        found: fp.Run | None = ledger.find_active_run("wf", "s")
        listed: list[fp.Run] = ledger.list_runs(scope_key=fp.ALL_SCOPES)
        digest: str = ledger.put_json({"k": [1]})
        assert ok
        assert started.tzinfo is dt.UTC
        assert acc.total_tokens == 3
        assert [e.type for e in events] == ["run.started", "unit.started", "unit.finished"]
        assert [s.step_id for s in steps] == ["a"]
        assert units[0].status == "completed"
        assert found == ledger.get_run(run.run_id)
        assert listed[0].run_id == run.run_id
        assert ledger.get_json(digest) == {"k": [1]}


async def _typed_async_usage() -> None:
    # mypy --strict checks these against fencepost.aio's ParamSpec-typed wrappers.
    from fencepost.aio import AsyncLedger

    async with await AsyncLedger.open(":memory:") as aledger:
        arun: fp.Run = await aledger.start_run("wf", scope_key=None, steps=[{"id": "s"}])
        ares: fp.Reservation = await aledger.reserve_attempt(arun.run_id, "u", step_id="s")
        ok: bool = await aledger.finish_attempt(
            arun.run_id, "u", ares.attempt, ares.dispatch_id, status="completed"
        )
        aclaim: fp.Claim | None = await aledger.claim(arun.run_id, "host-a", lease_ms=10)
        assert ok
        assert aclaim is not None

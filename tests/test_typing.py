"""Uses the public API the way a user would; `mypy --strict` checks this file (the lint step),
so it doubles as a test of the types a user leans on, and its asserts also run as a smoke test.
`test_mypy_strict_*` run mypy on snippets here too: a controller's narrowing must pass, and the
misuses the types exist to catch must be reported."""

from __future__ import annotations

import datetime as dt
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

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


DEFINITION = {"steps": [{"id": "s"}]}


def prepare(ledger: fp.Ledger, run_id: str) -> fp.ClaimedPreparation | fp.AdoptedPreparation:
    return ledger.prepare_or_adopt(
        run_id,
        workflow_name="wf",
        workflow_ref="wf@1",
        source={"repo": "r"},
        definition_digest=fp.digest(DEFINITION),
        definition=DEFINITION,
        runner_id="controller-1",
        origin_session_id="session-1",
        lease_ms=30_000,
    )


def test_preparation_state_narrows_claim() -> None:
    with fp.Ledger.open(":memory:") as ledger:
        prep = prepare(ledger, "run-1")
        queued: fp.RunStatus = prep.run.status
        token = ""
        if prep.state == "claimed":
            claim: fp.Claim = prep.claim  # narrowed: never None here
            token = prep.claim.token
            ledger.heartbeat(claim, lease_ms=30_000)
        again = prepare(ledger, "run-1")
        if again.state == "adopted":
            nothing: None = again.claim
            assert nothing is None
        state: fp.PreparationState = again.state
        either: fp.Preparation = again
        assert queued == "starting"
        assert token
        assert state == "adopted"
        assert either.claim is None
        assert isinstance(prep, fp.Preparation)


def test_statuses_are_literals() -> None:
    with fp.Ledger.open(":memory:") as ledger:
        run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        res = ledger.reserve_attempt(run.run_id, "u", step_id="s")
        kind: fp.ReservationKind = res.kind
        again = ledger.reserve_attempt(run.run_id, "u", step_id="s")
        ledger.finish_attempt(
            run.run_id, "u", res.attempt, res.dispatch_id, status="timed_out", tokens=1
        )
        attempts: list[fp.AttemptStatus] = [a.status for a in ledger.attempts(run.run_id, "u")]
        unit = ledger.unit(run.run_id, "u")
        assert unit is not None
        unit_status: fp.UnitStatus = unit.status
        steps: list[fp.StepStatus] = [s.status for s in ledger.steps(run.run_id)]
        run_status: fp.RunStatus = run.status
        assert (kind, again.kind) == ("reserved", "reclaimed")
        assert attempts == ["timed_out"]
        assert unit_status == "timed_out"
        assert steps == ["active"]
        assert run_status == "active"


# A controller and a dispatcher as a user writes them: `mypy --strict` must accept this.
GOOD = """
    from __future__ import annotations

    import fencepost as fp
    from fencepost.aio import AsyncLedger


    def controller(ledger: fp.Ledger, definition: object) -> str | None:
        prep = ledger.prepare_or_adopt(
            "run-1", workflow_name="wf", workflow_ref="wf@1", source={},
            definition_digest=fp.digest(definition), definition=definition,
            runner_id="host-a", origin_session_id="s", lease_ms=30_000,
        )
        if prep.state == "claimed":
            ledger.set_status(prep.run.run_id, "active", claim=prep.claim)
            ledger.reserve_attempt(prep.run.run_id, "u", step_id="s", claim=prep.claim)
            return prep.claim.token
        adopted: None = prep.claim
        return adopted


    def dispatcher(ledger: fp.Ledger, run_id: str) -> bool:
        res = ledger.reserve_attempt(run_id, "u", step_id="s")
        fresh = res.kind == "reserved"
        unit = ledger.unit(run_id, "u")
        done = unit is not None and unit.status in ("completed", "failed")
        return fresh and not done and ledger.get_run(run_id) is not None


    async def tenant(url: str) -> str | None:
        async with await AsyncLedger.open(
            url, schema="tenant_a", create=False, durability="full", busy_timeout_ms=100
        ) as aledger:
            prep = await aledger.prepare_or_adopt(
                "run-1", workflow_name="wf", workflow_ref="wf@1", source={},
                definition_digest="sha256:x", definition={}, runner_id="host-a",
                origin_session_id="s", lease_ms=30_000,
            )
            return prep.claim.token if prep.state == "claimed" else None
"""

# Each line marked `# E: <error code>` must be reported with that code, and nothing else.
BAD = """
    from __future__ import annotations

    import fencepost as fp


    def misuse(ledger: fp.Ledger, run: fp.Run, claim: fp.Claim) -> None:
        prep = ledger.prepare_or_adopt(
            "run-1", workflow_name="wf", workflow_ref="wf@1", source={},
            definition_digest="sha256:x", definition={}, runner_id="host-a",
            origin_session_id="s", lease_ms=30_000,
        )
        print(prep.claim.token)  # E: union-attr
        if run.status == "runing":  # E: comparison-overlap
            pass
        ledger.set_outputs(run.run_id, {}, claim="a token")  # E: arg-type
        kind: fp.ReservationKind = "reclaim"  # E: assignment
        print(kind)
        ledger.set_status(run.run_id, "actve", claim=claim)  # E: arg-type
        ledger.list_runs(status="complted")  # E: arg-type
        ledger.list_runs(status=["completed", "faild"])  # E: list-item
        ledger.finish_attempt(run.run_id, "u", 1, "d", status="done")  # E: arg-type
        ledger.units(run.run_id, status="exhaustd")  # E: arg-type
        ledger.complete_step(run.run_id, "s", status="complete")  # E: arg-type
        ledger.prune(older_than=run.updated_at - run.created_at, statuses="done")  # E: arg-type
"""


def run_mypy(tmp_path: pathlib.Path, source: str) -> list[tuple[int, str]]:
    """(line, error code) of every error `mypy --strict` reports for `source`."""
    pytest.importorskip("mypy")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    # Run from tmp_path so no project configuration applies: plain --strict, as a user runs it.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11",
         "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", "--show-error-codes",
         str(snippet)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    errors = re.findall(r"^snippet\.py:(\d+): error: .*\[([a-z-]+)\]$", done.stdout, re.M)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return [(int(line), code) for line, code in errors]


def test_mypy_strict_accepts_a_controller(tmp_path: pathlib.Path) -> None:
    assert run_mypy(tmp_path, GOOD) == []


def test_mypy_strict_reports_misuse(tmp_path: pathlib.Path) -> None:
    lines = textwrap.dedent(BAD).splitlines()
    expected = [
        (i, line.split("# E: ")[1].strip())
        for i, line in enumerate(lines, start=1)
        if "# E: " in line
    ]
    assert len(expected) == 11
    assert run_mypy(tmp_path, BAD) == expected

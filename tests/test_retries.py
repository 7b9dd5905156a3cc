"""Unit retries under a policy: a failed or timed-out finish sets the unit's ``retry_at`` (or
exhausts it) in the same transaction, a reservation before that time is ``RetryNotDue`` and
one of an exhausted unit ``UnitExhausted`` (nothing written either way), ``due_units`` and
``exhausted_units`` page the waiting and the dead units, and ``retry_units`` / ``cancel_units``
move them in bulk under the fence. Every test runs on each backend; that both reads walk only
their own index is checked by the Rust plan tests."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import pathlib
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, cli, queued, raw_db
from tests.test_store_migrate import UNDO_0009, UNDO_0009_SQLITE

UTC = dt.UTC
POLICY: dict[str, Any] = {"max_attempts": 4, "initial_ms": 1_000, "factor": 3, "max_ms": 5_000}


def expected_delay(policy: dict[str, Any], run_id: str, unit_id: str, attempt: int) -> int:
    """The delay the ledger computes (docs/retries.md), written out independently: the base
    grows by the factor per attempt up to the cap, then jitter scales it by 1 + j(2u - 1) for a
    u drawn from SHA-256 over run, unit and attempt."""
    factor = float(policy.get("factor", 2))
    cap = float(policy.get("max_ms", 3_600_000))
    base = float(policy["initial_ms"])
    n = 1
    while n < attempt and base < cap:
        base *= factor
        n += 1
    base = min(base, cap)
    jitter = float(policy.get("jitter", 0))
    spread = 1.0
    if jitter > 0:
        digest = hashlib.sha256(f"{run_id}\0{unit_id}\0{attempt}".encode()).digest()
        u = min(int.from_bytes(digest[:8], "big") / 2**64, 1 - 2**-52)
        spread = 1 + jitter * (2 * u - 1)
    return max(0, math.floor(base * spread))


def ms(t: dt.datetime | None) -> int | None:
    return None if t is None else fp.models.to_ms(t)


def fail(ledger: fp.Ledger, r: fp.Reservation, status: str = "failed") -> None:
    assert ledger.finish_attempt(r.run_id, r.unit_id, r.attempt, r.dispatch_id, status=status)


def reserve(ledger: fp.Ledger, run_id: str, unit_id: str, **kw: Any) -> fp.Reservation:
    return ledger.reserve_attempt(run_id, unit_id, step_id=kw.pop("step_id", "s"), **kw)


def a_run(ledger: fp.Ledger, retry: dict[str, Any] | None = POLICY, **kw: Any) -> fp.Run:
    steps = kw.pop("steps", [{"id": "s"}])
    return ledger.start_run("wf", scope_key=None, force=True, steps=steps, retry=retry, **kw)


def written(ledger: fp.Ledger, run_id: str) -> tuple[int, list[Any]]:
    """What a refused call must leave as it was: the run's events and units."""
    return len(ledger.events(run_id)), ledger.units(run_id)


@pytest.mark.parametrize(
    "policy",
    [
        POLICY,
        {"max_attempts": 6, "initial_ms": 250},
        {"max_attempts": 5, "initial_ms": 1_000, "factor": 1.5, "jitter": 0.3},
        {"max_attempts": 7, "initial_ms": 10, "factor": 10, "max_ms": 20_000, "jitter": 1},
    ],
)
def test_the_backoff_schedule_is_exact(
    ledger: fp.Ledger, clock: FakeClock, policy: dict[str, Any]
) -> None:
    run = a_run(ledger, policy)
    for unit in ("u1", "u2"):
        for attempt in range(1, policy["max_attempts"] + 1):
            r = reserve(ledger, run.run_id, unit)
            assert r.attempt == attempt
            clock.advance(7)
            failed_at = clock.now
            fail(ledger, r, "timed_out" if attempt % 2 else "failed")
            got = ledger.unit(run.run_id, unit)
            assert got is not None
            if attempt < policy["max_attempts"]:
                delay = expected_delay(policy, run.run_id, unit, attempt)
                assert ms(got.retry_at) == failed_at + delay
                assert got.status == ("timed_out" if attempt % 2 else "failed")
                jitter = policy.get("jitter", 0)
                base = expected_delay({**policy, "jitter": 0}, run.run_id, unit, attempt)
                assert base * (1 - jitter) - 1 <= delay <= base * (1 + jitter)
                clock.advance(delay)
            else:
                assert got.status == "exhausted"
                assert got.retry_at is None


def test_a_policy_is_stored_whole_and_a_step_policy_overrides_the_runs(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    run = a_run(
        ledger,
        {"max_attempts": 3, "initial_ms": 100},
        steps=[{"id": "s"}, {"id": "quick", "retry": {"max_attempts": 1, "initial_ms": 0}}],
    )
    r = reserve(ledger, run.run_id, "a", step_id="quick")
    fail(ledger, r)
    assert ledger.unit(run.run_id, "a").status == "exhausted"  # type: ignore[union-attr]
    r = reserve(ledger, run.run_id, "b", step_id="s")
    fail(ledger, r)
    b = ledger.unit(run.run_id, "b")
    assert b is not None
    assert b.status == "failed"
    assert ms(b.retry_at) == clock.now + 100
    # A step the run does not list gets the run's policy; a run without one, no retries.
    r = reserve(ledger, run.run_id, "c", step_id="elsewhere")
    fail(ledger, r)
    assert ms(ledger.unit(run.run_id, "c").retry_at) == clock.now + 100  # type: ignore[union-attr]
    plain = a_run(ledger, None)
    r = reserve(ledger, plain.run_id, "a")
    fail(ledger, r)
    a = ledger.unit(plain.run_id, "a")
    assert a is not None
    assert a.status == "failed"
    assert a.retry_at is None
    assert reserve(ledger, plain.run_id, "a").attempt == 2


def test_completed_and_cancelled_finishes_schedule_nothing(ledger: fp.Ledger) -> None:
    run = a_run(ledger)
    for status in ("completed", "cancelled"):
        r = reserve(ledger, run.run_id, status)
        fail(ledger, r, status)
        u = ledger.unit(run.run_id, status)
        assert u is not None
        assert u.status == status
        assert u.retry_at is None


def test_retry_not_due_and_unit_exhausted_write_nothing(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    run = a_run(ledger, {"max_attempts": 2, "initial_ms": 1_000})
    fail(ledger, reserve(ledger, run.run_id, "u"))
    before = written(ledger, run.run_id)
    with pytest.raises(fp.RetryNotDue) as not_due:
        reserve(ledger, run.run_id, "u")
    assert not_due.value.unit_id == "u"
    assert not_due.value.run_id == run.run_id
    assert ms(not_due.value.retry_at) == clock.now + 1_000
    assert "force=True" in str(not_due.value)
    # A batch is all or nothing: the fresh unit beside it is not reserved either.
    with pytest.raises(fp.RetryNotDue):
        ledger.reserve_attempts(
            run.run_id, [{"unit_id": "fresh", "step_id": "s"}, {"unit_id": "u", "step_id": "s"}]
        )
    assert written(ledger, run.run_id) == before
    clock.advance(999)
    with pytest.raises(fp.RetryNotDue):
        reserve(ledger, run.run_id, "u")
    clock.advance(1)
    fail(ledger, reserve(ledger, run.run_id, "u"))
    before = written(ledger, run.run_id)
    for force in (False, True):
        with pytest.raises(fp.UnitExhausted) as exhausted:
            reserve(ledger, run.run_id, "u", force=force)
        assert exhausted.value.attempts == 2
        with pytest.raises(fp.UnitExhausted):
            ledger.reserve_attempts(
                run.run_id, [{"unit_id": "fresh", "step_id": "s"}, {"unit_id": "u", "step_id": "s"}]
            )
    assert written(ledger, run.run_id) == before


def test_force_reserves_before_the_retry_time(ledger: fp.Ledger) -> None:
    run = a_run(ledger)
    fail(ledger, reserve(ledger, run.run_id, "u"))
    assert reserve(ledger, run.run_id, "u", force=True).attempt == 2
    fail(ledger, reserve(ledger, run.run_id, "v"))
    got = ledger.reserve_attempts(run.run_id, [{"unit_id": "v", "step_id": "s"}], force=True)
    assert [r.attempt for r in got] == [2]
    # The new attempt's unit waits for nothing: retry_at is cleared with the reservation.
    assert ledger.unit(run.run_id, "v").retry_at is None  # type: ignore[union-attr]


def test_a_batch_of_failing_finishes_writes_what_one_by_one_writes(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    policy = {"max_attempts": 2, "initial_ms": 500, "jitter": 0.5}

    def exhaust_half(run: fp.Run, batch: bool) -> list[Any]:
        rs = ledger.reserve_attempts(
            run.run_id, [{"unit_id": f"u{i}", "step_id": "s"} for i in range(4)]
        )
        ledger.finish_attempts(
            [
                {
                    "run_id": r.run_id,
                    "unit_id": r.unit_id,
                    "attempt": r.attempt,
                    "dispatch_id": r.dispatch_id,
                    "status": "failed",
                }
                for r in rs
            ]
        )
        clock.advance(10_000)
        rs = ledger.reserve_attempts(
            run.run_id, [{"unit_id": f"u{i}", "step_id": "s"} for i in range(4)]
        )
        finishes = [
            {
                "run_id": r.run_id,
                "unit_id": r.unit_id,
                "attempt": r.attempt,
                "dispatch_id": r.dispatch_id,
                "status": "timed_out" if i % 2 else "completed",
            }
            for i, r in enumerate(rs)
        ]
        if batch:
            assert ledger.finish_attempts(finishes) == [True] * 4
        else:
            for f in finishes:
                assert ledger.finish_attempt(**f)
        return [
            (e.type, {k: v for k, v in e.payload.items() if k not in ("run_id", "dispatch_id")})
            for e in ledger.events(run.run_id)
        ]

    one = a_run(ledger, policy, run_id="one")
    many = a_run(ledger, policy, run_id="many")
    assert exhaust_half(one, batch=False) == exhaust_half(many, batch=True)
    types = [e.type for e in ledger.events("many")]
    assert types[-6:] == [
        "unit.finished",
        "unit.finished",
        "unit.exhausted",
        "unit.finished",
        "unit.finished",
        "unit.exhausted",
    ]
    assert [u.unit_id for u in ledger.exhausted_units("many")] == ["u1", "u3"]


def test_due_units_in_order_with_a_cursor(ledger: fp.Ledger, clock: FakeClock) -> None:
    runs = [a_run(ledger, {"max_attempts": 9, "initial_ms": 1_000}, run_id=f"r{i}") for i in (1, 2)]
    start = clock.now
    # Ten units failing at different times: each is due 1 s after its failure.
    order: list[tuple[int, str, str]] = []
    for i in range(10):
        run = runs[i % 2]
        unit = f"u{9 - i}"
        clock.advance(10 if i != 5 else 0)
        fail(ledger, reserve(ledger, run.run_id, unit))
        order.append((clock.now + 1_000, run.run_id, unit))
    order.sort()
    assert ledger.due_units() == []
    clock.advance(1_000 - (clock.now - start) + 30)  # the first three are due
    due = [(ms(u.retry_at), u.run_id, u.unit_id) for u in ledger.due_units()]
    assert due == [o for o in order if o[0] <= clock.now]
    assert len(due) == 3
    clock.advance(1_000)
    page1 = ledger.due_units(limit=3)
    page2 = ledger.due_units(limit=3, after=page1[-1])
    page3 = ledger.due_units(limit=10, after=page2[-1])
    got = [(ms(u.retry_at), u.run_id, u.unit_id) for u in page1 + page2 + page3]
    assert got == order
    assert ledger.due_units(after=page3[-1]) == []
    mine = ledger.due_units("r1", limit=2)
    mine += ledger.due_units("r1", after=mine[-1])
    assert [(ms(u.retry_at), u.run_id, u.unit_id) for u in mine] == [
        o for o in order if o[1] == "r1"
    ]
    # A reserved unit leaves the list; a completed one never joins it.
    first = page1[0]
    reserve(ledger, first.run_id, first.unit_id)
    assert first.unit_id not in [u.unit_id for u in ledger.due_units(first.run_id)]
    with pytest.raises(fp.InvalidArgument, match="after"):
        ledger.due_units(after="u1")  # type: ignore[arg-type]
    with pytest.raises(fp.InvalidArgument, match="limit"):
        ledger.due_units(limit=0)


def test_exhausted_units_page_by_run_then_unit(ledger: fp.Ledger) -> None:
    for run_id in ("b", "a"):
        a_run(ledger, {"max_attempts": 1, "initial_ms": 0}, run_id=run_id)
        for unit in ("z", "x", "y"):
            fail(ledger, reserve(ledger, run_id, unit))
    page = ledger.exhausted_units(limit=4)
    page += ledger.exhausted_units(limit=4, after=page[-1])
    assert [(u.run_id, u.unit_id) for u in page] == [
        (r, u) for r in ("a", "b") for u in ("x", "y", "z")
    ]
    assert all(u.status == "exhausted" and u.attempts == 1 for u in page)
    of_b = ledger.exhausted_units("b", limit=1)
    of_b += ledger.exhausted_units("b", after=of_b[-1])
    assert [u.unit_id for u in of_b] == ["x", "y", "z"]


def test_retry_units_gives_an_exhausted_unit_exactly_one_more_attempt(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    run = a_run(ledger, {"max_attempts": 2, "initial_ms": 60_000})
    for unit in ("dead", "waiting", "done", "plain"):
        fail(ledger, reserve(ledger, run.run_id, unit), "completed" if unit == "done" else "failed")
    clock.advance(60_000)
    fail(ledger, reserve(ledger, run.run_id, "dead"), "timed_out")
    assert ledger.unit(run.run_id, "dead").status == "exhausted"  # type: ignore[union-attr]
    clock.advance(5)
    assert ledger.retry_units(run.run_id) == 3  # dead, waiting, plain; not done
    dead = ledger.unit(run.run_id, "dead")
    assert dead is not None
    assert dead.status == "timed_out"
    assert ms(dead.retry_at) == clock.now
    # "plain" and "waiting" were due already (their retry_at had come): they keep their place.
    assert [u.unit_id for u in ledger.due_units(run.run_id)] == ["plain", "waiting", "dead"]
    types = [e.type for e in ledger.events(run.run_id)]
    assert types.count("unit.retried") == 3
    r = reserve(ledger, run.run_id, "dead")
    assert r.attempt == 3
    fail(ledger, r)
    assert ledger.unit(run.run_id, "dead").status == "exhausted"  # type: ignore[union-attr]
    assert ledger.retry_units(run.run_id, ["dead", "dead"]) == 1
    with pytest.raises(fp.NotFound):
        ledger.retry_units(run.run_id, ["dead", "no-such-unit"])
    assert ledger.unit(run.run_id, "dead").status == "failed"  # type: ignore[union-attr]


def test_cancel_units_cancels_running_attempts_through_the_finish(
    ledger: fp.Ledger,
) -> None:
    run = a_run(ledger)
    running = reserve(ledger, run.run_id, "running")
    fail(ledger, reserve(ledger, run.run_id, "failed"))
    fail(ledger, reserve(ledger, run.run_id, "done"), "completed")
    assert ledger.cancel_units(run.run_id, reason="operator stop") == 2
    by_id = {u.unit_id: u for u in ledger.units(run.run_id)}
    assert {k: u.status for k, u in by_id.items()} == {
        "running": "cancelled",
        "failed": "cancelled",
        "done": "completed",
    }
    assert by_id["failed"].retry_at is None
    assert ledger.due_units(run.run_id) == []
    assert by_id["running"].failure_reason == "operator stop"
    # The running attempt was finished: its own finish now loses.
    assert not ledger.finish_attempt(
        run.run_id, "running", running.attempt, running.dispatch_id, status="completed"
    )
    assert ledger.attempts(run.run_id, "running")[-1].status == "cancelled"
    types = [e.type for e in ledger.events(run.run_id)]
    assert types[-3:] == ["unit.finished", "unit.cancelled", "unit.cancelled"]
    assert ledger.cancel_units(run.run_id) == 0


def test_bulk_moves_are_fenced_and_refuse_an_ended_run(ledger: fp.Ledger, clock: FakeClock) -> None:
    ledger.reserve_run("q", **queued("q", retry={"max_attempts": 3, "initial_ms": 10}))
    old = ledger.claim("q", "host-a", lease_ms=1_000)
    assert old is not None
    ledger.set_status("q", "active", claim=old)
    fail(ledger, ledger.reserve_attempt("q", "u", step_id="s", claim=old))
    clock.advance(1_001)
    new = ledger.claim("q", "host-b", lease_ms=10_000)
    assert new is not None
    before = written(ledger, "q")
    with pytest.raises(fp.LeaseLost):
        ledger.retry_units("q", claim=old)
    with pytest.raises(fp.LeaseLost):
        ledger.cancel_units("q", claim=old)
    assert written(ledger, "q") == before
    assert ledger.retry_units("q", claim=new) == 1
    assert [e.actor_id for e in ledger.events("q")][-1] == "host-b"
    assert ledger.cancel_units("q", ["u"], claim=new) == 1
    ledger.set_status("q", "completed", claim=new)
    with pytest.raises(fp.RunNotActive):
        ledger.retry_units("q")


def test_policies_are_checked_and_named(ledger: fp.Ledger) -> None:
    bad: list[tuple[Any, str]] = [
        ({"initial_ms": 1}, "max_attempts"),
        ({"max_attempts": 0, "initial_ms": 1}, "max_attempts"),
        ({"max_attempts": 1}, "initial_ms"),
        ({"max_attempts": 1, "initial_ms": -1}, "initial_ms"),
        ({"max_attempts": 1, "initial_ms": 1, "factor": 0.5}, "factor"),
        ({"max_attempts": 1, "initial_ms": 1, "factor": float("nan")}, "factor"),
        ({"max_attempts": 1, "initial_ms": 1, "max_ms": -1}, "max_ms"),
        ({"max_attempts": 1, "initial_ms": 1, "jitter": 1.5}, "jitter"),
        ({"max_attempts": 1, "initial_ms": 1, "jiter": 0.1}, "jiter"),
        ({"max_attempts": True, "initial_ms": 1}, "max_attempts"),
        ({"max_attempts": 1.5, "initial_ms": 1}, "max_attempts"),
        ([3], "dict"),
    ]
    for policy, named in bad:
        with pytest.raises(fp.InvalidArgument) as e:
            a_run(ledger, policy)
        assert e.value.argument == "retry", policy
        assert named in str(e.value), (policy, str(e.value))
        with pytest.raises(fp.InvalidArgument) as e:
            a_run(ledger, None, steps=[{"id": "s"}, {"id": "t", "retry": policy}])
        assert e.value.argument == "steps"
        assert "item 1" in str(e.value)
        assert named in str(e.value)
        with pytest.raises(fp.InvalidArgument):
            ledger.reserve_run("q", **queued("q", retry=policy))
    assert ledger.list_runs() == []


def test_prepare_or_adopt_compares_the_policy(ledger: fp.Ledger) -> None:
    kw = queued("p", retry={"max_attempts": 3, "initial_ms": 10})
    first = ledger.prepare_or_adopt("p", lease_ms=1_000, **kw)
    assert first.state == "claimed"
    # The same policy spelled with its defaults is the same policy.
    same = {**kw, "retry": {"max_attempts": 3, "initial_ms": 10, "factor": 2.0, "jitter": 0}}
    assert ledger.prepare_or_adopt("p", lease_ms=1_000, **same).state == "adopted"
    with pytest.raises(fp.PreparationConflict) as e:
        ledger.prepare_or_adopt(
            "p", lease_ms=1_000, **{**kw, "retry": {"max_attempts": 4, "initial_ms": 10}}
        )
    assert e.value.fields == ["retry"]


def test_a_child_run_takes_its_own_policy(ledger: fp.Ledger) -> None:
    parent = a_run(ledger, None)
    child = ledger.publish_child_run(
        parent.run_id,
        parent_unit_id="p",
        invocation_key="k",
        workflow_ref="child",
        steps=[{"id": "s"}],
        retry={"max_attempts": 1, "initial_ms": 0},
    )
    fail(ledger, reserve(ledger, child.run_id, "u"))
    assert [u.unit_id for u in ledger.exhausted_units(child.run_id)] == ["u"]


def test_a_ledger_from_before_retries_migrates_and_exhausts(target: str, clock: FakeClock) -> None:
    """A ledger at schema 8 with a failed unit (0010 taken away too): 0009 adds the policy
    columns and admits ``exhausted`` (SQLite's CHECK is widened in place), and the old unit
    keeps its state."""
    with fp.Ledger.open(target, clock=clock) as ledger:
        old = a_run(ledger, None, run_id="old")
        fail(ledger, reserve(ledger, old.run_id, "u"))
    with raw_db(target) as db:
        if hasattr(db, "executescript"):
            db.executescript(UNDO_0009_SQLITE)
        else:
            db.execute(UNDO_0009)
        db.execute("DELETE FROM schema_migrations WHERE version >= 9")
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.pragmas()["schema_version"] == fp.SCHEMA_VERSION == 13
        u = ledger.unit("old", "u")
        assert u is not None
        assert (u.status, u.retry_at, u.attempts) == ("failed", None, 1)
        assert reserve(ledger, "old", "u").attempt == 2
        new = a_run(ledger, {"max_attempts": 1, "initial_ms": 0}, run_id="new")
        fail(ledger, reserve(ledger, new.run_id, "u"))
        assert [u.unit_id for u in ledger.exhausted_units()] == ["u"]


def test_policies_retry_times_and_dead_letters_travel_in_archives(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    day = dt.timedelta(days=1)
    with fp.Ledger.open(target, clock=clock) as ledger:
        run = a_run(
            ledger,
            {"max_attempts": 2, "initial_ms": 50, "jitter": 0.5},
            run_id="gone",
            steps=[{"id": "s", "retry": {"max_attempts": 1, "initial_ms": 0}}, {"id": "t"}],
        )
        fail(ledger, reserve(ledger, run.run_id, "dead"))
        fail(ledger, reserve(ledger, run.run_id, "waiting", step_id="t"))
        before = {u.unit_id: u for u in ledger.units("gone")}
        assert before["dead"].status == "exhausted"
        assert before["waiting"].retry_at is not None
        assert ledger.abandon_run("gone")
        clock.advance(40 * 86_400_000)
        assert ledger.prune(older_than=30 * day, archive=tmp_path / "a.jsonl").runs == 1
        assert ledger.unit("gone", "dead") is None
        assert ledger.restore(tmp_path / "a.jsonl") == 1
        assert {u.unit_id: u for u in ledger.units("gone")} == before
        assert [u.unit_id for u in ledger.exhausted_units("gone")] == ["dead"]
    # A policy the ledger would not have written is refused, naming the column.
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    at = lines[0]["tables"]["runs"].index("retry_policy")
    lines[1]["runs"][0][at] = '{"max_attempts":0}'
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with fp.Ledger.open(target, clock=clock) as ledger:
        ledger.prune(older_than=30 * day)
        with pytest.raises(fp.InvalidArgument, match=r"runs\.retry_policy"):
            ledger.restore(tmp_path / "bad.jsonl")


def test_the_cli_lists_retries_and_moves_units(tmp_path: pathlib.Path) -> None:
    db = str(tmp_path / "cli.db")
    # A clock that moves on every reading, so each unit is first reserved at its own time.
    ticks = iter(range(1_764_720_000_000, 1_764_720_000_000 + 10_000, 10))
    with fp.Ledger.open(db, clock=lambda: next(ticks)) as ledger:
        run = a_run(ledger, {"max_attempts": 2, "initial_ms": 0}, run_id="run-cli")
        fail(ledger, reserve(ledger, run.run_id, "due"))
        for _ in range(2):
            fail(ledger, reserve(ledger, run.run_id, "dead", force=True))
        reserve(ledger, run.run_id, "busy")
    due = cli("units", "--due", "--db", db, "--json")
    assert due.returncode == 0, due.stderr
    assert [u["unit_id"] for u in json.loads(due.stdout)] == ["due"]
    dead = cli("units", "run-c", "--exhausted", "--db", db)
    assert dead.returncode == 0, dead.stderr
    assert "dead" in dead.stdout
    assert "exhausted" in dead.stdout
    assert "due " not in dead.stdout
    page = cli("units", "run-cli", "--limit", "1", "--db", db, "--json")
    assert [u["unit_id"] for u in json.loads(page.stdout)] == ["due"]
    assert "--after run-cli/due" in page.stderr
    rest = cli("units", "run-cli", "--after", "run-cli/due", "--db", db, "--json")
    assert [u["unit_id"] for u in json.loads(rest.stdout)] == ["dead", "busy"]
    retried = cli("retry", "run-cli", "dead", "--db", db)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == "retried 1 unit of run run-cli"
    missing = cli("retry", "run-cli", "nope", "--db", db)
    assert missing.returncode == 1
    assert "fencepost units run-cli" in missing.stderr
    cancelled = cli("cancel-units", "run-cli", "--reason", "stop", "--db", db, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout) == {"run_id": "run-cli", "cancelled": 3}
    with fp.Ledger.open(db) as ledger:
        assert {u.status for u in ledger.units("run-cli")} == {"cancelled"}
    assert cli("units", "--db", db).returncode == 1


def test_async_ledger_retries(target: str, clock: FakeClock) -> None:
    import asyncio

    from fencepost.aio import AsyncLedger

    async def main() -> tuple[list[str], list[str], int, int]:
        async with await AsyncLedger.open(target, clock=clock) as ledger:
            run = await ledger.start_run(
                "wf", scope_key=None, force=True, steps=[{"id": "s"}],
                retry={"max_attempts": 2, "initial_ms": 0},
            )  # fmt: skip
            for unit in ("a", "b"):
                r = await ledger.reserve_attempt(run.run_id, unit, step_id="s")
                await ledger.finish_attempt(
                    run.run_id, unit, r.attempt, r.dispatch_id, status="failed"
                )
            r = await ledger.reserve_attempt(run.run_id, "b", step_id="s")
            await ledger.finish_attempt(run.run_id, "b", r.attempt, r.dispatch_id, status="failed")
            due = [u.unit_id for u in await ledger.due_units(run.run_id)]
            dead = [u.unit_id for u in await ledger.exhausted_units()]
            return (
                due,
                dead,
                await ledger.retry_units(run.run_id),
                await ledger.cancel_units(run.run_id),
            )

    assert asyncio.run(main()) == (["a"], ["b"], 2, 2)

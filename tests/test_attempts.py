"""Attempts, the dispatcher's hot path (``attempts``): reserving creates attempt n+1 with a fresh
dispatch id or reclaims the running one in place, finishing is a compare-and-set that one
callback wins, batches write what one call per item would, and the unit row follows its latest
attempt."""

from __future__ import annotations

import re
import sqlite3
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import STEPS, FakeClock, raw_db

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def run(ledger: fp.Ledger) -> fp.Run:
    return ledger.start_run("wf/fan", scope_key="s", steps=STEPS)


def test_fresh_reserve(ledger: fp.Ledger, run: fp.Run, clock: FakeClock) -> None:
    """A new unit gets attempt 1, running, with its ``unit.started`` event."""
    res = ledger.reserve_attempt(
        run.run_id, "u1", step_id="build", node_id="n1", input_hash="h1", holder="w1"
    )
    assert (res.run_id, res.unit_id, res.kind, res.attempt, res.reclaims) == (
        run.run_id,
        "u1",
        "reserved",
        1,
        0,
    )
    assert UUID.fullmatch(res.dispatch_id)
    assert res.lease_generation is None
    [attempt] = ledger.attempts(run.run_id, "u1")
    assert (attempt.status, attempt.phase, attempt.holder, attempt.dispatch_id) == (
        "running",
        "unit",
        "w1",
        res.dispatch_id,
    )
    assert attempt.started_at == fp.models.from_ms(clock.now)
    assert attempt.finished_at is None
    unit = ledger.unit(run.run_id, "u1")
    assert (unit.status, unit.attempts, unit.step_id, unit.claim_holder) == (
        "running",
        1,
        "build",
        "w1",
    )
    started = ledger.events(run.run_id, types=["unit.started"])
    assert len(started) == 1
    assert started[0].payload == {
        "run_id": run.run_id,
        "step_id": "build",
        "unit_id": "u1",
        "attempt": 1,
        "dispatch_id": res.dispatch_id,
        "phase": "unit",
        "status": "running",
    }
    assert ledger.events(run.run_id, types=["unit.finished"]) == []


def test_reclaim_in_place(ledger: fp.Ledger, run: fp.Run) -> None:
    """A reclaim keeps the attempt: same number, same dispatch id, one row, one started event."""
    first = ledger.reserve_attempt(run.run_id, "u1", step_id="build", input_hash="h", holder="a")
    again = ledger.reserve_attempt(run.run_id, "u1", step_id="build", input_hash="h", holder="b")
    assert again.kind == "reclaimed"
    assert (again.attempt, again.dispatch_id, again.reclaims) == (1, first.dispatch_id, 1)
    [attempt] = ledger.attempts(run.run_id, "u1")
    assert (attempt.reclaims, attempt.holder) == (1, "b")
    assert len(ledger.events(run.run_id, types=["unit.started"])) == 1


def test_reclaim_refuses_changed_inputs(ledger: fp.Ledger, run: fp.Run) -> None:
    """A reclaim must not hand back an attempt made for different inputs."""
    ledger.reserve_attempt(run.run_id, "u1", step_id="build", input_hash="h1")
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.reserve_attempt(run.run_id, "u1", step_id="build", input_hash="h2")
    assert info.value.argument == "input_hash"
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.reserve_attempt(run.run_id, "u1", step_id="ship", input_hash="h1")
    assert info.value.argument == "step_id"
    assert ledger.attempts(run.run_id, "u1")[0].reclaims == 0


def test_reserve_requires_active_run(ledger: fp.Ledger, run: fp.Run) -> None:
    """Only an active run takes new attempts; a refusal writes nothing."""
    ledger.abandon_run(run.run_id)
    before = ledger.events(run.run_id)
    with pytest.raises(fp.RunNotActive) as info:
        ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    assert (info.value.run_id, info.value.status) == (run.run_id, "cancelled")
    assert ledger.attempts(run.run_id, "u1") == []
    assert ledger.events(run.run_id) == before
    with pytest.raises(fp.RunNotFound):
        ledger.reserve_attempt("missing", "u1", step_id="build")


def test_finish_commits_once(ledger: fp.Ledger, run: fp.Run, clock: FakeClock) -> None:
    """The first finish commits; a second is False and changes nothing."""
    res = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    clock.advance(250)
    ok = ledger.finish_attempt(
        run.run_id,
        "u1",
        res.attempt,
        res.dispatch_id,
        status="completed",
        result={"answer": 42},
        tokens=7,
        session_id="sess-1",
    )
    assert ok is True
    dup = ledger.finish_attempt(
        run.run_id, "u1", res.attempt, res.dispatch_id, status="completed", tokens=999
    )
    assert dup is False
    [attempt] = ledger.attempts(run.run_id, "u1")
    assert (attempt.status, attempt.result, attempt.tokens) == ("completed", {"answer": 42}, 7)
    assert attempt.finished_at == fp.models.from_ms(clock.now)
    unit = ledger.unit(run.run_id, "u1")
    assert (unit.status, unit.result, unit.tokens) == ("completed", {"answer": 42}, 7)
    types = [e.type for e in ledger.events(run.run_id) if e.type.startswith("unit.")]
    assert types == ["unit.started", "unit.finished"]
    finished = ledger.events(run.run_id, types=["unit.finished"])[0]
    assert finished.payload == {
        "run_id": run.run_id,
        "step_id": "build",
        "unit_id": "u1",
        "attempt": 1,
        "dispatch_id": res.dispatch_id,
        "phase": "unit",
        "status": "completed",
        "tokens": 7,
    }


def test_failure_payload_has_reason_and_no_tokens(ledger: fp.Ledger, run: fp.Run) -> None:
    """A failed finish records its reason, and its payload carries no tokens."""
    for unit, status, reason in [("u1", "timed_out", "timeout"), ("u2", "cancelled", "aborted")]:
        res = ledger.reserve_attempt(run.run_id, unit, step_id="build")
        assert ledger.finish_attempt(
            run.run_id, unit, 1, res.dispatch_id, status=status, failure_reason=reason
        )
        [attempt] = ledger.attempts(run.run_id, unit)
        assert (attempt.status, attempt.tokens, attempt.failure_reason) == (status, None, reason)
    payloads = [e.payload for e in ledger.events(run.run_id, types=["unit.finished"])]
    assert [p["failure_reason"] for p in payloads] == ["timeout", "aborted"]
    assert all("tokens" not in p for p in payloads)


def test_retry_appends_a_new_attempt(ledger: fp.Ledger, run: fp.Run) -> None:
    """After a finished attempt, a retry is attempt n+1 with a new dispatch id."""
    first = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    ledger.finish_attempt(run.run_id, "u1", 1, first.dispatch_id, status="failed", tokens=3)
    second = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    assert (second.kind, second.attempt) == ("reserved", 2)
    assert second.dispatch_id != first.dispatch_id
    a1, a2 = ledger.attempts(run.run_id, "u1")
    assert (a1.status, a1.tokens, a2.status) == ("failed", 3, "running")
    assert ledger.unit(run.run_id, "u1").attempts == 2
    assert [e.payload["attempt"] for e in ledger.events(run.run_id, types=["unit.started"])] == [
        1,
        2,
    ]


def test_crash_reclaim_then_stale_finish(ledger: fp.Ledger, run: fp.Run) -> None:
    """The reclaimer finishes first; the crashed driver's late finish is False."""
    res = ledger.reserve_attempt(run.run_id, "u1", step_id="build", holder="crashed")
    ledger.reserve_attempt(run.run_id, "u1", step_id="build", holder="reclaimer")
    assert ledger.finish_attempt(run.run_id, "u1", 1, res.dispatch_id, status="completed", tokens=5)
    assert not ledger.finish_attempt(
        run.run_id, "u1", 1, res.dispatch_id, status="completed", tokens=101
    )
    acc = ledger.accounting(run.run_id)
    assert (
        acc.total_attempts,
        acc.total_tokens,
        acc.dispatch_attempts,
        acc.dispatch_tokens,
        acc.gate_attempts,
        acc.gate_tokens,
    ) == (1, 5, 1, 5, 0, 0)


def test_accounting_splits_gate_and_unit(ledger: fp.Ledger, run: fp.Run) -> None:
    """Accounting counts gate and unit attempts (and their tokens) apart."""
    u = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    g = ledger.reserve_attempt(run.run_id, "g1", step_id="build", phase="gate")
    ledger.finish_attempt(run.run_id, "u1", 1, u.dispatch_id, status="completed", tokens=7)
    ledger.finish_attempt(run.run_id, "g1", 1, g.dispatch_id, status="completed", tokens=5)
    acc = ledger.accounting(run.run_id)
    assert acc == fp.models.Accounting(2, 12, 1, 7, 1, 5)


def test_wrong_or_unknown_finishes_are_false(ledger: fp.Ledger, run: fp.Run) -> None:
    res = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    assert not ledger.finish_attempt(run.run_id, "u1", 1, "not-the-id", status="completed")
    assert not ledger.finish_attempt(run.run_id, "u1", 2, res.dispatch_id, status="completed")
    assert not ledger.finish_attempt(run.run_id, "zz", 1, res.dispatch_id, status="completed")
    assert not ledger.finish_attempt("other", "u1", 1, res.dispatch_id, status="completed")
    assert ledger.attempts(run.run_id, "u1")[0].status == "running"
    assert ledger.events(run.run_id, types=["unit.finished"]) == []


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"status": "running"}, "status"),
        ({"status": "done"}, "status"),
        ({"status": "completed", "tokens": -1}, "tokens"),
        ({"status": "completed", "tokens": True}, "tokens"),
        ({"status": "completed", "result": {"x": float("nan")}}, "result"),
    ],
)
def test_bad_finish_arguments_write_nothing(
    ledger: fp.Ledger, run: fp.Run, kwargs: dict[str, Any], argument: str
) -> None:
    res = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.finish_attempt(run.run_id, "u1", 1, res.dispatch_id, **kwargs)
    assert info.value.argument == argument
    assert ledger.attempts(run.run_id, "u1")[0].status == "running"


def test_bad_reserve_arguments(ledger: fp.Ledger, run: fp.Run) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.reserve_attempt(run.run_id, "u1", step_id="build", phase="other")
    assert info.value.argument == "phase"
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.reserve_attempt(run.run_id, "", step_id="build")
    assert info.value.argument == "unit_id"
    assert ledger.units(run.run_id) == []


def test_batch_reserve_and_finish(ledger: fp.Ledger, run: fp.Run) -> None:
    units = [{"unit_id": f"u{i:04d}", "step_id": "build", "holder": "w"} for i in range(1000)]
    got = ledger.reserve_attempts(run.run_id, units)
    assert [g.unit_id for g in got] == [u["unit_id"] for u in units]
    assert all(g.kind == "reserved" and g.attempt == 1 for g in got)
    assert len({g.dispatch_id for g in got}) == 1000
    again = ledger.reserve_attempts(run.run_id, units[:10])
    assert all(g.kind == "reclaimed" for g in again)
    finishes = [
        {
            "run_id": run.run_id,
            "unit_id": g.unit_id,
            "attempt": g.attempt,
            "dispatch_id": g.dispatch_id,
            "status": "completed",
            "tokens": 1,
        }
        for g in got
    ]
    oks = ledger.finish_attempts(finishes + finishes[:3])
    assert oks == [True] * 1000 + [False] * 3
    assert ledger.accounting(run.run_id).total_tokens == 1000
    assert len(ledger.units(run.run_id, step_id="build")) == 1000
    assert ledger.units(run.run_id, step_id="ship") == []


def test_batch_is_all_or_nothing(ledger: fp.Ledger, run: fp.Run) -> None:
    units = [
        {"unit_id": "ok", "step_id": "build"},
        {"unit_id": "bad", "step_id": "build", "phase": "x"},
    ]
    with pytest.raises(fp.InvalidArgument):
        ledger.reserve_attempts(run.run_id, units)
    assert ledger.units(run.run_id) == []
    assert ledger.events(run.run_id, types=["unit.started"]) == []


def test_units_order_and_unknown(ledger: fp.Ledger, run: fp.Run, clock: FakeClock) -> None:
    for name in ["b", "a", "c"]:
        clock.advance(1)
        ledger.reserve_attempt(run.run_id, name, step_id="build")
    assert [u.unit_id for u in ledger.units(run.run_id)] == ["b", "a", "c"]
    assert ledger.unit(run.run_id, "nope") is None
    assert ledger.attempts(run.run_id, "nope") == []


def test_abandoning_a_run_cancels_its_running_attempts(ledger: fp.Ledger, run: fp.Run) -> None:
    """Abandoning a run mid-dispatch finishes its running attempts as ``cancelled`` (with their
    ``unit.finished`` events); a worker's late finish then loses the compare-and-set, while a
    finished attempt keeps its result."""
    running = ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    done = ledger.reserve_attempt(run.run_id, "u2", step_id="build")
    assert ledger.finish_attempt(run.run_id, "u2", 1, done.dispatch_id, status="completed")
    assert ledger.abandon_run(run.run_id, reason="operator stop")
    attempt = ledger.attempts(run.run_id, "u1")[0]
    assert (attempt.status, attempt.failure_reason) == ("cancelled", "operator stop")
    assert ledger.unit(run.run_id, "u1").status == "cancelled"  # type: ignore[union-attr]
    assert ledger.unit(run.run_id, "u2").status == "completed"  # type: ignore[union-attr]
    finished = [e for e in ledger.events(run.run_id) if e.type == "unit.finished"]
    assert [(e.payload["unit_id"], e.payload["status"]) for e in finished] == [
        ("u2", "completed"),
        ("u1", "cancelled"),
    ]
    assert not ledger.finish_attempt(run.run_id, "u1", 1, running.dispatch_id, status="completed")


def test_dispatch_ids_unique_in_database(ledger: fp.Ledger, run: fp.Run, tmp_path: Any) -> None:
    for i in range(50):
        ledger.reserve_attempt(run.run_id, f"u{i}", step_id="build")
    ids = [ledger.attempts(run.run_id, f"u{i}")[0].dispatch_id for i in range(50)]
    assert len(set(ids)) == 50


def test_check_constraints_guard_statuses(tmp_path: Any) -> None:
    path = tmp_path / "c.db"
    with fp.Ledger.open(str(path)) as ledger:
        run = ledger.start_run("wf", scope_key="s", steps=STEPS)
        ledger.reserve_attempt(run.run_id, "u1", step_id="build")
    with raw_db(path) as db:
        for sql in [
            "UPDATE runs SET status='exploded'",
            "UPDATE attempts SET status='weird'",
            "UPDATE steps SET status='nope'",
            "UPDATE units SET phase='other'",
        ]:
            with pytest.raises(sqlite3.IntegrityError):
                db.execute(sql)


def test_batches_match_one_by_one(ledger: fp.Ledger, run: fp.Run) -> None:
    """A mixed batch (a new attempt after a finished one, a reclaim, a new unit; finishes over
    two runs with a duplicate and a wrong dispatch id) writes what one call per item would:
    PostgreSQL runs batches as set-based statements, SQLite one by one; both must agree."""
    rid = run.run_id
    first = ledger.reserve_attempt(rid, "u1", step_id="build")
    assert ledger.finish_attempt(rid, "u1", 1, first.dispatch_id, status="failed")
    running = ledger.reserve_attempt(rid, "u2", step_id="build", holder="w1")
    got = ledger.reserve_attempts(
        rid,
        [
            {"unit_id": "u1", "step_id": "build", "holder": "w2"},
            {"unit_id": "u2", "step_id": "build", "holder": "w2"},
            {"unit_id": "u3", "step_id": "build", "phase": "gate", "input_hash": "h3"},
        ],
    )
    assert [(g.unit_id, g.kind, g.attempt, g.reclaims) for g in got] == [
        ("u1", "reserved", 2, 0),
        ("u2", "reclaimed", 1, 1),
        ("u3", "reserved", 1, 0),
    ]
    assert got[1].dispatch_id == running.dispatch_id
    assert ledger.unit(rid, "u2").claim_holder == "w2"
    started = ledger.events(rid, types=["unit.started"])
    assert [e.payload["unit_id"] for e in started] == ["u1", "u2", "u1", "u3"]
    assert started[2].payload["attempt"] == 2
    assert started[3].payload["phase"] == "gate"
    revisions = [e.revision for e in ledger.events(rid)]
    assert revisions == list(range(1, len(revisions) + 1))

    other = ledger.start_run("wf/other", scope_key=None, steps=STEPS, force=True)
    o = ledger.reserve_attempt(other.run_id, "x", step_id="plan")

    def fin(r: str, res: Any, **kw: Any) -> dict[str, Any]:
        return {"run_id": r, "unit_id": res.unit_id, "attempt": res.attempt,
                "dispatch_id": res.dispatch_id, "status": "completed", **kw}  # fmt: skip

    oks = ledger.finish_attempts(
        [
            fin(rid, got[0], tokens=5),
            fin(other.run_id, o, status="failed", failure_reason="boom"),
            fin(rid, got[0]),  # duplicate: the first wins
            {**fin(rid, got[2]), "dispatch_id": "not-it"},  # wrong dispatch id
            fin(rid, got[1], result={"ok": True}),
        ]
    )
    assert oks == [True, True, False, False, True]
    assert ledger.attempts(rid, "u1")[-1].tokens == 5
    assert ledger.unit(rid, "u2").result == {"ok": True}
    assert ledger.unit(rid, "u3").status == "running"
    assert ledger.unit(other.run_id, "x").failure_reason == "boom"
    finished = ledger.events(rid, types=["unit.finished"])
    assert [e.payload["unit_id"] for e in finished] == ["u1", "u1", "u2"]
    assert finished[1].payload["tokens"] == 5
    assert (
        ledger.events(other.run_id, types=["unit.finished"])[0].payload["failure_reason"] == "boom"
    )
    for r in (rid, other.run_id):
        revisions = [e.revision for e in ledger.events(r)]
        assert revisions == list(range(1, len(revisions) + 1))
    assert ledger.get_run(rid).revision == revisions_of(ledger, rid)

    # A unit twice in one batch: reserved, then reclaimed in place (one event).
    twice = ledger.reserve_attempts(
        rid, [{"unit_id": "t", "step_id": "build"}, {"unit_id": "t", "step_id": "build"}]
    )
    assert [(t.kind, t.attempt) for t in twice] == [("reserved", 1), ("reclaimed", 1)]
    assert twice[0].dispatch_id == twice[1].dispatch_id


def revisions_of(ledger: fp.Ledger, run_id: str) -> int:
    return max(e.revision for e in ledger.events(run_id))


def test_unit_attempts_reads_the_newest_of_a_page_of_units(ledger: fp.Ledger) -> None:
    run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
    for _ in range(4):
        r = ledger.reserve_attempt(run.run_id, "a", step_id="s")
        ledger.finish_attempt(run.run_id, "a", r.attempt, r.dispatch_id, status="failed")
    ledger.reserve_attempt(run.run_id, "b", step_id="s")
    got = ledger.unit_attempts(run.run_id, ["b", "a", "nope"], latest=2)
    assert list(got) == ["b", "a", "nope"]
    assert [a.attempt for a in got["a"]] == [3, 4]
    assert got["a"] == ledger.attempts(run.run_id, "a")[-2:]
    assert [(a.attempt, a.status) for a in got["b"]] == [(1, "running")]
    assert got["nope"] == []
    assert ledger.unit_attempts(run.run_id, []) == {}
    assert [len(v) for v in ledger.unit_attempts(run.run_id, ["a"], latest=10).values()] == [4]
    for kw, argument in (({"latest": 0}, "latest"), ({"latest": 10_001}, "latest")):
        with pytest.raises(fp.InvalidArgument) as bad:
            ledger.unit_attempts(run.run_id, ["a"], **kw)
        assert bad.value.argument == argument
    with pytest.raises(fp.InvalidArgument) as many:
        ledger.unit_attempts(run.run_id, [f"u{i}" for i in range(10_001)])
    assert many.value.argument == "unit_ids"


def test_newest_event_seq(ledger: fp.Ledger) -> None:
    assert ledger.newest_event_seq() == 0
    run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
    ledger.reserve_attempts(run.run_id, [{"unit_id": f"u{i}", "step_id": "s"} for i in range(5)])
    assert ledger.newest_event_seq() == ledger.events(limit=1000)[-1].seq

"""Dispatchers racing under a retry policy as real processes on one ledger (a SQLite file or a
PostgreSQL schema), on the system clock: eight dispatchers reserve and finish units that fail
at random, while a ninth reserves a few and is killed with ``kill -9``. Every unit ends
completed or exhausted, none takes more attempts than its policy allows (the killed
dispatcher's attempts are reclaimed in place, not started again), no attempt starts before
its unit's retry time, and every attempt has its events, with no raw database error."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import fencepost as fp
from tests.conftest import raw_db
from tests.processes import check_invariants, kill_mid_flight, outcome, run_all
from tests.test_retries import expected_delay

PROCS = 8
UNITS = [f"u{i:02}" for i in range(48)]
POLICY: dict[str, Any] = {
    "max_attempts": 4,
    "initial_ms": 20,
    "factor": 2,
    "max_ms": 120,
    "jitter": 0.5,
}
DOOMED = UNITS[:6]


def _dispatch(i: int, barrier: Any, queue: Any, path: str, run_id: str) -> None:
    """Dispatcher ``i`` owns every eighth unit: it starts those never reserved, reclaims
    those the killed dispatcher left running, reserves those ``due_units`` lists, and now and
    then tries one that is not due yet (``RetryNotDue``) or exhausted (``UnitExhausted``).
    One owner per unit, as a dispatcher working from ``due_units`` should have: a unit listed
    due and completed meanwhile by another would otherwise be reserved again (a completed
    unit may be run again on purpose), past its policy."""
    rnd = random.Random(i)
    mine = UNITS[i::PROCS]
    errors: list[str] = []
    refused = {"RetryNotDue": 0, "UnitExhausted": 0}
    deadline = time.monotonic() + 60
    with fp.Ledger.open(path) as ledger:
        barrier.wait()
        while time.monotonic() < deadline:
            state = {u: ledger.unit(run_id, u) for u in mine}
            if all(
                s is not None and s.status in ("completed", "exhausted") for s in state.values()
            ):
                break
            due = {u.unit_id for u in ledger.due_units(run_id, limit=1000)}
            todo = [u for u, s in state.items() if s is None or s.status == "running" or u in due]
            waiting = [
                u
                for u, s in state.items()
                if s is not None and s.status != "completed" and u not in todo
            ]
            if waiting and rnd.random() < 0.3:
                todo.append(rnd.choice(waiting))  # not due yet, or exhausted: refused
            for unit in todo:
                kind, res = outcome(
                    lambda u=unit: ledger.reserve_attempt(run_id, u, step_id="s", holder=f"p{i}")
                )
                if kind in refused:
                    refused[kind] += 1
                    continue
                if kind != "ok":
                    errors.append(f"reserve {unit}: {kind} {res}")
                    continue
                status = "completed" if rnd.random() < 0.35 else rnd.choice(["failed", "timed_out"])
                kind, ok = outcome(
                    lambda r=res, u=unit, st=status: ledger.finish_attempt(
                        run_id, u, r.attempt, r.dispatch_id, status=st
                    )
                )
                if kind != "ok" or not ok:
                    errors.append(f"finish {unit}: {kind} {ok}")
            time.sleep(0.005)
        # Settled: an exhausted unit takes no attempt, forced or not.
        dead = [u for u in mine if (s := ledger.unit(run_id, u)) and s.status == "exhausted"]
        for unit in dead:
            for force in (False, True):
                kind, res = outcome(
                    lambda u=unit, f=force: ledger.reserve_attempt(run_id, u, step_id="s", force=f)
                )
                if kind == "UnitExhausted":
                    refused[kind] += 1
                else:
                    errors.append(f"exhausted {unit} reserved: {kind} {res}")
    queue.put((i, (errors, refused)))


def _doomed(path: str, run_id: str, ready: Any) -> None:
    """Reserve a few units, then keep busy until the signal: the attempts stay running."""
    with fp.Ledger.open(path) as ledger:
        for unit in DOOMED:
            ledger.reserve_attempt(run_id, unit, step_id="s", holder="doomed")
        ready.set()
        while True:
            ledger.unit(run_id, DOOMED[0])
            time.sleep(0.001)


def test_dispatchers_retry_under_a_policy_through_a_kill(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        run_id = ledger.start_run(
            "wf/retry", scope_key=None, force=True, steps=[{"id": "s"}], retry=POLICY
        ).run_id
    kill_mid_flight(_doomed, (target, run_id), 0.05)
    results = run_all(_dispatch, [(target, run_id)] * PROCS)
    errors = [e for errs, _ in results for e in errs]
    assert errors == []
    refused = {k: sum(r[k] for _, r in results) for k in ("RetryNotDue", "UnitExhausted")}
    # The dispatchers met both refusals: they raced the policy, not a quiet ledger.
    assert refused["RetryNotDue"] > 0, refused
    assert refused["UnitExhausted"] > 0, refused

    with fp.Ledger.open(target) as ledger:
        units = {u.unit_id: u for u in ledger.units(run_id)}
        assert set(units) == set(UNITS)
        assert {u.status for u in units.values()} <= {"completed", "exhausted"}
        exhausted = {u for u, s in units.items() if s.status == "exhausted"}
        assert exhausted, "some unit used up its attempts"
        histories = {u: ledger.attempts(run_id, u) for u in UNITS}
        exhausted_events = [
            e.payload["unit_id"] for e in ledger.events(run_id) if e.type == "unit.exhausted"
        ]
    assert sorted(exhausted_events) == sorted(exhausted)
    for unit, history in histories.items():
        # No attempt past the policy's, none lost, none doubled.
        assert [a.attempt for a in history] == list(range(1, len(history) + 1))
        assert len(history) <= POLICY["max_attempts"], (unit, history)
        if unit in exhausted:
            assert len(history) == POLICY["max_attempts"]
            assert history[-1].status in ("failed", "timed_out")
        else:
            assert history[-1].status == "completed"
        assert all(a.status in ("failed", "timed_out") for a in history[:-1])
        # No attempt started before its unit's retry time (nobody forced one).
        for before, after in itertools.pairwise(history):
            assert before.finished_at is not None
            retry_at = fp.models.to_ms(before.finished_at) + expected_delay(
                POLICY, run_id, unit, before.attempt
            )
            assert fp.models.to_ms(after.started_at) >= retry_at, (unit, before, after)
    # The killed dispatcher's attempts were reclaimed in place, not counted again.
    reclaimed = [histories[u][0] for u in DOOMED]
    assert all(a.reclaims >= 1 and a.attempt == 1 for a in reclaimed), reclaimed
    check_invariants(target)
    with raw_db(target) as db:
        waiting = db.execute(
            "SELECT count(*) FROM units WHERE run_id = ? AND retry_at IS NOT NULL", (run_id,)
        ).fetchone()[0]
    assert waiting == 0

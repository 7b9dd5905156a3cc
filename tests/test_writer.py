"""Group commit: reserves, finishes, heartbeats, claims, status moves and step completions from
threads sharing one ``Ledger`` join one transaction while one is in flight, and each call keeps
the outcome it would have alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import fencepost as fp
from tests.processes import check_invariants, held_write_lock

THREADS = 16
UNITS = 20


def _start(ledger: fp.Ledger, run_id: str) -> str:
    return ledger.start_run(
        "wf", scope_key=None, steps=[{"id": "s"}], run_id=run_id, force=True
    ).run_id


def test_threads_share_transactions_and_keep_their_outcomes(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        run = _start(ledger, "shared")
        barrier = threading.Barrier(THREADS)
        wins: list[tuple[str, int]] = []
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                barrier.wait()
                for i in range(UNITS):
                    unit = f"t{t}-u{i}"
                    r = ledger.reserve_attempt(run, unit, step_id="s")
                    first = ledger.finish_attempt(
                        run, unit, r.attempt, r.dispatch_id, status="completed"
                    )
                    again = ledger.finish_attempt(
                        run, unit, r.attempt, r.dispatch_id, status="failed"
                    )
                    assert (first, again) == (True, False)
                    wins.append((unit, r.attempt))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        stats = ledger._core.group_stats()
        assert stats["calls"] >= THREADS * UNITS * 3
        assert stats["groups"] <= stats["calls"]
        for unit, attempt in wins:
            got = ledger.attempts(run, unit)
            assert [(a.attempt, a.status) for a in got] == [(attempt, "completed")]
    assert check_invariants(target) == THREADS * UNITS


def test_threads_that_call_again_at_once_share_the_next_group(target: str) -> None:
    """Eight threads, each reserving and finishing one unit after another, where a commit costs
    a flush or a round trip (durability="full"): a leader waits, for at most half of what the
    last group held the store, until as many calls are queued as that group had, so a group
    holds nearly all eight. Without the wait, each group held those answered by the group
    before it, about half of them."""
    threads, rounds = 8, 30
    with fp.Ledger.open(target, durability="full") as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r", force=True)
        before = ledger._core.group_stats()

        def work(t: int) -> None:
            for i in range(rounds):
                res = ledger.reserve_attempt("r", f"t{t}-{i}", step_id="s")
                assert ledger.finish_attempt(
                    "r", res.unit_id, res.attempt, res.dispatch_id, status="completed"
                )

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        after = ledger._core.group_stats()
    calls = after["calls"] - before["calls"]
    groups = after["groups"] - before["groups"]
    assert calls == 2 * threads * rounds
    assert calls / groups >= 6, (calls, groups)


def test_group_commit_off_runs_every_call_alone(target: str) -> None:
    with fp.Ledger.open(target, group_commit=False) as ledger:
        run = _start(ledger, "alone")

        def work(t: int) -> None:
            for i in range(5):
                ledger.reserve_attempt(run, f"t{t}-{i}", step_id="s")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = ledger._core.group_stats()
        assert stats["max_group"] == 1
        assert stats["calls"] == stats["groups"] == 20


def _one_held_group(
    ledger: fp.Ledger, target: str, dummy: str, calls: dict[str, Callable[[], Any]]
) -> dict[str, Any]:
    """Run ``calls`` from threads so that they queue together: a call on ``dummy`` leads and
    waits on a lock held elsewhere, the others queue behind it, and once the lock goes they
    form the next group. Each call's result, or the fencepost error it raised, by name."""
    out: dict[str, Any] = {}

    def call(name: str, f: Callable[[], Any]) -> None:
        try:
            out[name] = f()
        except fp.LedgerError as e:
            out[name] = e

    with held_write_lock(target, dummy):
        lead = threading.Thread(
            target=call,
            args=("dummy", lambda: ledger.reserve_attempt(dummy, "u", step_id="s")),
        )
        lead.start()
        time.sleep(0.3)  # the dummy call leads and waits for the lock (nothing to poll)
        queued = [threading.Thread(target=call, args=item) for item in calls.items()]
        for t in queued:
            t.start()
        time.sleep(0.3)  # every call queues behind the dummy
    for t in [lead, *queued]:
        t.join()
    return out


def test_a_stale_owner_and_the_new_owner_in_one_group(target: str) -> None:
    with fp.Ledger.open(target, busy_timeout_ms=10_000) as ledger:
        run = _start(ledger, "fenced")
        dummy = _start(ledger, "dummy")
        stale = ledger.claim(run, "host-a", lease_ms=60_000)
        live = ledger.claim(run, "host-a", lease_ms=60_000)
        assert stale is not None
        assert live is not None
        events_before = len(ledger.events(run))
        out = _one_held_group(
            ledger,
            target,
            dummy,
            {
                "stale": lambda: ledger.heartbeat(stale, lease_ms=30_000),
                "stale_reserve": lambda: ledger.reserve_attempt(run, "x", step_id="s", claim=stale),
                "live": lambda: ledger.heartbeat(live, lease_ms=30_000),
            },
        )
        assert isinstance(out["stale"], fp.LeaseLost)
        assert isinstance(out["stale_reserve"], fp.LeaseLost)
        assert isinstance(out["live"], fp.Claim)
        assert out["live"].generation == live.generation
        assert ledger.unit(run, "x") is None, "nothing of the stale call is written"
        assert len(ledger.events(run)) == events_before
        assert ledger._core.group_stats()["max_group"] >= 3, (ledger._core.group_stats(), out)
        assert ledger.lease(run).expires_at == out["live"].expires_at


def test_close_fails_nothing_that_ran_and_refuses_what_comes_after(target: str) -> None:
    ledger = fp.Ledger.open(target)
    run = _start(ledger, "closing")
    r = ledger.reserve_attempt(run, "u", step_id="s")
    ledger.close()
    with pytest.raises(fp.StoreError, match="closed"):
        ledger.finish_attempt(run, "u", r.attempt, r.dispatch_id, status="completed")


def test_claims_moves_and_steps_keep_their_outcomes_in_one_group(target: str) -> None:
    """Claims, status moves and step completions queued behind one lock holder commit as one
    group, and each gets what it gets alone: the stale owner's move and completion raise
    LeaseLost and write nothing, another runner's claim of a held run is None, an invalid move
    is refused with the message it has alone, and the live calls commit."""
    steps = [{"id": "s"}, {"id": "t"}]
    with fp.Ledger.open(target, busy_timeout_ms=10_000) as ledger:
        a, b, c = (
            ledger.start_run("wf", scope_key=None, steps=steps, run_id=r, force=True).run_id
            for r in ("a", "b", "c")
        )
        dummy = _start(ledger, "dummy")
        stale = ledger.claim(a, "host-a", lease_ms=60_000)
        live = ledger.claim(a, "host-a", lease_ms=60_000)
        held = ledger.claim(b, "host-a", lease_ms=60_000)
        assert stale is not None
        assert live is not None
        assert held is not None
        before = {r: len(ledger.events(r)) for r in (a, b, c)}
        calls: dict[str, Any] = {
            "stale_move": lambda: ledger.set_status(a, "blocked", claim=stale),
            "stale_step": lambda: ledger.complete_step(a, "s", claim=stale),
            "live_step": lambda: ledger.complete_step(a, "s", claim=live),
            "held_claim": lambda: ledger.claim(b, "host-b", lease_ms=60_000),
            "bad_move": lambda: ledger.set_status(b, "queued", claim=held),
            "new_claim": lambda: ledger.claim(c, "host-b", lease_ms=60_000),
        }
        groups_before = ledger._core.group_stats()["groups"]
        out = _one_held_group(ledger, target, dummy, calls)
        stats = ledger._core.group_stats()
        assert stats["max_group"] >= len(calls), (stats, out)
        assert stats["groups"] - groups_before <= 2, "the dummy's group, then all the rest"
        assert stats["fallbacks"] == 0

        assert isinstance(out["stale_move"], fp.LeaseLost)
        assert isinstance(out["stale_step"], fp.LeaseLost)
        assert out["live_step"].current_step_id == "t"
        assert out["held_claim"] is None
        assert isinstance(out["bad_move"], fp.InvalidArgument)
        assert out["new_claim"].generation == 1
        assert out["new_claim"].owner_id == "host-b"
        types = {r: [e.type for e in ledger.events(r)[before[r] :]] for r in (a, b, c)}
        assert types == {a: ["step.completed"], b: [], c: ["lease.claimed"]}
        run_b = ledger.get_run(b)
        assert run_b is not None
        assert run_b.status == "active"
        # The refusals again, alone: the same errors, word for word.
        for name in ("stale_move", "stale_step", "bad_move"):
            with pytest.raises(type(out[name])) as alone:
                calls[name]()
            assert str(alone.value) == str(out[name])
    check_invariants(target)

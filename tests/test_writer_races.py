"""Group commit: many threads sharing one Ledger, on a SQLite file and on PostgreSQL.

Concurrent covered calls (reserve_attempt(s), finish_attempt(s), heartbeat, claim, set_status,
complete_step) share transactions, and each still keeps its own outcome: a call that returned is
in the database, a call that raised LeaseLost, RunNotActive or InvalidArgument (or a claim that
returned None) wrote nothing, a finish wins at most once per attempt, and every run's event
revisions stay gap-free. ``group_commit=False`` gives the same results with
one call per transaction.

Threads start together behind a barrier so that calls really arrive while a transaction is in
flight; ``_core.group_stats()`` says whether they coalesced (its counts are since open).
"""

from __future__ import annotations

import functools
import pathlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import STEPS, FakeClock, fresh_target, raw_db
from tests.processes import check_invariants, outcome

THREADS = 16
# Enough steps that the threads completing them never reach the last one (which would end the
# run, and with it every other call on it).
MANY_STEPS = [{"id": f"s{k:03}", "title": f"Step {k}"} for k in range(300)]
# Fixed, so that a lease's expiry (now + lease_ms) names the call that wrote it.
LEASE_MS = 600_000
# No call may take anywhere near this long; a thread still alive after it means a hang.
JOIN_S = 60


def _open(target: str, clock: FakeClock, *, group_commit: bool = True) -> fp.Ledger:
    return fp.Ledger.open(target, clock=clock, group_commit=group_commit)


def _stats(ledger: fp.Ledger) -> dict[str, int]:
    return ledger._core.group_stats()


def _run(ledger: fp.Ledger, run_id: str, steps: list[dict[str, Any]] = STEPS) -> str:
    ledger.start_run("wf/gc", scope_key=None, steps=steps, run_id=run_id, force=True)
    return run_id


def _try(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``outcome`` of one call, its arguments bound now."""
    return outcome(functools.partial(fn, *args, **kwargs))


def _threads(n: int, body: Callable[[int, threading.Barrier], None]) -> None:
    """Run ``body(i, barrier)`` on ``n`` threads that start together; fail on a hang or on an
    exception a body let escape."""
    barrier = threading.Barrier(n)
    escaped: list[BaseException] = []

    def main(i: int) -> None:
        try:
            body(i, barrier)
        except BaseException as e:  # reported below, with the thread's traceback
            escaped.append(e)
            barrier.abort()

    threads = [threading.Thread(target=main, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a call hung"
    if escaped:
        raise escaped[0]


def _revisions_gap_free(target: str) -> None:
    with raw_db(target) as db:
        rows = db.execute("SELECT resource_id, revision FROM events").fetchall()
    by_run: dict[str, list[int]] = {}
    for resource, revision in rows:
        by_run.setdefault(resource, []).append(revision)
    for resource, revisions in by_run.items():
        assert sorted(revisions) == list(range(1, len(revisions) + 1)), resource


# ------------------------------------------------------------------ random calls, shared state


class _Shared:
    """What the threads of the random workload share: the current and stale claims per run,
    the reservations made so far (finished at random, duplicates included), and the log of
    every call with its outcome."""

    def __init__(self, claims: dict[str, fp.Claim]) -> None:
        self.lock = threading.Lock()
        self.current = dict(claims)
        self.stale: dict[str, list[fp.Claim]] = {r: [] for r in claims}
        self.reservations: list[fp.Reservation] = []
        self.log: list[tuple[str, Any, str, Any]] = []
        self.ids = iter(range(1, 1 << 30))

    def next_id(self) -> int:
        with self.lock:
            return next(self.ids)

    def record(self, kind: str, call: Any, result: tuple[str, Any]) -> None:
        with self.lock:
            self.log.append((kind, call, result[0], result[1]))
            if kind == "reserve" and result[0] == "ok":
                got = result[1]
                self.reservations.extend(got if isinstance(got, list) else [got])


def _random_calls(
    ledger: fp.Ledger,
    shared: _Shared,
    fenced: list[str],
    free: str,
    blocked: str,
    stepped: str,
    calls: int,
) -> Callable[[int, threading.Barrier], None]:
    """A thread's body: ``calls`` random covered calls: takeovers (a re-claim by the owner,
    which leaves the previous claim stale while other threads still use it) and claims by
    another runner (refused while the lease is live), moves of the fenced runs between
    ``active`` and ``blocked`` (a move to the status the run has is refused), completions of
    ``stepped``'s current step (a step another thread completed first is refused), reserves,
    finishes and heartbeats."""

    def takeover(run_id: str) -> None:
        result = _try(ledger.claim, run_id, "host-a", lease_ms=LEASE_MS)
        assert result[0] == "ok", result
        assert result[1] is not None, "the owner's own re-claim is never refused"
        new = result[1]
        shared.record("claim", run_id, result)
        with shared.lock:
            # Two takeovers of one run may return in either order: the later generation is
            # the current claim, the other is stale.
            old = shared.current[run_id]
            if new.generation > old.generation:
                shared.current[run_id] = new
            else:
                old = new
            shared.stale[run_id].append(old)

    def body(i: int, barrier: threading.Barrier) -> None:
        rnd = random.Random(i)
        barrier.wait()
        for _ in range(calls):
            n = shared.next_id()
            roll = rnd.random()
            run_id = rnd.choice([*fenced, free])
            with shared.lock:
                current = shared.current.get(run_id)
                stale = rnd.choice(shared.stale[run_id]) if shared.stale.get(run_id) else None
            claim = rnd.choice([current, current, stale]) if run_id in fenced else None
            if roll < 0.03 and run_id in fenced:
                takeover(rnd.choice([run_id, stepped]))
            elif roll < 0.05:
                # Another runner, while host-a's lease is live: None, and nothing written.
                target = rnd.choice([*fenced, stepped])
                shared.record(
                    "claim", target, _try(ledger.claim, target, "host-b", lease_ms=LEASE_MS)
                )
            elif roll < 0.1 and run_id in fenced:
                claim = rnd.choice([c for c in (current, current, stale) if c is not None])
                to = rnd.choice(["active", "blocked"])
                shared.record(
                    "move", (run_id, to, claim), _try(ledger.set_status, run_id, to, claim=claim)
                )
            elif roll < 0.18:
                with shared.lock:
                    current = shared.current[stepped]
                    stale = shared.stale[stepped][-1] if shared.stale[stepped] else None
                fence = rnd.choice([current, current, None, stale])
                # Read just before: other threads complete steps too, so the read may be stale
                # by the time the call runs.
                run = ledger.get_run(stepped)
                assert run is not None
                assert run.current_step_id is not None
                # Now and then the last step, never current: refused however the threads race.
                step = run.current_step_id if rnd.random() < 0.8 else MANY_STEPS[-1]["id"]
                shared.record(
                    "step",
                    (step, n),
                    _try(
                        ledger.complete_step,
                        stepped,
                        step,
                        status=rnd.choice(["completed", "skipped"]),
                        notes=f"call-{n}",
                        claim=fence,
                    ),
                )
            elif roll < 0.35:
                unit = f"u{rnd.randrange(40)}"
                holder = f"call-{n}"
                shared.record(
                    "reserve",
                    (run_id, [holder]),
                    _try(
                        ledger.reserve_attempt,
                        run_id,
                        unit,
                        step_id="build",
                        holder=holder,
                        claim=claim,
                    ),
                )
            elif roll < 0.45:
                # The batch form is one call too: all of its units or none.
                units = [f"u{u}" for u in rnd.sample(range(40), 2)]
                holders = [f"call-{n}-{j}" for j in range(2)]
                batch = [
                    {"unit_id": u, "step_id": "build", "holder": h}
                    for u, h in zip(units, holders, strict=True)
                ]
                shared.record(
                    "reserve",
                    (run_id, holders),
                    _try(ledger.reserve_attempts, run_id, batch, claim=claim),
                )
            elif roll < 0.5:
                unit = f"u{rnd.randrange(40)}"
                holder = f"call-{n}"
                shared.record(
                    "reserve",
                    (blocked, [holder]),
                    _try(ledger.reserve_attempt, blocked, unit, step_id="build", holder=holder),
                )
            elif roll < 0.85:
                with shared.lock:
                    picked = rnd.choice(shared.reservations) if shared.reservations else None
                if picked is None:
                    continue
                claim = None
                if picked.run_id in fenced:
                    with shared.lock:
                        current = shared.current[picked.run_id]
                        olds = shared.stale[picked.run_id]
                        claim = rnd.choice([current, current, *(olds[-1:])])
                if rnd.random() < 0.2:
                    finish = {
                        "run_id": picked.run_id,
                        "unit_id": picked.unit_id,
                        "attempt": picked.attempt,
                        "dispatch_id": picked.dispatch_id,
                        "status": "completed",
                        "tokens": n,
                    }
                    result = _try(ledger.finish_attempts, [finish], claim=claim)
                    if result[0] == "ok":
                        result = ("ok", result[1][0])
                else:
                    result = _try(
                        ledger.finish_attempt,
                        picked.run_id,
                        picked.unit_id,
                        picked.attempt,
                        picked.dispatch_id,
                        status="completed",
                        tokens=n,
                        claim=claim,
                    )
                shared.record("finish", (picked, n), result)
            elif run_id in fenced:
                claim = rnd.choice([c for c in (current, current, stale) if c is not None])
                # Its own lease length, so the expiry in the lease row names the call.
                shared.record(
                    "heartbeat",
                    (run_id, LEASE_MS + n),
                    _try(ledger.heartbeat, claim, lease_ms=LEASE_MS + n),
                )

    return body


def test_threads_share_transactions_and_keep_their_outcomes(target: str, clock: FakeClock) -> None:
    with _open(target, clock) as ledger:
        fenced = [_run(ledger, "gc-a"), _run(ledger, "gc-b")]
        free = _run(ledger, "gc-free")
        blocked = _run(ledger, "gc-blocked")
        ledger.block_run(blocked, notes="held")
        stepped = _run(ledger, "gc-steps", MANY_STEPS)
        claims = {}
        for run_id in [*fenced, stepped]:
            claim = ledger.claim(run_id, "host-a", lease_ms=LEASE_MS)
            assert claim is not None
            claims[run_id] = claim
        shared = _Shared(claims)
        _threads(THREADS, _random_calls(ledger, shared, fenced, free, blocked, stepped, 60))
        stats = _stats(ledger)
        final_claims = dict(shared.current)

    log = shared.log
    kinds = Counter(result for _, _, result, _ in log)
    assert set(kinds) <= {"ok", "LeaseLost", "RunNotActive", "InvalidArgument"}, kinds
    for kind in ("ok", "LeaseLost", "RunNotActive", "InvalidArgument"):
        assert kinds[kind], kinds
    calls = Counter((kind, result) for kind, _, result, _ in log)
    for kind in ("claim", "move", "step"):
        assert calls[kind, "ok"], calls
    for kind in ("move", "step"):
        assert calls[kind, "InvalidArgument"], calls
        assert calls[kind, "LeaseLost"], calls
    # Every call went through the writer, and some of them shared a transaction.
    assert stats["calls"] >= len(log)
    assert stats["groups"] < stats["calls"]
    assert stats["max_group"] > 1, stats

    with raw_db(target) as db:
        attempts = {
            (r, u, a): (d, status, tokens, holder)
            for r, u, a, d, status, tokens, holder in db.execute(
                "SELECT run_id, unit_id, attempt, dispatch_id, status, tokens, holder FROM attempts"
            ).fetchall()
        }
        leases = {
            r: (generation, expires_at - clock.now)
            for r, generation, expires_at in db.execute(
                "SELECT resource_id, generation, expires_at FROM leases WHERE owner_id IS NOT NULL"
            ).fetchall()
        }
    holders = {h for *_, h in attempts.values()}
    tokens = {t for _, _, t, _ in attempts.values() if t is not None}
    wins: Counter[tuple[str, str, int]] = Counter()
    for kind, call, result, value in log:
        if kind == "reserve":
            run_id, call_holders = call
            if result == "ok":
                for res in value if isinstance(value, list) else [value]:
                    key = (res.run_id, res.unit_id, res.attempt)
                    assert attempts[key][0] == res.dispatch_id  # a returned reservation is there
            else:
                for holder in call_holders:
                    assert holder not in holders, f"{holder} raised {result} but wrote an attempt"
                if run_id == blocked:
                    assert result == "RunNotActive"
        elif kind == "finish":
            picked, n = call
            key = (picked.run_id, picked.unit_id, picked.attempt)
            if result == "ok" and value:
                wins[key] += 1
                assert attempts[key][1:3] == ("completed", n)  # the winner's own finish
            elif result != "ok":
                assert n not in tokens, f"finish {n} raised {result} but wrote its result"
    assert all(w == 1 for w in wins.values()), "two winning finishes for one attempt"
    finished = {k for k, (_, status, _, _) in attempts.items() if status != "running"}
    assert finished == set(wins)  # every finished attempt has exactly its one winning call
    beats = {call: result for kind, call, result, _ in log if kind == "heartbeat"}
    for run_id, claim in final_claims.items():
        generation, lease_ms = leases[run_id]
        assert generation == claim.generation
        # The lease's length is the last claim's or a heartbeat's that returned, never one
        # that raised LeaseLost.
        assert lease_ms == LEASE_MS or beats[run_id, lease_ms] == "ok", lease_ms
    _run_calls_kept_their_outcomes(target, log, claims, stepped)
    _revisions_gap_free(target)
    check_invariants(target)


def _run_calls_kept_their_outcomes(
    target: str, log: list[tuple[str, Any, str, Any]], first: dict[str, fp.Claim], stepped: str
) -> None:
    """The claims, moves and step completions of the random workload: each one that returned
    wrote its event and rows, and each refusal (or a claim's None) wrote nothing."""
    with raw_db(target) as db:
        events = db.execute(
            "SELECT resource_id, revision, type, actor_id, generation, "
            "json_extract(payload, '$.to'), json_extract(payload, '$.step_id') "
            "FROM events WHERE type IN ('lease.claimed', 'run.status', 'step.completed')"
        ).fetchall()
        steps = dict(
            db.execute(
                "SELECT step_id, notes FROM steps WHERE run_id = ? AND completed_at IS NOT NULL",
                (stepped,),
            ).fetchall()
        )
    by_revision = {
        (r, rev): (t, actor, gen, to, step) for r, rev, t, actor, gen, to, step in events
    }
    # Claims: the returned ones are exactly the lease.claimed events, one per generation.
    claimed = {(c.run_id, c.generation, c.owner_id) for c in first.values()}
    for kind, _run_id, result, value in log:
        if kind == "claim":
            assert result == "ok", (result, value)  # never an error: None, or a claim
            if value is not None:
                claimed.add((value.run_id, value.generation, value.owner_id))
    written = {(r, gen, actor) for r, _, t, actor, gen, _, _ in events if t == "lease.claimed"}
    assert written == claimed
    for run_id in first:
        gens = sorted(g for r, g, _ in claimed if r == run_id)
        assert gens == list(range(1, len(gens) + 1)), (run_id, gens)
    assert all(owner == "host-a" for _, _, owner in claimed)  # host-b never took a live lease
    # Moves: each returned run is its move's run.status event; refused moves wrote none.
    moves = [
        (call, value) for kind, call, result, value in log if kind == "move" and result == "ok"
    ]
    for (run_id, to, claim), run in moves:
        assert run.status == to
        assert by_revision[run_id, run.revision] == (
            "run.status",
            "host-a",
            claim.generation,
            to,
            None,
        )
    # (`first` holds the claimed runs; the blocked run's one move was made before the threads.)
    statuses = Counter(r for r, _, t, *_ in events if t == "run.status" and r in first)
    assert statuses == Counter(call[0] for call, _ in moves)
    # Step completions: one returned call per completed step, each with its own notes.
    done = [(call, value) for kind, call, result, value in log if kind == "step" and result == "ok"]
    assert len({step for (step, _), _ in done}) == len(done)
    assert steps == {step: f"call-{n}" for (step, n), _ in done}
    completions = [step for r, _, t, _, _, _, step in events if t == "step.completed"]
    assert sorted(completions) == sorted(steps)
    for (step, _), run in done:
        event = by_revision[stepped, run.revision]
        assert event[0] == "step.completed"
        assert event[4] == step


# ------------------------------------------------------------------ grouped == one by one


def _own_run_call(
    ledger: fp.Ledger, rnd: random.Random, run_id: str, claims: list[fp.Claim], step: list[str]
) -> tuple[Any, ...]:
    """One call on a run only this thread touches: a takeover (``claims[-1]`` is the current
    claim, the others are stale), another runner's claim, a status move or a step's
    completion (``step[0]`` is the current step as this thread last saw it). The outcome."""
    roll = rnd.random()
    fence = rnd.choice([claims[-1], claims[-1], rnd.choice(claims)])
    if roll < 0.1:
        new = ledger.claim(run_id, "host-a", lease_ms=LEASE_MS)
        assert new is not None
        claims.append(new)
        return ("takeover", new.generation, new.owner_id)
    if roll < 0.2:
        return ("claim", ledger.claim(run_id, "host-b", lease_ms=LEASE_MS))
    if roll < 0.55:
        to = rnd.choice(["active", "blocked"])
        res = _try(ledger.set_status, run_id, to, claim=fence)
        got = (res[1].status, res[1].revision) if res[0] == "ok" else res[0]
        return ("move", to, fence.generation, got)
    target = step[0] if rnd.random() < 0.8 else MANY_STEPS[-1]["id"]
    res = _try(
        ledger.complete_step,
        run_id,
        target,
        status=rnd.choice(["completed", "skipped"]),
        notes=target,
        claim=rnd.choice([fence, None]),
    )
    if res[0] != "ok":
        return ("step", target, res[0])
    assert res[1].current_step_id is not None
    step[0] = res[1].current_step_id
    return ("step", target, res[1].current_step_id, res[1].revision)


def _deterministic(
    ledger: fp.Ledger,
    claim: fp.Claim,
    stale: fp.Claim,
    own: dict[int, list[fp.Claim]],
    results: dict[int, list[Any]],
) -> Callable[[int, threading.Barrier], None]:
    """A thread's body whose outcomes do not depend on how the threads interleave: each
    thread works on its own units, the shared run's lease never changes hands during the run,
    and each thread's claims, moves and step completions are on a run of its own."""

    def body(i: int, barrier: threading.Barrier) -> None:
        rnd = random.Random(1000 + i)
        mine: list[Any] = []
        latest: dict[str, fp.Reservation] = {}
        own_claims = own[i]
        own_step = [MANY_STEPS[0]["id"]]
        barrier.wait()
        for k in range(40):
            if rnd.random() < 0.3:
                mine.append(_own_run_call(ledger, rnd, f"det-{i}", own_claims, own_step))
                continue
            roll = rnd.random()
            unit = f"t{i}-u{rnd.randrange(6)}"
            fence = rnd.choice([claim, claim, stale, None])
            if roll < 0.4 or unit not in latest:
                res = _try(
                    ledger.reserve_attempt,
                    "det",
                    unit,
                    step_id="build",
                    holder=f"t{i}",
                    claim=fence,
                )
                if res[0] == "ok":
                    latest[unit] = res[1]
                    mine.append(("reserve", unit, res[1].kind, res[1].attempt, res[1].reclaims))
                else:
                    mine.append(("reserve", unit, res[0]))
            elif roll < 0.75:
                r = latest[unit]
                wrong = roll < 0.45
                res = _try(
                    ledger.finish_attempt,
                    "det",
                    r.unit_id,
                    r.attempt,
                    "not-the-dispatch-id" if wrong else r.dispatch_id,
                    status=rnd.choice(["completed", "failed"]),
                    tokens=k,
                    claim=fence,
                )
                mine.append(("finish", unit, r.attempt, res[0], res[1] if res[0] == "ok" else 0))
            elif roll < 0.82:
                res = _try(ledger.reserve_attempt, "det-blocked", unit, step_id="build")
                mine.append(("blocked", unit, res[0]))
            else:
                hb = rnd.choice([claim, stale])
                res = _try(ledger.heartbeat, hb, lease_ms=LEASE_MS)
                got = res[1].generation if res[0] == "ok" else res[0]
                mine.append(("heartbeat", hb is claim, got))
        results[i] = mine

    return body


def _deterministic_run(
    target: str, clock: FakeClock, group_commit: bool
) -> tuple[dict[int, list[Any]], dict[str, Any], dict[str, int]]:
    results: dict[int, list[Any]] = {}
    with _open(target, clock, group_commit=group_commit) as ledger:
        _run(ledger, "det")
        _run(ledger, "det-blocked")
        ledger.block_run("det-blocked", notes="held")
        stale = ledger.claim("det", "host-a", lease_ms=LEASE_MS)
        claim = ledger.claim("det", "host-a", lease_ms=LEASE_MS)
        assert stale is not None
        assert claim is not None
        own: dict[int, list[fp.Claim]] = {}
        for i in range(THREADS):
            _run(ledger, f"det-{i}", MANY_STEPS)
            claims = [ledger.claim(f"det-{i}", "host-a", lease_ms=LEASE_MS) for _ in range(2)]
            own[i] = [c for c in claims if c is not None]
        _threads(THREADS, _deterministic(ledger, claim, stale, own, results))
        stats = _stats(ledger)
    with raw_db(target) as db:
        rows = {
            "attempts": sorted(
                db.execute(
                    "SELECT run_id, unit_id, attempt, status, tokens, holder, lease_generation, "
                    "reclaims, started_at, finished_at FROM attempts"
                ).fetchall()
            ),
            "units": sorted(db.execute("SELECT * FROM units").fetchall()),
            "leases": sorted(
                db.execute(
                    "SELECT resource_id, generation, owner_id, expires_at FROM leases"
                ).fetchall()
            ),
            # The writer picks the order of concurrent calls, so events compare as a multiset
            # (revisions are checked gap-free on their own).
            "events": sorted(
                db.execute(
                    "SELECT resource_id, type, actor_type, actor_id, generation, "
                    "json_extract(payload, '$.unit_id'), json_extract(payload, '$.attempt'), "
                    "json_extract(payload, '$.to'), json_extract(payload, '$.step_id') "
                    "FROM events"
                ).fetchall(),
                key=repr,
            ),
            "runs": sorted(
                db.execute(
                    "SELECT run_id, status, current_step_id, updated_at, completed_at FROM runs"
                ).fetchall()
            ),
            "steps": sorted(
                db.execute(
                    "SELECT run_id, step_id, status, notes, completed_at FROM steps"
                ).fetchall()
            ),
        }
    _revisions_gap_free(target)
    check_invariants(target)
    return results, rows, stats


def _own_outcome(call: tuple[Any, ...]) -> tuple[str, str]:
    """``(kind, outcome)`` of a recorded own-run call: ``ok``, ``None`` (a refused claim) or
    the error's name."""
    kind, last = call[0], call[-1]
    if kind == "takeover":
        return kind, "ok"
    if isinstance(last, str):
        return kind, last
    return kind, "None" if last is None else "ok"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_grouped_matches_ungrouped(kind: str, tmp_path: pathlib.Path) -> None:
    """The same seeded calls on disjoint units, with group_commit on and off: the same result
    per call and the same rows; only grouping shows in the stats."""
    outs = {}
    for grouped in (False, True):
        place = tmp_path / str(grouped)
        place.mkdir()
        with fresh_target(kind, place) as target:
            outs[grouped] = _deterministic_run(target, FakeClock(), grouped)
    (plain, plain_rows, plain_stats), (grouped_results, grouped_rows, grouped_stats) = (
        outs[False],
        outs[True],
    )
    assert grouped_results == plain
    # The run calls met every outcome: taken and refused claims, moves made and refused (a
    # stale claim, a move to the status the run has), steps completed and refused.
    seen = {_own_outcome(call) for calls in plain.values() for call in calls}
    for want in [
        ("takeover", "ok"),
        ("claim", "None"),
        ("move", "ok"),
        ("move", "LeaseLost"),
        ("move", "InvalidArgument"),
        ("step", "ok"),
        ("step", "InvalidArgument"),
        ("step", "LeaseLost"),
        ("step", "RunNotActive"),
    ]:
        assert want in seen, (want, seen)
    for table in plain_rows:
        assert grouped_rows[table] == plain_rows[table], table
    assert plain_stats["max_group"] == 1
    assert grouped_stats["max_group"] > 1, grouped_stats


def test_ungrouped_runs_one_call_per_transaction(target: str, clock: FakeClock) -> None:
    _, _, stats = _deterministic_run(target, clock, group_commit=False)
    assert stats["max_group"] == 1
    assert stats["groups"] == stats["calls"] >= THREADS * 40


# ------------------------------------------------------------------ fencing under coalescing


def test_close_while_threads_submit(target: str, clock: FakeClock) -> None:
    ledger = _open(target, clock)
    run_id = _run(ledger, "closing")
    done: dict[int, list[tuple[str, int, str, bool | None]]] = {}
    refused: list[str] = []

    def body(i: int, barrier: threading.Barrier) -> None:
        mine: list[tuple[str, int, str, bool | None]] = []
        done[i] = mine
        barrier.wait()
        for k in range(10_000):
            try:
                res = ledger.reserve_attempt(run_id, f"c{i}-{k}", step_id="build")
                mine.append((res.unit_id, res.attempt, res.dispatch_id, None))
                won = ledger.finish_attempt(
                    run_id, res.unit_id, res.attempt, res.dispatch_id, status="completed"
                )
                mine[-1] = (res.unit_id, res.attempt, res.dispatch_id, won)
            except fp.StoreError as e:
                refused.append(str(e))
                return

    closer = threading.Thread(target=lambda: (time.sleep(0.3), ledger.close()), daemon=True)
    closer.start()
    _threads(THREADS, body)
    closer.join(JOIN_S)
    assert not closer.is_alive(), "close() hung"
    assert len(refused) == THREADS  # every thread ended on the closed ledger's StoreError
    assert sum(len(m) for m in done.values()) > 0

    with raw_db(target) as db:
        rows = {
            d: status
            for d, status in db.execute("SELECT dispatch_id, status FROM attempts").fetchall()
        }
    returned = {d for mine in done.values() for _, _, d, _ in mine}
    assert set(rows) == returned  # nothing committed that its caller was not told of
    for mine in done.values():
        for _unit, _attempt, dispatch_id, won in mine:
            assert dispatch_id in rows  # a reservation that returned was committed
            if won:
                assert rows[dispatch_id] == "completed"
    check_invariants(target)

"""Scheduling queued runs: ``reserve_run``/``prepare_or_adopt`` take ``not_before``,
``priority`` and ``concurrency_key``; ``claim_next`` hands out priority first (higher first),
then due time (``not_before``, else the time the run was queued), then run id, and passes over
runs that are not due yet. Every test runs on each backend; that the claim reads only the due
runs' index (and moves runs that came due by their own index) is checked by the Rust plan
tests."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, queued, raw_db
from tests.processes import kill_mid_flight, outcome, run_all
from tests.test_store_migrate import UNDO_0008, UNDO_0008_SQLITE

UTC = dt.UTC


def _at(clock: FakeClock, ms: int = 0) -> dt.datetime:
    """The fake clock's now (plus ``ms``) as an aware datetime."""
    return dt.datetime.fromtimestamp((clock.now + ms) / 1000, UTC)


def _claim_ids(ledger: fp.Ledger, limit: int = 100) -> list[str]:
    return [c.run_id for c in ledger.claim_next("ctl", lease_ms=60_000, limit=limit)]


def test_priority_then_due_time_then_run_id(ledger: fp.Ledger, clock: FakeClock) -> None:
    ledger.reserve_run("low", **queued("low", priority=-5))
    clock.advance(1)
    ledger.reserve_run("plain-b", **queued("plain-b"))
    ledger.reserve_run("plain-a", **queued("plain-a"))  # same millisecond: run id decides
    clock.advance(1)
    # Due in the past: it orders by its not_before, before runs queued earlier than it.
    ledger.reserve_run("backdated", **queued("backdated", not_before=_at(clock, -60_000)))
    ledger.reserve_run("urgent", **queued("urgent", priority=1000))
    ledger.reserve_run("high", **queued("high", priority=7))
    assert _claim_ids(ledger, limit=2) == ["urgent", "high"]
    assert _claim_ids(ledger) == ["backdated", "plain-a", "plain-b", "low"]
    assert _claim_ids(ledger) == []


def test_a_run_not_yet_due_is_claimed_the_first_call_after_its_time(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    ledger.reserve_run("later", **queued("later", not_before=dt.timedelta(seconds=10)))
    ledger.reserve_run("at", **queued("at", not_before=_at(clock, 20_000), priority=5))
    ledger.reserve_run("now", **queued("now", priority=-1))
    # Not-yet-due runs of any priority are passed over; the due one behind them is not.
    assert _claim_ids(ledger) == ["now"]
    clock.advance(9_999)
    assert _claim_ids(ledger) == []
    clock.advance(1)
    assert _claim_ids(ledger) == ["later"]
    clock.advance(10_000)
    [claim] = ledger.claim_next("ctl", lease_ms=60_000, limit=5)
    assert (claim.run_id, claim.generation, claim.owner_id) == ("at", 1, "ctl")
    run = ledger.get_run("at")
    assert run is not None
    assert run.status == "starting"


def test_a_due_run_keeps_its_place_by_due_time(ledger: fp.Ledger, clock: FakeClock) -> None:
    """A run that waited for its time goes ahead of runs queued after that time, and behind
    runs queued before it (due time orders, not the moment a claim noticed it)."""
    ledger.reserve_run("waited", **queued("waited", not_before=dt.timedelta(seconds=5)))
    clock.advance(4_000)
    ledger.reserve_run("before", **queued("before"))
    clock.advance(2_000)
    ledger.reserve_run("after", **queued("after"))
    assert _claim_ids(ledger) == ["before", "waited", "after"]


def test_the_run_says_how_it_was_scheduled(ledger: fp.Ledger, clock: FakeClock) -> None:
    ledger.reserve_run(
        "r",
        **queued("r", not_before=dt.timedelta(minutes=5), priority=-1000, concurrency_key="t-1"),
    )
    run = ledger.get_run("r")
    assert run is not None
    assert run.not_before == _at(clock, 300_000)
    assert (run.priority, run.concurrency_key) == (-1000, "t-1")
    [queued_event] = [e for e in ledger.events("r") if e.type == "run.queued"]
    assert queued_event.payload["not_before"] == clock.now + 300_000
    assert queued_event.payload["priority"] == -1000
    assert queued_event.payload["concurrency_key"] == "t-1"
    ledger.reserve_run("plain", **queued("plain"))
    plain = ledger.get_run("plain")
    assert plain is not None
    assert (plain.not_before, plain.priority, plain.concurrency_key) == (None, 0, None)
    [plain_event] = [e for e in ledger.events("plain") if e.type == "run.queued"]
    assert set(plain_event.payload) == {"definition_digest", "status"}


def test_prepare_or_adopt_schedules_a_new_run_and_claims_it_at_once(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    kw = queued("p", not_before=dt.timedelta(hours=1), priority=3, concurrency_key="k")
    prep = ledger.prepare_or_adopt("p", **kw, lease_ms=10_000)
    assert prep.state == "claimed"
    assert prep.run.priority == 3
    assert prep.run.not_before == _at(clock, 3_600_000)
    assert prep.claim.generation == 1
    # How a run is scheduled is not what it is: adopting with other keywords is no conflict,
    # and the stored ones stand.
    again = ledger.prepare_or_adopt(
        "p", **{**kw, "priority": -3, "not_before": None}, lease_ms=10_000
    )
    assert again.state == "adopted"
    assert again.run.priority == 3


NAIVE = dt.datetime(2030, 1, 1, 12, 0)  # naive on purpose: it is refused


@pytest.mark.parametrize(
    ("overrides", "argument"),
    [
        ({"not_before": NAIVE}, "not_before"),
        ({"not_before": dt.timedelta(milliseconds=-1)}, "not_before"),
        ({"not_before": 1_900_000_000_000}, "not_before"),
        ({"not_before": "tomorrow"}, "not_before"),
        ({"priority": 1001}, "priority"),
        ({"priority": -1001}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": 2**70}, "priority"),
        ({"concurrency_key": "k" * 1025}, "concurrency_key"),
        ({"concurrency_key": "a\x00b"}, "concurrency_key"),
        ({"concurrency_key": ""}, "concurrency_key"),
        ({"concurrency_key": 7}, "concurrency_key"),
    ],
)
@pytest.mark.parametrize("call", ["reserve_run", "prepare_or_adopt"])
def test_bad_scheduling_is_refused_naming_the_argument_and_writes_nothing(
    ledger: fp.Ledger, overrides: dict[str, Any], argument: str, call: str
) -> None:
    before = ledger.events()
    extra: dict[str, Any] = {"lease_ms": 10_000} if call == "prepare_or_adopt" else {}
    with pytest.raises(fp.InvalidArgument) as info:
        getattr(ledger, call)("bad", **queued("bad", **overrides), **extra)
    assert info.value.argument == argument
    assert argument in str(info.value)
    assert ledger.get_run("bad") is None
    assert ledger.events() == before


def test_a_key_of_1024_bytes_is_accepted(ledger: fp.Ledger) -> None:
    key = "é" * 512  # 1024 bytes of UTF-8
    ledger.reserve_run("r", **queued("r", concurrency_key=key))
    run = ledger.get_run("r")
    assert run is not None
    assert run.concurrency_key == key


def test_runs_queued_before_the_migration_are_claimed_in_their_order(
    target: str, clock: FakeClock
) -> None:
    """A ledger at schema 7 with queued runs: 0008 puts them in the due lane with their queue
    time as due time, so they are claimed oldest first, as before."""
    with fp.Ledger.open(target, clock=clock) as ledger:
        for run_id in ["old-b", "old-a", "old-c"]:
            ledger.reserve_run(run_id, **queued(run_id))
            clock.advance(1)
    with raw_db(target) as db:
        if hasattr(db, "executescript"):
            db.executescript(UNDO_0008_SQLITE)
        else:
            db.execute(UNDO_0008)
        db.execute("DELETE FROM schema_migrations WHERE version >= 8")
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.pragmas()["schema_version"] == fp.SCHEMA_VERSION
        ledger.reserve_run("new", **queued("new", priority=1))
        assert _claim_ids(ledger) == ["new", "old-b", "old-a", "old-c"]
        old = ledger.get_run("old-a")
        assert old is not None
        assert (old.not_before, old.priority, old.concurrency_key) == (None, 0, None)


# ------------------------------------------------------------------ key limits


def _keyed(ledger: fp.Ledger, clock: FakeClock, key: str | None, ids: list[str], **kw: Any) -> None:
    for run_id in ids:
        ledger.reserve_run(run_id, **queued(run_id, concurrency_key=key, **kw))
        clock.advance(1)


def test_a_key_at_its_limit_is_passed_over_and_a_slot_frees_when_a_lease_ends(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    ledger.set_concurrency_limit("t", 2)
    _keyed(ledger, clock, "t", ["t1", "t2", "t3", "t4", "t5"])
    _keyed(ledger, clock, None, ["free"], priority=-1)
    _keyed(ledger, clock, "other", ["o1"])  # a key without a limit is not limited
    # This call's own claims count: two of "t", then the rest in order.
    got = ledger.claim_next("ctl", lease_ms=10_000, limit=10)
    assert [c.run_id for c in got] == ["t1", "t2", "o1", "free"]
    assert _claim_ids(ledger) == []
    # A released lease frees its slot.
    ledger.release(got[0])
    assert _claim_ids(ledger) == ["t3"]
    # So does an ended run (its lease unexpired): "t2" completes.
    t2 = got[1]
    ledger.set_status("t2", "active", claim=t2)
    ledger.set_status("t2", "completed", claim=t2)
    assert _claim_ids(ledger) == ["t4"]
    # And an expired lease: "t3" and "t4" lapse (claimed with 60 s leases).
    assert _claim_ids(ledger) == []
    clock.advance(60_000)
    assert _claim_ids(ledger, limit=1) == ["t5"]


def test_limit_zero_holds_the_key_and_removing_the_limit_frees_it(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    _keyed(ledger, clock, "k", ["k1", "k2"])
    ledger.set_concurrency_limit("k", 0)  # set after the runs were queued
    _keyed(ledger, clock, "k", ["k3"])
    _keyed(ledger, clock, None, ["free"])
    assert ledger.concurrency_limits() == {"k": 0}
    assert _claim_ids(ledger) == ["free"]
    ledger.set_concurrency_limit("k", 1)
    assert ledger.concurrency_limits() == {"k": 1}
    assert _claim_ids(ledger) == ["k1"]
    ledger.set_concurrency_limit("k", None)
    assert ledger.concurrency_limits() == {}
    assert _claim_ids(ledger) == ["k2", "k3"]


def test_limits_keep_the_claim_order_across_keys(ledger: fp.Ledger, clock: FakeClock) -> None:
    ledger.set_concurrency_limit("a", 5)
    ledger.set_concurrency_limit("b", 5)
    _keyed(ledger, clock, "a", ["a-low"], priority=-1)
    _keyed(ledger, clock, "b", ["b-high"], priority=9)
    _keyed(ledger, clock, None, ["free-mid"], priority=4)
    _keyed(ledger, clock, "a", ["a-mid"], priority=4)
    assert _claim_ids(ledger) == ["b-high", "free-mid", "a-mid", "a-low"]


@pytest.mark.parametrize(
    ("key", "limit", "argument"),
    [
        ("k", -1, "limit"),
        ("k", True, "limit"),
        ("k", "3", "limit"),
        ("", 1, "concurrency_key"),
        ("a\x00b", 1, "concurrency_key"),
        ("k" * 1025, 1, "concurrency_key"),
        (None, 1, "concurrency_key"),
    ],
)
def test_bad_limits_are_refused_and_change_nothing(
    ledger: fp.Ledger, key: Any, limit: Any, argument: str
) -> None:
    ledger.set_concurrency_limit("kept", 3)
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.set_concurrency_limit(key, limit)
    assert info.value.argument == argument
    assert ledger.concurrency_limits() == {"kept": 3}


# ------------------------------------------------------------------ paused workflows


def test_a_paused_workflow_is_passed_over_until_resumed(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    ledger.reserve_run("d1", **queued("d1", workflow_name="deploy"))
    clock.advance(1)
    ledger.reserve_run("b1", **queued("b1", workflow_name="build"))
    clock.advance(1)
    ledger.pause_workflow("deploy")
    ledger.pause_workflow("deploy")  # again: no change
    ledger.pause_workflow("nothing-queued-yet")
    assert ledger.paused_workflows() == ["deploy", "nothing-queued-yet"]
    # Queued while paused, due later while paused, keyed while paused: all held.
    ledger.set_concurrency_limit("k", 5)
    ledger.reserve_run("d2", **queued("d2", workflow_name="deploy", concurrency_key="k"))
    ledger.reserve_run(
        "d3", **queued("d3", workflow_name="deploy", not_before=dt.timedelta(seconds=1))
    )
    clock.advance(5_000)
    assert _claim_ids(ledger) == ["b1"]
    ledger.resume_workflow("deploy")
    ledger.resume_workflow("never-paused")
    assert ledger.paused_workflows() == ["nothing-queued-yet"]
    assert _claim_ids(ledger) == ["d1", "d2", "d3"]


@pytest.mark.parametrize("name", ["", "a\x00b", None, "x" * 1025])
def test_bad_workflow_names_are_refused(ledger: fp.Ledger, name: Any) -> None:
    for call in (ledger.pause_workflow, ledger.resume_workflow):
        with pytest.raises(fp.InvalidArgument) as info:
            call(name)
        assert info.value.argument == "workflow_name"
    assert ledger.paused_workflows() == []


# ------------------------------------------------------------------ limits under races

RACE_RUNS = 500
RACE_KEYS = {"one": 1, "three": 3}


def _claimer(i: int, barrier: Any, queue: Any, target: str) -> None:
    """Claim, hold the run a moment, finish it; until nothing is queued (a claimer may find
    nothing while the keys it could take are at their limits: it waits for them)."""
    done: list[str] = []
    errors: list[str] = []
    with fp.Ledger.open(target) as ledger:
        barrier.wait()
        while True:
            kind, claims = outcome(
                lambda: ledger.claim_next(f"ctl-{i}", lease_ms=60_000, limit=1 + i % 3)
            )
            if kind != "ok":
                errors.append(f"{kind}: {claims}")
                if len(errors) > 20:
                    break
                continue
            if not claims:
                if not ledger.list_runs(status="queued", limit=1):
                    break
                time.sleep(0.005)
                continue
            time.sleep(0.002)
            for c in claims:
                ledger.set_status(c.run_id, "active", claim=c)
                ledger.set_status(c.run_id, "completed", claim=c)
                done.append(c.run_id)
    queue.put((i, (done, errors)))


def _live_by_key(target: str) -> dict[str, int]:
    with raw_db(target) as db:
        rows = db.execute(
            "SELECT r.concurrency_key, count(*) FROM runs r "
            "JOIN leases l ON l.resource_id = r.run_id "
            "WHERE r.concurrency_key IS NOT NULL "
            "AND r.status IN ('starting', 'active', 'blocked', 'parked') "
            f"AND l.expires_at > {int(time.time() * 1000)} GROUP BY r.concurrency_key"
        ).fetchall()
    return {k: n for k, n in rows}


def test_eight_processes_never_exceed_a_key_limit(target: str) -> None:
    rng = random.Random(8)
    keys = [*RACE_KEYS, "free"]
    with fp.Ledger.open(target) as ledger:
        for key, limit in RACE_KEYS.items():
            ledger.set_concurrency_limit(key, limit)
        for n in range(RACE_RUNS):
            key = rng.choice(keys)
            ledger.reserve_run(
                f"r{n:03d}",
                **queued(f"r{n:03d}", concurrency_key=None if key == "free" else key),
            )
    samples: list[dict[str, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(_live_by_key(target))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        results = run_all(_claimer, [(target,) for _ in range(8)])
    finally:
        stop.set()
        sampler.join()
    finished = [run_id for done, errors in results for run_id in done]
    assert [errors for _, errors in results] == [[]] * 8
    assert sorted(finished) == [f"r{n:03d}" for n in range(RACE_RUNS)]
    assert sum(1 for done, _ in results if done) > 1  # the work was shared
    assert len(samples) > 5
    for seen in samples:
        for key, limit in RACE_KEYS.items():
            assert seen.get(key, 0) <= limit, (key, seen)
    # From the events, in commit order of what each claim depended on: a claim's event is
    # numbered after the ends it counted (those committed before its key's count).
    with fp.Ledger.open(target) as ledger:
        key_of = {r.run_id: r.concurrency_key for r in ledger.list_runs(limit=1000)}
        live: dict[str, int] = {}
        most: dict[str, int] = {}
        for e in ledger.events(limit=10_000):
            key = key_of.get(e.resource_id)
            if key not in RACE_KEYS:
                continue
            if e.type == "lease.claimed":
                live[key] = live.get(key, 0) + 1
                most[key] = max(most.get(key, 0), live[key])
            elif e.type == "run.status" and e.payload.get("to") == "completed":
                live[key] -= 1
    assert most == RACE_KEYS, most


def test_an_archive_carries_how_a_run_was_scheduled(
    target: str, clock: FakeClock, tmp_path: Any
) -> None:
    """Limits and paused workflows are the ledger's settings, not part of any run tree: they
    stay where they are through prune and restore."""
    with fp.Ledger.open(target, clock=clock) as ledger:
        ledger.set_concurrency_limit("t", 2)
        ledger.pause_workflow("deploy")
        ledger.reserve_run(
            "r", **queued("r", not_before=dt.timedelta(minutes=1), priority=9, concurrency_key="t")
        )
        before = ledger.get_run("r")
        assert ledger.abandon_run("r")
        clock.advance(31 * 86_400_000)
        pruned = ledger.prune(older_than=dt.timedelta(days=30), archive=tmp_path / "a.jsonl")
        assert pruned.runs == 1
        assert ledger.get_run("r") is None
        assert ledger.restore(tmp_path / "a.jsonl") == 1
        after = ledger.get_run("r")
        assert after is not None
        assert before is not None
        assert (after.not_before, after.priority, after.concurrency_key) == (
            before.not_before, 9, "t",
        )  # fmt: skip
        assert ledger.concurrency_limits() == {"t": 2}
        assert ledger.paused_workflows() == ["deploy"]


# ------------------------------------------------------------------ rescue


def test_rescue_takes_over_a_run_whose_owner_lease_expired(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    ledger.reserve_run("r", **queued("r"))
    [old] = ledger.claim_next("w1", lease_ms=1_000)
    ledger.set_status("r", "active", claim=old)
    assert _claim_ids(ledger) == []  # the lease is live
    clock.advance(1_000)  # expires_at <= now: expired
    assert ledger.claim_next("w2", lease_ms=1_000, rescue=False) == []
    [new] = ledger.claim_next("w2", lease_ms=5_000)
    assert (new.run_id, new.generation, new.owner_id, new.taken_from) == ("r", 2, "w2", "w1")
    run = ledger.get_run("r")
    assert run is not None
    assert run.status == "active"  # a takeover keeps the run's status
    assert ledger.lease("r").takeovers == 1
    with pytest.raises(fp.LeaseLost):
        ledger.set_status("r", "completed", claim=old)
    assert ledger.set_status("r", "completed", claim=new).status == "completed"
    # The same runner rescuing its own expired lease: a new generation, no takeover.
    ledger.reserve_run("s", **queued("s"))
    [mine] = ledger.claim_next("w3", lease_ms=1_000)
    clock.advance(1_000)
    [again] = ledger.claim_next("w3", lease_ms=1_000)
    assert (again.run_id, again.generation, again.taken_from) == ("s", 2, None)
    assert ledger.lease("s").takeovers == 0
    assert mine.token != again.token


def test_released_and_ended_runs_are_not_rescued(ledger: fp.Ledger, clock: FakeClock) -> None:
    for run_id in ["released", "ended", "cancelled"]:
        ledger.reserve_run(run_id, **queued(run_id))
    claims = {c.run_id: c for c in ledger.claim_next("w1", lease_ms=1_000, limit=3)}
    ledger.release(claims["released"])
    ledger.set_status("ended", "active", claim=claims["ended"])
    ledger.set_status("ended", "completed", claim=claims["ended"])
    assert ledger.abandon_run("cancelled")
    clock.advance(10_000)
    assert _claim_ids(ledger) == []


def test_rescue_keeps_the_order_and_obeys_pauses_and_limits(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    ledger.set_concurrency_limit("k", 1)
    ledger.reserve_run("keyed", **queued("keyed", concurrency_key="k"))
    ledger.reserve_run("paused", **queued("paused", workflow_name="build"))
    ledger.reserve_run("high", **queued("high", priority=5))
    got = ledger.claim_next("w1", lease_ms=1_000, limit=3)
    assert [c.run_id for c in got] == ["high", "keyed", "paused"]
    clock.advance(500)
    ledger.reserve_run("queued-k", **queued("queued-k", concurrency_key="k"))
    ledger.reserve_run("queued-low", **queued("queued-low", priority=-1))
    clock.advance(500)  # all three leases expire now
    ledger.pause_workflow("build")
    # "high" by priority; "queued-k" (queued before "keyed" expired: due earlier) takes the
    # key's one slot, so "keyed" waits; "paused" is held; "queued-low" last.
    assert _claim_ids(ledger) == ["high", "queued-k", "queued-low"]
    ledger.resume_workflow("build")
    [paused] = ledger.claim_next("w2", lease_ms=1_000, limit=5)
    assert (paused.run_id, paused.taken_from) == ("paused", "w1")


def _hold_a_run(target: str, path: str, ready: Any) -> None:
    """Claim the run, hand the claim's token to the test, then hang until killed."""
    with fp.Ledger.open(target) as ledger:
        [claim] = ledger.claim_next("doomed", lease_ms=1_500)
        ledger.set_status(claim.run_id, "active", claim=claim)
        with open(path, "w") as f:
            f.write(claim.token)
        ready.set()
        time.sleep(60)


def test_a_killed_owner_s_run_is_rescued_once_its_lease_expires(target: str, tmp_path: Any) -> None:
    with fp.Ledger.open(target) as ledger:
        ledger.reserve_run("job", **queued("job"))
    token_file = str(tmp_path / "token")
    kill_mid_flight(_hold_a_run, (target, token_file), pause_s=0.05)
    with open(token_file) as f:
        old_token = f.read()
    with fp.Ledger.open(target) as ledger:
        assert ledger.claim_next("rescuer", lease_ms=10_000) == []  # still live
        deadline = time.monotonic() + 10
        got: list[fp.Claim] = []
        while not got and time.monotonic() < deadline:
            time.sleep(0.1)
            got = ledger.claim_next("rescuer", lease_ms=10_000)
        [claim] = got
        assert (claim.run_id, claim.generation, claim.taken_from) == ("job", 2, "doomed")
        old = fp.Claim(
            run_id="job", generation=1, token=old_token, owner_id="doomed",
            expires_at=claim.expires_at,
        )  # fmt: skip
        with pytest.raises(fp.LeaseLost):
            ledger.set_status("job", "completed", claim=old)
        assert ledger.set_status("job", "completed", claim=claim).status == "completed"
        types = [e.type for e in ledger.events("job")]
        assert types.count("lease.claimed") == 2


def _page_all(ledger: fp.Ledger, lane: Any, size: int) -> list[str]:
    """Every run of ``lane``, read ``size`` at a time."""
    seen: list[str] = []
    after = None
    while True:
        page = ledger.queued_runs(lane=lane, limit=size, after=after)
        seen += [r.run_id for r in page]
        if len(page) < size:
            return seen
        after = page[-1]


def test_the_queue_is_read_in_claim_order_page_by_page(ledger: fp.Ledger, clock: FakeClock) -> None:
    rng = random.Random(7)
    due = []
    urgent = 0
    for i in range(40):
        # Priorities with ties, due times with ties: every level of the order decides somewhere.
        priority = rng.choice([-3, 0, 0, 2, 1000])
        back = rng.choice([0, 0, 1_000, 5_000])
        ledger.reserve_run(
            f"r{i:02}", **queued(f"r{i:02}", priority=priority, not_before=_at(clock, -back))
        )
        due.append(f"r{i:02}")
        urgent += priority == 1000
        if i % 3 == 0:
            clock.advance(1)
    later = [f"l{i}" for i in range(5)]
    for i, run_id in enumerate(later):
        # Queued in reverse order of their due times: the lane orders by due time.
        ledger.reserve_run(run_id, **queued(run_id, not_before=dt.timedelta(seconds=50 - i)))
    ledger.set_concurrency_limit("k", 1)
    ledger.reserve_run("keyed", **queued("keyed", concurrency_key="k", priority=1000))
    ledger.pause_workflow("held")
    ledger.reserve_run("paused", **queued("paused", workflow_name="held", priority=1000))
    in_order = _page_all(ledger, "due", 40)
    # Left out: the keyed run and the paused one; pages of 1, 3 and 7 read the same order.
    assert sorted(in_order) == due
    for size in (1, 3, 7):
        assert _page_all(ledger, "due", size) == in_order
    assert _page_all(ledger, "later", 2) == later[::-1]
    # The order is claim_next's own, which also takes the keyed run (its key has room): the
    # last of priority 1000, being the last due.
    claims = [c.run_id for c in ledger.claim_next("ctl", lease_ms=60_000, limit=41)]
    assert claims == [*in_order[:urgent], "keyed", *in_order[urgent:]]
    assert ledger.queued_runs() == []
    # Runs that come due move to the due lane at the next claim, soonest first.
    clock.advance(50_000)
    assert ledger.queued_runs(lane="later") != []
    assert ledger.claim_next("ctl", lease_ms=60_000, limit=2)[0].run_id == later[4]
    assert [r.run_id for r in ledger.queued_runs()] == later[:3][::-1]
    assert ledger.queued_runs(lane="later") == []


def test_the_queue_overview_counts_lanes_keys_and_pauses(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    empty = ledger.queue_overview()
    assert (empty.due, empty.keyed, empty.later, empty.keys, empty.paused) == (0, 0, 0, [], [])
    ledger.set_concurrency_limit("gpu", 2)
    ledger.set_concurrency_limit("idle", 0)
    for i in range(5):
        ledger.reserve_run(f"g{i}", **queued(f"g{i}", concurrency_key="gpu"))
    ledger.reserve_run("g-later", **queued("g-later", concurrency_key="gpu",
                                           not_before=dt.timedelta(minutes=1)))  # fmt: skip
    for i in range(3):
        ledger.reserve_run(f"d{i}", **queued(f"d{i}"))
    ledger.reserve_run("w", **queued("w", not_before=dt.timedelta(minutes=5)))
    ledger.pause_workflow("nightly")
    clock.advance(10)
    for i in range(4):
        ledger.reserve_run(f"n{i}", **queued(f"n{i}", workflow_name="nightly"))
    # Two gpu runs hold live leases (the limit), one is taken and released: not live.
    claims = ledger.claim_next("ctl", lease_ms=60_000, limit=5)
    assert sorted(c.run_id for c in claims) == ["d0", "d1", "d2", "g0", "g1"]
    o = ledger.queue_overview()
    assert (o.due, o.keyed, o.later, o.count_max) == (0, 3, 2, 10_000)
    assert o.keys == [fp.KeyUsage("gpu", 2, 2, 4), fp.KeyUsage("idle", 0, 0, 0)]
    assert o.paused == [fp.PausedWorkflow("nightly", _at(clock, -10), 4)]
    ledger.release(next(c for c in claims if c.run_id == "g0"))
    clock.advance(60_001)  # g1's lease expires; g-later and w come due at the next claim
    o = ledger.queue_overview(count_max=2, limit=1)
    assert (o.due, o.keyed, o.later) == (0, 2, 2)  # counts stop at count_max
    assert o.keys == [fp.KeyUsage("gpu", 2, 0, 2)]
    assert ledger.queue_overview(after_key="gpu").keys == [fp.KeyUsage("idle", 0, 0, 0)]


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda led: led.queued_runs(lane="soon"), "lane"),
        (lambda led: led.queued_runs(limit=0), "limit"),
        (lambda led: led.queued_runs(limit=10_001), "limit"),
        (lambda led: led.queued_runs(after="r1"), "after"),
        (lambda led: led.queue_overview(count_max=0), "count_max"),
        (lambda led: led.queue_overview(count_max=1_000_001), "count_max"),
        (lambda led: led.queue_overview(limit=0), "limit"),
        (lambda led: led.queue_overview(after_key="a\x00b"), "after_key"),
    ],
)
def test_bad_queue_reads_are_refused_naming_the_argument(
    ledger: fp.Ledger, call: Any, argument: str
) -> None:
    with pytest.raises(fp.InvalidArgument) as e:
        call(ledger)
    assert e.value.argument == argument

"""Cron schedules: ``put_schedule`` keeps what each fire queues, ``tick_schedules`` queues one
run per due slot (``reserve_run`` under the id ``name:slot``, due at the slot), exactly once
however many processes tick. Catch-up after downtime, overlap skip, pause and resume, daylight
saving in Europe/Berlin and America/New_York, and the refusals. Every test runs on each
backend; 8 processes tick through a simulated day against one shared clock."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

import fencepost as fp
from fencepost.aio import AsyncLedger
from tests.conftest import DEFINITION, FakeClock, cli
from tests.processes import SPAWN

UTC = dt.UTC
MINUTE = 60_000
TEMPLATE = {
    "workflow_ref": "report@1",
    "source": {"kind": "builtin", "id": "report"},
    "definition_digest": fp.digest(DEFINITION),
    "definition": DEFINITION,
    "runner_id": "host-a",
    "origin_session_id": "cron",
}


def ms(*args: int) -> int:
    """Epoch ms of a UTC wall time."""
    return int(dt.datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def put(ledger: fp.Ledger, name: str = "nightly", **kw: Any) -> fp.Schedule:
    kw.setdefault("cron", "0 3 * * *")
    kw.setdefault("workflow_name", "report")
    kw.setdefault("template", TEMPLATE)
    return ledger.put_schedule(name, **kw)


def test_a_schedule_fires_its_slot_once(ledger: fp.Ledger, clock: FakeClock) -> None:
    clock.now = ms(2026, 12, 6, 1, 0)
    template = {**TEMPLATE, "input": {"day": "today"}, "priority": 5, "concurrency_key": "rep",
                "retry": {"max_attempts": 3, "initial_ms": 1000}}  # fmt: skip
    s = put(ledger, template=template)
    assert (s.name, s.cron, s.timezone, s.overlap, s.catch_up, s.paused) == (
        "nightly", "0 3 * * *", "UTC", "skip", 0, False
    )  # fmt: skip
    assert s.next_slot == dt.datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
    assert (s.last_slot, s.last_run_id) == (None, None)
    assert s.template["input"] == {"day": "today"}
    assert s.template["launch_options"] == {}
    assert s.template["retry"]["max_attempts"] == 3
    assert ledger.schedules() == [s]
    assert ledger.tick_schedules() == []
    clock.now = ms(2026, 12, 6, 3, 0)
    [run] = ledger.tick_schedules()
    assert run.run_id == "nightly:2026-12-06T03:00Z"
    assert (run.status, run.workflow_name, run.workflow_ref) == ("queued", "report", "report@1")
    assert run.not_before == dt.datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
    assert (run.priority, run.concurrency_key) == (5, "rep")
    assert ledger.get_run(run.run_id) == run
    assert ledger.tick_schedules() == []
    [s] = ledger.schedules()
    assert s.next_slot == dt.datetime(2026, 12, 7, 3, 0, tzinfo=UTC)
    assert (s.last_slot, s.last_run_id) == (run.not_before, run.run_id)
    assert s.last_run_status == "queued"
    # The queued run is an ordinary one: claim_next hands it out.
    [claim] = ledger.claim_next("host-a", lease_ms=10_000)
    assert claim.run_id == run.run_id


def test_catch_up_fires_the_newest_slot_and_at_most_that_many_missed(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    clock.now = ms(2026, 12, 6, 0, 0)
    put(ledger, "none", cron="*/10 * * * *", overlap="allow")
    put(ledger, "three", cron="*/10 * * * *", overlap="allow", catch_up=3)
    clock.now = ms(2026, 12, 6, 1, 5)  # slots 00:10 .. 01:00 missed: 6 of them
    fired = [r.run_id for r in ledger.tick_schedules()]
    assert sorted(fired) == sorted([
        "none:2026-12-06T01:00Z",
        "three:2026-12-06T00:30Z", "three:2026-12-06T00:40Z", "three:2026-12-06T00:50Z",
        "three:2026-12-06T01:00Z",
    ])  # fmt: skip
    # Oldest first within a schedule.
    assert [r for r in fired if r.startswith("three")] == sorted(
        r for r in fired if r.startswith("three")
    )
    next_slots = {s.next_slot for s in ledger.schedules()}
    assert next_slots == {dt.datetime(2026, 12, 6, 1, 10, tzinfo=UTC)}


def test_overlap_skip_uses_a_slot_up_while_the_last_run_is_live(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    clock.now = ms(2026, 12, 6, 0, 0)
    put(ledger, "skip", cron="0 * * * *")
    put(ledger, "allow", cron="0 * * * *", overlap="allow")
    clock.now = ms(2026, 12, 6, 1, 0)
    assert {r.run_id for r in ledger.tick_schedules()} == {
        "skip:2026-12-06T01:00Z", "allow:2026-12-06T01:00Z"
    }  # fmt: skip
    clock.now = ms(2026, 12, 6, 2, 0)
    # skip's first run is still queued: its 02:00 slot goes by without a run.
    assert [r.run_id for r in ledger.tick_schedules()] == ["allow:2026-12-06T02:00Z"]
    skip = next(s for s in ledger.schedules() if s.name == "skip")
    assert skip.last_slot == dt.datetime(2026, 12, 6, 2, 0, tzinfo=UTC)
    assert skip.last_run_id == "skip:2026-12-06T01:00Z"
    assert ledger.abandon_run("skip:2026-12-06T01:00Z")
    clock.now = ms(2026, 12, 6, 3, 0)
    assert {r.run_id for r in ledger.tick_schedules()} == {
        "skip:2026-12-06T03:00Z", "allow:2026-12-06T03:00Z"
    }  # fmt: skip
    # With catch-up, the first fire of a tick is live for the rest of that tick.
    put(ledger, "burst", cron="*/5 * * * *", catch_up=5)
    clock.now = ms(2026, 12, 6, 3, 30)
    fired = [r.run_id for r in ledger.tick_schedules() if r.run_id.startswith("burst")]
    assert fired == ["burst:2026-12-06T03:05Z"]


def test_pause_resume_replace_and_delete(ledger: fp.Ledger, clock: FakeClock) -> None:
    clock.now = ms(2026, 12, 6, 0, 0)
    put(ledger, "h", cron="0 * * * *", catch_up=1, overlap="allow")
    ledger.pause_schedule("h")
    assert ledger.schedules()[0].paused
    clock.now = ms(2026, 12, 6, 5, 30)
    assert ledger.tick_schedules() == []
    ledger.resume_schedule("h")
    # Five slots missed while paused: the newest and one more.
    assert [r.run_id for r in ledger.tick_schedules()] == [
        "h:2026-12-06T04:00Z", "h:2026-12-06T05:00Z"
    ]  # fmt: skip
    # Replacing keeps it paused and its last fire, and counts slots from now.
    ledger.pause_schedule("h")
    s = put(ledger, "h", cron="15 * * * *", overlap="allow")
    assert (s.paused, s.cron, s.catch_up) == (True, "15 * * * *", 0)
    assert s.last_run_id == "h:2026-12-06T05:00Z"
    assert s.next_slot == dt.datetime(2026, 12, 6, 6, 15, tzinfo=UTC)
    ledger.delete_schedule("h")
    assert ledger.schedules() == []
    assert ledger.get_run("h:2026-12-06T05:00Z") is not None
    for call in (ledger.pause_schedule, ledger.resume_schedule, ledger.delete_schedule):
        with pytest.raises(fp.NotFound) as missing:
            call("h")
        assert missing.value.kind == "schedule"


def fires_through(
    ledger: fp.Ledger, clock: FakeClock, start: int, hours: int, step_min: int = 5
) -> list[tuple[str, dt.datetime | None]]:
    """Tick every ``step_min`` minutes for ``hours`` from ``start``; the runs queued."""
    out = []
    for t in range(start, start + hours * 3_600_000 + 1, step_min * MINUTE):
        clock.now = t
        out += [(r.run_id, r.not_before) for r in ledger.tick_schedules()]
    return out


@pytest.mark.parametrize(
    ("zone", "cron", "day", "expected"),
    [
        # New York springs forward at 02:00 EST on 2026-03-08: 02:30 is shifted by the gap to
        # 03:30 EDT (07:30Z), once.
        ("America/New_York", "30 2 * * *", (2026, 3, 7, 12), [(2026, 3, 8, 7, 30)]),
        # It falls back at 02:00 EDT on 2026-11-01: 01:30 happens twice and fires at the first
        # (EDT, 05:30Z), not at 06:30Z.
        ("America/New_York", "30 1 * * *", (2026, 10, 31, 12), [(2026, 11, 1, 5, 30)]),
        # Hourly across that fall-back: 01:00 EDT, then 02:00 EST two hours later.
        (
            "America/New_York",
            "0 0-3 * * *",
            (2026, 10, 31, 12),
            [(2026, 11, 1, 4, 0), (2026, 11, 1, 5, 0), (2026, 11, 1, 7, 0), (2026, 11, 1, 8, 0)],
        ),
        # Berlin springs forward at 02:00 CET on 2026-03-29: 02:30 becomes 03:30 CEST (01:30Z);
        # 03:30 itself is the same instant, one slot.
        ("Europe/Berlin", "30 2,3 * * *", (2026, 3, 28, 12), [(2026, 3, 29, 1, 30)]),
        # It falls back at 03:00 CEST on 2026-10-25: 02:30 fires once, at CEST (00:30Z).
        ("Europe/Berlin", "30 2 * * *", (2026, 10, 24, 12), [(2026, 10, 25, 0, 30)]),
    ],
)
def test_daylight_saving_gaps_and_repeats(
    target: str, clock: FakeClock, zone: str, cron: str, day: tuple[int, ...],
    expected: list[tuple[int, ...]],
) -> None:  # fmt: skip
    start = ms(*day)
    clock.now = start
    with fp.Ledger.open(target, clock=clock) as ledger:
        put(ledger, "dst", cron=cron, timezone=zone, overlap="allow")
        fired = fires_through(ledger, clock, start, 24)
    want = [dt.datetime(*e, tzinfo=UTC) for e in expected]  # type: ignore[misc]
    assert [at for _, at in fired] == want
    assert [rid for rid, _ in fired] == [f"dst:{w:%Y-%m-%dT%H:%MZ}" for w in want]


@pytest.mark.parametrize(
    ("kw", "argument"),
    [
        ({"cron": "0 3 * *"}, "cron"),
        ({"cron": "0 3 * * * *"}, "cron"),
        ({"cron": "61 3 * * *"}, "cron"),
        ({"cron": "0 3 * FOO *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": ""}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"timezone": ""}, "timezone"),
        ({"overlap": "never"}, "overlap"),
        ({"catch_up": -1}, "catch_up"),
        ({"catch_up": 1001}, "catch_up"),
        ({"name": "bad name"}, "name"),
        ({"name": "x" * 111}, "name"),
        ({"template": {**TEMPLATE, "run_id": "r"}}, "template"),
        ({"template": {**TEMPLATE, "not_before": dt.timedelta(0)}}, "template"),
        ({"template": {**TEMPLATE, "parent_run_id": "p"}}, "template"),
        ({"template": {**TEMPLATE, "bogus": 1}}, "template"),
        ({"template": {k: v for k, v in TEMPLATE.items() if k != "runner_id"}}, "template"),
        ({"template": {**TEMPLATE, "priority": 5000}}, "template"),
        ({"template": {**TEMPLATE, "definition_digest": "sha256:00"}}, "template"),
        ({"template": {**TEMPLATE, "retry": {"max_attempts": 0, "initial_ms": 1}}}, "template"),
        ({"template": [1]}, "template"),
        ({"workflow_name": ""}, "workflow_name"),
    ],
)
def test_bad_schedules_name_the_argument_and_write_nothing(
    ledger: fp.Ledger, kw: dict[str, Any], argument: str
) -> None:
    kw = dict(kw)
    name = kw.pop("name", "s")
    with pytest.raises(fp.InvalidArgument) as refused:
        put(ledger, name, **kw)
    assert refused.value.argument == argument, refused.value
    assert ledger.schedules() == []


def _ticker(i: int, barrier: Any, queue: Any, target: str, now: Any, rounds: int) -> None:
    fired: list[str] = []
    with fp.Ledger.open(target, clock=lambda: now.value) as ledger:
        for _ in range(rounds):
            barrier.wait()
            fired += [r.run_id for r in ledger.tick_schedules()]
            barrier.wait()
    queue.put((i, fired))


def test_eight_tickers_fire_every_slot_of_a_day_exactly_once(target: str) -> None:
    start = ms(2026, 12, 6, 0, 0)
    clock = FakeClock(start)
    with fp.Ledger.open(target, clock=clock) as ledger:
        put(ledger, "five", cron="*/5 * * * *", overlap="allow")
        put(ledger, "hourly", cron="0 * * * *", overlap="allow")
        put(ledger, "once", cron="7 13 * * *", overlap="allow")
    rounds = 24 * 60
    now = SPAWN.Value("q", start)
    barrier = SPAWN.Barrier(9)
    queue = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_ticker, args=(i, barrier, queue, target, now, rounds))
        for i in range(8)
    ]
    for p in procs:
        p.start()
    for minute in range(1, rounds + 1):
        now.value = start + minute * MINUTE
        barrier.wait(timeout=60)  # the round starts
        barrier.wait(timeout=60)  # every ticker has ticked
    results = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    fired = [rid for i in range(8) for rid in results[i]]
    assert len(fired) == len(set(fired)), "a slot fired twice"
    end = start + rounds * MINUTE

    def slots(name: str, step: int, offset: int = 0) -> set[str]:
        return {fp_id(name, t) for t in range(start + offset, end + 1, step) if t > start}

    want = (
        slots("five", 5 * MINUTE) | slots("hourly", 60 * MINUTE)
        | {fp_id("once", ms(2026, 12, 6, 13, 7))}
    )  # fmt: skip
    assert set(fired) == want
    assert len(fired) == 288 + 24 + 1
    # More than one ticker did the firing: the race was real.
    assert sum(1 for i in range(8) if results[i]) > 1
    with fp.Ledger.open(target, clock=lambda: end) as ledger:
        stored = {r.run_id for r in ledger.list_runs(limit=1000)}
        assert stored == want


def fp_id(name: str, at_ms: int) -> str:
    return f"{name}:{dt.datetime.fromtimestamp(at_ms / 1000, UTC):%Y-%m-%dT%H:%MZ}"


def test_async_ledger(target: str, clock: FakeClock) -> None:
    async def main() -> None:
        clock.now = ms(2026, 12, 6, 0, 0)
        async with await AsyncLedger.open(target, clock=clock) as ledger:
            await ledger.put_schedule("a", cron="0 * * * *", workflow_name="w", template=TEMPLATE)
            clock.now = ms(2026, 12, 6, 1, 0)
            [run] = await ledger.tick_schedules()
            assert run.run_id == "a:2026-12-06T01:00Z"
            await ledger.pause_schedule("a")
            await ledger.resume_schedule("a")
            assert [s.name for s in await ledger.schedules()] == ["a"]
            await ledger.delete_schedule("a")
            assert await ledger.schedules() == []

    asyncio.run(main())


def test_cli_lists_pauses_and_ticks(tmp_path: Any, clock: FakeClock) -> None:
    db = str(tmp_path / "l.db")
    with fp.Ledger.open(db, clock=clock) as ledger:
        put(ledger, "yearly", cron="0 0 1 1 *")
    listed = json.loads(cli("schedules", "--db", db, "--json").stdout)
    assert [s["name"] for s in listed] == ["yearly"]
    assert "yearly" in cli("schedules", "--db", db).stdout
    paused = json.loads(cli("schedules", "--pause", "yearly", "--db", db, "--json").stdout)
    assert paused[0]["paused"] is True
    assert cli("tick", "--db", db).stdout == ""
    cli("schedules", "--resume", "yearly", "--db", db)
    # The CLI reads the real clock: the newest New Year since the fake clock's now is due.
    out = cli("tick", "--db", db).stdout
    assert re.fullmatch(r"queued yearly:\d{4}-01-01T00:00Z \(report, due \S+\)\n", out), out
    assert cli("tick", "--db", db).stdout == ""
    missing = cli("schedules", "--pause", "nope", "--db", db)
    assert missing.returncode == 1
    assert "schedule" in missing.stderr


def test_cli_tick_every_loops_until_sigterm(tmp_path: Any, clock: FakeClock) -> None:
    db = str(tmp_path / "l.db")
    with fp.Ledger.open(db, clock=clock) as ledger:
        put(ledger, "yearly", cron="0 0 1 1 *")
        put(ledger, "midyear", cron="0 12 1 7 *")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost", "tick", "--every", "1s", "--db", db, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert {line["run_id"].split(":")[0] for line in lines} == {"yearly", "midyear"}
        time.sleep(1.5)  # a second round finds nothing new due
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == ""
    with fp.Ledger.open(db) as ledger:
        assert len(ledger.list_runs(limit=100)) == 2

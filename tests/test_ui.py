"""``fencepost ui``: the dashboard's JSON API, event stream and static files over real HTTP,
on SQLite and PostgreSQL (the ``target`` fixture), with the server in a thread on a free port.

Covered: each call's content (runs with filters and paging, a run with its units, attempts,
totals and the fence's counts, leases by state, the event tail and its stream with resume,
throughput, doctor); hostile data (ids, refs, scope keys, JSON holding markup, quotes and
unicode) coming back inert and exact; the token; read-only (405, nothing written); errors as
JSON without a driver's words; and the command line (the URL printed, Ctrl-C, refusing a
non-loopback host without a token).
"""

from __future__ import annotations

import datetime as dt
import errno
import http.client
import importlib.resources
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost as fp
from fencepost import _core
from fencepost.ui import api, server
from tests.conftest import STEPS, FakeClock, cli, counts, queued, started
from tests.test_cron_schedules import TEMPLATE
from tests.uiserve import get_json, request, served

HOSTILE = "<script>alert(1)</script>\"'&\u2028\u202e é🙂 </textarea><img src=x onerror=alert(2)>"


def assert_inert(body: bytes) -> None:
    """A JSON body that no HTML or script context can misread: no markup characters, ASCII
    only (everything else escaped)."""
    for ch in (b"<", b">", b"&"):
        assert ch not in body
    body.decode("ascii")


@pytest.fixture
def filled(target: str, clock: FakeClock) -> Iterator[fp.Ledger]:
    """``target`` opened for writing by the test (the server opens its own connections)."""
    with fp.Ledger.open(target, clock=clock) as ledger:
        yield ledger


# ------------------------------------------------------------------ runs


def test_runs_filters_and_paging(filled: fp.Ledger, target: str, clock: FakeClock) -> None:
    for i in range(7):
        clock.advance(1000)
        filled.start_run(
            f"wf/{'ab'[i % 2]}", scope_key=f"scope-{i % 3}", steps=STEPS, run_id=f"run-{i}",
            force=True,
        )  # fmt: skip
    filled.abandon_run("run-0")
    filled.abandon_run("run-3")
    parent = filled.get_run("run-6")
    assert parent is not None
    filled.publish_child_run(
        "run-6", parent_unit_id="u", invocation_key="k", workflow_ref="wf/child", steps=STEPS,
        run_id="child-1",
    )  # fmt: skip
    with served(target, clock=clock) as srv:
        page = get_json(srv, "/api/runs")
        assert [r["run_id"] for r in page["runs"]] == [r.run_id for r in filled.list_runs()]
        assert len(page["runs"]) == 7
        assert page["next"] is None
        assert page["runs"][0]["run_id"] == "run-6"  # its child's publication updated it
        assert page["runs"][0]["updated_at"].endswith("Z")

        cancelled = get_json(srv, "/api/runs", status="cancelled")
        assert {r["run_id"] for r in cancelled["runs"]} == {"run-0", "run-3"}
        both = get_json(srv, "/api/runs", status=["cancelled", "active"], workflow="wf/a")
        assert {r["run_id"] for r in both["runs"]} == {"run-0", "run-2", "run-4", "run-6"}
        scoped = get_json(srv, "/api/runs", scope="scope-1")
        assert {r["run_id"] for r in scoped["runs"]} == {"run-1", "run-4"}
        children = get_json(srv, "/api/runs", children="1")
        assert "child-1" in {r["run_id"] for r in children["runs"]}
        assert "child-1" not in {r["run_id"] for r in page["runs"]}

        # Keyset paging: pages of 3 cover the runs once each, in order.
        seen: list[str] = []
        after = None
        while True:
            params: dict[str, Any] = {"limit": 3}
            if after:
                params["after"] = after
            got = get_json(srv, "/api/runs", **params)
            seen += [r["run_id"] for r in got["runs"]]
            after = got["next"]
            if after is None:
                break
        assert seen == [r["run_id"] for r in page["runs"]]

        assert request(srv, "/api/runs?limit=0").status == 400
        assert request(srv, "/api/runs?limit=201").status == 400
        assert request(srv, "/api/runs?limit=x").status == 400
        bad = request(srv, "/api/runs?status=bogus")
        assert bad.status == 400
        assert "bogus" in bad.json()["error"]
        assert request(srv, "/api/runs?after=no-such-run").status == 400
        assert request(srv, "/api/runs?after=1.x.r").status == 400
        assert request(srv, "/api/runs?after=99999999999999999999.1.r").status == 400

        # A run that changes between pages moves to the top; the next page still follows on
        # from where the first one ended, repeating nothing.
        first = get_json(srv, "/api/runs", limit=4)
        moved = first["runs"][-1]["run_id"]
        assert moved == "run-5"  # active, so it can move
        clock.advance(1000)
        filled.block_run(moved)
        rest = get_json(srv, "/api/runs", limit=200, after=first["next"])
        ids = [r["run_id"] for r in rest["runs"]]
        assert not set(ids) & {r["run_id"] for r in first["runs"]}
        assert ids == [r["run_id"] for r in page["runs"]][4:]
        assert request(srv, "/api/runs?scope=a&scope=b").status == 400


def test_runs_by_name_time_range_totals_and_id_search(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    for i in range(6):
        clock.advance(1000)
        filled.start_run(f"wf/{'ab'[i % 2]}", scope_key=None, steps=STEPS, run_id=f"run-{i}",
                         force=True)  # fmt: skip
    filled.abandon_run("run-2")
    times = {r.run_id: r.updated_at for r in filled.list_runs()}
    name = filled.get_run("run-1").workflow_name  # type: ignore[union-attr]
    with served(target, clock=clock) as srv:
        page = get_json(srv, "/api/runs")
        # Totals: every status, counted up to count_max.
        assert page["count_max"] == api.RUN_COUNT_MAX
        assert list(page["totals"]) == list(_core.RUN_STATUSES)
        assert page["totals"]["active"] == 5
        assert page["totals"]["cancelled"] == 1
        assert sum(page["totals"].values()) == 6
        # By workflow name, and by name and status.
        named = get_json(srv, "/api/runs", name=name)
        assert [r["run_id"] for r in named["runs"]] == ["run-5", "run-3", "run-1"]
        assert get_json(srv, "/api/runs", name=name, status="cancelled")["runs"] == []
        # A time range: updated in [run-1's time, run-4's time).
        since = times["run-1"].isoformat()
        until = times["run-4"].isoformat()
        window = get_json(srv, "/api/runs", updated_after=since, updated_before=until)
        assert [r["run_id"] for r in window["runs"]] == ["run-3", "run-1"]
        assert request(srv, "/api/runs?updated_after=yesterday").status == 400
        naive = request(srv, "/api/runs?updated_after=2026-01-01T00:00:00")
        assert naive.status == 400
        assert "offset" in naive.json()["error"]
        backwards = request(
            srv,
            "/api/runs?"
            + urllib.parse.urlencode({"updated_after": until, "updated_before": since}),
        )
        assert backwards.status == 400
        assert "updated_before" in backwards.json()["error"]
        # Find by id: one match opens it, several are listed, none is empty.
        assert get_json(srv, "/api/find", prefix="run-4") == {"run_id": "run-4", "matches": []}
        several = get_json(srv, "/api/find", prefix="run-")
        assert several["run_id"] is None
        assert several["matches"] == [f"run-{i}" for i in range(6)]
        assert get_json(srv, "/api/find", prefix="nope") == {"run_id": None, "matches": []}
        assert request(srv, "/api/find").status == 400


def test_one_units_page_shows_every_failure_in_full(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    run = filled.start_run("wf", scope_key=None, steps=STEPS, run_id="flaky", force=True)
    long_reason = "x" * 5000
    for i in range(3):
        r = filled.reserve_attempt(run.run_id, "u1", step_id="build")
        filled.finish_attempt(run.run_id, "u1", r.attempt, r.dispatch_id, status="failed",
                              failure_reason=f"try {i}: " + long_reason)  # fmt: skip
    with served(target, clock=clock) as srv:
        unit = get_json(srv, "/api/unit", run="flaky", unit="u1")
        assert unit["status"] == "failed"
        assert unit["attempts"] == 3
        assert [a["attempt"] for a in unit["history"]] == [1, 2, 3]
        # Reasons are not cut short here, unlike a page of units.
        assert unit["history"][0]["failure_reason"] == "try 0: " + long_reason
        assert unit["failure_reason"] == "try 2: " + long_reason
        assert request(srv, "/api/unit?run=flaky&unit=nope").status == 404
        assert request(srv, "/api/unit?run=flaky").status == 400
        # A failed unit among the run's units is read by the status's own index: no window.
        failed = get_json(srv, "/api/units", run="flaky", status="failed")
        assert [u["unit_id"] for u in failed["units"]] == ["u1"]
        assert failed["scanned"] is None


# ------------------------------------------------------------------ one run and the fence


def _takeover(ledger: fp.Ledger, clock: FakeClock) -> tuple[fp.Claim, fp.Claim]:
    """run-1 claimed by host-a, which reserves two units and dies; host-b takes the lease
    over after it expires and reclaims one unit in place; host-a's stale writes are refused
    (three of them)."""
    dead = started(ledger, "run-1", runner="host-a")
    got = ledger.reserve_attempt("run-1", "u-1", step_id="build", holder="host-a", claim=dead)
    ledger.finish_attempt("run-1", "u-1", got.attempt, got.dispatch_id, status="failed",
                          failure_reason="boom", claim=dead)  # fmt: skip
    for unit in ("u-1", "u-2"):
        ledger.reserve_attempt("run-1", unit, step_id="build", holder="host-a", claim=dead)
    clock.advance(11_000)
    taker = ledger.claim("run-1", "host-b", lease_ms=60_000)
    assert taker is not None
    assert taker.generation == 2
    again = ledger.reserve_attempt("run-1", "u-2", step_id="build", holder="host-b", claim=taker)
    assert again.kind == "reclaimed"
    for write in (
        lambda: ledger.heartbeat(dead, lease_ms=1000),
        lambda: ledger.reserve_attempt("run-1", "u-3", step_id="build", claim=dead),
        lambda: ledger.set_outputs("run-1", {"stale": True}, claim=dead),
    ):
        with pytest.raises(fp.LeaseLost):
            write()
    return dead, taker


def test_run_units_attempts_and_the_fence(filled: fp.Ledger, target: str, clock: FakeClock) -> None:
    _, taker = _takeover(filled, clock)
    filled.publish_child_run(
        "run-1", parent_unit_id="u-1", invocation_key="k1", workflow_ref="wf/child",
        steps=STEPS, run_id="child-1",
    )  # fmt: skip
    with served(target, clock=clock) as srv:
        doc = get_json(srv, "/api/run", id="run-1")
        assert doc["run"]["run_id"] == "run-1"
        assert doc["run"]["status"] == "active"
        assert doc["steps"] == []  # a controller's run: its definition has the steps
        lease = doc["lease"]
        assert lease["generation"] == 2
        assert lease["owner_id"] == "host-b"
        assert lease["state"] == "live"
        assert lease["remaining_ms"] == 60_000
        assert lease["takeovers"] == 1
        assert lease["refused_writes"] == 3
        assert [c["run_id"] for c in doc["children"]] == ["child-1"]
        assert doc["children_total"] == 1
        child = get_json(srv, "/api/run", id="child-1")
        assert child["parent"]["run_id"] == "run-1"
        assert [s["step_id"] for s in child["steps"]] == ["plan", "build", "ship"]
        assert child["steps"][0]["status"] == "active"
        assert child["lease"]["state"] == "free"

        units = get_json(srv, "/api/run/totals", run="run-1", part="units")
        assert units["total"] == 2
        assert units["by_status"]["failed"] == 0
        assert units["by_status"]["running"] == 2
        acc = get_json(srv, "/api/run/totals", run="run-1", part="accounting")
        assert acc["total_attempts"] == 3
        assert request(srv, "/api/run/totals?run=run-1&part=x").status == 400

        page = get_json(srv, "/api/units", run="run-1")
        by_id = {u["unit_id"]: u for u in page["units"]}
        assert list(by_id) == ["u-1", "u-2"]
        first, second = by_id["u-1"]["history"]
        assert first["status"] == "failed"
        assert first["failure_reason"] == "boom"
        assert first["lease_generation"] == 1
        assert first["holder"] == "host-a"
        assert first["duration_ms"] == 0
        assert second["attempt"] == 2
        assert second["status"] == "running"
        (reclaimed,) = by_id["u-2"]["history"]
        assert reclaimed["reclaims"] == 1
        assert reclaimed["lease_generation"] == taker.generation
        assert reclaimed["holder"] == "host-b"
        assert reclaimed["dispatch_id"]

        one = get_json(srv, "/api/units", run="run-1", limit=1)
        assert [u["unit_id"] for u in one["units"]] == ["u-1"]
        assert one["next"] == "u-1"
        rest = get_json(srv, "/api/units", run="run-1", limit=1, after="u-1")
        assert [u["unit_id"] for u in rest["units"]] == ["u-2"]
        assert rest["next"] is None
        # The counts (known for this revision) say no unit is completed: answered unread.
        assert get_json(srv, "/api/units", run="run-1", status="completed")["units"] == []
        assert len(get_json(srv, "/api/units", run="run-1", status="running")["units"]) == 2
        assert request(srv, "/api/units?run=run-1&status=bogus").status == 400

        claims = [
            e for e in get_json(srv, "/api/events", run="run-1", after=0)["events"]
            if e["type"] == "lease.claimed"
        ]  # fmt: skip
        assert [e["generation"] for e in claims] == [1, 2]
        assert [e["taken_from"] for e in claims] == [None, "host-a"]

        missing = request(srv, "/api/run?id=nope")
        assert missing.status == 404
        assert missing.json()["error"] == "no run 'nope'"
        assert request(srv, "/api/run").status == 400
        assert request(srv, "/api/units?run=nope").status == 404


def test_run_totals_follow_the_runs_revision(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    run = filled.start_run("wf", scope_key=None, steps=STEPS, force=True)
    with served(target, clock=clock) as srv:
        assert get_json(srv, "/api/run/totals", run=run.run_id, part="units")["total"] == 0
        got = filled.reserve_attempt(run.run_id, "u", step_id="build")
        assert get_json(srv, "/api/run/totals", run=run.run_id, part="units")["total"] == 1
        filled.finish_attempt(run.run_id, "u", got.attempt, got.dispatch_id, status="completed",
                              tokens=7)  # fmt: skip
        acc = get_json(srv, "/api/run/totals", run=run.run_id, part="accounting")
        assert acc["total_tokens"] == 7
        units = get_json(srv, "/api/run/totals", run=run.run_id, part="units")
        assert units["by_status"]["completed"] == 1


def test_a_status_filter_looks_through_a_bounded_window(
    filled: fp.Ledger, target: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filtered by a status no index holds (running, completed), a view reads the next
    SCANNED units in order and keeps the matches; paging on from where it stopped finds the
    rest, each match once. Any other status is its index's page."""
    monkeypatch.setattr(api, "SCANNED", 10)
    run = filled.start_run("wf", scope_key=None, steps=STEPS, force=True)
    got = filled.reserve_attempts(
        run.run_id, [{"unit_id": f"u{i:02d}", "step_id": "build"} for i in range(24)]
    )
    completed = {"u03", "u04", "u05", "u21"}
    for r in got:
        status = "completed" if r.unit_id in completed else "failed"
        filled.finish_attempt(run.run_id, r.unit_id, r.attempt, r.dispatch_id, status=status)
    with served(target, clock=clock) as srv:
        failed = get_json(srv, "/api/units", run=run.run_id, status="failed", limit=200)
        assert [u["unit_id"] for u in failed["units"]] == sorted(
            r.unit_id for r in got if r.unit_id not in completed
        )
        assert failed["scanned"] is None
        pages = []
        after = ""
        while True:
            page = get_json(srv, "/api/units", run=run.run_id, status="completed", limit=2,
                            after=after)  # fmt: skip
            pages.append(([u["unit_id"] for u in page["units"]], page["scanned"], page["next"]))
            if page["next"] is None:
                break
            after = page["next"]
    assert pages == [
        (["u03", "u04"], 5, "u04"),  # two matches: the page is full before the window ends
        (["u05"], 10, "u14"),
        (["u21"], 9, None),  # the last window was not full: the end
    ]


# ------------------------------------------------------------------ leases


def test_leases_by_state(filled: fp.Ledger, target: str, clock: FakeClock) -> None:
    _takeover(filled, clock)  # run-1: host-b, 60 s
    for run_id, lease_ms in (("live-1", 100_000), ("late-1", 9_000), ("gone-1", 1_000)):
        filled.reserve_run(run_id, **queued(run_id))
        assert filled.claim(run_id, "ctl", lease_ms=lease_ms) is not None
    clock.advance(7_000)  # late-1: 2 s of 9 left; gone-1 expired
    with served(target, clock=clock) as srv:
        doc = get_json(srv, "/api/leases")
        states = {le["run_id"]: le["state"] for le in doc["owned"]}
        assert states == {
            "gone-1": "expired", "late-1": "expiring", "run-1": "live", "live-1": "live",
        }  # fmt: skip
        assert doc["owned"][0]["run_id"] == "gone-1"  # soonest to expire first
        assert doc["counts"] == {
            "live": 2, "expiring": 1, "expired": 1, "owned": 4, "blocking": 1,
        }  # fmt: skip
        assert [le["run_id"] for le in doc["blocking"]] == ["gone-1"]
        recent = {le["run_id"]: le for le in doc["recent"]}
        assert recent["run-1"]["generation"] == 2
        assert recent["run-1"]["run_status"] == "active"
        assert recent["run-1"]["takeovers"] == 1
        assert recent["run-1"]["refused_writes"] == 3
        first = get_json(srv, "/api/leases", limit=2)
        assert len(first["recent"]) == 2
        second = get_json(srv, "/api/leases", limit=2, after=first["next"])
        assert not {le["run_id"] for le in first["recent"]} & {
            le["run_id"] for le in second["recent"]
        }


# ------------------------------------------------------------------ queue


def test_the_queue_by_lane_keys_and_pauses(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    for i in range(5):
        filled.reserve_run(f"q{i}", **queued(f"q{i}", priority=i % 3))
    filled.reserve_run("soon", **queued("soon", not_before=dt.timedelta(seconds=30)))
    filled.set_concurrency_limit("gpu", 1)
    filled.reserve_run("g0", **queued("g0", concurrency_key="gpu", priority=5))
    filled.reserve_run("g1", **queued("g1", concurrency_key="gpu"))
    filled.pause_workflow("nightly")
    filled.reserve_run("n0", **queued("n0", workflow_name="nightly"))
    [taken] = filled.claim_next("ctl", lease_ms=60_000, workflow_names=["deploy"], limit=1)
    with served(target, clock=clock) as srv:
        doc = get_json(srv, "/api/queue", limit=2)
        assert doc["counts"] == {"due": 5, "keyed": 1, "later": 1}
        assert doc["count_max"] == api.QUEUE_COUNT_MAX
        assert doc["keys"] == [{"key": "gpu", "limit": 1, "live": 1, "queued": 1}]
        assert [(p["workflow_name"], p["queued"]) for p in doc["paused"]] == [("nightly", 1)]
        # Claim order, paged: what claim_next takes after the run it took.
        order = [r.run_id for r in filled.queued_runs()]
        assert taken.run_id == "g0"
        assert [r["run_id"] for r in doc["runs"]] == order[:2]
        second = get_json(srv, "/api/queue", limit=2, after=doc["next"])
        third = get_json(srv, "/api/queue", limit=2, after=second["next"])
        assert [r["run_id"] for r in second["runs"] + third["runs"]] == order[2:]
        assert len(order) == 5
        assert third["next"] is None
        later = get_json(srv, "/api/queue", lane="later")
        [soon] = later["runs"]
        assert (soon["run_id"], soon["due_in_ms"]) == ("soon", 30_000)
        for bad in ({"lane": "soon"}, {"after": "1.2"}, {"after": "5000.1.r"}):
            answer = request(srv, "/api/queue", params=bad)
            assert answer.status == 400, (bad, answer.body)


def test_the_retries_page_lists_due_and_exhausted_units(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    policy = {"max_attempts": 2, "initial_ms": 1_000}
    for run_id in ("ra", "rb"):
        filled.start_run("wf", scope_key=None, steps=STEPS, run_id=run_id, force=True, retry=policy)
    for i in range(5):
        run_id = "ra" if i % 2 else "rb"
        r = filled.reserve_attempt(run_id, f"u{i}/x.y", step_id="plan")
        filled.finish_attempt(run_id, r.unit_id, r.attempt, r.dispatch_id, status="failed")
        clock.advance(10)
    for run_id in ("ra", "rb"):
        r = filled.reserve_attempt(run_id, "dead", step_id="plan", force=True)
        filled.finish_attempt(run_id, "dead", 1, r.dispatch_id, status="failed")
        r = filled.reserve_attempt(run_id, "dead", step_id="plan", force=True)
        filled.finish_attempt(run_id, "dead", 2, r.dispatch_id, status="timed_out")
    clock.advance(985)
    with served(target, clock=clock) as srv:
        due = get_json(srv, "/api/retries", limit=2)
        # Due by now: the first four failures (the fifth is due in 5 ms).
        order = [(u.run_id, u.unit_id) for u in filled.due_units()]
        assert len(order) == 4
        assert [(u["run_id"], u["unit_id"]) for u in due["units"]] == order[:2]
        assert due["units"][0]["due_in_ms"] <= 0
        rest = get_json(srv, "/api/retries", limit=2, after=due["next"])
        assert [(u["run_id"], u["unit_id"]) for u in rest["units"]] == order[2:]
        assert rest["next"] is None
        of_ra = get_json(srv, "/api/retries", run="ra")
        assert {u["run_id"] for u in of_ra["units"]} == {"ra"}
        dead = get_json(srv, "/api/retries", kind="exhausted", limit=1)
        assert [(u["run_id"], u["unit_id"], u["status"]) for u in dead["units"]] == [
            ("ra", "dead", "exhausted")
        ]
        more = get_json(srv, "/api/retries", kind="exhausted", after=dead["next"])
        assert [(u["run_id"], u["unit_id"]) for u in more["units"]] == [("rb", "dead")]
        for bad in ({"kind": "soon"}, {"after": "x"}, {"kind": "exhausted", "after": "ra"}):
            answer = request(srv, "/api/retries", params=bad)
            assert answer.status == 400, (bad, answer.body)
        assert request(srv, "/api/retries", params={"run": "nope"}).status == 404


# ------------------------------------------------------------------ schedules

SCHEDULE_TEMPLATE = TEMPLATE


def _dec6(hour: int, minute: int) -> int:
    """Epoch ms of a UTC wall time on 2026-12-06."""
    return int(dt.datetime(2026, 12, 6, hour, minute, tzinfo=dt.UTC).timestamp() * 1000)


def test_the_schedules_page_lists_schedules_and_their_last_runs(
    filled: fp.Ledger, target: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with served(target, clock=clock) as srv:
        empty = get_json(srv, "/api/schedules")
        assert (empty["schedules"], empty["total"], empty["more"]) == ([], 0, False)

    def put(name: str, cron: str, **kw: Any) -> None:
        kw.setdefault("workflow_name", "report")
        filled.put_schedule(name, cron=cron, template=SCHEDULE_TEMPLATE, **kw)

    clock.now = _dec6(0, 0)
    put("hourly", "0 * * * *", timezone="Europe/Berlin", overlap="allow", catch_up=2)
    put("nightly", "0 3 * * *", workflow_name=HOSTILE)
    put("paused", "*/15 * * * *")
    filled.pause_schedule("paused")
    put("skipper", "*/10 * * * *")
    put("gone", "0 * * * *")
    clock.now = _dec6(1, 0)
    assert len(filled.tick_schedules()) == 3  # hourly, skipper, gone
    assert filled.abandon_run("gone:2026-12-06T01:00Z")
    clock.now = _dec6(1, 10)
    # skipper's run is still queued: its 01:10 slot goes by without a run.
    assert filled.tick_schedules() == []
    assert filled.abandon_run("hourly:2026-12-06T01:00Z")
    clock.now = _dec6(1, 12)
    # gone's run (ended at 01:00) leaves the ledger; hourly's (ended at 01:10) stays.
    assert filled.prune(older_than=dt.timedelta(minutes=10)).runs == 1

    reads: list[str] = []
    get_run = fp.Ledger.get_run

    def counted(self: fp.Ledger, run_id: str) -> fp.Run | None:
        reads.append(run_id)
        return get_run(self, run_id)

    monkeypatch.setattr(fp.Ledger, "get_run", counted)
    with served(target, clock=clock) as srv:
        answer = request(srv, "/api/schedules")
        assert answer.status == 200
        assert_inert(answer.body)
        page = answer.json()
        assert page["now"] == "2026-12-06T01:12:00.000Z"
        assert (page["total"], page["more"], page["shown_max"]) == (5, False, 200)
        rows = {row["name"]: row for row in page["schedules"]}
        assert list(rows) == ["gone", "hourly", "nightly", "paused", "skipper"]
        assert rows["hourly"] == {
            "name": "hourly",
            "cron": "0 * * * *",
            "timezone": "Europe/Berlin",
            "workflow_name": "report",
            "overlap": "allow",
            "catch_up": 2,
            "paused": False,
            "next_slot": "2026-12-06T02:00:00.000Z",
            "next_in_ms": 48 * 60_000,
            "last_slot": "2026-12-06T01:00:00.000Z",
            "last_run_id": "hourly:2026-12-06T01:00Z",
            "last_run_status": "cancelled",
        }
        never = rows["nightly"]
        assert never["workflow_name"] == HOSTILE
        assert (never["next_slot"], never["next_in_ms"]) == ("2026-12-06T03:00:00.000Z", 6_480_000)
        assert (never["last_slot"], never["last_run_id"], never["last_run_status"]) == (
            None, None, None
        )  # fmt: skip
        # Paused: its next slot went by unfired.
        assert rows["paused"]["paused"] is True
        assert rows["paused"]["next_in_ms"] == -57 * 60_000
        skipped = rows["skipper"]
        assert (skipped["last_slot"], skipped["last_run_id"], skipped["last_run_status"]) == (
            "2026-12-06T01:10:00.000Z", "skipper:2026-12-06T01:00Z", "queued"
        )  # fmt: skip
        assert skipped["next_in_ms"] == 8 * 60_000
        # A pruned last run: its id stays on the schedule, without a status.
        assert (rows["gone"]["last_run_id"], rows["gone"]["last_run_status"]) == (
            "gone:2026-12-06T01:00Z", None
        )  # fmt: skip
        # The schedules' read carries the runs' statuses: no run is read on its own.
        assert reads == []
        # Capped: the first schedules by name, the rest counted, and only their runs read.
        monkeypatch.setattr(api, "SCHEDULES_SHOWN", 2)
        reads.clear()
        capped = get_json(srv, "/api/schedules")
        assert [r["name"] for r in capped["schedules"]] == ["gone", "hourly"]
        assert (capped["total"], capped["more"], capped["shown_max"]) == (5, True, 2)
        assert reads == []


# ------------------------------------------------------------------ events


def test_events_page_and_stream_resume(filled: fp.Ledger, target: str, clock: FakeClock) -> None:
    for i in range(5):
        filled.start_run("wf", scope_key=None, steps=STEPS, run_id=f"r-{i}", force=True)
    everything = filled.events(limit=1000)
    with served(target, clock=clock) as srv:
        tail = get_json(srv, "/api/events", limit=3)
        assert [e["seq"] for e in tail["events"]] == [e.seq for e in everything[-3:]]
        assert tail["head"] == everything[-1].seq
        assert tail["after"] == everything[-1].seq
        first = get_json(srv, "/api/events", after=0, limit=2)
        assert [e["seq"] for e in first["events"]] == [e.seq for e in everything[:2]]
        of_run = get_json(srv, "/api/events", run="r-2", after=0)
        assert {e["run_id"] for e in of_run["events"]} == {"r-2"}
        assert of_run["events"][0]["type"] == "run.started"
        # A run's tail starts at the head; from a seq that is not one of its events, the log
        # is read and filtered.
        assert get_json(srv, "/api/events", run="r-2")["events"] == []
        filtered = get_json(srv, "/api/events", run="r-3", after=everything[0].seq)
        assert {e["run_id"] for e in filtered["events"]} == {"r-3"}

        stream = _open_stream(srv, "/api/stream")
        filled.start_run("wf", scope_key=None, steps=STEPS, run_id="new-1", force=True)
        seq, event = _next_event(stream)
        assert event["run_id"] == "new-1"
        assert event["type"] == "run.started"
        assert seq == event["seq"]
        stream.close()

        # Resume: Last-Event-ID (what EventSource sends) wins over ?after.
        filled.start_run("wf", scope_key=None, steps=STEPS, run_id="new-2", force=True)
        resumed = _open_stream(srv, "/api/stream?after=0", {"Last-Event-ID": str(seq)})
        assert _next_event(resumed)[1]["run_id"] == "new-2"
        resumed.close()

        # One run's stream: other runs' events are not sent.
        only = _open_stream(srv, "/api/stream?run=new-3")
        filled.start_run("wf", scope_key=None, steps=STEPS, run_id="noise", force=True)
        filled.start_run("wf", scope_key=None, steps=STEPS, run_id="new-3", force=True)
        assert _next_event(only)[1]["run_id"] == "new-3"
        only.close()

        bad = request(srv, "/api/stream", headers={"Last-Event-ID": "x"})
        assert bad.status == 400


class _Stream:
    def __init__(self, conn: http.client.HTTPConnection, res: http.client.HTTPResponse) -> None:
        self.conn, self.res = conn, res

    def close(self) -> None:
        self.conn.close()


def _open_stream(srv: server.DashboardServer, path: str, headers: Any = None) -> _Stream:
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=20)
    conn.request("GET", path, headers=headers or {})
    res = conn.getresponse()
    assert res.status == 200
    assert res.headers["Content-Type"].startswith("text/event-stream")
    assert res.headers["X-Content-Type-Options"] == "nosniff"
    return _Stream(conn, res)


def _next_event(stream: _Stream) -> tuple[int, Any]:
    """The next ``ledger`` event of a stream: (its id, its data)."""
    seq = None
    while True:
        line = stream.res.fp.readline()
        assert line, "the stream ended"
        if line.startswith(b"id: "):
            seq = int(line[4:])
        elif line.startswith(b"data: "):
            assert_inert(line[6:].strip())
            assert seq is not None
            return seq, json.loads(line[6:])


def test_streams_end_when_the_server_stops(filled: fp.Ledger, target: str) -> None:
    with served(target) as srv:
        stream = _open_stream(srv, "/api/stream")
        assert srv.dashboard.streams
        started_at = time.monotonic()
    # served() shut the server down and closed it: the stream's thread ended and its
    # connection closed, well before any timeout.
    while stream.res.fp.readline():
        pass
    assert time.monotonic() - started_at < 5
    assert not srv.dashboard.streams
    stream.close()


# ------------------------------------------------------------------ throughput


def test_throughput_per_minute(filled: fp.Ledger, target: str, clock: FakeClock) -> None:
    clock.now = (clock.now // 60_000) * 60_000 + 5_000
    start = clock.now
    per_minute = [3, 0, 5, 1, 8, 2]
    for minute, n in enumerate(per_minute):
        if not n:
            continue
        clock.now = start + minute * 60_000
        run = filled.start_run("wf", scope_key=None, steps=STEPS, force=True)
        for i in range(n - 1):  # run.started is one event
            filled.reserve_attempt(run.run_id, f"u{i}", step_id="build")
    now = clock.now + 1_000
    expected = [0] * 54 + per_minute
    query = {"minutes": ["60"]}
    exact = api.Throughput()(filled, query, now)
    assert exact["exact"]
    assert [m["count"] for m in exact["minutes"]] == expected
    assert exact["total"] == sum(per_minute)
    # Counted by seq positions (what a busy hour gets): the same counts, found by probes.
    counter = api.Throughput(exact_max=0)
    probed = counter(filled, query, now)
    assert not probed["exact"]
    assert [m["count"] for m in probed["minutes"]] == expected
    assert probed["head"] == filled.newest_event_seq()
    with served(target, clock=lambda: now) as srv:
        doc = get_json(srv, "/api/throughput")
        assert [m["count"] for m in doc["minutes"]] == expected
        assert request(srv, "/api/throughput?minutes=1000").status == 400


def test_throughput_of_an_empty_log(tmp_path: pathlib.Path) -> None:
    db = str(tmp_path / "empty.db")
    fp.Ledger.open(db).close()
    with served(db) as srv:
        doc = get_json(srv, "/api/throughput")
        assert doc["total"] == 0
        assert doc["head"] == 0
        assert get_json(srv, "/api/events")["events"] == []


def test_head_seq_is_the_newest_event(tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(str(tmp_path / "h.db")) as ledger:
        assert api.head_seq(ledger) == 0 == ledger.newest_event_seq()
        run = ledger.start_run("wf", scope_key=None, steps=STEPS, force=True)
        for start in range(0, 2500, 500):
            ledger.reserve_attempts(
                run.run_id,
                [{"unit_id": f"u{i}", "step_id": "build"} for i in range(start, start + 500)],
            )
        last = ledger.events(after_seq=2400, limit=1000)[-1].seq
        assert api.head_seq(ledger) == last == ledger.newest_event_seq()


# ------------------------------------------------------------------ doctor


def test_doctor(filled: fp.Ledger, target: str) -> None:
    filled.start_run("wf", scope_key=None, steps=STEPS, force=True)
    with served(target) as srv:
        quick = get_json(srv, "/api/doctor")
        assert quick["checked"] is False
        assert quick["healthy"] is None
        assert quick["schema_version"] == fp.SCHEMA_VERSION
        assert quick["pragmas"]["foreign_keys"] is True
        full = get_json(srv, "/api/doctor", checks="1")
        assert full["checked"] is True
        assert full["healthy"] is True
        assert full["integrity_check"] == ["ok"]
        assert full["orphan_attempts"] == []
        assert full["integrity_check_mode"] == "quick"


# ------------------------------------------------------------------ hostile data


def test_hostile_data_comes_back_exact_and_inert(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    steps = [{"id": "s" + HOSTILE, "title": "T" + HOSTILE, "instructions": HOSTILE}]
    run = filled.start_run(
        "wf/" + HOSTILE, scope_key="scope" + HOSTILE, steps=steps, params={"k" + HOSTILE: HOSTILE},
        run_id="run-x", force=True,
    )  # fmt: skip
    got = filled.reserve_attempt("run-x", "u" + HOSTILE, step_id="s" + HOSTILE,
                                 holder="h" + HOSTILE)  # fmt: skip
    filled.finish_attempt(
        "run-x", "u" + HOSTILE, got.attempt, got.dispatch_id, status="failed",
        result={"r" + HOSTILE: [HOSTILE]}, failure_reason="f" + HOSTILE,
    )  # fmt: skip
    filled.reserve_run("ctl-x", **queued("ctl-x", workflow_ref="ref" + HOSTILE))
    assert filled.claim("ctl-x", "owner" + HOSTILE, lease_ms=60_000) is not None
    with served(target, clock=clock) as srv:
        calls = [
            ("/api/runs", {}),
            ("/api/runs", {"scope": "scope" + HOSTILE}),
            ("/api/runs", {"workflow": "wf/" + HOSTILE}),
            ("/api/run", {"id": "run-x"}),
            ("/api/units", {"run": "run-x", "step": "s" + HOSTILE}),
            ("/api/leases", {}),
            ("/api/events", {"after": 0}),
            ("/api/doctor", {}),
        ]
        answers = {}
        for path, params in calls:
            answer = request(srv, path, params=params)
            assert answer.status == 200, (path, answer.body[:300])
            assert answer.header("Content-Type") == "application/json; charset=utf-8"
            assert answer.header("X-Content-Type-Options") == "nosniff"
            assert_inert(answer.body)
            answers[path, tuple(params)] = answer.json()
        listed = answers["/api/runs", ()]["runs"]
        assert {r["workflow_ref"] for r in listed} >= {"wf/" + HOSTILE, "ref" + HOSTILE}
        assert [r["run_id"] for r in answers["/api/runs", ("scope",)]["runs"]] == ["run-x"]
        assert [r["run_id"] for r in answers["/api/runs", ("workflow",)]["runs"]] == ["run-x"]
        detail = answers["/api/run", ("id",)]
        assert detail["run"]["scope_key"] == "scope" + HOSTILE
        assert json.loads(detail["run"]["params"]) == run.params
        assert detail["steps"][0]["title"] == "T" + HOSTILE
        (unit,) = answers["/api/units", ("run", "step")]["units"]
        assert unit["unit_id"] == "u" + HOSTILE
        assert unit["failure_reason"] == "f" + HOSTILE
        assert json.loads(unit["result"]) == {"r" + HOSTILE: [HOSTILE]}
        assert unit["history"][0]["holder"] == "h" + HOSTILE
        owned = answers["/api/leases", ()]["owned"]
        assert [le["owner_id"] for le in owned] == ["owner" + HOSTILE]
        payloads = [e["payload"] for e in answers["/api/events", ("after",)]["events"]]
        assert any(HOSTILE in json.loads(p).get("unit_id", "") for p in payloads)
        # An error that quotes the request: inert too.
        error = request(srv, "/api/run", params={"id": HOSTILE})
        assert error.status == 404
        assert_inert(error.body)
        assert error.json()["error"] == f"no run {HOSTILE!r}"


def test_dumps_escapes_markup_and_non_ascii() -> None:
    body = api.dumps({"<k>": "</script><b>&amp;\u2028é"})
    assert body == (
        b'{"\\u003ck\\u003e":"\\u003c/script\\u003e\\u003cb\\u003e\\u0026amp;\\u2028\\u00e9"}'
    )
    assert json.loads(body) == {"<k>": "</script><b>&amp;\u2028é"}
    assert api.clip({"a": "x" * 50}, 10) == '{"a": "xxx\u2026'


# ------------------------------------------------------------------ the server's rules


def test_pages_static_files_and_headers(filled: fp.Ledger, target: str) -> None:
    with served(target) as srv:
        page = request(srv, "/")
        assert page.status == 200
        assert page.header("Content-Type") == "text/html; charset=utf-8"
        assert page.header("Content-Security-Policy").startswith("default-src 'self'")
        assert page.header("X-Content-Type-Options") == "nosniff"
        assert page.header("Referrer-Policy") == "no-referrer"
        html = page.body.decode()
        # No inline script or style for the policy to allow: one script file, one stylesheet.
        assert html.count("<script") == 1
        assert '<script src="/static/app.js" defer></script>' in html
        assert "<style" not in html
        assert " style=" not in html
        assert "http://" not in html
        assert "https://" not in html
        js = request(srv, "/static/app.js")
        assert js.header("Content-Type") == "text/javascript; charset=utf-8"
        # The page builds its DOM from text nodes only.
        assert not re.search(
            rb"\.(inner|outer)HTML|insertAdjacentHTML|document\.write|eval\(|new Function",
            js.body,
        )
        # Nothing fetched from elsewhere (the one URL is SVG's namespace name, never fetched).
        assert re.findall(rb"https?://[^\s\"']*", js.body) == [b"http://www.w3.org/2000/svg"]
        assert request(srv, "/static/app.css").header("Content-Type") == "text/css; charset=utf-8"
        head = request(srv, "/api/meta", method="HEAD")
        assert head.status == 200
        assert head.body == b""
        assert int(head.header("Content-Length")) > 0
        missing = request(srv, "/static/../server.py")
        assert missing.status == 404
        assert missing.json()["status"] == 404
        assert request(srv, "/nope").status == 404
        # A name that is not loopback (DNS rebinding): refused without a token.
        rebound = request(srv, "/api/meta", headers={"Host": "evil.example:80"})
        assert rebound.status == 421
        assert request(srv, "/api/meta", headers={"Host": "localhost:1"}).status == 200
        bad = request(srv, "/" + "x" * 70_000)
        assert bad.status == 414
        assert bad.header("Content-Security-Policy").startswith("default-src 'self'")
        assert bad.json()["status"] == 414


def test_static_files_are_in_the_package() -> None:
    static = importlib.resources.files("fencepost.ui").joinpath("static")
    for name in ("index.html", "app.js", "app.css", "favicon.svg"):
        assert static.joinpath(name).is_file(), name


def test_read_only(filled: fp.Ledger, target: str) -> None:
    filled.start_run("wf", scope_key=None, steps=STEPS, run_id="r", force=True)
    before = counts(target)
    with served(target) as srv:
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"):
            answer = request(srv, "/api/runs", method=method, body=b'{"x": 1}')
            assert answer.status == 405, method
            assert answer.header("Allow") == "GET, HEAD"
            assert "read-only" in answer.json()["error"]
            assert answer.header("Content-Security-Policy")
        for path in ("/api/runs", "/api/run?id=r", "/api/units?run=r", "/api/leases",
                     "/api/queue", "/api/queue?lane=later", "/api/events", "/api/throughput",
                     "/api/doctor?checks=1"):  # fmt: skip
            assert request(srv, path).status == 200
    assert counts(target) == before


def test_malformed_and_cross_site_requests(filled: fp.Ledger, target: str) -> None:
    """Another site's page cannot make the browser call the dashboard (it could not read the
    answer, but could keep the whole-database checks busy); a request with too many fields
    and a stream resuming past any seq are refused before anything is sent."""
    filled.start_run("wf", scope_key=None, steps=STEPS, run_id="r", force=True)
    with served(target) as srv:
        for site in ("cross-site", "same-site"):
            refused = request(srv, "/api/doctor?checks=1", headers={"Sec-Fetch-Site": site})
            assert refused.status == 403, site
        ours = request(srv, "/api/meta", headers={"Sec-Fetch-Site": "same-origin"})
        assert ours.status == 200
        many = "&".join(f"f{i}=1" for i in range(60))
        assert request(srv, f"/api/runs?{many}").status == 400
        huge = request(srv, "/api/stream?after=99999999999999999999999")
        assert huge.status == 400
        assert huge.header("Content-Type").startswith("application/json")
        assert "after must be an event seq" in huge.json()["error"]


def _raw(srv: server.DashboardServer, data: bytes) -> bytes:
    """Send ``data`` on a socket of its own; everything the server answers until it closes."""
    host, port = srv.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: %d\r\n",
        b"Content-Length: %d\r\nContent-Length: 0\r\n",
        b"Transfer-Encoding: chunked\r\n",
    ],
    ids=["length", "two-lengths", "chunked"],
)
@pytest.mark.parametrize("method", [b"GET", b"HEAD"])
def test_a_get_with_a_body_is_refused_not_read_as_a_request(
    filled: fp.Ledger, target: str, framing: bytes, method: bytes
) -> None:
    """A body on a GET or HEAD is never read as the connection's next request (behind a proxy
    that forwards GET bodies, that would be a request the proxy never saw): 400, and the
    connection closes after that one answer."""
    inner = b"GET /api/doctor HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    if b"chunked" in framing:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(inner), inner)
    else:
        body, framing = inner, framing % len(inner) if b"%d" in framing else framing
    head = b"%s /api/meta HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (method, framing)
    with served(target) as srv:
        got = _raw(srv, head + body)
        assert got.count(b"HTTP/1.1 ") == 1, got
        assert got.startswith(b"HTTP/1.1 400 ")
        assert b"\r\nConnection: close\r\n" in got
        assert b"\r\nContent-Security-Policy: " in got
        if method == b"GET":
            assert b"must not carry a body" in got
        assert b"doctor" not in got.split(b"\r\n\r\n", 1)[1]
        # Without a body (or with an empty one) a connection still serves request after
        # request.
        plain = b"GET /api/meta HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        last = b"GET /api/meta HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        both = _raw(srv, plain + last)
        assert both.count(b"HTTP/1.1 200 ") == 2, both


def test_token(filled: fp.Ledger, target: str) -> None:
    token = "s3cret-token"
    with served(target, token=token) as srv:
        assert srv.dashboard.token == token
        denied = request(srv, "/api/meta")
        assert denied.status == 401
        assert denied.header("WWW-Authenticate") == "Bearer"
        assert denied.json()["error"] == "a token is required"
        assert request(srv, "/").status == 401
        assert request(srv, "/static/app.js").status == 401
        assert request(srv, "/api/stream").status == 401
        wrong = {"Authorization": "Bearer nope"}
        assert request(srv, "/api/meta", headers=wrong).status == 401
        right = {"Authorization": f"Bearer {token}"}
        meta = request(srv, "/api/meta", headers=right)
        assert meta.status == 200
        assert meta.json()["token_required"] is True
        # The query-string token is for page loads only, never for the API.
        assert request(srv, f"/api/meta?token={token}").status == 401
        assert request(srv, "/?token=nope").status == 401

        login = request(srv, f"/?token={token}")
        assert login.status == 303
        assert login.header("Location") == "/"
        cookie = login.header("Set-Cookie")
        attributes = [part.strip() for part in cookie.split(";")]
        assert "HttpOnly" in attributes
        assert "SameSite=Strict" in attributes
        assert "Path=/" in attributes
        name, value = attributes[0].split("=", 1)
        assert token not in value  # a value derived from the token, not the token
        jar = {"Cookie": f"{name}={value}"}
        assert request(srv, "/", headers=jar).status == 200
        assert request(srv, "/api/runs", headers=jar).status == 200
        assert request(srv, "/api/meta", headers={"Cookie": f"{name}=x{value}"}).status == 401
        # Another application's cookie on this host (cookies ignore ports), even one a strict
        # parser gives up on, does not hide ours.
        foreign = {"Cookie": f'prefs={{"a":1}}; x=a b; {name}={value}'}
        assert request(srv, "/api/meta", headers=foreign).status == 200
        assert name.endswith(f"_{srv.server_address[1]}")
        # With a token, any Host may be asked for (the token is the fence).
        other = request(srv, "/api/meta", headers={**right, "Host": "dash.example"})
        assert other.status == 200


def test_make_server_refuses_an_open_host_without_a_token(target: str) -> None:
    fp.Ledger.open(target).close()
    with pytest.raises(ValueError, match="needs a token"):
        server.make_server(target, host="0.0.0.0", port=0)
    with pytest.raises(ValueError, match="must not be empty"):
        server.make_server(target, port=0, token="")
    assert server.is_loopback("127.0.0.1")
    assert server.is_loopback("::1")
    assert server.is_loopback("[::1]")
    assert server.is_loopback("localhost")
    assert not server.is_loopback("0.0.0.0")
    assert not server.is_loopback("example.com")


# ------------------------------------------------------------------ errors


def test_ledger_errors_become_json(
    filled: fp.Ledger,
    target: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def store_error(*args: Any, **kwargs: Any) -> Any:
        raise fp.StoreError(
            "server said: FATAL password=hunter2 host db-7", operation="listing runs"
        )

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals")

    def busy(*args: Any, **kwargs: Any) -> Any:
        raise fp.StoreBusy("busy")

    with served(target) as srv:
        monkeypatch.setattr(api, "runs_page", store_error)
        failed = request(srv, "/api/runs")
        assert failed.status == 503
        assert failed.json() == {
            "error": "the database failed while listing runs; run `fencepost doctor`",
            "status": 503,
        }
        monkeypatch.setattr(api, "runs_page", bug)
        crashed = request(srv, "/api/runs")
        assert crashed.status == 500
        assert b"secret" not in crashed.body
        assert b"Traceback" not in crashed.body
        assert crashed.json()["error"].startswith("internal error")
        monkeypatch.setattr(api, "runs_page", busy)
        assert request(srv, "/api/runs").status == 503
        # The server keeps serving.
        assert request(srv, "/api/meta").status == 200
    logged = capsys.readouterr().err
    assert "secret internals" in logged  # the server's own log has the details


def test_bad_cursors_run_ids_and_seqs_are_400_on_every_call(filled: fp.Ledger, target: str) -> None:
    """A malformed page cursor, a run id the ledger refuses and an event seq out of range are
    each a 400 saying what is wrong, whichever call gets them and whatever else it is given;
    every seq from 0 to 2**63-1 is accepted wherever a seq is."""
    filled.start_run("wf", scope_key=None, steps=STEPS, run_id="r", force=True)
    with served(target) as srv:
        for path in ("/api/runs", "/api/leases"):
            for cursor in ("1.2", "1", "x", "1.2.r.", "1.x.r"):
                answer = request(srv, path, params={"after": cursor})
                if cursor == "1.2.r.":  # a cursor whose run id holds a dot: well formed
                    assert answer.status == 200, (path, cursor)
                    continue
                assert answer.status == 400, (path, cursor, answer.body)
                assert answer.json()["error"] == f"not a page cursor: {cursor!r}"

        nul = "r\x00"
        calls = [
            ("/api/events", {"run": nul}),
            ("/api/events", {"run": nul, "after": "0"}),
            ("/api/events", {"run": nul, "after": "5"}),
            ("/api/stream", {"run": nul}),
            ("/api/stream", {"run": nul, "after": "0"}),
            ("/api/run", {"id": nul}),
            ("/api/run/totals", {"run": nul, "part": "units"}),
            ("/api/units", {"run": nul}),
        ]
        for path, params in calls:
            answer = request(srv, path, params=params)
            assert answer.status == 400, (path, params, answer.body)
            assert "NUL" in answer.json()["error"], (path, params)
        # A run that does not exist is no error for a tail: it may be about to start.
        assert request(srv, "/api/events", params={"run": "later"}).status == 200
        assert request(srv, "/api/stream?run=later", method="HEAD").status == 200

        top = str(2**63 - 1)
        assert get_json(srv, "/api/events", after=top)["events"] == []
        assert get_json(srv, "/api/events", after=top, run="r")["events"] == []
        assert request(srv, f"/api/stream?after={top}", method="HEAD").status == 200
        assert request(srv, f"/api/stream?after={top}&run=r", method="HEAD").status == 200
        resume = request(srv, "/api/stream", method="HEAD", headers={"Last-Event-ID": top})
        assert resume.status == 200
        for bad in (str(2**63), "-1", "+1", " 1", "1.5", "1_0", "\u0661", "9" * 5000):
            for path, params, headers in (
                ("/api/events", {"after": bad}, {}),
                ("/api/events", {"after": bad, "run": "r"}, {}),
                ("/api/stream", {"after": bad}, {}),
                ("/api/stream", {}, {"Last-Event-ID": bad}),
            ):
                if headers and (not bad.isascii() or bad != bad.strip()):
                    continue  # not sent as is: headers are ASCII, stripped of spaces
                answer = request(srv, path, params=params, headers=headers, timeout=10)
                assert answer.status == 400, (path, bad, answer.body[:200])
                error = answer.json()["error"]
                assert f"from 0 to {2**63 - 1}" in error, error
                assert ("Last-Event-ID" if headers else "after") in error


def test_a_port_in_use_is_an_error_about_the_port(target: str) -> None:
    fp.Ledger.open(target).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="in use") as raised:
            server.make_server(target, port=port)
        assert raised.value.errno == errno.EADDRINUSE
        done = cli("ui", "--db", target, "--port", str(port), timeout=30)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"fencepost: error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "pass another --host or --port (--port 0: any free port)\n"
    )
    hosts = [("name.invalid", ["--token", "t"])]
    try:
        socket.getaddrinfo("localhost.", 0)
    except OSError:  # it resolves on some systems, and would then serve
        hosts.append(("localhost.", []))
    for host, extra in hosts:
        unknown = cli("ui", "--db", target, "--host", host, "--port", "0", *extra, timeout=30)
        assert unknown.returncode == 2, unknown.stderr
        assert unknown.stderr.startswith(f"fencepost: error: cannot listen on {host}:0: ")
        assert unknown.stderr.count("\n") == 1, unknown.stderr


def test_a_missing_ledger_is_not_created(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "absent.db"
    with pytest.raises(fp.StoreError):
        server.make_server(str(db), port=0)
    assert not db.exists()


# ------------------------------------------------------------------ the command line


def test_cli_refuses_a_non_loopback_host_without_a_token(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "l.db"
    fp.Ledger.open(str(db)).close()
    done = cli("ui", "--db", str(db), "--host", "0.0.0.0", env={"FENCEPOST_UI_TOKEN": ""})
    assert done.returncode == 2
    assert "--host 0.0.0.0 is not loopback" in done.stderr
    assert "--token" in done.stderr
    assert done.stdout == ""
    for blank in (" ", " tok"):
        empty = cli("ui", "--db", str(db), "--token", blank)
        assert empty.returncode == 2
        assert "--token must not be empty or begin or end with spaces" in empty.stderr
    missing = cli("ui", "--db", str(tmp_path / "none.db"), "--port", "0")
    assert missing.returncode == 1
    assert "no ledger at" in missing.stderr
    assert not (tmp_path / "none.db").exists()
    bad_port = cli("ui", "--db", str(db), "--port", "70000")
    assert bad_port.returncode == 2


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cli_prints_its_url_and_stops_cleanly(target: str, stop: signal.Signals) -> None:
    with fp.Ledger.open(target) as ledger:
        ledger.start_run("wf", scope_key=None, steps=STEPS, run_id="r", force=True)
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_UI_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost", "ui", "--db", target, "--port", "0",
         "--token", "t+k&n#1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "(read-only)" in proc.stdout.readline()
        line = proc.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:")
        url = urllib.parse.urlsplit(line.split()[2])
        # The token is quoted in the URL: opened as printed, the page load logs in.
        assert urllib.parse.parse_qs(url.query) == {"token": ["t+k&n#1"]}
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=10)
        conn.request("GET", f"/?{url.query}")
        login = conn.getresponse()
        login.read()
        assert login.status == 303
        conn.request("GET", "/api/runs", headers={"Authorization": "Bearer t+k&n#1"})
        res = conn.getresponse()
        assert res.status == 200
        assert [r["run_id"] for r in json.loads(res.read())["runs"]] == ["r"]
        # A stream is open when the signal comes: it must not hold the exit up.
        conn.request("GET", "/api/stream", headers={"Authorization": "Bearer t+k&n#1"})
        assert conn.getresponse().status == 200
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=15)
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopping" in out
    assert "Traceback" not in err


def test_a_units_page_is_a_bounded_number_of_reads(
    filled: fp.Ledger, target: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = filled.start_run("wf", scope_key=None, steps=STEPS, run_id="many", force=True)
    filled.reserve_attempts(run.run_id, [{"unit_id": f"x{i:02}", "step_id": "build"}
                                         for i in range(30)])  # fmt: skip
    # One unit failed 25 times: the page shows its newest ATTEMPTS_SHOWN.
    for _ in range(25):
        r = filled.reserve_attempt(run.run_id, "x00", step_id="build")
        filled.finish_attempt(run.run_id, "x00", r.attempt, r.dispatch_id, status="failed")
    calls: list[str] = []
    for name in ("attempts", "unit_attempts", "units", "events", "get_run"):
        original = getattr(fp.Ledger, name)

        def counted(self: fp.Ledger, *a: Any, _f: Any = original, _n: str = name, **k: Any) -> Any:
            # The server's own throughput counter reads on a thread of its own.
            if threading.current_thread().name != "fencepost-ui-throughput":
                calls.append(_n)
            return _f(self, *a, **k)

        monkeypatch.setattr(fp.Ledger, name, counted)
    with served(target, clock=clock) as srv:
        page = get_json(srv, "/api/units", run="many", limit=50)
    assert len(page["units"]) == 30
    history = page["units"][0]["history"]
    assert [a["attempt"] for a in history] == list(range(6, 26))
    assert sorted(calls) == ["get_run", "unit_attempts", "units"], calls


class _Counting:
    """A ledger hook (``fencepost._hooks``) that counts the operations the server makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def call(self, name: str, fn: Any, args: Any, kwargs: Any) -> Any:
        with self.lock:
            self.calls.append(name)
        return fn(*args, **kwargs)

    async def acall(self, name: str, fn: Any, args: Any, kwargs: Any) -> Any:  # pragma: no cover
        return await fn(*args, **kwargs)


PAGES = [
    "/api/meta", "/api/runs", "/api/run?id=big", "/api/run/totals?run=big&part=units",
    "/api/runs?name=wf&updated_after=2000-01-01T00:00:00Z&status=failed",
    "/api/find?prefix=b", "/api/unit?run=big&unit=u00000",
    "/api/units?run=big", "/api/units?run=big&status=failed",
    "/api/units?run=big&status=completed", "/api/leases", "/api/queue",
    "/api/queue?lane=later", "/api/retries", "/api/retries?kind=exhausted", "/api/schedules",
    "/api/events", "/api/events?run=big&after=0", "/api/throughput", "/api/doctor",
]  # fmt: skip


def test_every_page_is_a_bounded_number_of_reads(
    filled: fp.Ledger, target: str, clock: FakeClock
) -> None:
    """Each page makes the same number of ledger calls with ten times the data behind it."""
    from fencepost import _hooks

    def grow(n: int) -> None:
        run = filled.get_run("big") or filled.start_run(
            "wf", scope_key=None, steps=STEPS, run_id="big", force=True
        )
        for _ in range(n):
            clock.advance(1)
            filled.start_run("wf", scope_key=None, steps=STEPS, force=True)
        have = len(filled.units(run.run_id, limit=10_000))
        units = [{"unit_id": f"u{have + i:05}", "step_id": "build"} for i in range(n * 5)]
        got = filled.reserve_attempts(run.run_id, units)
        filled.finish_attempts([
            {"run_id": "big", "unit_id": r.unit_id, "attempt": r.attempt,
             "dispatch_id": r.dispatch_id, "status": "failed"}
            for r in got[::2]
        ])  # fmt: skip

    def reads() -> dict[str, int]:
        counts = {}
        counter = _Counting()
        with served(target, clock=clock) as srv:
            assert _hooks.hook is None
            _hooks.hook = counter
            try:
                for page in PAGES:
                    before = len(counter.calls)
                    answer = request(srv, page)
                    assert answer.status == 200, (page, answer.body)
                    counts[page] = len(counter.calls) - before
            finally:
                _hooks.hook = None
        return counts

    grow(10)
    small = reads()
    grow(100)
    large = reads()
    assert large == small
    assert max(small.values()) <= 6, small

"""The dashboard's pages (``fencepost ui``) on a large ledger: every JSON call a page makes,
through the real HTTP server over loopback, on SQLite and PostgreSQL. The budget is 200 ms
per page at a million attempts (``FENCEPOST_BENCH_ATTEMPTS=1000000``, what ``scripts/bench``
passes; CI's pass of the benches uses the small default, so it stays quick).

The ledger: half of the attempts in runs of 1 000 (two workflows, four scopes; one in four
cancelled, the rest live), the other half in one big run with three child runs, all written
with a clock that walks through the last hour (so the throughput page has an hour of events to
count), plus 10 runs claimed by a controller, 3 whose leases expired, and one taken over from
a dead owner whose stale heartbeat was refused. A page's time is that of its calls made at
once, as the browser makes them, each on a connection of its own; the server's memory of run
totals and throughput is cleared where a first view is what is timed. The reads a page makes
only on a click (a very large run's totals, a filter) are timed on their own.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from tests.conftest import pg_schema
from tests.uiserve import request, served

import fencepost as fp
from benches.bench_claims import queued
from benches.bench_scale import BATCH, PER_RUN, fill
from benches.conftest import Clock, label, plaintext
from fencepost.ui import DashboardServer, api, server

ATTEMPTS = int(os.environ.get("FENCEPOST_BENCH_ATTEMPTS", "20000"))
OWNED = 10
HOUR_MS = 3_600_000
BUDGET_S = 0.200


@dataclass
class Built:
    """A built ledger and the ids the pages read."""

    target: str
    attempts: int
    big_run: str
    middle_unit: str


def build(target: str, attempts: int) -> Built:
    """The ledger of the module's docstring. Progress goes to stderr."""
    clock = Clock()
    now = time.time_ns() // 1_000_000
    clock.now_ms = now - HOUR_MS - 120_000
    batches = max(1, attempts // BATCH)
    tick = HOUR_MS // batches
    started = time.monotonic()
    steps = [{"id": "s", "title": "Work"}, {"id": "t", "title": "Report"}]
    with fp.Ledger.open(target, clock=clock) as ledger:
        small_runs = (attempts // 2) // PER_RUN
        for i in range(small_runs):
            run_id = f"run-{i:05d}"
            ledger.start_run(
                f"bench/{'ab'[i % 2]}", scope_key=f"tenant-{i % 4}", steps=steps, run_id=run_id,
                params={"i": i}, force=True,
            )  # fmt: skip
            fill(ledger, run_id, PER_RUN, clock=clock, tick_ms=tick, worked=True)
            if i % 4 == 3:
                ledger.abandon_run(run_id)
            if i % max(1, small_runs // 10) == 0:
                sys.stderr.write(f"\rbuilding the ui ledger: run {i + 1} of {small_runs}\x1b[K")
        for i in range(OWNED):
            ledger.reserve_run(f"ctl-{i:02d}", **queued())
            ledger.claim(f"ctl-{i:02d}", "controller-1", lease_ms=24 * HOUR_MS)
        for i in range(3):
            ledger.reserve_run(f"lapsed-{i}", **queued())
            ledger.claim(f"lapsed-{i}", "controller-2", lease_ms=1_000)
        ledger.reserve_run("taken", **queued())
        dead = ledger.claim("taken", "controller-dead", lease_ms=1_000)
        assert dead is not None
        clock.now_ms += 2_000
        assert ledger.claim("taken", "controller-3", lease_ms=24 * HOUR_MS) is not None
        with contextlib.suppress(fp.LeaseLost):
            ledger.heartbeat(dead, lease_ms=1_000)
        ledger.start_run("bench/big", scope_key=None, steps=steps, run_id="big", force=True)
        for i in range(3):
            ledger.publish_child_run(
                "big", parent_unit_id=f"u{i:07d}", invocation_key=f"child-{i}",
                workflow_ref="bench/child", steps=[{"id": "s"}],
            )  # fmt: skip
        big = attempts - small_runs * PER_RUN
        fill(ledger, "big", big, clock=clock, tick_ms=tick, worked=True)
    took = time.monotonic() - started
    sys.stderr.write(f"\rbuilt the ui ledger: {attempts} attempts in {took:.0f} s\x1b[K\n")
    return Built(target, attempts, "big", f"u{big // 2:07d}")


# ------------------------------------------------------------------ the pages


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Built]:
    if request.param == "postgres":
        with pg_schema() as url:
            yield build(plaintext(url), ATTEMPTS)
        return
    yield build(str(tmp_path_factory.mktemp("ui") / "ui.db"), ATTEMPTS)


@pytest.fixture(scope="module")
def dash(built: Built) -> Iterator[DashboardServer]:
    with served(built.target, readers=server.READERS) as srv:
        yield srv


def _name(built: Built) -> str:
    backend = "postgres" if built.target.startswith("postgresql://") else "sqlite"
    return f"{backend} @{built.attempts // 1000}k"


def _page(dash: DashboardServer, *calls: str) -> list[bytes]:
    """A page's calls, made at once as the browser makes them; each must answer 200."""
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda path: request(dash, path), calls))
    for path, answer in zip(calls, answers, strict=True):
        assert answer.status == 200, (path, answer.body[:300])
    return [a.body for a in answers]


def _bench(benchmark: Any, built: Built, group: str, page: Any, setup: Any = None) -> None:
    label(benchmark, f"ui: {group}", _name(built), 1)
    benchmark.extra_info["budget_ms"] = BUDGET_S * 1000
    benchmark.pedantic(page, setup=setup, rounds=20, warmup_rounds=1)


def bench_ui_runs_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    _bench(benchmark, built, "runs, first page of 50", lambda: _page(dash, "/api/runs?limit=50"))


def bench_ui_runs_filtered(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    path = "/api/runs?limit=50&status=active&scope=tenant-1&workflow=bench/b"
    _bench(benchmark, built, "runs, status + scope + workflow", lambda: _page(dash, path))


def bench_ui_runs_later_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    # The cursor the dashboard hands out for the page that ends at the 200th run (at the
    # small scale of a CI pass, the second to last).
    with fp.Ledger.open(built.target) as ledger:
        skip = min(200, len(ledger.list_runs(limit=201)) - 1)
    cursor = request(dash, f"/api/runs?limit={skip}").json()["next"]
    assert cursor
    path = f"/api/runs?limit=50&after={urllib.parse.quote(cursor)}"
    _bench(benchmark, built, "runs, a page after 200 runs", lambda: _page(dash, path))


def _run_page(dash: DashboardServer, run_id: str, *, totals: bool, after: str = "") -> None:
    """What a run's page asks for: the run and a page of its units, and its two totals when
    the run is not so large that the page leaves them to a click; nothing remembered."""
    dash.dashboard.totals = api.RunTotals()
    calls = [f"/api/run?id={run_id}", f"/api/units?run={run_id}&limit=50&after={after}"]
    if totals:
        calls += [f"/api/run/totals?run={run_id}&part={part}" for part in ("units", "accounting")]
    _page(dash, *calls)


def bench_ui_run_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """A run of 1 000 attempts: the run, its units, both totals, side by side."""
    _bench(benchmark, built, "a run of 1 000 attempts",
           lambda: _run_page(dash, "run-00001", totals=True))  # fmt: skip


def bench_ui_big_run_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """The big run (half of the ledger's attempts): past the size where its totals are read
    on their own, so the page is the run and a page of its units, from its middle."""
    with fp.Ledger.open(built.target) as ledger:
        run = ledger.get_run(built.big_run)
        assert run is not None
    totals = run.revision <= api.TOTALS_AUTO_MAX_REVISION

    def page() -> None:
        _run_page(dash, built.big_run, totals=totals, after=built.middle_unit)

    _bench(benchmark, built, "the big run (units from its middle)", page)


def bench_ui_big_run_unit_counts(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """On a click: the big run's units counted by status (an aggregate over all of them)."""

    def counts() -> None:
        dash.dashboard.totals = api.RunTotals()
        _page(dash, f"/api/run/totals?run={built.big_run}&part=units")

    _bench(benchmark, built, "the big run: its unit counts (on a click)", counts)


def bench_ui_big_run_accounting(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """On a click: the big run's attempts and tokens added up (an aggregate over all of them)."""

    def accounting() -> None:
        dash.dashboard.totals = api.RunTotals()
        _page(dash, f"/api/run/totals?run={built.big_run}&part=accounting")

    _bench(benchmark, built, "the big run: its accounting (on a click)", accounting)


def bench_ui_units_rare_status(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """The big run's units of a status only its last 1 000 have: ``Ledger.units`` walks the
    run's units in order to find them (no index leads with the status), so this one grows with
    the run."""
    path = f"/api/units?run={built.big_run}&limit=50&status=running"
    _bench(benchmark, built, "a run: units of a rare status", lambda: _page(dash, path))


def bench_ui_leases_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    _bench(benchmark, built, "leases", lambda: _page(dash, "/api/leases?limit=50"))


def bench_ui_tail_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """The tail's backlog and its stream up to the first bytes (the log's head is one probe)."""

    def page() -> None:
        _page(dash, "/api/events?limit=50")
        host, port = dash.server_address[:2]
        conn = http.client.HTTPConnection(str(host), int(port), timeout=30)
        try:
            conn.request("GET", "/api/stream")
            res = conn.getresponse()
            assert res.status == 200
            assert res.fp.readline().startswith(b"retry:")
        finally:
            conn.close()

    def drained() -> None:
        # The stream of the round before ends when its server thread notices the close.
        deadline = time.monotonic() + 10
        while dash.dashboard.streams and time.monotonic() < deadline:
            time.sleep(0.01)

    _bench(benchmark, built, "live tail (backlog + stream open)", page, drained)


def bench_ui_throughput_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    """Events per minute over the hour from a fresh counter: every minute's boundary found by
    probes of the log's primary key, in one read (``Ledger.event_counts``); nothing is kept
    between views, so every view costs this."""

    def page() -> bytes:
        dash.dashboard.throughput = api.Throughput()
        return _page(dash, "/api/throughput")[0]

    _bench(benchmark, built, "throughput, counted from nothing", page)
    body = page()
    assert b'"total":' in body


def bench_ui_throughput_again(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    _bench(benchmark, built, "throughput, refreshed", lambda: _page(dash, "/api/throughput"))


def bench_ui_doctor_page(benchmark: Any, built: Built, dash: DashboardServer) -> None:
    _bench(benchmark, built, "doctor (without the whole-file checks)",
           lambda: _page(dash, "/api/doctor"))  # fmt: skip

"""Paged reads (``list_runs(status=, limit=, after=)``, ``units(limit=, after=)``), a run's unit
summary counted by the database (``unit_counts``), every lease in one read (``leases``), and
the command line's pages: every row once, in order, whatever changes between pages; bad page
arguments are ``InvalidArgument`` naming the keyword. That each read is served by an index is
checked on both backends by the Rust plan tests (``rust/conformance/reads.rs``)."""

from __future__ import annotations

import json
import pathlib
import typing

import pytest

import fencepost as fp
from tests.conftest import FakeClock, cli, started

STEPS = [{"id": "s"}]


def _runs(ledger: fp.Ledger, clock: FakeClock, n: int) -> list[str]:
    """``n`` top-level runs, one per millisecond, each third blocked and each fifth done."""
    ids = []
    for i in range(n):
        run = ledger.start_run("wf", scope_key=None, steps=STEPS, run_id=f"r{i:03}", force=True)
        if i % 3 == 0:
            ledger.block_run(run.run_id, notes="waiting")
        elif i % 5 == 0:
            ledger.complete_step(run.run_id, "s", status="completed")
        ids.append(run.run_id)
        clock.advance(1)
    return ids


def _pages(ledger: fp.Ledger, size: int, **filters: object) -> list[fp.Run]:
    seen: list[fp.Run] = []
    after = None
    while True:
        page = ledger.list_runs(limit=size, after=after, **filters)  # type: ignore[arg-type]
        assert len(page) <= size
        if not page:
            return seen
        seen.extend(page)
        after = page[-1]


def test_run_pages_return_every_run_once_newest_first(ledger: fp.Ledger, clock: FakeClock) -> None:
    _runs(ledger, clock, 40)
    everything = ledger.list_runs()
    assert len(everything) == 40
    assert [r.run_id for r in _pages(ledger, 7)] == [r.run_id for r in everything]
    blocked = _pages(ledger, 4, status="blocked")
    assert [r.run_id for r in blocked] == [r.run_id for r in everything if r.status == "blocked"]
    assert len(blocked) == 14
    # Several statuses are one order, paged across the seams between them.
    two = _pages(ledger, 3, status=["completed", "blocked"])
    assert [r.run_id for r in two] == [
        r.run_id for r in everything if r.status in ("completed", "blocked")
    ]
    # active_only and status must both hold.
    assert ledger.list_runs(active_only=True, status="blocked") == []
    assert {r.status for r in ledger.list_runs(active_only=True, limit=50)} == {"active"}


def test_runs_by_workflow_name_and_time_range_and_counted(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    _runs(ledger, clock, 30)
    for i in range(6):
        ledger.start_run("other@2", scope_key=None, steps=STEPS, run_id=f"o{i}", force=True)
        clock.advance(1)
    everything = ledger.list_runs()
    other = ledger.get_run("o0")
    assert other is not None
    # A workflow name: every status's range merged, paged across the seams.
    named = _pages(ledger, 4, workflow_name=other.workflow_name)
    assert [r.run_id for r in named] == [f"o{i}" for i in reversed(range(6))]
    first = everything[-1].workflow_name
    wf = _pages(ledger, 5, workflow_name=first, status="blocked")
    assert [r.run_id for r in wf] == [
        r.run_id for r in everything if r.status == "blocked" and r.workflow_name == first
    ]
    assert len(wf) == 10
    assert ledger.list_runs(workflow_name="nobody") == []
    # [updated_after, updated_before): by the runs' own times.
    times = sorted({r.updated_at for r in everything})
    since, until = times[5], times[20]
    window = _pages(ledger, 6, updated_after=since, updated_before=until)
    assert [r.run_id for r in window] == [
        r.run_id for r in everything if since <= r.updated_at < until
    ]
    for bad in (
        {"updated_after": since.replace(tzinfo=None)},
        {"updated_before": "2026-01-01"},
        {"updated_after": until, "updated_before": since},
    ):
        with pytest.raises(fp.InvalidArgument) as info:
            ledger.list_runs(**bad)  # type: ignore[arg-type]
        assert info.value.argument in ("updated_after", "updated_before")
    # Totals: every status, in lifecycle order, each counted up to count_max.
    counts = ledger.run_counts()
    assert list(counts) == list(typing.get_args(fp.RunStatus))
    assert counts["blocked"] == 10
    assert sum(counts.values()) == 36
    capped = ledger.run_counts(count_max=3)
    assert capped["blocked"] == 3
    assert capped["queued"] == 0
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.run_counts(count_max=-1)
    assert info.value.argument == "count_max"


def test_a_run_changed_between_pages_moves_up_and_the_cursor_holds(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    _runs(ledger, clock, 12)
    first = ledger.list_runs(limit=5)
    # The newest run on page one and an older one beyond it both change: they move to the
    # top (above the cursor); the next pages are the rest, each run once.
    ledger.set_outputs(first[0].run_id, {"x": 1})
    ledger.block_run("r001", notes="now")
    rest = _pages_after(ledger, first[-1])
    want = [r.run_id for r in ledger.list_runs() if r.run_id not in {x.run_id for x in first}]
    want.remove("r001")
    assert [r.run_id for r in rest] == want


def _pages_after(ledger: fp.Ledger, after: fp.Run) -> list[fp.Run]:
    seen: list[fp.Run] = []
    while page := ledger.list_runs(limit=3, after=after):
        seen.extend(page)
        after = page[-1]
    return seen


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"status": "done"}, "status"),
        ({"status": ["active", 7]}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": True}, "limit"),
        ({"after": "r001"}, "after"),
    ],
)
def test_bad_run_page_arguments_name_the_keyword(
    ledger: fp.Ledger, kwargs: dict[str, object], argument: str
) -> None:
    ledger.start_run("wf", scope_key=None, steps=STEPS, run_id="r001", force=True)
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.list_runs(**kwargs)  # type: ignore[arg-type]
    assert info.value.argument == argument


def test_unit_pages_and_counts(ledger: fp.Ledger, clock: FakeClock) -> None:
    claim = started(ledger, "run-1")
    units = [{"unit_id": f"u{i:02}", "step_id": "s"} for i in range(30)]
    res = ledger.reserve_attempts("run-1", units, claim=claim)
    finishes = [
        {
            "run_id": "run-1",
            "unit_id": r.unit_id,
            "attempt": r.attempt,
            "dispatch_id": r.dispatch_id,
            "status": "failed" if i % 4 == 0 else "completed",
        }
        for i, r in enumerate(res)
        if i % 3
    ]
    ledger.finish_attempts(finishes, claim=claim)
    everything = ledger.units("run-1")
    assert len(everything) == 30
    seen: list[str] = []
    after = None
    while page := ledger.units("run-1", limit=4, after=after):
        seen.extend(u.unit_id for u in page)
        after = page[-1].unit_id
    assert seen == [u.unit_id for u in everything]
    # A unit keeps its place: a retried unit stays where it was first reserved.
    clock.advance(5)
    assert everything[4].status == "failed"
    ledger.reserve_attempt("run-1", everything[4].unit_id, step_id="s", claim=claim)
    now = ledger.units("run-1")
    assert [u.unit_id for u in now] == seen
    failed = ledger.units("run-1", status="failed", limit=100)
    assert [u.unit_id for u in failed] == [u.unit_id for u in now if u.status == "failed"]
    assert len(failed) == 4
    counts = ledger.unit_counts("run-1")
    assert list(counts) == list(fp._core.UNIT_STATUSES)
    statuses = [u.status for u in now]
    assert counts == {s: statuses.count(s) for s in fp._core.UNIT_STATUSES}
    assert counts["running"] == 11
    assert counts["pending"] == 0
    with pytest.raises(fp.RunNotFound):
        ledger.unit_counts("nope")
    for kwargs, argument in [
        ({"after": "u99"}, "after"),
        ({"status": "done"}, "status"),
        ({"limit": 0}, "limit"),
    ]:
        with pytest.raises(fp.InvalidArgument) as info:
            ledger.units("run-1", **kwargs)  # type: ignore[arg-type]
        assert info.value.argument == argument


def test_leases_in_one_read(ledger: fp.Ledger, clock: FakeClock) -> None:
    ledger.start_run("wf", scope_key=None, steps=STEPS, run_id="plain", force=True)
    clock.advance(1)
    started(ledger, "q1")
    clock.advance(1)
    c2 = started(ledger, "q2")
    ledger.release(c2)
    everything = ledger.leases()
    assert [le.run_id for le in everything] == [r.run_id for r in ledger.list_runs()]
    assert [le.run_id for le in everything] == ["q2", "q1", "plain"]
    assert everything == [ledger.lease(r) for r in ("q2", "q1", "plain")]
    owned = ledger.leases(owned_only=True)
    assert [(le.run_id, le.owner_id) for le in owned] == [("q1", "host-a")]
    # Past its expiry the lease is listed as expired on an active run.
    clock.advance(10_001)
    assert [le.run_id for le in ledger.expired_leases(active_only=True)] == ["q1"]
    ledger.block_run("q1", notes="stuck")
    assert ledger.expired_leases(active_only=True) == []
    assert [le.run_id for le in ledger.expired_leases()] == ["q1"]


def test_cli_pages_and_says_when_there_is_more(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "pages.db"
    with fp.Ledger.open(str(db)) as ledger:
        for i in range(5):
            ledger.start_run("wf", scope_key=None, steps=STEPS, run_id=f"r{i}", force=True)
        ledger.block_run("r2", notes="x")
    first = cli("runs", "--db", str(db), "--json", "--limit", "2")
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    assert len(page) == 2
    assert f"--after {page[-1]['run_id']}" in first.stderr
    second = cli("runs", "--db", str(db), "--json", "--limit", "2", "--after", page[-1]["run_id"])
    assert [r["run_id"] for r in json.loads(second.stdout)] != [r["run_id"] for r in page]
    blocked = cli("runs", "--db", str(db), "--json", "--status", "blocked")
    assert [r["run_id"] for r in json.loads(blocked.stdout)] == ["r2"]
    assert blocked.stderr == ""
    too_big = cli("runs", "--db", str(db), "--limit", "10001")
    assert too_big.returncode == 2
    assert "at most 10000" in too_big.stderr
    # events: a full page says how to read on; the last page says nothing.
    events = cli("events", "--db", str(db), "--json", "--limit", "3")
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert len(lines) == 3
    assert f"--after {lines[-1]['seq']}" in events.stderr
    total = len(cli("events", "--db", str(db), "--json").stdout.splitlines())
    exact = cli("events", "--db", str(db), "--json", "--limit", str(total))
    assert exact.stderr == ""
    show = cli("show", "--db", str(db), "--json", "r0")
    assert json.loads(show.stdout)["units"] == {"total": 0, "by_status": {}}
    leases = cli("leases", "--db", str(db), "--json")
    runs = cli("runs", "--db", str(db), "--json", "--children")
    assert [le["run_id"] for le in json.loads(leases.stdout)] == [
        r["run_id"] for r in json.loads(runs.stdout)
    ]

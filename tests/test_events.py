"""The event log (``events``): paged by the global ``seq``, filtered by run and type, and
append-only, which each database enforces itself (an UPDATE or DELETE of an event fails, and
TRUNCATE on PostgreSQL), so a ``seq`` a reader has seen keeps its meaning."""

from __future__ import annotations

import datetime as dt
import pathlib
import sqlite3

import psycopg
import pytest

import fencepost as fp
from tests.conftest import STEPS, FakeClock, pg_connect, pg_schema, raw_db


def test_events_paging_and_filters(ledger: fp.Ledger, run: fp.Run) -> None:
    for i in range(30):
        ledger.reserve_attempt(run.run_id, f"u{i}", step_id="build")
    events = ledger.events(run.run_id)
    assert len(events) == 31
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    page1 = ledger.events(run.run_id, limit=10)
    page2 = ledger.events(run.run_id, after_seq=page1[-1].seq, limit=10)
    assert [e.seq for e in page1 + page2] == [e.seq for e in events[:20]]
    other = ledger.start_run("wf/x", scope_key="t", steps=STEPS)
    assert [e.resource_id for e in ledger.events()][-1] == other.run_id
    assert len(ledger.events(types=["run.started"])) == 2
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.events(limit=0)
    assert info.value.argument == "limit"


def test_events_are_append_only_in_sqlite(tmp_path: pathlib.Path) -> None:
    # Outside prune no event row can be deleted or changed; prune's deletes never free a seq
    # for reuse (test_prune.py).
    path = tmp_path / "ledger.db"
    with fp.Ledger.open(str(path)) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
    with raw_db(path) as db:
        for statement in ("DELETE FROM events", "UPDATE events SET type = 'x'"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(statement)
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 1


def test_events_are_append_only_in_postgresql() -> None:
    with pg_schema() as url:
        with fp.Ledger.open(url) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        with pg_connect(url) as conn:
            for statement in (
                "DELETE FROM events",
                "UPDATE events SET type = 'x'",
                "TRUNCATE events",
            ):
                with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                    conn.execute(statement)
            assert conn.execute("SELECT count(*) FROM events").fetchone() == (1,)


def test_event_counts_per_minute_exact_and_by_position(ledger: fp.Ledger, clock: FakeClock) -> None:
    minute = 60_000
    start = (clock.now // minute) * minute
    per_minute = [3, 0, 5, 1, 8, 2]
    run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
    clock.now = start
    first = ledger.newest_event_seq()
    for m, n in enumerate(per_minute):
        clock.now = start + m * minute + 1_000
        for i in range(n):
            ledger.reserve_attempt(run.run_id, f"m{m}-{i}", step_id="s")
    since = fp.models.from_ms(start)
    exact = ledger.event_counts(since=since, minutes=6)
    assert exact.exact
    assert [c for _, c in exact.minutes] == [1 + per_minute[0], *per_minute[1:]]
    assert [t for t, _ in exact.minutes] == [
        fp.models.from_ms(start + m * minute) for m in range(6)
    ]
    # Counted by position (what a busy range gets): the same counts, found by probes.
    probed = ledger.event_counts(since=since, minutes=6, exact_max=0)
    assert not probed.exact
    assert probed.minutes == exact.minutes
    assert probed.total == exact.total == ledger.newest_event_seq() - first + 1
    # By default the last minutes by the ledger's clock, the current one included.
    latest = ledger.event_counts(minutes=2)
    assert [c for _, c in latest.minutes] == per_minute[-2:]
    for kw, argument in (
        ({"minutes": 0}, "minutes"),
        ({"minutes": 1441}, "minutes"),
        ({"exact_max": -1}, "exact_max"),
        ({"since": dt.datetime(2026, 1, 1)}, "since"),
    ):
        with pytest.raises(fp.InvalidArgument) as bad:
            ledger.event_counts(**kw)
        assert bad.value.argument == argument

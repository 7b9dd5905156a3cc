"""The event log (``events``): paged by the global ``seq``, filtered by run and type, and
append-only, which each database enforces itself (an UPDATE or DELETE of an event fails, and
TRUNCATE on PostgreSQL), so a ``seq`` a reader has seen keeps its meaning."""

from __future__ import annotations

import pathlib
import sqlite3

import psycopg
import pytest

import fencepost as fp
from tests.conftest import STEPS, pg_connect, pg_schema, raw_db


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

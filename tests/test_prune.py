"""Ledger.prune and Ledger.restore on both backends: which trees go, the archive round trip row
for row, refusals that write nothing, the SQLite file shrinking, and the CLI."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import pathlib
import sqlite3
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, cli, counts, raw_db

DAY = dt.timedelta(days=1)
TABLES = {
    "blobs": "digest",
    "definitions": "definition_digest",
    "runs": "run_id",
    "steps": "run_id, step_id",
    "units": "run_id, unit_id",
    "attempts": "run_id, unit_id, attempt",
    "leases": "resource_id",
    "events": "seq",  # restored events keep their seq
    "messages": "run_id, seq",
    "pruning": "run_id",
}


def dump(target: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, as stored (bytes as bytes)."""
    with raw_db(target) as db:
        return {
            t: [
                tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in db.execute(f"SELECT * FROM {t} ORDER BY {order}").fetchall()
            ]
            for t, order in TABLES.items()
        }


def begin(ledger: fp.Ledger, run_id: str, parent: str | None = None) -> None:
    """A run, or the child of ``parent``, sharing one params blob with the others."""
    if parent is None:
        ledger.start_run(
            "wf", scope_key=None, steps=[{"id": "s"}], run_id=run_id, force=True,
            params={"shared": True},
        )  # fmt: skip
    else:
        ledger.publish_child_run(
            parent, parent_unit_id="u0", invocation_key=run_id, workflow_ref="child",
            steps=[{"id": "s"}], run_id=run_id, params={"shared": True},
        )  # fmt: skip


def work(ledger: fp.Ledger, run_id: str, units: int) -> None:
    """``units`` attempts reserved and finished."""
    got = ledger.reserve_attempts(
        run_id, [{"unit_id": f"u{i}", "step_id": "s"} for i in range(units)]
    )
    finishes = [
        {"run_id": run_id, "unit_id": r.unit_id, "attempt": r.attempt,
         "dispatch_id": r.dispatch_id, "status": "completed", "result": {"i": i}}
        for i, r in enumerate(got)
    ]  # fmt: skip
    ledger.finish_attempts(finishes)


def finished(ledger: fp.Ledger, run_id: str, *, units: int = 3) -> None:
    """A run with ``units`` finished attempts, cancelled."""
    begin(ledger, run_id)
    work(ledger, run_id, units)
    assert ledger.abandon_run(run_id)


def history(ledger: fp.Ledger, clock: FakeClock) -> None:
    """old (with two children) and lone finished 40 days ago; kept (a live child) likewise;
    young finished 10 days ago; active never finished (and holds the newest event)."""
    begin(ledger, "old")
    ledger.send("old", "approval", {"ok": True}, key="k")
    ledger.send("old", "approval", {"ok": False})
    for child in ("old-a", "old-b"):
        begin(ledger, child, parent="old")
        work(ledger, child, 3)
        assert ledger.abandon_run(child)
    work(ledger, "old", 3)
    assert ledger.abandon_run("old")
    finished(ledger, "lone", units=5)
    begin(ledger, "kept")
    begin(ledger, "kept-live", parent="kept")
    assert ledger.abandon_run("kept", cascade=False)
    clock.advance(30 * 86_400_000)
    finished(ledger, "young")
    clock.advance(10 * 86_400_000)
    begin(ledger, "active")
    work(ledger, "active", 2)


def test_prune_removes_whole_old_terminal_trees_only(target: str, clock: FakeClock) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
        kept_events = {r: len(ledger.events(r)) for r in ("kept", "young", "active")}
        gone_events = sum(len(ledger.events(r)) for r in ("old", "old-a", "old-b", "lone"))
        seen: list[fp.PruneReport] = []
        report = ledger.prune(older_than=30 * DAY, progress=seen.append)
        assert (report.runs, report.attempts, report.dry_run) == (4, 3 + 3 + 3 + 5, False)
        assert report.events == gone_events
        assert seen
        assert seen[-1].runs == report.runs
        for gone in ("old", "old-a", "old-b", "lone"):
            assert ledger.get_run(gone) is None
            assert ledger.events(gone) == []
        for kept, n in kept_events.items():
            assert len(ledger.events(kept)) == n
        assert ledger.get_run("kept-live") is not None
        # The params blob is still referred to by young: it stays.
        assert ledger.get_json(fp.digest({"shared": True})) == {"shared": True}
        # Only old runs' rows went: nothing of young or active is missing.
        assert len(ledger.units("young")) == 3
        assert len(ledger.units("active")) == 2
        assert ledger.prune(older_than=30 * DAY).runs == 0
        # A cutoff as an aware datetime; statuses narrow what goes.
        cutoff = fp.models.from_ms(clock()) + DAY
        assert ledger.prune(older_than=cutoff, statuses="completed").runs == 0
        assert ledger.prune(older_than=cutoff, statuses=["cancelled"], limit=1).runs == 1
    with raw_db(target) as db:
        assert db.execute("SELECT count(*) FROM pruning").fetchone()[0] == 0
        left = db.execute(
            "SELECT count(*) FROM events WHERE substr(resource_id, 1, 3) = 'old'"
        ).fetchone()
        assert left[0] == 0


def newest_seq(ledger: fp.Ledger) -> int:
    """The newest ``seq`` in the log (0 for an empty one), paging as a follower does."""
    seq = 0
    while page := ledger.events(after_seq=seq):
        seq = page[-1].seq
    return seq


def test_a_ledger_whose_last_activity_was_one_tree_prunes_to_empty(
    target: str, clock: FakeClock
) -> None:
    """A batch job's ledger: its newest event is in the last tree to finish, and that tree
    goes with the rest; the next event is still numbered above every ``seq`` handed out, so a
    follower whose cursor reached the old newest event sees it."""
    with fp.Ledger.open(target, clock=clock) as ledger:
        finished(ledger, "first")
        finished(ledger, "last")
        newest = newest_seq(ledger)
        clock.advance(2 * 86_400_000)
        report = ledger.prune(older_than=DAY)
        assert (report.runs, report.attempts) == (2, 6)
    assert {t: rows for t, rows in dump(target).items() if rows} == {}
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.events() == []
        begin(ledger, "next")
        seen = ledger.events(after_seq=newest)
        assert [e.resource_id for e in seen] == ["next"]
        assert seen[0].seq > newest
        assert ledger.wait_events(after_seq=newest, timeout_s=5) == seen
        # The next tree to hold the newest event goes too, and its numbers stay used.
        assert ledger.abandon_run("next")
        newest = newest_seq(ledger)
        clock.advance(2 * 86_400_000)
        assert ledger.prune(older_than=DAY).runs == 1
        begin(ledger, "after")
        seen = ledger.events(after_seq=newest)
        assert [e.resource_id for e in seen] == ["after"]
        assert seen[0].seq > newest


def test_the_demo_ledger_prunes_to_empty(
    demo: tuple[pathlib.Path, dict[str, Any], str], tmp_path: pathlib.Path
) -> None:
    source, _, _ = demo
    path = tmp_path / "demo.db"
    path.write_bytes(source.read_bytes())  # the demo's ledger is closed: no -wal to copy
    runs = len(dump(str(path))["runs"])
    with fp.Ledger.open(str(path)) as ledger:
        newest = newest_seq(ledger)
    assert runs > 0
    archive = tmp_path / "a.gz"
    done = cli(
        "prune", "--db", str(path), "--older-than", "0s", "--archive", str(archive), "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"] == runs
    assert {t: rows for t, rows in dump(str(path)).items() if rows} == {}
    with fp.Ledger.open(str(path)) as ledger:
        begin(ledger, "next")
        assert [e.seq > newest for e in ledger.events(after_seq=newest)] == [True]


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "stream"])
def test_archive_then_restore_round_trips_every_row(
    target: str, clock: FakeClock, tmp_path: pathlib.Path, kind: str
) -> None:
    # The raw reads happen with the ledger closed: a second SQLite library in this process
    # would release fencepost's file locks when its connection closes.
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
    before = dump(target)
    archive: Any = io.BytesIO() if kind == "stream" else tmp_path / f"a.{kind}"
    with fp.Ledger.open(target, clock=clock) as ledger:
        report = ledger.prune(older_than=30 * DAY, archive=archive)
    assert report.runs == 4
    assert report.archived_bytes > 0
    assert dump(target) != before
    if kind == "stream":
        archive.seek(0)
    else:
        assert archive.read_bytes().startswith(b"\x1f\x8b") == kind.endswith(".gz")
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.restore(archive) == 4
    assert dump(target) == before
    if kind == "stream":
        archive.seek(0)
    with fp.Ledger.open(target, clock=clock) as ledger:
        with pytest.raises(fp.InvalidArgument, match="exist") as refused:
            ledger.restore(archive)
        assert refused.value.argument == "archive"
    assert dump(target) == before


def test_restore_refuses_truncated_and_foreign_files(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "a.jsonl"
    zipped = tmp_path / "a.jsonl.gz"
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
        ledger.prune(older_than=30 * DAY, archive=path)
    lines = path.read_bytes().splitlines(keepends=True)
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    bad: dict[str, bytes] = {
        "no trailer": b"".join(lines[:-1]),
        "cut mid-line": path.read_bytes()[:-30],
        "cut gzip": zipped.read_bytes()[:-40],
        "no header": b"".join(lines[1:]),
        "foreign json": b'{"hello": "world"}\n',
        "not json": b"id,name\n1,x\n",
        "empty": b"",
        "tampered": path.read_bytes().replace(b'"completed"', b'"complete"', 1),
        "tampered blob": path.read_bytes().replace(b'{\\"shared\\":true}', b'{\\"shared\\":1}', 1),
    }
    before = counts(target)
    for name, data in bad.items():
        f = tmp_path / f"bad-{name.replace(' ', '-')}"
        f.write_bytes(data)
        with fp.Ledger.open(target, clock=clock) as ledger, pytest.raises(fp.InvalidArgument) as e:
            ledger.restore(f)
        assert e.value.argument == "archive", name
        assert "nothing was restored" in str(e.value), name
        assert counts(target) == before, name
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.restore(zipped) == 4


BAD_PRUNES: list[tuple[dict[str, Any], str]] = [
    ({"older_than": dt.datetime(2020, 1, 1)}, "older_than"),  # naive on purpose
    ({"older_than": -DAY}, "older_than"),
    ({"older_than": 30}, "older_than"),
    ({"older_than": DAY, "statuses": ["finished"]}, "statuses"),
    ({"older_than": DAY, "statuses": ["active"]}, "statuses"),
    ({"older_than": DAY, "statuses": "queued"}, "statuses"),
    ({"older_than": DAY, "statuses": []}, "statuses"),
    ({"older_than": DAY, "limit": 0}, "limit"),
    ({"older_than": DAY, "limit": -3}, "limit"),
    ({"older_than": DAY, "archive": 42}, "archive"),
]


@pytest.mark.parametrize(("kwargs", "argument"), BAD_PRUNES)
def test_bad_prune_arguments_write_nothing(
    target: str, clock: FakeClock, kwargs: dict[str, Any], argument: str
) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
    before = dump(target)
    with fp.Ledger.open(target, clock=clock) as ledger:
        with pytest.raises(fp.InvalidArgument) as e:
            ledger.prune(**kwargs)
        assert e.value.argument == argument
    assert dump(target) == before


def test_an_existing_archive_is_never_overwritten(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"precious\n")
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
    before = dump(target)
    with fp.Ledger.open(target, clock=clock) as ledger:
        with pytest.raises(fp.InvalidArgument, match="exists") as e:
            ledger.prune(older_than=30 * DAY, archive=path)
        assert e.value.argument == "archive"
    assert dump(target) == before
    assert path.read_bytes() == b"precious\n"


def test_a_dry_run_counts_and_changes_nothing(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "dry.jsonl.gz"
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
    before = dump(target)
    with fp.Ledger.open(target, clock=clock) as ledger:
        dry = ledger.prune(older_than=30 * DAY, dry_run=True, archive=path)
    assert dump(target) == before
    assert not path.exists()
    with fp.Ledger.open(target, clock=clock) as ledger:
        real = ledger.prune(older_than=30 * DAY, archive=tmp_path / "real.jsonl")
        assert dry.dry_run
        assert not real.dry_run
        assert (dry.runs, dry.attempts, dry.events) == (real.runs, real.attempts, real.events)
        assert dry.archived_bytes == real.archived_bytes


def test_an_archive_sink_that_fails_deletes_nothing(target: str, clock: FakeClock) -> None:
    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            raise OSError(28, "No space left on device")

    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
    before = dump(target)
    with fp.Ledger.open(target, clock=clock) as ledger, pytest.raises(OSError, match="No space"):
        ledger.prune(older_than=30 * DAY, archive=Full())
    assert dump(target) == before


def test_events_stay_append_only_for_everyone_else(target: str, clock: FakeClock) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        history(ledger, clock)
    for sql in (
        "DELETE FROM events WHERE resource_id = 'old'",
        "DELETE FROM events WHERE resource_id = 'active'",
        "UPDATE events SET type = 'x' WHERE resource_id = 'old'",
        "INSERT INTO pruning (run_id) VALUES ('active')",
    ):
        with (
            pytest.raises(Exception, match=r"append-only|only a terminal run"),
            raw_db(target) as db,
        ):
            db.execute(sql)


def test_a_new_sqlite_file_shrinks_after_a_prune(tmp_path: pathlib.Path, clock: FakeClock) -> None:
    path = tmp_path / "shrink.db"
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        for i in range(40):
            finished(ledger, f"r{i}", units=200)
        clock.advance(40 * 86_400_000)
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="now", force=True)
    big = path.stat().st_size
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        report = ledger.prune(older_than=30 * DAY)
        assert report.attempts == 40 * 200
    small = path.stat().st_size
    assert small < big / 3, (big, small)
    # What the report says was given back is what the file lost, in a few short transactions
    # (many pages each: not one transaction per page).
    assert report.reclaimed_bytes >= (big - small) * 0.9, (report, big, small)
    assert report.transactions < 40, report
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        dry = ledger.prune(older_than=0 * DAY, dry_run=True)
        assert dry.reclaimed_bytes == 0


def test_doctor_vacuum_lets_an_old_file_shrink(tmp_path: pathlib.Path, clock: FakeClock) -> None:
    path = tmp_path / "old.db"
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        finished(ledger, "r0")
    # A file made before incremental auto-vacuum: rewritten without it.
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA auto_vacuum = NONE")
        db.execute("VACUUM")
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    done = cli("doctor", "--vacuum", "--db", str(path))
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2


def test_cli_prune_and_restore(tmp_path: pathlib.Path, clock: FakeClock) -> None:
    path = tmp_path / "cli.db"
    archive = tmp_path / "old.jsonl.gz"
    with fp.Ledger.open(str(path), clock=clock) as ledger:
        history(ledger, clock)
    before = dump(str(path))
    dry = cli("prune", "--db", str(path), "--older-than", "1d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True
    # The CLI reads the system clock: every fake-clock run is over a day old (active, never
    # finished, stays).
    done = cli("prune", "--db", str(path), "--older-than", "1d", "--archive", str(archive))
    assert done.returncode == 0, done.stderr
    assert "pruned" in done.stdout
    assert archive.exists()
    back = cli("restore", "--db", str(path), str(archive))
    assert back.returncode == 0, back.stderr
    assert "restored" in back.stdout
    assert dump(str(path)) == before
    for bad in (["--older-than", "30x"], ["--older-than", "-3d"], []):
        refused = cli("prune", "--db", str(path), *bad)
        assert refused.returncode == 2, bad


def test_async_prune_and_restore(target: str, clock: FakeClock, tmp_path: pathlib.Path) -> None:
    import asyncio

    from fencepost.aio import AsyncLedger

    async def main() -> tuple[fp.PruneReport, int]:
        async with await AsyncLedger.open(target, clock=clock) as ledger:
            await asyncio.to_thread(history, ledger.ledger, clock)
            report = await ledger.prune(older_than=30 * DAY, archive=tmp_path / "a.jsonl")
            return report, await ledger.restore(tmp_path / "a.jsonl")

    report, restored = asyncio.run(main())
    assert report.runs == restored == 4


def test_the_fence_counts_and_trace_context_travel_and_older_archives_restore(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    """A lease's takeovers and refused writes and an attempt's trace context go into the
    archive and come back; an archive written before those columns existed (its header and
    rows without them) restores with the values the migration gave older rows."""
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with fp.Ledger.open(target, clock=clock) as ledger:
        begin(ledger, "fenced")
        a = ledger.claim("fenced", "host:a", lease_ms=1000)
        assert a is not None
        ledger.reserve_attempt("fenced", "u1", step_id="s", claim=a, trace_context=tp)
        ledger.send("fenced", "go", [1], key="once")
        ledger.send("fenced", "go", [2])
        assert [m.payload for m in ledger.receive("fenced", "go", claim=a)] == [[1]]
        clock.advance(2000)
        assert ledger.claim("fenced", "host:b", lease_ms=1000) is not None
        with pytest.raises(fp.LeaseLost):
            ledger.heartbeat(a, lease_ms=1000)
        assert ledger.abandon_run("fenced")
        clock.advance(40 * 86_400_000)
        assert ledger.prune(older_than=30 * DAY, archive=tmp_path / "new.jsonl").runs == 1
    lines = [json.loads(x) for x in (tmp_path / "new.jsonl").read_text().splitlines()]
    header = lines[0]
    assert header["tables"]["leases"][-3:] == ["takeovers", "refused_writes", "run_ended"]
    assert header["tables"]["attempts"][-1] == "trace_context"
    assert header["tables"]["runs"][-4:] == [
        "not_before",
        "priority",
        "concurrency_key",
        "retry_policy",
    ]
    assert header["tables"]["steps"][-1] == "retry_policy"
    assert header["tables"]["units"][-1] == "retry_at"
    assert header["tables"]["messages"][0:2] == ["run_id", "seq"]
    assert [m[4] for m in lines[1]["messages"]] == ["[1]", "[2]"]
    # The same archive as a library before schema 6 wrote it (and before messages).
    old = [dict(line) for line in lines]
    old[0] = {**old[0], "tables": {k: v for k, v in header["tables"].items() if k != "messages"}}
    for line in old[1:-1]:
        del line["messages"]
    cut = {"leases": 3, "attempts": 1, "runs": 4, "steps": 1, "units": 1}
    old[0] = {
        **old[0],
        "tables": {
            **old[0]["tables"],
            **{table: header["tables"][table][:-n] for table, n in cut.items()},
        },
    }
    for line in old[1:-1]:
        for table, n in cut.items():
            line[table] = [row[:-n] for row in line[table]]
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(x) + "\n" for x in old))

    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.restore(tmp_path / "new.jsonl") == 1
        lease = ledger.lease("fenced")
        assert (lease.takeovers, lease.refused_writes) == (1, 1)
        assert ledger.attempts("fenced", "u1")[0].trace_context == tp
        taken, waiting = ledger.messages("fenced")
        assert (taken.key, taken.consumed_generation, waiting.consumed_at) == ("once", 1, None)
        ledger.prune(older_than=30 * DAY)
        assert ledger.restore(tmp_path / "old.jsonl") == 1
        lease = ledger.lease("fenced")
        assert (lease.generation, lease.takeovers, lease.refused_writes) == (2, 0, 0)
        (attempt,) = ledger.attempts("fenced", "u1")
        assert (attempt.status, attempt.trace_context) == ("cancelled", None)
        assert ledger.messages("fenced") == []
    # A header missing a column that was not added later is still refused.
    worse = [dict(x) for x in old]
    worse[0] = {**old[0], "tables": {**old[0]["tables"], "runs": old[0]["tables"]["runs"][:-1]}}
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(x) + "\n" for x in worse))
    with fp.Ledger.open(target, clock=clock) as ledger, pytest.raises(fp.InvalidArgument) as e:
        ledger.restore(tmp_path / "bad.jsonl")
    assert "runs columns differ" in str(e.value)

"""Ledger.restore trusts no archive, on both backends: every hostile or damaged archive is
refused with ``InvalidArgument`` naming what is wrong and leaves every table exactly as it was
(the whole restore is one transaction), a restore killed with ``kill -9`` part way leaves the
ledger as it was, a line longer than the bound is refused without being read whole, and the
event log goes on numbering above every restored seq."""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, fresh_target, raw_db
from tests.processes import kill_mid_flight
from tests.test_prune import DAY, begin, dump, finished, history, work

Lines = list[dict[str, Any]]
COLUMNS: dict[str, list[str]] = {}


def col(table: str, column: str) -> int:
    return COLUMNS[table].index(column)


def cell(line: dict[str, Any], table: str, column: str, row: int = 0) -> Any:
    return line[table][row][col(table, column)]


def put(line: dict[str, Any], table: str, column: str, value: Any, row: int = 0) -> None:
    line[table][row][col(table, column)] = value


def last(lines: Lines) -> dict[str, Any]:
    """The last tree line (the one before the trailer)."""
    return lines[-2]


def live_seq(target: str) -> int:
    with raw_db(target) as db:
        return int(db.execute("SELECT max(seq) FROM events").fetchone()[0])


def live_dispatch_id(target: str) -> str:
    with raw_db(target) as db:
        return str(db.execute("SELECT min(dispatch_id) FROM attempts").fetchone()[0])


def renamed(line: dict[str, Any], to: str) -> dict[str, Any]:
    """The tree line with its root's run id replaced everywhere by ``to``."""
    root = line["tree"]
    return dict(json.loads(json.dumps(line).replace(f'"{root}"', f'"{to}"')))


# Each case edits the parsed archive (header, tree lines, trailer) and names a text the refusal
# must hold: the field, or what is wrong. The target is given for cases that reach into the
# ledger's own rows.
Edit = Callable[[Lines, str], Any]
CASES: list[tuple[str, Edit, str]] = [
    # What an insert used to find first, after earlier trees were written.
    (
        "two events share a seq",
        lambda ls, t: put(last(ls), "events", "seq", cell(last(ls), "events", "seq", 1)),
        "events.seq",
    ),
    (
        "a seq the ledger holds",
        lambda ls, t: put(last(ls), "events", "seq", live_seq(t)),
        "events.seq",
    ),
    (
        "a dispatch id the ledger holds",
        lambda ls, t: put(last(ls), "attempts", "dispatch_id", live_dispatch_id(t)),
        "attempts.dispatch_id",
    ),
    (
        "a dispatch id twice",
        lambda ls, t: put(
            last(ls), "attempts", "dispatch_id", cell(ls[1], "attempts", "dispatch_id")
        ),
        "attempts.dispatch_id",
    ),
    (
        "an idempotency key twice",
        lambda ls, t: [
            put(ls[1], "events", "idempotency_key", "k"),
            put(last(ls), "events", "idempotency_key", "k"),
        ],
        "events.idempotency_key",
    ),
    ("a removed blob row", lambda ls, t: last(ls).update(blobs=[]), "has no blob"),
    (
        "a params digest without its blob",
        lambda ls, t: put(last(ls), "runs", "params", "sha256:" + "0" * 64),
        "runs.params",
    ),
    (
        "a definition without its blob",
        lambda ls, t: [
            last(ls)["definitions"].append(["sha256:" + "1" * 64, "wf", 1]),
        ],
        "definitions.definition_digest",
    ),
    (
        "a digest that is not one",
        lambda ls, t: put(last(ls), "runs", "params", "sha256:xyz"),
        "runs.params",
    ),
    # Rows the database's constraints refuse, which used to surface as raw store errors.
    (
        "active with completed_at",
        lambda ls, t: put(last(ls), "runs", "status", "active"),
        "runs.completed_at",
    ),
    (
        "a live run",
        lambda ls, t: [
            put(last(ls), "runs", "status", "active"),
            put(last(ls), "runs", "completed_at", None),
        ],
        "only finished runs",
    ),
    (
        "a running attempt with finished_at",
        lambda ls, t: put(last(ls), "attempts", "status", "running"),
        "attempts.finished_at",
    ),
    ("tokens -5", lambda ls, t: put(last(ls), "attempts", "tokens", -5), "attempts.tokens"),
    ("guarded 2", lambda ls, t: put(last(ls), "runs", "guarded", 2), "runs.guarded"),
    (
        "text in an integer column",
        lambda ls, t: put(last(ls), "runs", "guarded", "1"),
        "runs.guarded",
    ),
    (
        "an integer in a text column",
        lambda ls, t: put(last(ls), "runs", "workflow_ref", 7),
        "runs.workflow_ref",
    ),
    (
        "NULL where the ledger never writes it",
        lambda ls, t: put(last(ls), "runs", "workflow_name", None),
        "runs.workflow_name",
    ),
    (
        "a status the ledger never writes",
        lambda ls, t: put(last(ls), "units", "status", "complete"),
        "units.status",
    ),
    (
        "a lease with half an owner",
        lambda ls, t: last(ls)["leases"].append(
            [last(ls)["tree"], 1, None, "host:x", None, None, None, None, 0, 0, 1]
        ),
        "owner",
    ),
    # Values the ledger never writes, which used to be stored.
    (
        "non-JSON result",
        lambda ls, t: put(last(ls), "attempts", "result", "not json"),
        "attempts.result",
    ),
    (
        "a lone surrogate",
        lambda ls, t: put(last(ls), "attempts", "result", '"\\ud800"'),
        "attempts.result",
    ),
    (
        "non-canonical JSON",
        lambda ls, t: put(last(ls), "attempts", "result", '{"b":1,"a":2}'),
        "attempts.result",
    ),
    (
        "a number written twice over",
        lambda ls, t: put(last(ls), "events", "payload", '{"n":1.0}'),
        "events.payload",
    ),
    (
        "a blob that is not canonical",
        lambda ls, t: last(ls)["blobs"].append([_digest_of(b'{ "a": 1 }'), '{ "a": 1 }', 1]),
        "blobs.bytes",
    ),
    (
        "a workflow_ref of 5000 characters",
        lambda ls, t: put(last(ls), "runs", "workflow_ref", "w" * 5000),
        "runs.workflow_ref",
    ),
    (
        "a NUL in workflow_ref",
        lambda ls, t: put(last(ls), "runs", "workflow_ref", "w\x00f"),
        "runs.workflow_ref",
    ),
    (
        "a NUL in a failure reason",
        lambda ls, t: put(last(ls), "attempts", "failure_reason", "x\x00"),
        "attempts.failure_reason",
    ),
    (
        "a key past 1024 bytes",
        lambda ls, t: put(last(ls), "events", "type", "t" * 1025),
        "events.type",
    ),
    ("a header claiming schema 99", lambda ls, t: ls[0].update(schema_version=99), "schema 99"),
    ("a header without a schema", lambda ls, t: ls[0].pop("schema_version"), "schema"),
    ("an unknown header key", lambda ls, t: ls[0].update(extra=1), "extra"),
    ("an unknown table key", lambda ls, t: last(ls).update(jobs=[]), "jobs"),
    ("an unknown trailer key", lambda ls, t: ls[-1].update(extra=1), "extra"),
    (
        "a gap in event revisions",
        lambda ls, t: put(last(ls), "events", "revision", len(last(ls)["events"]) + 5, -1),
        "events.revision",
    ),
    (
        "a repeated event revision",
        lambda ls, t: put(last(ls), "events", "revision", 1, -1),
        "events.revision",
    ),
    # Seqs the log cannot continue from, and timestamps no reader can turn into a date.
    ("seq 2**63-1", lambda ls, t: put(last(ls), "events", "seq", 2**63 - 1, -1), "events.seq"),
    ("seq 2**53", lambda ls, t: put(last(ls), "events", "seq", 2**53, -1), "events.seq"),
    ("a negative seq", lambda ls, t: put(last(ls), "events", "seq", -3, -1), "events.seq"),
    ("seq 0", lambda ls, t: put(last(ls), "events", "seq", 0, -1), "events.seq"),
    (
        "created_at -10**15",
        lambda ls, t: put(last(ls), "runs", "created_at", -(10**15)),
        "runs.created_at",
    ),
    (
        "created_at 2**62",
        lambda ls, t: put(last(ls), "runs", "created_at", 2**62),
        "runs.created_at",
    ),
    (
        "an event time past 9999",
        lambda ls, t: put(last(ls), "events", "ts", 253_402_300_800_000),
        "events.ts",
    ),
    # What already held, kept in the same net.
    (
        "a changed blob",
        lambda ls, t: put(last(ls), "blobs", "bytes", '{"shared":false}'),
        "does not hash",
    ),
    ("a duplicated line", lambda ls, t: ls.insert(2, copy.deepcopy(ls[1])), "twice"),
    ("a missing trailer", lambda ls, t: ls.pop(), "trailer"),
    ("a row of the wrong width", lambda ls, t: last(ls)["units"][0].pop(), "wrong width"),
    (
        "a row of a foreign run",
        lambda ls, t: put(last(ls), "steps", "run_id", "elsewhere"),
        "not in the tree",
    ),
    ("seq 2**64", lambda ls, t: put(last(ls), "events", "seq", 2**64, -1), "past 64 bits"),
    # Whole files that are no archive, or no longer one.
    ("an empty file", lambda ls, t: b"", "without its trailer"),
    ("a CSV file", lambda ls, t: b"id,name\n1,x\n", "not JSON"),
    ("foreign JSON", lambda ls, t: b'{"hello": "world"}\n', "no header"),
    ("a blank line", lambda ls, t: b"\n", "an empty line"),
    ("bytes that are not UTF-8", lambda ls, t: b"\xff\xfe\n", "not JSON"),
    ("a gzip cut short", lambda ls, t: gzip.compress(encode(ls))[:-40], "damaged gzip"),
    ("a line cut short", lambda ls, t: encode(ls)[:-30], "not JSON"),
    (
        "a run id the ledger holds",
        lambda ls, t: ls.__setitem__(-2, renamed(last(ls), "kept")),
        "runs.run_id kept exists",
    ),
]


def _digest_of(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def encode(lines: Lines) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def write(path: pathlib.Path, lines: Lines) -> None:
    path.write_bytes(encode(lines))


def dump_all(target: str, *, but: tuple[str, ...] = ()) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the ledger's schema (the catalog's list, not a fixed one),
    as stored; sequences are not tables and are not compared."""
    with raw_db(target) as db:
        if target.startswith("postgresql://"):
            names = db.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            ).fetchall()
        else:
            names = db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
        out = {}
        for (name,) in sorted(names):
            if name in but:
                continue
            rows = db.execute(f"SELECT * FROM {name}").fetchall()
            out[name] = sorted(
                (tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows),
                key=repr,
            )
        return out


@pytest.fixture
def archived(target: str, clock: FakeClock, tmp_path: pathlib.Path) -> tuple[str, Lines]:
    """A ledger whose old trees (eight of them, besides history's) were pruned into an archive,
    with live runs left in it; the archive parsed."""
    path = tmp_path / "a.jsonl"
    with fp.Ledger.open(target, clock=clock) as ledger:
        for i in range(8):
            finished(ledger, f"t{i}", units=2)
        history(ledger, clock)
        assert ledger.prune(older_than=30 * DAY, archive=path).runs == 12
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    COLUMNS.update(lines[0]["tables"])
    return target, lines


@pytest.mark.parametrize(("name", "edit", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_archive_is_refused_and_changes_nothing(
    archived: tuple[str, Lines],
    clock: FakeClock,
    tmp_path: pathlib.Path,
    name: str,
    edit: Edit,
    says: str,
) -> None:
    target, lines = archived
    lines = copy.deepcopy(lines)
    whole = edit(lines, target)
    path = tmp_path / "hostile.jsonl"
    if isinstance(whole, bytes):
        path.write_bytes(whole)
    else:
        write(path, lines)
    before = dump_all(target)
    assert {"runs", "events", "blobs", "schema_migrations"} <= set(before)
    with fp.Ledger.open(target, clock=clock) as ledger, pytest.raises(fp.InvalidArgument) as e:
        ledger.restore(path)
    assert e.value.argument == "archive", name
    assert says in str(e.value), str(e.value)
    assert "nothing was restored" in str(e.value), str(e.value)
    assert dump_all(target) == before, name


def test_the_untouched_archive_restores_after_every_refusal(
    archived: tuple[str, Lines], clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    """The net above catches only edits: the same archive unedited restores whole."""
    target, lines = archived
    path = tmp_path / "a.jsonl"
    write(path, lines)
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.restore(path) == 12
        assert ledger.get_run("t7").status == "cancelled"


def test_a_line_past_the_bound_is_refused_without_reading_it_whole(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    """A small gzip that expands to one 200 MB line: refused after 64 MiB of it, in a process
    whose peak memory stays far below what reading the line whole costs (~900 MB). Typically
    ~150 MB; the bound leaves room for the allocator's outliers (one run of the suite saw 403)."""
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(json.dumps({"fencepost_archive": 1, "schema_version": 6}).encode()[:-1])
        f.write(b', "tables": "')
        chunk = b"a" * (1 << 20)
        for _ in range(200):
            f.write(chunk)
        f.write(b'"}\n')
    assert bomb.stat().st_size < 1 << 20
    script = textwrap.dedent(
        """
        import resource, sys
        import fencepost as fp
        with fp.Ledger.open(sys.argv[1]) as ledger:
            try:
                ledger.restore(sys.argv[2])
            except fp.InvalidArgument as e:
                print(e.argument, "longer than" in str(e))
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, target, str(bomb)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    assert out[:2] == ["archive", "True"], out
    assert int(out[2]) < 550, f"peak RSS {out[2]} MB"


def test_max_line_bytes_bounds_each_line_and_is_checked(
    archived: tuple[str, Lines], clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    target, lines = archived
    path = tmp_path / "a.jsonl"
    write(path, lines)
    longest = max(len(json.dumps(x)) for x in lines) + 1
    before = dump(target)
    with fp.Ledger.open(target, clock=clock) as ledger:
        with pytest.raises(fp.InvalidArgument, match="longer than") as e:
            ledger.restore(path, max_line_bytes=max(1024, longest - 1))
        assert e.value.argument == "archive"
        for bad in (0, 10, -1, True, "big", 1.5):
            with pytest.raises(fp.InvalidArgument) as e:
                ledger.restore(path, max_line_bytes=bad)  # type: ignore[arg-type]
            assert e.value.argument == "max_line_bytes"
        assert dump(target) == before
        assert ledger.restore(path, max_line_bytes=longest) == 12


def test_an_archive_file_opened_in_text_mode_is_refused(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        finished(ledger, "old")
        clock.advance(40 * 86_400_000)
        begin(ledger, "new")
        with open(tmp_path / "a.jsonl", "w") as text, pytest.raises(fp.InvalidArgument) as e:
            ledger.prune(older_than=30 * DAY, archive=text)
        assert e.value.argument == "archive"
        assert "binary" in str(e.value)
        assert ledger.get_run("old").status == "cancelled"
        assert ledger.prune(older_than=30 * DAY, archive=tmp_path / "b.jsonl").runs == 1
        with open(tmp_path / "b.jsonl") as text, pytest.raises(fp.InvalidArgument) as e:
            ledger.restore(text)  # type: ignore[arg-type]
        assert e.value.argument == "archive"
        assert "binary" in str(e.value)


def _restore_slowly(target: str, archive: str, ready: Any) -> None:
    """Restore, signalling once the transaction has inserted its first runs, then crawling so
    the kill lands inside the transaction."""
    import time

    def progress(runs: int) -> None:
        ready.set()
        time.sleep(5)

    with fp.Ledger.open(target) as ledger:
        ledger.restore(archive, progress=progress)


def test_a_restore_killed_part_way_leaves_the_ledger_as_it_was(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "big.jsonl"
    with fp.Ledger.open(target, clock=clock) as ledger:
        for i in range(700):
            finished(ledger, f"r{i:04}", units=1)
        clock.advance(40 * 86_400_000)
        begin(ledger, "live")
        work(ledger, "live", 2)
        assert ledger.prune(older_than=30 * DAY, archive=path).runs == 700
    before = dump_all(target, but=("event_seq_floor",))
    kill_mid_flight(_restore_slowly, (target, str(path)), pause_s=0.2)
    assert dump_all(target, but=("event_seq_floor",)) == before
    with fp.Ledger.open(target, clock=clock) as ledger:
        assert ledger.restore(path) == 700
        assert ledger.get_run("r0699").status == "cancelled"


def test_new_events_are_numbered_above_every_restored_seq(
    clock: FakeClock, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """An archive restored into a new ledger whose log is shorter than the archive's seqs:
    the next event is numbered above them (PostgreSQL's identity sequence is moved forward)."""
    for kind in ("sqlite", "postgres"):
        with (
            fresh_target(kind, tmp_path / "a") as source,
            fresh_target(kind, tmp_path / "b") as fresh,
        ):
            (tmp_path / "a").mkdir(exist_ok=True)
            (tmp_path / "b").mkdir(exist_ok=True)
            path = tmp_path / f"{kind}.jsonl"
            with fp.Ledger.open(source, clock=clock) as ledger:
                for i in range(5):
                    finished(ledger, f"s{i}", units=4)
                clock.advance(40 * 86_400_000)
                begin(ledger, "later")
                ledger.prune(older_than=30 * DAY, archive=path)
            top = max(
                row[0]
                for line in (json.loads(x) for x in path.read_text().splitlines()[1:-1])
                for row in line["events"]
            )
            with fp.Ledger.open(fresh, clock=clock) as ledger:
                assert ledger.restore(path) >= 1
                run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
                seqs = [e.seq for e in ledger.events(run.run_id)]
                assert min(seqs) > top, (kind, seqs, top)
                assert [e.seq for e in ledger.events(after_seq=top)][:1] == seqs[:1]


def test_the_cli_restore_reports_a_refusal_in_one_line(
    archived: tuple[str, Lines], tmp_path: pathlib.Path
) -> None:
    target, lines = archived
    lines = copy.deepcopy(lines)
    put(last(lines), "runs", "guarded", 2)
    path = tmp_path / "bad.jsonl"
    write(path, lines)
    got = subprocess.run(
        [sys.executable, "-m", "fencepost", "restore", str(path), "--db", target],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert got.returncode == 2, got
    assert "Traceback" not in got.stderr
    assert "runs.guarded" in got.stderr
    put(last(lines), "runs", "guarded", 0)
    write(path, lines)
    command = [sys.executable, "-m", "fencepost", "restore", str(path), "--db", target]
    got = subprocess.run(
        [*command, "--max-line-bytes", "1024"], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 2, got
    assert "longer than 1024 bytes" in got.stderr
    got = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got
    assert "restored 12 runs" in got.stdout


class _Changing(io.BytesIO):
    """An archive whose bytes change after the first reading: the second reading (the insert)
    sees ``then`` instead."""

    def __init__(self, first: bytes, then: bytes) -> None:
        super().__init__(first)
        self.then = then
        self.starts = 0

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) == (0, 0):
            self.starts += 1
            if self.starts == 2:
                self.truncate(0)
                self.write(self.then)
        return super().seek(offset, whence)


def test_an_archive_that_changes_between_the_readings_is_refused(
    archived: tuple[str, Lines], clock: FakeClock
) -> None:
    """The insert reads the file again; a line that is not the one checked (here a run made
    live, which the check would have refused) stops it before the commit."""
    target, lines = archived
    edited = copy.deepcopy(lines)
    put(last(edited), "runs", "status", "active")
    put(last(edited), "runs", "completed_at", None)
    # The numbering is raised before the insert (a sequence, not a row of the archive's).
    before = dump_all(target, but=("event_seq_floor",))
    with fp.Ledger.open(target, clock=clock) as ledger, pytest.raises(fp.InvalidArgument) as e:
        ledger.restore(_Changing(encode(lines), encode(edited)))
    assert "changed while it was being restored" in str(e.value)
    assert dump_all(target, but=("event_seq_floor",)) == before

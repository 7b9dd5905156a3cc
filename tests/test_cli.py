"""The inspection commands as a user runs them (``fencepost runs|show|events|leases|doctor``):
real subprocesses against real database files (the demo's, from the session's ``demo``
fixture), checking output and exit codes (0 ok, 1 refused, 2 usage), including bad input, and
that a read command never creates a database."""

from __future__ import annotations

import datetime
import json
import pathlib
import sqlite3
import subprocess
import sys
import time
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, cli, fresh_target, raw_db


def test_runs_show_events_leases(demo: tuple[pathlib.Path, dict[str, Any], str]) -> None:
    db, _, _ = demo
    runs = cli("runs", "--db", str(db), "--children", "--json")
    assert runs.returncode == 0
    listed = json.loads(runs.stdout)
    assert len(listed) == 4
    parent = next(r for r in listed if r["workflow_ref"] == "demo/fan-out")
    assert parent["updated_at"].endswith("Z")  # UTC ISO 8601
    top = cli("runs", "--db", str(db))
    assert top.returncode == 0
    assert top.stdout.splitlines()[0].split()[:3] == [
        "RUN",
        "STATUS",
        "WORKFLOW",
    ]
    assert len(top.stdout.splitlines()) == 2  # header + the top-level run only

    shard = next(r for r in listed if r["workflow_ref"] == "demo/shard")
    show = cli("show", shard["run_id"], "--db", str(db))
    assert show.returncode == 0
    assert "completed=200" in show.stdout
    assert "generation" in show.stdout
    doc = json.loads(cli("show", shard["run_id"], "--db", str(db), "--json").stdout)
    assert doc["units"] == {"total": 200, "by_status": {"completed": 200}}

    events = cli("events", shard["run_id"], "--db", str(db), "--json")
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert lines[0]["type"] == "run.started"
    assert sum(1 for e in lines if e["type"] == "unit.finished") == 200
    after = cli("events", "--db", str(db), "--after", str(lines[-1]["seq"] - 1), "--json")
    seqs = [json.loads(line)["seq"] for line in after.stdout.splitlines()]
    assert seqs
    assert min(seqs) >= lines[-1]["seq"]

    leases = json.loads(cli("leases", "--db", str(db), "--json").stdout)
    assert {le["generation"] for le in leases} >= {0, 1}
    # The killed worker's shard: taken over once, the dead claim's four writes refused.
    fenced = [le for le in leases if le["takeovers"]]
    assert [(le["takeovers"], le["refused_writes"]) for le in fenced] == [(1, 4)]
    shown = cli("show", fenced[0]["run_id"], "--db", str(db)).stdout
    assert "takeovers 1, stale writes refused 4" in shown
    table = cli("leases", "--db", str(db)).stdout.splitlines()
    assert table[0].split()[-2:] == ["TAKEOVERS", "REFUSED"]
    assert json.loads(cli("leases", "--expired", "--db", str(db), "--json").stdout) == []


def test_doctor_healthy_and_the_env_var(demo: tuple[pathlib.Path, dict[str, Any], str]) -> None:
    db, _, _ = demo
    done = cli("doctor", env={"FENCEPOST_DB": str(db)})
    assert done.returncode == 0, done.stderr
    assert "journal_mode" in done.stdout
    assert "wal" in done.stdout
    assert not any(line.startswith("tls ") for line in done.stdout.splitlines())  # SQLite
    assert done.stdout.rstrip().endswith("healthy")
    report = json.loads(cli("doctor", "--json", env={"FENCEPOST_DB": str(db)}).stdout)
    assert report["healthy"]
    assert report["integrity_check"] == ["ok"]
    assert report["schema_version"] == fp.SCHEMA_VERSION


def test_doctor_finds_an_orphan_attempt(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "orphan.db"
    with fp.Ledger.open(str(db)) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        ledger.reserve_attempt("r1", "u1", step_id="s")
    with raw_db(db) as c:  # written behind the API's back: an attempt with no event
        c.execute(
            "INSERT INTO units(run_id, unit_id, phase, status, attempts, first_started_at, "
            "started_at) VALUES ('r1', 'u2', 'unit', 'running', 1, 0, 0)"
        )
        c.execute(
            "INSERT INTO attempts(run_id, unit_id, attempt, dispatch_id, phase, status, "
            "started_at) VALUES ('r1', 'u2', 1, 'd-orphan', 'unit', 'running', 0)"
        )
    done = cli("doctor", "--db", str(db))
    assert done.returncode == 1
    assert "orphan: run r1 unit u2 attempt 1 dispatch d-orphan" in done.stdout
    assert "NOT healthy" in done.stdout


def test_prefix_errors(demo: tuple[pathlib.Path, dict[str, Any], str]) -> None:
    db, _, _ = demo
    unknown = cli("show", "zzz", "--db", str(db))
    assert unknown.returncode == 1
    assert "no run id starts with 'zzz'" in unknown.stderr
    ambiguous = cli("show", "0", "--db", str(db))
    assert ambiguous.returncode == 1
    assert "matches 4 runs" in ambiguous.stderr


def test_read_commands_never_create_a_database(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "missing.db"
    for command in (["runs"], ["show", "x"], ["events"], ["leases"], ["doctor"], ["limits"],
                    ["pause", "wf"], ["resume", "wf"]):  # fmt: skip
        done = cli(*command, "--db", str(missing))
        assert done.returncode == 1, command
        assert "no ledger at" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [["events", "--after", "-1"], ["events", "--limit", "0"], ["runs", "--bogus"], ["nope"], []],
)
def test_usage_errors(demo: tuple[pathlib.Path, dict[str, Any], str], args: list[str]) -> None:
    db, _, _ = demo
    done = cli(*args, "--db", str(db)) if args and args[0] != "nope" else cli(*args)
    assert done.returncode == 2
    assert "error" in done.stderr


def test_console_script_and_module_agree(demo: tuple[pathlib.Path, dict[str, Any], str]) -> None:
    db, _, _ = demo
    script = pathlib.Path(sys.executable).with_name("fencepost")
    via_script = subprocess.run(
        [str(script), "runs", "--db", str(db), "--json"], capture_output=True, text=True
    )
    assert via_script.returncode == 0
    assert json.loads(via_script.stdout) == json.loads(
        cli("runs", "--db", str(db), "--json").stdout
    )


def test_doctor_is_quick_unless_asked_for_the_full_check(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "drift.db"
    with fp.Ledger.open(str(db)) as ledger:
        for i in range(3):
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id=f"r{i}", force=True)
    # An index whose entries no longer match its table (its definition rewritten behind
    # SQLite's back): only the full check compares every index with its table.
    con = sqlite3.connect(db)
    con.execute("PRAGMA writable_schema = ON")
    con.execute(
        "UPDATE sqlite_master SET sql = 'CREATE INDEX runs_recent ON runs(run_id, created_at)' "
        "WHERE name = 'runs_recent'"
    )
    con.commit()
    con.close()
    quick = json.loads(cli("doctor", "--db", str(db), "--json").stdout)
    assert quick["integrity_check_mode"] == "quick"
    assert quick["integrity_check"] == ["ok"]
    full = cli("doctor", "--db", str(db), "--json", "--full")
    assert full.returncode == 1
    report = json.loads(full.stdout)
    assert report["integrity_check_mode"] == "full"
    assert report["integrity_check"] != ["ok"]
    assert not report["healthy"]
    text = cli("doctor", "--db", str(db)).stdout
    assert "(quick check)" in text


def test_restore_creates_the_ledger_it_is_given(
    target: str, tmp_path: pathlib.Path, clock: FakeClock
) -> None:
    """Restore is a write: into a ledger that does not exist yet it creates one, as
    ``Ledger.open`` does (moving archived runs to a fresh database is what it is for)."""
    archive = tmp_path / "k.jsonl.gz"
    with fp.Ledger.open(target, clock=clock) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        ledger.abandon_run("r1")
        # The tree holding the newest event is never pruned: another run's start follows.
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r2", force=True)
        clock.advance(3_600_000)
        assert ledger.prune(older_than=datetime.timedelta(minutes=1), archive=str(archive)).runs
    kind = "postgres" if target.startswith("postgresql://") else "sqlite"
    with fresh_target(kind, tmp_path / "new") as new:
        (tmp_path / "new").mkdir()
        done = cli("restore", str(archive), "--db", new)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"restored 1 runs from {archive}\n"
        with fp.Ledger.open(new, create=False) as restored:
            run = restored.get_run("r1")
            assert run is not None
            assert run.status == "cancelled"
    # The read commands still refuse a missing ledger, and say which command creates one.
    missing = tmp_path / "missing.db"
    refused = cli("runs", "--db", str(missing))
    assert refused.returncode == 1
    assert "only restore creates one" in refused.stderr
    assert not missing.exists()


MALFORMED_URLS = ["postgresql:/broken", "postgres:/x", "postgresql//x", "postgres:x", "sqlite:x.db"]


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_malformed_url_is_a_usage_error_not_a_file(tmp_path: pathlib.Path, url: str) -> None:
    """A --db that begins like a URL but is not one is a usage error naming the forms taken,
    for the commands that create (restore) as for those that read; nothing is created where
    the URL, read as a path, would have put a file."""
    (tmp_path / "postgresql").mkdir()  # "postgresql//x" read as a path: postgresql/x
    archive = tmp_path / "a.jsonl"
    archive.write_text("")
    for command in (["restore", str(archive)], ["runs"], ["doctor"], ["ui", "--port", "0"],
                    ["prune", "--older-than", "1d"]):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "fencepost", *command, "--db", url],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith("fencepost: error: target beginning "), done.stderr
        assert "'postgresql://user@host:port/db'" in done.stderr
        assert done.stderr.count("\n") == 1
        assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.jsonl", "postgresql"]


def test_sqlite_urls_name_the_same_file_for_every_command(tmp_path: pathlib.Path) -> None:
    """``sqlite:///rel.db`` is relative, ``sqlite:////abs.db`` absolute (SQLAlchemy's forms),
    for the read commands' check for a missing file as for ``Ledger.open``."""
    with fp.Ledger.open(str(tmp_path / "rel.db")) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
    for db in ("sqlite:///rel.db", f"sqlite:///{tmp_path / 'rel.db'}"):
        done = subprocess.run(
            [sys.executable, "-m", "fencepost", "runs", "--db", db, "--json"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (db, done.stderr)
        assert [r["run_id"] for r in json.loads(done.stdout)] == ["r1"]


def test_the_queue_limits_and_pauses(tmp_path: pathlib.Path) -> None:
    """``runs --queued`` shows what claim_next goes by; ``limits`` shows and sets limits;
    ``pause``/``resume`` change what claim_next hands out."""
    from tests.conftest import queued

    db = tmp_path / "q.db"
    with fp.Ledger.open(str(db)) as ledger:
        ledger.reserve_run("soon", **queued("soon", priority=3, concurrency_key="tenant-a"))
        ledger.reserve_run("later", **queued("later", not_before=datetime.timedelta(days=1)))
    shown = cli("runs", "--queued", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["RUN", "WORKFLOW", "DUE", "AT", "DUE", "PRIORITY", "KEY"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["soon"][3:] == ["yes", "3", "tenant-a"]
    assert rows["later"][3:5] == ["no", "0"]
    as_json = json.loads(cli("runs", "--queued", "--json", "--db", str(db)).stdout)
    assert {r["run_id"]: r["priority"] for r in as_json} == {"soon": 3, "later": 0}

    assert cli("limits", "tenant-a", "0", "--db", str(db)).returncode == 0
    listed = cli("limits", "--json", "--db", str(db))
    assert json.loads(listed.stdout) == {"tenant-a": 0}
    bad = cli("limits", "tenant-a", "-1", "--db", str(db))
    assert bad.returncode == 2
    assert "limit" in bad.stderr
    words = cli("limits", "tenant-a", "many", "--db", str(db))
    assert words.returncode == 1
    assert "not a whole number" in words.stderr
    paused = cli("pause", "deploy", "--json", "--db", str(db))
    assert json.loads(paused.stdout) == ["deploy"]
    with fp.Ledger.open(str(db)) as ledger:
        assert ledger.concurrency_limits() == {"tenant-a": 0}
        assert ledger.claim_next("ctl", lease_ms=1000) == []  # held by key and by pause
    assert cli("limits", "tenant-a", "none", "--db", str(db)).returncode == 0
    assert json.loads(cli("resume", "deploy", "--json", "--db", str(db)).stdout) == []
    with fp.Ledger.open(str(db)) as ledger:
        assert [c.run_id for c in ledger.claim_next("ctl", lease_ms=1000)] == ["soon"]


def test_events_follow_prints_its_header_once(tmp_path: pathlib.Path) -> None:
    db = str(tmp_path / "f.db")
    with fp.Ledger.open(db) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r", force=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost", "events", "--follow", "--db", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]  # the header, run.started
        with fp.Ledger.open(db) as ledger:
            for i in range(3):
                ledger.reserve_attempt("r", f"u{i}", step_id="s")
                time.sleep(0.05)  # separate wakes: one part of the table each
        lines += [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert lines[0].split()[:2] == ["SEQ", "TS"]
    assert [line.split()[4] for line in lines[1:]] == ["run.started"] + ["unit.started"] * 3
    assert sum(line.startswith("SEQ") for line in lines) == 1
    # One table: each column starts where the header's does.
    assert {line.index(line.split()[1]) for line in lines} == {lines[0].index("TS")}


def test_db_help_names_both_backends() -> None:
    out = cli("runs", "--help").stdout
    assert "postgresql://" in out

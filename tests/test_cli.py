"""The command line as a user runs it (issue: demo/CLI/asyncio): real subprocesses against
real database files, checking output and exit codes (0 ok, 1 refused, 2 usage), including bad
input, and that a read command never creates a database."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import raw_db


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "fencepost", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any], str]:
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    done = cli("demo", "--units", "600", "--workers", "3", "--seed", "3", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    return db, json.loads(done.stdout), done.stderr


def test_demo_report_and_invariants(demo: tuple[pathlib.Path, dict[str, Any], str]) -> None:
    db, report, stderr = demo
    assert report["units"] == 600
    assert report["workers"] == 3
    assert all(report["invariants"].values())
    assert report["killed_worker"] == 0
    # The killed worker's shard was taken over at the next generation, its in-flight batch
    # reclaimed in place, and its replayed claim refused on every write.
    [takeover] = report["takeovers"]
    assert takeover["shard"] == 0
    assert takeover["generation"] == 2
    assert report["reclaims"] >= 1
    assert report["stale_writes_refused"] == 4
    assert report["attempts"] == 600  # reclaims reuse attempts; nothing ran twice
    assert report["duplicate_finishes_ignored"] >= 1
    # Progress on stderr: not a TTY here, so periodic lines, then the kill.
    assert "units" in stderr
    assert "kill -9 worker 0" in stderr
    with fp.Ledger.open(str(db)) as ledger:
        assert ledger.integrity_check() == ["ok"]
        assert (
            sum(1 for r in ledger.list_runs(include_children=True) if r.status == "completed") == 4
        )


def test_demo_text_report_without_kill(tmp_path: pathlib.Path) -> None:
    done = cli(
        "demo", "--units", "120", "--workers", "2", "--no-kill", "--db", str(tmp_path / "d.db")
    )
    assert done.returncode == 0, done.stderr
    assert "invariants (read back from the database):" in done.stdout
    assert "FAIL" not in done.stdout
    assert done.stdout.count("ok   ") == 4
    assert "killed                -" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--units", "0"], "--units"),
        (["--units", "ten"], "--units"),
        (["--workers", "0"], "--workers"),
        (["--workers", "65"], "--workers"),
        (["--seed", "x"], "--seed"),
    ],
)
def test_demo_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    done = cli("demo", *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_demo_refuses_an_existing_file(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "x.db"
    db.write_bytes(b"")
    done = cli("demo", "--units", "10", "--db", str(db))
    assert done.returncode == 2
    assert "exists" in done.stderr


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
    for command in (["runs"], ["show", "x"], ["events"], ["leases"], ["doctor"]):
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


def test_demo_draws_a_bar_on_a_terminal(tmp_path: pathlib.Path) -> None:
    # stderr on a pseudo-terminal: the bar is redrawn in place with carriage returns.
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost", "demo", "--units", "300", "--workers", "2",
         "--kill-one", "--db", str(tmp_path / "tty.db")],
        stdout=subprocess.PIPE, stderr=follower, text=True,
    )  # fmt: skip
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the demo exited
            break
        if not chunk:
            break
        drawn += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0
    assert b"\r[" in drawn
    assert b"#" in drawn
    assert b"300/300 units" in drawn
    assert "ok   every unit finished exactly once" in out

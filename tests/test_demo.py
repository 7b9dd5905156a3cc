"""``fencepost demo`` as a user runs it (a real subprocess): the report and the invariants it
reads back from the database, the text report, the progress bar on a terminal, and bad
arguments as usage errors."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import cli


def test_demo_report_and_invariants(demo: tuple[pathlib.Path, dict[str, Any], str]) -> None:
    db, report, stderr = demo
    assert report["units"] == 600
    assert report["workers"] == 3
    assert all(report["invariants"].values())
    assert report["invariants"]["the leases count the takeovers and refused writes"]
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
    assert done.stdout.count("ok   ") == 5
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

"""The SQLite write-ahead log stays bounded with several writer processes.

A log starts over only when it is fully copied and no reader is inside it; with several
processes writing and reading all the time that moment never came by itself, and the ``-wal``
file grew past 100 MB (and reads through it slowed). These runs start real processes doing a
dispatcher's mix of single and batched reserve + finish and event reads on one file, sample the
file's size, and check it stays within a few times the configured ``journal_size_limit``, with
no call running out of its busy budget (a ``StoreBusy`` would fail the worker).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO

# The log restarts past ~4 MiB of frames and its file is truncated to 16 MiB when it does.
BOUND = 16 << 20


def writers(db: pathlib.Path, processes: int, seconds: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.wal_writers", str(db), str(processes), str(seconds)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    # Shown with -rA / on failure: the worst single call is the number to watch.
    print(f"wal_writers {processes} processes {seconds} s: {report}")
    return report


def test_four_processes_keep_the_log_bounded(tmp_path: pathlib.Path) -> None:
    report = writers(tmp_path / "wal.db", 4, 10)
    assert report["calls"] > 1000
    assert report["largest_wal"] <= BOUND, report


@pytest.mark.slow
def test_four_processes_for_a_minute_keep_the_log_bounded(tmp_path: pathlib.Path) -> None:
    report = writers(tmp_path / "wal.db", 4, 60)
    assert report["largest_wal"] <= BOUND, report

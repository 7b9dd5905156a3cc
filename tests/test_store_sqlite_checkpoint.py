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

import fencepost as fp
from tests.conftest import REPO, raw_db

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


def test_write_ahead_log_stays_bounded_and_is_removed_at_close(tmp_path: pathlib.Path) -> None:
    # Checkpoints run on a background thread; the writer restarts the log past a hard limit
    # (rust/store/sqlite/checkpoint.rs: 4000 frames of 1 KiB + 24 bytes). Without the restart
    # the log would grow by every commit's frames for as long as writes keep coming.
    path = tmp_path / "ledger.db"
    wal = pathlib.Path(str(path) + "-wal")
    limit = 5000 * (1024 + 24)
    biggest = 0
    with fp.Ledger.open(str(path)) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        for batch in range(120):
            got = ledger.reserve_attempts(
                "r1", [{"unit_id": f"u{batch}-{i}", "step_id": "s"} for i in range(50)]
            )
            ledger.finish_attempts(
                [
                    {"run_id": "r1", "unit_id": r.unit_id, "attempt": r.attempt,
                     "dispatch_id": r.dispatch_id, "status": "completed"}
                    for r in got
                ]
            )  # fmt: skip
            biggest = max(biggest, wal.stat().st_size)
        assert len(ledger.units("r1")) == 6000
    assert 0 < biggest < limit
    assert not wal.exists()
    with raw_db(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        done = db.execute("SELECT count(*) FROM attempts WHERE status = 'completed'").fetchone()
        assert done[0] == 6000

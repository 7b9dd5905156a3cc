"""The guides' Python examples run, so a guide cannot drift from the API without failing CI:
docs/controller.md's blocks, in order, as one script with a ledger that has a queue to look at
(a key with a limit, queued runs); docs/retries.md's and docs/orchestrator.md's blocks, which
make their own ledgers."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from tests.conftest import REPO

SETUP = """
import fencepost as fp

definition = {"steps": ["build"]}
ledger = fp.Ledger.open("controller.db")
ledger.set_concurrency_limit("tenant-42", 3)
for i in range(5):
    ledger.reserve_run(
        f"build-{i}", workflow_name="build", workflow_ref="build@1",
        source={"kind": "builtin", "id": "build"}, definition_digest=fp.digest(definition),
        definition=definition, runner_id="host-a", origin_session_id="session-1",
        concurrency_key="tenant-42" if i % 2 else None, priority=i,
    )
"""

CHECK = """
assert next_up == ["build-4", "build-2", "build-0"], next_up
[key] = overview.keys
assert (key.concurrency_key, key.limit, key.live, key.queued) == ("tenant-42", 3, 0, 2)
"""


def test_the_controller_guide_runs(tmp_path: pathlib.Path) -> None:
    text = (REPO / "docs" / "controller.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2  # the loop, watching the queue
    script = tmp_path / "controller.py"
    script.write_text("\n".join([SETUP, *blocks, CHECK]), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "tenant-42: 0/3 live, 2 queued, has room" in done.stdout


def test_the_retries_guide_runs(tmp_path: pathlib.Path) -> None:
    """docs/retries.md's blocks, in order, as one script: its own asserts check what each
    step says happens."""
    text = (REPO / "docs" / "retries.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    script = tmp_path / "retries.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("not before 2026-01-01 00:00:01+00:00"), done.stdout


def test_the_orchestrator_guide_runs(tmp_path: pathlib.Path) -> None:
    """docs/orchestrator.md's blocks, in order, as one script."""
    text = (REPO / "docs" / "orchestrator.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    script = tmp_path / "orchestrator.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "'by_status': {'completed': 3}" in done.stdout, done.stdout

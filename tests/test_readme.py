"""The README's Python examples run, in order, as one script against a fresh directory: the
documentation cannot drift from the API without failing CI."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from tests.conftest import PG_URL, REPO, pg_connect


def test_readme_examples_run(tmp_path: pathlib.Path) -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4  # quick start, orchestrator, dispatcher, controller
    script = tmp_path / "readme.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    try:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "fencepost.db").exists()
    finally:
        with pg_connect(PG_URL) as conn:
            conn.execute('DROP SCHEMA IF EXISTS "readme_example" CASCADE')

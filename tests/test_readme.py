"""The README stays a front page: its Python examples (the five-minute tour) run, in order, as
one script against a fresh directory, so it cannot drift from the API without failing CI; it
stays short, keeps its two set-up commands, and links every guide and reference in docs/."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_examples_run(tmp_path: pathlib.Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 3  # the tour: a dispatcher, a controller, inspecting
    script = tmp_path / "readme.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fencepost.db").exists()
    lines = done.stdout.splitlines()
    assert lines[:2] == ["superseded 1 2", "publish"], done.stdout  # as the comments say
    assert "8120" in lines, done.stdout
    assert "2 host-b 1" in lines, done.stdout


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 250


def test_the_two_set_up_commands() -> None:
    """A newcomer's install-and-demo command, and the test command CI runs (.ci/run)."""
    install = "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/fencepost demo"
    assert f"```sh\n{install}\n```" in README
    assert "```sh\nbash scripts/test\n```" in README
    assert "bash scripts/test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_every_doc_is_linked() -> None:
    """The README's "Where to go next" names every page of docs/."""
    docs = REPO / "docs"
    pages = [p.relative_to(REPO).as_posix() for p in docs.glob("*.md")]
    pages.append("docs/grafana/README.md")
    linked = set(re.findall(r"\]\(([^)#]+)", README))
    assert sorted(set(pages) - linked) == []

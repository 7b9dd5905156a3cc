"""The guides' Python examples run, so a guide cannot drift from the API without failing CI:
each guide's blocks run in order as one script in a fresh directory (each makes its own
ledger), and each test checks something the guide prints or leaves."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from tests.conftest import PG_URL, REPO, pg_connect


def run_guide(tmp_path: pathlib.Path, name: str, *, at_least: int) -> str:
    """The Python blocks of ``docs/NAME.md``, in order, run as one script in ``tmp_path``;
    returns what it printed."""
    text = (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= at_least
    script = tmp_path / f"{name}.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_controller_guide_runs(tmp_path: pathlib.Path) -> None:
    """The queue as the guide leaves it to look at, the claims it takes, the fence's refusal
    and an idempotent submission."""
    out = run_guide(tmp_path, "controller", at_least=6)
    assert "tenant-42: 0/3 live, 2 queued, has room" in out, out
    assert "['build-4', 'build-2', 'build-0']" in out, out
    assert "claimed 5 runs" in out, out
    assert "refused: superseded 1 2" in out, out
    assert "claimed adopted ['input']" in out, out


def test_the_retries_guide_runs(tmp_path: pathlib.Path) -> None:
    """Its own asserts check what each step says happens."""
    out = run_guide(tmp_path, "retries", at_least=5)
    assert out.startswith("not before 2026-01-01 00:00:01+00:00"), out


def test_the_orchestrator_guide_runs(tmp_path: pathlib.Path) -> None:
    """A resumed run on its step, the fan-in's payload, a message received."""
    out = run_guide(tmp_path, "orchestrator", at_least=8)
    assert out.startswith("active fan-out\n"), out
    assert "'by_status': {'completed': 3}" in out, out
    assert "{'by': 'ana'}" in out, out


def test_the_api_reference_runs(tmp_path: pathlib.Path) -> None:
    """What its examples print: digests, a child summary, a batch of finishes with a loser."""
    out = run_guide(tmp_path, "api", at_least=6)
    assert "sha256:93a23971a914e5eacbf0a8d25154cda309c3c1c72fbb9914d47c60f3cb681588" in out, out
    assert "ChildSummary(total=1, by_status={'active': 1}, settled=False)" in out, out
    assert "[True, True, True, False]" in out, out


def test_the_operations_guide_runs(tmp_path: pathlib.Path) -> None:
    """Its PostgreSQL example makes a schema of its own, dropped afterwards."""
    try:
        out = run_guide(tmp_path, "operations", at_least=6)
        assert out.startswith("PruneReport(runs=0, attempts=0, events=0"), out
        assert (tmp_path / "runs-2026-11.jsonl.gz").exists()
    finally:
        with pg_connect(PG_URL) as conn:
            conn.execute('DROP SCHEMA IF EXISTS "operations_example" CASCADE')


def test_the_tutorial_builds_a_working_dispatcher(tmp_path: pathlib.Path) -> None:
    """A newcomer following the tutorial literally, on a fresh ledger: every step prints what
    the tutorial says it does, and the run ends completed with the totals it shows."""
    out = run_guide(tmp_path, "tutorial", at_least=9)
    assert out.splitlines() == [
        "run active on step resize",
        "10 attempts reclaimed in place",
        "41 of 41 finishes recorded",
        "duplicate finish recorded: [False]",
        "exhausted: [('img-666', 3, 'corrupt header')]",
        "run completed",
        "{'completed': 40, 'cancelled': 1}",
        "attempts: 45",
        "img-013: [(1, 'timed_out'), (2, 'timed_out'), (3, 'completed')]",
    ], out
    shown = (REPO / "docs" / "tutorial.md").read_text(encoding="utf-8")
    assert "\n".join(out.splitlines()[-4:]) in shown  # the output the tutorial shows
    assert (tmp_path / "tutorial.db").exists()


# ------------------------------------------------------------------ every guide, every link

# Guides whose examples another test module runs, and how many of their Python blocks it runs
# (None: all of them, in order).
RUN_ELSEWHERE = {
    "testing.md": ("test_testing_plugin.py", None),  # a pytest module, under pytester
    "grafana/README.md": ("test_grafana.py", 1),  # the views, read back through the SDK
}
# What a fence may be: Python runs; the others are shell sessions, commands, output, config.
FENCES = {"python", "text", "console", "sh", "toml", "yaml", "json"}
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def fences(text: str) -> list[str]:
    """The language of every fenced block's opening line."""
    found, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if not inside:
                found.append(line.strip()[3:])
            inside = not inside
    return found


def test_every_guide_with_python_blocks_runs_as_a_test() -> None:
    """A guide's ```python blocks run here through ``run_guide`` (or in the module named in
    RUN_ELSEWHERE), so a new guide cannot leave its examples unrun."""
    here = set(
        re.findall(r'run_guide\(\s*tmp_path,\s*"([\w-]+)"', pathlib.Path(__file__).read_text())
    )
    unrun = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        name = page.relative_to(REPO / "docs").as_posix()
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
        if not blocks or name.removesuffix(".md") in here:
            continue
        if name in RUN_ELSEWHERE:
            module, count = RUN_ELSEWHERE[name]
            source = (REPO / "tests" / module).read_text(encoding="utf-8")
            assert all(f'"{part}"' in source for part in name.split("/")), (name, module)
            assert count is None or len(blocks) == count, (name, len(blocks))
            continue
        unrun.append(name)
    assert unrun == []


def test_every_fence_says_what_it_holds() -> None:
    """No untagged or other-tagged block (```py, ```python3) slips past the runner."""
    odd = {
        (page.relative_to(REPO).as_posix(), lang)
        for page in PAGES
        for lang in fences(page.read_text(encoding="utf-8"))
        if lang not in FENCES
    }
    assert odd == set()


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_resolves() -> None:
    """Links between the README and the docs point at files that exist and headings they
    have (the guides moved out of the README; a stale anchor is a broken promise)."""
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append((page.name, target))
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", dest.read_text(encoding="utf-8"), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append((page.name, target))
    assert broken == []

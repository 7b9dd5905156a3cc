"""fencepost.testing, the pytest plugin for users' tests: its FakeClock, and its fixtures and
options as a user's test run sees them (pytester: pytest in a subprocess, on small test files).

The plugin is loaded with ``-p fencepost.testing``, as the entry point is only installed with
the package; ``test_the_entry_point_loads_the_plugin`` checks the entry point pyproject.toml
declares. The PostgreSQL tests look for the test's schema behind the plugin's back, in
``information_schema``."""

from __future__ import annotations

import datetime as dt
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from fencepost.testing import FakeClock
from tests.conftest import PG_URL, REPO, pg_connect

pytest_plugins = ["pytester"]

START = 1_764_720_000_000  # FakeClock's default: 2025-12-03 00:00 UTC


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest with the plugin in a subprocess, warnings as errors (the plugin's own too)."""
    return pytester.runpytest_subprocess(
        "-p", "fencepost.testing", "-p", "no:cacheprovider", "-W", "error", *args, timeout=120
    )


def schema_exists(schema: str) -> bool:
    with pg_connect(PG_URL) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    return bool(found[0])


BACKENDS = ["file", "memory", pytest.param("postgres", marks=pytest.mark.postgres)]


# ------------------------------------------------------------------ FakeClock


def test_fake_clock_starts_at_a_fixed_instant_and_is_called_by_the_ledger() -> None:
    clock = FakeClock()
    assert clock() == clock.now == START
    assert clock.datetime == dt.datetime(2025, 12, 3, tzinfo=dt.UTC)
    assert repr(clock) == "FakeClock(1764720000000: 2025-12-03T00:00:00+00:00)"
    assert FakeClock(5)() == 5
    assert FakeClock(dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC))() == 1000


def test_fake_clock_advances_by_milliseconds_or_a_timedelta() -> None:
    clock = FakeClock(0)
    assert clock.advance(250) == 250
    assert clock.advance(dt.timedelta(seconds=2)) == 2250
    # Whole milliseconds, as the ledger reads a timedelta.
    assert clock.advance(dt.timedelta(microseconds=1999)) == 2251
    assert clock.advance(-251) == 2000  # backwards: a host whose clock lags
    assert clock() == 2000


def test_fake_clock_jumps_to_an_aware_datetime_or_epoch_milliseconds() -> None:
    clock = FakeClock()
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert clock.set(dt.datetime(2026, 1, 1, 2, tzinfo=plus_two)) == 1_767_225_600_000
    assert clock.datetime == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert clock.set(42) == 42
    clock.now = 7
    assert clock() == 7


def test_fake_clock_refuses_what_names_no_instant() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match="naive datetime"):
        clock.set(dt.datetime(2026, 1, 1))
    with pytest.raises(TypeError, match="not float"):
        clock.advance(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not bool"):
        clock.set(True)
    with pytest.raises(ValueError, match="naive datetime"):
        FakeClock(dt.datetime(2026, 1, 1))
    assert clock() == START


# ------------------------------------------------------------------ the fixtures

QUEUE = """
import fencepost

def queue(ledger, run_id):
    definition = {"steps": ["build"]}
    ledger.reserve_run(
        run_id, workflow_name="build", workflow_ref="build@1",
        source={"kind": "builtin", "id": "build"}, definition_digest=fencepost.digest(definition),
        definition=definition, runner_id="host-a", origin_session_id="session-1",
    )
"""


def test_the_fake_clock_drives_lease_expiry(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        QUEUE
        + """
import datetime as dt

def test_expiry(ledger, fake_clock):
    queue(ledger, "r1")
    assert ledger.get_run("r1").created_at == fake_clock.datetime
    claim = ledger.claim("r1", "host-a", lease_ms=10_000)
    assert claim.expires_at == fake_clock.datetime + dt.timedelta(seconds=10)
    fake_clock.advance(9_999)
    assert ledger.claim("r1", "host-b", lease_ms=10_000) is None
    assert ledger.expired_leases() == []
    fake_clock.advance(dt.timedelta(milliseconds=1))
    [expired] = ledger.expired_leases()
    assert expired.owner_id == "host-a"
    taken = ledger.claim("r1", "host-b", lease_ms=10_000)
    assert taken.taken_from == "host-a"
"""
    )
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_test_gets_a_fresh_empty_ledger(pytester: pytest.Pytester, backend: str) -> None:
    # Two tests write the same run; each sees only its own.
    pytester.makepyfile(
        QUEUE
        + f"""
import pathlib

import pytest

@pytest.mark.parametrize("n", [1, 2])
def test_fresh(ledger, ledger_target, fencepost_backend, n):
    assert fencepost_backend == {backend!r}
    with open(pathlib.Path(__file__).parent / "targets.txt", "a") as out:
        out.write(ledger_target + "\\n")
    assert ledger.list_runs() == []
    queue(ledger, "r1")
    assert [r.run_id for r in ledger.list_runs()] == ["r1"]
"""
    )
    run(pytester, f"--fencepost-backend={backend}", f"--fencepost-pg-url={PG_URL}").assert_outcomes(
        passed=2
    )
    targets = (pytester.path / "targets.txt").read_text().split()
    if backend == "memory":
        assert targets == [":memory:", ":memory:"]
    elif backend == "file":
        assert targets[0] != targets[1]
        assert all(t.endswith("fencepost.db") for t in targets)
        # Both under the run's basetemp: pytest cleans them up like any tmp_path.
        assert all(pathlib.Path(t).parent.parent.parent == pytester.path for t in targets)
    else:
        assert targets[0] != targets[1]
        assert all(t.startswith(f"{PG_URL}?schema=fencepost_test_") for t in targets)
        assert not any(schema_exists(t.rsplit("=", 1)[1]) for t in targets)


def test_ledger_target_opens_the_same_store(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        QUEUE
        + """
import asyncio

import fencepost
from fencepost.aio import AsyncLedger

def test_shared(ledger, ledger_target, fake_clock):
    queue(ledger, "r1")
    with fencepost.Ledger.open(ledger_target, clock=fake_clock) as other:
        assert other.get_run("r1").status == "queued"

    async def read():
        async with await AsyncLedger.open(ledger_target) as aio:
            return await aio.get_run("r1")

    assert asyncio.run(read()).run_id == "r1"
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_memory_is_the_backend_asked_for(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
def test_memory(ledger, ledger_target, fencepost_backend):
    assert (ledger_target, fencepost_backend) == (":memory:", "memory")
    assert ledger.target == ":memory:"
"""
    )
    run(pytester, "--fencepost-backend=memory").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nfencepost_backend = memory\n")
    run(pytester).assert_outcomes(passed=1)
    # The command line wins over the ini file.
    run(pytester, "--fencepost-backend=file").assert_outcomes(failed=1)


ALL = """
import pytest

def test_ledger(ledger):
    pass

def test_target_only(ledger_target):
    pass

@pytest.mark.parametrize("fencepost_backend", ["memory"], indirect=True)
def test_own_choice(ledger, fencepost_backend):
    assert fencepost_backend == "memory"

def test_no_ledger(fake_clock):
    pass
"""


def test_all_collects_each_backend(pytester: pytest.Pytester) -> None:
    """Collection only: no test here opens a ledger, so no PostgreSQL is needed."""
    pytester.makepyfile(test_all=ALL)
    done = run(pytester, "--fencepost-backend=all", "--collect-only", "-q")
    ids = [line for line in done.outlines if "::" in line]
    assert ids == [
        "test_all.py::test_ledger[file]",
        "test_all.py::test_ledger[memory]",
        "test_all.py::test_ledger[postgres]",
        "test_all.py::test_target_only[file]",
        "test_all.py::test_target_only[memory]",
        "test_all.py::test_target_only[postgres]",
        "test_all.py::test_own_choice[memory]",
        "test_all.py::test_no_ledger",
    ]


@pytest.mark.postgres
def test_all_runs_each_backend_postgres(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_all=ALL)
    done = run(pytester, "--fencepost-backend=all", f"--fencepost-pg-url={PG_URL}", "-v")
    done.assert_outcomes(passed=8)
    done.stdout.fnmatch_lines(["*test_ledger?postgres? PASSED*"])


def test_a_conftest_fixture_of_the_same_name_wins(pytester: pytest.Pytester) -> None:
    """A project's own ``ledger`` (fencepost's own suite has one) overrides the plugin's, and
    ``all`` does not multiply the tests that use it."""
    pytester.makeconftest(
        """
import pytest

@pytest.fixture
def ledger():
    return "the project's own"
"""
    )
    pytester.makepyfile(
        """
def test_own(ledger, fake_clock):
    assert ledger == "the project's own"
"""
    )
    run(pytester, "--fencepost-backend=all").assert_outcomes(passed=1)


# ------------------------------------------------------------------ PostgreSQL schemas

SCHEMA_RECORDED = """
import pathlib

def test_uses_schema(ledger, ledger_target):
    ledger.start_run("wf", scope_key=None, force=True, steps=[{"id": "s"}])
    schema = ledger_target.rsplit("schema=", 1)[1]
    (pathlib.Path(__file__).parent / "schema.txt").write_text(schema)
    CHECK
"""


@pytest.mark.postgres
def test_the_postgres_schema_is_dropped_after_the_test(pytester: pytest.Pytester) -> None:
    # Seen from the test, the schema is there (so "gone" below is not vacuous).
    pytester.makepyfile(
        SCHEMA_RECORDED.replace(
            "CHECK",
            f"""import psycopg
    with psycopg.connect({PG_URL!r}) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s",
            (schema,),
        ).fetchone()
    assert found[0] == 1""",
        )
    )
    run(pytester, "--fencepost-backend=postgres", f"--fencepost-pg-url={PG_URL}").assert_outcomes(
        passed=1
    )
    schema = (pytester.path / "schema.txt").read_text()
    assert schema.startswith("fencepost_test_")
    assert not schema_exists(schema)


@pytest.mark.postgres
def test_the_postgres_schema_is_dropped_with_psql_without_psycopg(
    pytester: pytest.Pytester,
) -> None:
    if shutil.which("psql") is None:
        pytest.skip(
            "psql (Debian's postgresql-client) is not on PATH: this test covers the plugin's "
            "fallback that drops a schema with psql when psycopg is missing"
        )
    # psycopg cannot be imported in the run: only psql can drop the schema.
    pytester.makeconftest("import sys\nsys.modules['psycopg'] = None\n")
    pytester.makepyfile(
        SCHEMA_RECORDED.replace(
            "CHECK",
            """import pytest
    with pytest.raises(ImportError):
        import psycopg""",
        )
    )
    run(pytester, "--fencepost-backend=postgres", f"--fencepost-pg-url={PG_URL}").assert_outcomes(
        passed=1
    )
    assert not schema_exists((pytester.path / "schema.txt").read_text())


@pytest.mark.parametrize(
    ("url", "passed"),
    [
        ("postgresql://app:p%40ss@db:5433/t?sslmode=require", "postgresql://app@db:5433/t?sslmode=require"),
        ("postgres://app@db/t?password=p%40ss&sslmode=require", "postgres://app@db/t?sslmode=require"),
        ("postgresql://app@db/t?password=p%40ss", "postgresql://app@db/t"),
    ],
    ids=["in-userinfo", "a-parameter", "the-only-parameter"],
)  # fmt: skip
def test_psql_gets_the_password_in_its_environment(
    monkeypatch: pytest.MonkeyPatch, url: str, passed: str
) -> None:
    """Not on its command line, where any process listing would show it."""
    import fencepost.testing as plugin

    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(argv: list[str], *, env: dict[str, str], **_: object) -> object:
        calls.append((argv, env))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(plugin.shutil, "which", lambda name: f"/bin/{name}")
    monkeypatch.setattr(plugin.subprocess, "run", fake_run)
    drop = plugin._psql_dropper()
    assert drop is not None
    drop(url, "fencepost_test_x")
    [(argv, env)] = calls
    assert argv == [
        "/bin/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", passed,
        "-c", 'DROP SCHEMA IF EXISTS "fencepost_test_x" CASCADE',
    ]  # fmt: skip
    assert env["PGPASSWORD"] == "p@ss"
    assert env["PGAPPNAME"] == "fencepost.testing"


def test_an_unreachable_server_fails_the_test(pytester: pytest.Pytester) -> None:
    """Not a skip: a skipped PostgreSQL half would pass without testing anything."""
    pytester.makepyfile("def test_pg(ledger):\n    pass\n")
    done = run(
        pytester, "--fencepost-backend=postgres", "--fencepost-pg-url=postgresql://u@127.0.0.1:9/db"
    )
    assert done.ret == pytest.ExitCode.TESTS_FAILED
    assert done.parseoutcomes().get("skipped") is None
    out = done.stdout.str()
    assert "StoreError: cannot connect to PostgreSQL at 127.0.0.1:9" in out
    assert "could not drop the test's schema 'fencepost_test_" in out


def test_no_way_to_drop_a_schema_is_a_clear_error(pytester: pytest.Pytester) -> None:
    """Refused before the schema is made, so nothing is left behind. The URL names a port
    nothing listens on: were the ledger opened regardless, the test would fail otherwise."""
    pytester.makeconftest(
        "import os, sys\nsys.modules['psycopg'] = None\nos.environ['PATH'] = os.devnull\n"
    )
    pytester.makepyfile("def test_pg(ledger):\n    pass\n")
    done = run(
        pytester, "--fencepost-backend=postgres", "--fencepost-pg-url=postgresql://u@127.0.0.1:9/db"
    )
    done.assert_outcomes(errors=1)
    assert (
        "RuntimeError: the postgres backend of fencepost.testing drops each test's schema after "
        "the test, which needs psycopg or the psql client, and neither is here: pip install "
        "'psycopg[binary]', or put psql on PATH"
    ) in done.stdout.str()
    assert "StoreError" not in done.stdout.str()


# ------------------------------------------------------------------ usage errors


def test_a_bad_backend_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(ledger):\n    pass\n")
    done = run(pytester, "--fencepost-backend=sqlite")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    done.stderr.fnmatch_lines(
        ["*--fencepost-backend: invalid choice: 'sqlite' (choose from *file*memory*postgres*all*"]
    )

    pytester.makeini("[pytest]\nfencepost_backend = sqlite\n")
    done = run(pytester)
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    done.stderr.fnmatch_lines(
        ["*fencepost_backend = 'sqlite' is not a backend; use file, memory, postgres, all*"]
    )


def test_a_bad_backend_parameter_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest

@pytest.mark.parametrize("fencepost_backend", ["sqlite"], indirect=True)
def test_indirect(ledger):
    pass

@pytest.mark.parametrize("fencepost_backend", ["all"])
def test_direct(ledger):
    pass
"""
    )
    done = run(pytester)
    done.assert_outcomes(errors=2)
    done.stdout.fnmatch_lines(
        [
            "*ValueError: fencepost_backend 'sqlite' is not a backend; use file, memory, postgres",
            "*ValueError: fencepost_backend 'all' is not a backend; use file, memory, postgres",
        ],
        consecutive=False,
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u@127.0.0.1:9/db?schema=mine", "leave schema= out of the PostgreSQL URL"),
        ("mysql://u:secret@127.0.0.1:9/db", "must begin postgresql://, not mysql://..."),
    ],
    ids=["schema-in-url", "not-a-pg-url"],
)
def test_a_pg_url_the_plugin_cannot_use_is_a_usage_error(
    pytester: pytest.Pytester, url: str, says: str
) -> None:
    pytester.makepyfile("def test_x(ledger):\n    pass\n")
    done = run(pytester, "--fencepost-backend=postgres", f"--fencepost-pg-url={url}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert says in done.stderr.str()
    assert "secret" not in done.stderr.str()
    # Unused, a URL is not checked: a file-backed run does not care.
    run(pytester, f"--fencepost-pg-url={url}").assert_outcomes(passed=1)


def test_the_pg_password_stays_out_of_the_header(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(fake_clock):\n    pass\n")
    done = run(
        pytester,
        "--fencepost-backend=postgres",
        "--fencepost-pg-url=postgresql://u:hunter2x@h:9/db",
    )
    done.assert_outcomes(passed=1)
    done.stdout.fnmatch_lines(["fencepost: ledgers on postgres (postgresql://u:***@h:9/db)"])
    assert "hunter2x" not in done.stdout.str()


# ------------------------------------------------------------------ installation and docs


def test_the_entry_point_loads_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyproject.toml's pytest11 entry point, in a stand-in distribution on the path: pytest
    loads the plugin by itself, ``-p fencepost.testing`` on top of it registers it once, and
    ``-p no:fencepost.testing`` turns it off."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    entry_points = declared["project"]["entry-points"]["pytest11"]
    assert entry_points == {"fencepost.testing": "fencepost.testing"}
    site = pytester.path / "site"
    info = site / "fencepost_entry_point_check-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fencepost-entry-point-check\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile("def test_x(ledger, fake_clock):\n    assert ledger.list_runs() == []\n")

    def pytest_(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)

    pytest_().assert_outcomes(passed=1)
    pytest_("-p", "fencepost.testing").assert_outcomes(passed=1)
    off = pytest_("-p", "no:fencepost.testing")
    off.assert_outcomes(errors=1)
    off.stdout.fnmatch_lines(["*fixture 'ledger' not found*"])


def doc_examples() -> str:
    """docs/testing.md's Python blocks, in order: one test module."""
    text = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    return "\n".join(blocks)


def test_the_docs_examples_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_docs=doc_examples())
    run(pytester, "-k", "not postgres").assert_outcomes(passed=4, deselected=1)


@pytest.mark.postgres
def test_the_docs_examples_pass_on_each_backend_postgres(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_docs=doc_examples())
    run(pytester, "--fencepost-backend=all", f"--fencepost-pg-url={PG_URL}").assert_outcomes(
        passed=11
    )


def test_the_plugin_module_is_not_imported_by_the_package() -> None:
    """The wheel has no dependencies: ``import fencepost`` must not reach pytest through the
    plugin."""
    code = "import sys, fencepost, fencepost.aio; print('pytest' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"

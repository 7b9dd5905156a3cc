"""Shared fixtures and helpers for the fencepost test suite.

The fixtures that make ledgers and targets run a test once per backend:

- ``ledger``: an open ``fp.Ledger`` with the injected ``clock``, on a SQLite file, a private
  in-memory database and a fresh PostgreSQL schema (``ledger_target`` chooses where; a module
  whose tests read the database behind the API's back overrides ``ledger_target`` with
  ``target``, the backends another connection can see);
- ``target``: a fresh target on each backend with shared storage (a SQLite file, a PostgreSQL
  schema), for tests that open several ledgers or start processes on one.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import fencepost as fp

REPO = pathlib.Path(__file__).resolve().parents[1]


# The RFC 8785 vectors, vendored (tests/vectors/jcs/README.md says where they come from).
JCS_DIR = REPO / "tests" / "vectors" / "jcs"


# Hypothesis profiles: "ci" (default) is thorough and deterministic, "dev" is quick.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("FENCEPOST_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def jcs_dir() -> pathlib.Path:
    return JCS_DIR


class FakeClock:
    """An injectable clock (``Ledger.open(..., clock=...)``): epoch ms, moved by hand, so
    lease expiry is driven by the test instead of by sleeping."""

    def __init__(self, start_ms: int = 1_764_720_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# ------------------------------------------------------------------ PostgreSQL

PG_URL = os.environ.get("FENCEPOST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema for one test, dropped afterwards: yields the ledger URL.

    No skip when the server is down: the PostgreSQL half of the suite is part of the contract
    (.ci/run starts the server), so an unreachable server fails the test loudly.
    """
    schema = f"fpt_{uuid.uuid4().hex[:20]}"
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}schema={schema}"
    finally:
        with pg_connect(PG_URL) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def schema_of(url: str) -> str:
    """The schema a test's ledger URL names."""
    return url.rsplit("schema=", 1)[1]


def pg_connect(url: str) -> Any:
    """A psycopg connection to a ledger URL's database with the ledger's schema (``public``
    when the URL names none) on its search_path, for reading behind the API's back and for
    making and dropping schemas (autocommit)."""
    import psycopg

    base, _, query = url.partition("?")
    base = _DIRECT.get(base, base)
    schema = dict(p.split("=", 1) for p in query.split("&") if p).get("schema", "public")
    conn = psycopg.connect(base, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


# ------------------------------------------------------------------ targets and ledgers


# The modules whose PostgreSQL tests also run through PgBouncer in transaction mode (the
# ``pgbouncer`` backend: the ledger's ``?pooler=transaction``): the write paths (reserve, finish,
# claim, fencing on every write, the queue, prune, retries, fan-in, messages) and the reads of
# events and blobs.
POOLED_MODULES = {
    "test_attempts",
    "test_blobs",
    "test_fan_in",
    "test_messages",
    "test_attempts_races",
    "test_leases",
    "test_leases_races",
    "test_claim_next",
    "test_queue",
    "test_schedule",
    "test_prune",
    "test_retries",
    "test_runs",
    "test_events",
    "test_wait_events",
}

# A URL through the pooler (no query) -> the same database's direct URL, for reading behind
# the API's back: a session's own settings (search_path) mean nothing through the pooler.
_DIRECT: dict[str, str] = {}


@pytest.fixture(scope="session")
def pgbouncer_url() -> Iterator[str]:
    """PgBouncer in transaction mode in front of the tests' server, for the whole session."""
    from tests.pgbouncer import bouncer

    direct = PG_URL.partition("?")[0]
    with bouncer(direct) as url:
        _DIRECT[url] = direct
        yield url


@contextlib.contextmanager
def fresh_target(
    kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest | None = None
) -> Iterator[str]:
    """A target no ledger has used yet: ``file`` or ``sqlite`` a SQLite file, ``memory`` a
    private in-memory database, ``postgres`` a PostgreSQL schema (dropped afterwards),
    ``pgbouncer`` such a schema through PgBouncer in transaction mode."""
    if kind == "pgbouncer":
        assert request is not None
        from tests.pgbouncer import through

        pooler = request.getfixturevalue("pgbouncer_url")
        with pg_schema() as url:
            yield through(pooler, url)
    elif kind == "postgres":
        with pg_schema() as url:
            yield url
    elif kind == "memory":
        yield ":memory:"
    else:
        yield str(tmp_path / "ledger.db")


@pytest.fixture(params=["sqlite", "postgres", "pgbouncer"])
def target(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """A fresh ledger target on each shared-storage backend: a SQLite file or a PostgreSQL
    schema (in ``POOLED_MODULES`` also through PgBouncer). Tests that open several ledgers or
    start processes on one take this."""
    with fresh_target(request.param, tmp_path, request) as made:
        yield made


@pytest.fixture(params=["file", "memory", "postgres", "pgbouncer"])
def ledger_target(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """Where the ``ledger`` fixture opens its ledger: every backend, in-memory SQLite too."""
    with fresh_target(request.param, tmp_path, request) as made:
        yield made


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``pgbouncer`` backend runs only in ``POOLED_MODULES``: elsewhere those items are not
    made at all (they are not tests skipped or deselected, just not part of the suite)."""

    def pooled(item: pytest.Item) -> bool:
        params = getattr(getattr(item, "callspec", None), "params", {})
        return "pgbouncer" in (params.get("target"), params.get("ledger_target"))

    def module(item: pytest.Item) -> str:
        return str(getattr(getattr(item, "module", None), "__name__", "")).split(".")[-1]

    items[:] = [item for item in items if not pooled(item) or module(item) in POOLED_MODULES]


@pytest.fixture
def ledger(ledger_target: str, clock: FakeClock) -> Iterator[fp.Ledger]:
    """A fresh ledger on ``ledger_target``, with the injected clock."""
    with fp.Ledger.open(ledger_target, clock=clock) as opened:
        yield opened


STEPS = [
    {"id": "plan", "title": "Plan", "instructions": "Write the plan"},
    {"id": "build", "title": "Build", "instructions": "Build it", "completion": {"kind": "auto"}},
    {"id": "ship", "title": "Ship"},
]


@pytest.fixture
def run(ledger: fp.Ledger) -> fp.Run:
    """An active run of ``STEPS`` on the ``ledger``, in a guarded scope."""
    return ledger.start_run("wf/fan", scope_key="s", steps=STEPS)


# ------------------------------------------------------------------ reading behind the API


class _PgRaw:
    """The slice of sqlite3.Connection the tests use, over psycopg: `?` placeholders and the
    SQLite spellings the tests' queries use are translated, so one query reads both backends."""

    def __init__(self, url: str) -> None:
        self.conn = pg_connect(url)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        if sql.strip().upper().startswith("PRAGMA INTEGRITY_CHECK"):
            sql = "SELECT 'ok'"  # PostgreSQL checks its own pages
        sql = re.sub(r"json_extract\((\w+), '\$\.(\w+)'\)", r"(CAST(\1 AS jsonb) ->> '\2')", sql)
        return self.conn.execute(sql.replace("?", "%s"), params)

    def commit(self) -> None:
        """Autocommit: nothing to do."""

    def close(self) -> None:
        self.conn.close()


@contextlib.contextmanager
def raw_db(path: str | os.PathLike[str]) -> Iterator[Any]:
    """A raw connection to a ledger for reading behind the API's back: Python's sqlite3 on a
    file, psycopg on a PostgreSQL URL (the same queries work on both); closed on exit.

    For SQLite it is committed and *closed* on exit: a connection of a second SQLite library
    left open in this process would see the file through stale shared-memory state once
    fencepost closes it (POSIX locks are per process, so fencepost's last connection cannot see
    it and removes the -wal/-shm files).
    """
    if str(path).startswith("postgresql://"):
        pg = _PgRaw(str(path))
        try:
            yield pg
        finally:
            pg.close()
        return
    db = sqlite3.connect(path)
    try:
        yield db
        db.commit()
    finally:
        db.close()


def applied_migrations(target: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """The ledger's record of its migrations: (version, name), oldest first."""
    with raw_db(target) as db:
        return [
            tuple(row)
            for row in db.execute("SELECT version, name FROM schema_migrations ORDER BY version")
        ]


def counts(target: str) -> tuple[int, int, int, int]:
    """(runs, events, attempts, blobs): what 'nothing written' is checked against."""
    tables = ("runs", "events", "attempts", "blobs")
    with raw_db(target) as db:
        return tuple(  # type: ignore[return-value]
            db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables
        )


# ------------------------------------------------------------------ controllers' runs

DEFINITION = {"name": "deploy", "steps": [{"id": "build"}, {"id": "ship"}], "version": 3}


def queued(run_id: str = "run-1", **overrides: Any) -> dict[str, Any]:
    """reserve_run keywords, with the digest computed the way a caller should."""
    definition = overrides.pop("definition", DEFINITION)
    kw: dict[str, Any] = {
        "workflow_name": "deploy",
        "workflow_ref": "deploy@3",
        "source": {"kind": "builtin", "id": "deploy", "revision": 3},
        "definition_digest": fp.digest(definition),
        "definition": definition,
        "input": {"target": "prod"},
        "launch_options": {"max_parallel": 8},
        "runner_id": "host-a",
        "origin_session_id": "session-1",
    }
    kw.update(overrides)
    return kw


def started(ledger: fp.Ledger, run_id: str = "run-1", runner: str = "host-a") -> fp.Claim:
    """A controller's path to dispatch: reserve the run, claim it, set it active."""
    ledger.reserve_run(run_id, **queued(run_id))
    claim = ledger.claim(run_id, runner, lease_ms=10_000)
    assert claim is not None
    ledger.set_status(run_id, "active", claim=claim)
    return claim


# ------------------------------------------------------------------ the command line


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m fencepost ARGS`` in a child process, as a user runs it; never raises on a
    non-zero exit (the tests check the status)."""
    return subprocess.run(
        [sys.executable, "-m", "fencepost", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any], str]:
    """One demo run (600 units, 3 workers, one killed), shared by the demo's tests and the
    inspection commands' tests: its ledger file, its JSON report and its stderr."""
    import json

    db = tmp_path_factory.mktemp("demo") / "demo.db"
    done = cli("demo", "--units", "600", "--workers", "3", "--seed", "3", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    return db, json.loads(done.stdout), done.stderr

"""Shared fixtures and settings for the fencepost test suite."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

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
    """An injectable clock (DESIGN §2: `Ledger.open(..., clock=...)`): epoch ms, moved by hand."""

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


def pg_connect(url: str) -> Any:
    """A psycopg connection to a ledger URL's database with the ledger's schema (``public``
    when the URL names none) on its search_path, for reading behind the API's back and for
    making and dropping schemas (autocommit)."""
    import psycopg

    base, _, query = url.partition("?")
    schema = dict(p.split("=", 1) for p in query.split("&") if p).get("schema", "public")
    conn = psycopg.connect(base, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """A fresh ledger target on each shared-storage backend: a SQLite file or a PostgreSQL
    schema. Tests that start several processes on one ledger take this."""
    if request.param == "sqlite":
        yield str(tmp_path / "ledger.db")
    else:
        with pg_schema() as url:
            yield url


@pytest.fixture(params=["file", "memory", "postgres"])
def ledger(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, clock: FakeClock
) -> Iterator[Any]:
    """A fresh ledger on each backend, with the injected clock."""
    import fencepost as fp

    if request.param == "postgres":
        with pg_schema() as url, fp.Ledger.open(url, clock=clock) as opened:
            yield opened
        return
    target = str(tmp_path / "ledger.db") if request.param == "file" else ":memory:"
    with fp.Ledger.open(target, clock=clock) as opened:
        yield opened


STEPS = [
    {"id": "plan", "title": "Plan", "instructions": "Write the plan"},
    {"id": "build", "title": "Build", "instructions": "Build it", "completion": {"kind": "auto"}},
    {"id": "ship", "title": "Ship"},
]


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

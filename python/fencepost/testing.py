"""A pytest plugin for testing code that uses fencepost: a fake clock and a fresh ledger per test.

Installed with fencepost and loaded by pytest on its own (the ``pytest11`` entry point
``fencepost.testing``); ``-p fencepost.testing`` loads it explicitly and
``-p no:fencepost.testing`` turns it off. Its fixtures:

- ``fake_clock``: a :class:`FakeClock`, moved by hand, so lease expiry and due times are
  driven by the test instead of by sleeping;
- ``ledger``: a fresh, empty :class:`fencepost.Ledger` opened with ``fake_clock``, closed after
  the test;
- ``ledger_target``: the target that ledger was opened on, to open a second ``Ledger``, an
  ``AsyncLedger`` or a subprocess on the same store;
- ``fencepost_backend``: the backend of this test's ledger (``file``, ``memory`` or
  ``postgres``), which a test may parametrize.

The backend is a SQLite file in the test's ``tmp_path`` unless ``--fencepost-backend`` (or the
ini option ``fencepost_backend``) says ``memory``, ``postgres`` or ``all`` (every test that
takes a ledger runs once per backend). On PostgreSQL (``--fencepost-pg-url``, else
``$FENCEPOST_PG_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``) each test gets a
schema of its own, dropped after the test. docs/testing.md has the details and an example.

fencepost itself depends on nothing: this module is only imported when pytest loads it.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import os
import pathlib
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import unquote

try:
    import pytest
except ImportError as e:  # imported by hand outside pytest: the wheel does not bring pytest
    raise ImportError("fencepost.testing is a pytest plugin: pip install pytest") from e

from fencepost.ledger import Ledger, redact_target
from fencepost.models import from_ms, to_ms

__all__ = ["BACKENDS", "DEFAULT_PG_URL", "FakeClock"]

BACKENDS = ("file", "memory", "postgres")
"""The backends a test's ledger can be on; ``--fencepost-backend=all`` runs each."""

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""The PostgreSQL server used when neither ``--fencepost-pg-url`` nor ``$FENCEPOST_PG_URL``
names one."""

_MS = _dt.timedelta(milliseconds=1)


def _ms_of(when: _dt.datetime, argument: str) -> int:
    """Epoch milliseconds of an aware datetime (floored, as the ledger reads datetimes)."""
    if when.utcoffset() is None:
        raise ValueError(
            f"{argument} is a naive datetime, which names no instant; pass an aware one "
            "(datetime(2026, 1, 1, tzinfo=UTC))"
        )
    return to_ms(when)


class FakeClock:
    """An injectable clock for ``Ledger.open(..., clock=...)``: epoch milliseconds that move
    only when the test moves them.

    Calling it returns :attr:`now`. It starts at ``start`` (epoch milliseconds or an aware
    datetime; by default 2025-12-03 00:00 UTC, a fixed instant so tests are repeatable)::

        clock = FakeClock()
        ledger = fencepost.Ledger.open("test.db", clock=clock)
        claim = ledger.claim(run_id, "worker-a", lease_ms=10_000)
        clock.advance(timedelta(seconds=11))  # the lease has expired

    The ledger reads it on every operation, from whichever thread does the work; each read
    sees the time before or after a move, never a torn value, so the test may move it while
    other threads use the ledger (moves from several threads at once are not serialized).
    Moving it backwards is allowed (a host whose clock lags); the ledger refuses times before
    1970 or after the year 9999.
    """

    __slots__ = ("now",)

    now: int
    """The current time, in epoch milliseconds. Assign to it to jump (see also :meth:`set`)."""

    def __init__(self, start: int | _dt.datetime = 1_764_720_000_000) -> None:
        self.now = 0
        self.set(start)

    def __call__(self) -> int:
        """The current time in epoch milliseconds: what the ledger calls."""
        return self.now

    @property
    def datetime(self) -> _dt.datetime:
        """The current time as an aware UTC datetime, as the ledger's models show times."""
        return from_ms(self.now)

    def advance(self, by: int | _dt.timedelta) -> int:
        """Move the clock by ``by``: milliseconds, or a ``timedelta`` (whole milliseconds; any
        remainder is dropped). Returns the new :attr:`now`."""
        if isinstance(by, _dt.timedelta):
            self.now += by // _MS
        elif isinstance(by, int) and not isinstance(by, bool):
            self.now += by
        else:
            raise TypeError(
                f"advance takes milliseconds (int) or a timedelta, not {type(by).__name__}"
            )
        return self.now

    def set(self, when: int | _dt.datetime) -> int:
        """Jump to ``when``: epoch milliseconds, or an aware ``datetime``. Returns the new
        :attr:`now`."""
        if isinstance(when, _dt.datetime):
            self.now = _ms_of(when, "when")
        elif isinstance(when, int) and not isinstance(when, bool):
            self.now = when
        else:
            raise TypeError(
                f"set takes epoch milliseconds (int) or an aware datetime, not "
                f"{type(when).__name__}"
            )
        return self.now

    def __repr__(self) -> str:
        return f"FakeClock({self.now}: {self.datetime.isoformat()})"


# ------------------------------------------------------------------ options

_BACKEND = pytest.StashKey[str]()
_PG_URL = pytest.StashKey[str]()
_CHOICES = (*BACKENDS, "all")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--fencepost-backend``, ``--fencepost-pg-url`` and the ini option
    ``fencepost_backend``."""
    group = parser.getgroup("fencepost", "fencepost ledgers (fencepost.testing)")
    group.addoption(
        "--fencepost-backend",
        choices=_CHOICES,
        default=None,
        help="where the `ledger` fixture opens its ledger: a SQLite file in tmp_path (file, "
        "the default), an in-memory SQLite database (memory), a fresh PostgreSQL schema "
        "(postgres), or each of them in turn (all). Overrides the ini option.",
    )
    group.addoption(
        "--fencepost-pg-url",
        default=None,
        help="the PostgreSQL database of the postgres backend, without a schema (each test "
        f"makes its own); default $FENCEPOST_PG_URL, else {DEFAULT_PG_URL}",
    )
    parser.addini(
        "fencepost_backend",
        help="the default of --fencepost-backend: file, memory, postgres or all",
        default="file",
    )


def _check_pg_url(url: str) -> str:
    """``url`` if the postgres backend can make schemas in it; ``UsageError`` otherwise."""
    if not url.startswith(("postgresql://", "postgres://")):
        # Only the scheme is shown: redact_target knows where a PostgreSQL URL keeps its
        # password, not where any other string does.
        shown = f"{url.split('://', 1)[0]}://..." if "://" in url else "a URL without a scheme"
        raise pytest.UsageError(
            f"fencepost.testing: the PostgreSQL URL must begin postgresql://, not {shown} "
            "(--fencepost-pg-url or $FENCEPOST_PG_URL)"
        )
    query = url.partition("?")[2]
    if any(pair.split("=", 1)[0] == "schema" for pair in query.split("&")):
        raise pytest.UsageError(
            f"fencepost.testing: leave schema= out of the PostgreSQL URL "
            f"({redact_target(url)}): every test gets a fresh schema of its own, dropped "
            "afterwards"
        )
    return url


def pytest_configure(config: pytest.Config) -> None:
    """Read and check the options once, so a mistake is a usage error before any test runs."""
    chosen = config.getoption("fencepost_backend") or config.getini("fencepost_backend")
    backend = str(chosen).strip()
    if backend not in _CHOICES:
        raise pytest.UsageError(
            f"fencepost.testing: fencepost_backend = {backend!r} is not a backend; use "
            + ", ".join(_CHOICES)
        )
    config.stash[_BACKEND] = backend
    url = (
        config.getoption("fencepost_pg_url") or os.environ.get("FENCEPOST_PG_URL") or DEFAULT_PG_URL
    )
    # Checked now only where it will be used: an unused bad URL is no reason to fail a run.
    config.stash[_PG_URL] = _check_pg_url(url) if backend in ("postgres", "all") else url


def pytest_report_header(config: pytest.Config) -> str | None:
    """Name the backend when it is not the default, so a log says what the ledgers were on."""
    backend = config.stash.get(_BACKEND, "file")
    if backend == "file":
        return None
    if backend == "memory":
        return "fencepost: ledgers in memory"
    return f"fencepost: ledgers on {backend} ({redact_target(config.stash[_PG_URL])})"


def _parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether the test's own ``parametrize`` marks name the argument ``name``."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = names.split(",")
        if name in (n.strip() for n in names):
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``--fencepost-backend=all``: every test whose ledger this plugin makes runs once per
    backend. ``fencepost_backend`` is in a test's fixture closure only through this plugin's
    ``ledger_target``, so a project whose conftest overrides ``ledger_target`` (or ``ledger``)
    with fixtures of its own is left alone, as is a test that parametrizes the backend
    itself."""
    if "fencepost_backend" not in metafunc.fixturenames:
        return
    if metafunc.config.stash.get(_BACKEND, "file") != "all":
        return
    if _parametrized(metafunc, "fencepost_backend"):
        return
    metafunc.parametrize("fencepost_backend", BACKENDS, indirect=True)


# ------------------------------------------------------------------ dropping a test's schema


def _psycopg_dropper() -> Callable[[str, str], None] | None:
    """Drop with psycopg, if it can be imported: in this process, no password on a command
    line. Imported by name so that neither the wheel nor mypy needs it."""
    try:
        psycopg = importlib.import_module("psycopg")
    except ImportError:
        return None

    def drop(url: str, schema: str) -> None:
        with psycopg.connect(
            url, autocommit=True, connect_timeout=10, application_name="fencepost.testing"
        ) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return drop


def _psql_dropper() -> Callable[[str, str], None] | None:
    """Drop with ``psql``, if it is on PATH. The password goes in ``PGPASSWORD``, taken out of
    the URL, so no process listing shows it."""
    psql = shutil.which("psql")
    if psql is None:
        return None

    def drop(url: str, schema: str) -> None:
        scheme, rest = url.split("://", 1)
        authority, slash, tail = rest.partition("/")
        userinfo, at, hosts = authority.rpartition("@")
        env = {**os.environ, "PGAPPNAME": "fencepost.testing", "PGCONNECT_TIMEOUT": "10"}
        if ":" in userinfo:
            userinfo, password = userinfo.split(":", 1)
            env["PGPASSWORD"] = unquote(password)
        path, sep, query = tail.partition("?")
        pairs = []
        for pair in query.split("&"):
            if pair.split("=", 1)[0] == "password":
                env["PGPASSWORD"] = unquote(pair.split("=", 1)[1])
            elif pair:
                pairs.append(pair)
        bare = f"{scheme}://{userinfo}{at}{hosts}{slash}{path}{sep if pairs else ''}"
        done = subprocess.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", bare + "&".join(pairs), "-c",
             f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql exited with status {done.returncode}: {done.stderr.strip()}")

    return drop


def _schema_dropper() -> Callable[[str, str], None]:
    """How this process drops a test's schema. fencepost's own API has no way to drop a
    schema (a ledger never removes its own storage), so it takes psycopg or psql; found
    before the schema is made, so a missing route never leaves a schema behind."""
    drop = _psycopg_dropper() or _psql_dropper()
    if drop is None:
        raise RuntimeError(
            "the postgres backend of fencepost.testing drops each test's schema after the "
            "test, which needs psycopg or the psql client, and neither is here: "
            "pip install 'psycopg[binary]', or put psql on PATH"
        )
    return drop


# ------------------------------------------------------------------ fixtures


def _check_backend(backend: object) -> str:
    """``backend`` if it names one of :data:`BACKENDS`; ``ValueError`` otherwise."""
    if backend not in BACKENDS:
        raise ValueError(
            f"fencepost_backend {backend!r} is not a backend; use " + ", ".join(BACKENDS)
        )
    return str(backend)


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`FakeClock` at 2025-12-03 00:00 UTC, the clock of the ``ledger`` fixture:
    ``fake_clock.advance(ms or timedelta)`` moves the ledger's time."""
    return FakeClock()


@pytest.fixture
def fencepost_backend(request: pytest.FixtureRequest) -> str:
    """The backend of this test's ``ledger``: ``file``, ``memory`` or ``postgres``. It comes
    from ``--fencepost-backend`` (or the ini option ``fencepost_backend``; with ``all``, each
    in turn), or from the test: ``@pytest.mark.parametrize("fencepost_backend", ["memory",
    "postgres"], indirect=True)``."""
    backend = getattr(request, "param", None)
    if backend is None:
        configured = request.config.stash.get(_BACKEND, "file")
        # "all" reaches here only for a ledger asked for at run time
        # (request.getfixturevalue), after the tests were parametrized: the default, then.
        backend = "file" if configured == "all" else configured
    return _check_backend(backend)


@pytest.fixture
def ledger_target(
    request: pytest.FixtureRequest, fencepost_backend: str, tmp_path: pathlib.Path
) -> Iterator[str]:
    """Where the ``ledger`` fixture opens its ledger, fresh for each test: the path of a SQLite
    file in ``tmp_path`` (``file``), ``":memory:"`` (``memory``: every ``Ledger.open`` of it is
    a database of its own, so it cannot be shared), or a PostgreSQL URL ending
    ``?schema=NAME`` (``postgres``: a new schema, dropped with everything in it after the
    test). Open another ``Ledger``, an ``AsyncLedger`` or a subprocess on it to share the
    store."""
    if fencepost_backend == "memory":
        yield ":memory:"
        return
    if fencepost_backend == "file":
        yield str(tmp_path / "fencepost.db")
        return
    # Checked again: a test that parametrizes fencepost_backend directly (not indirect)
    # replaces the fixture, and its check with it.
    _check_backend(fencepost_backend)
    url = request.config.stash.get(_PG_URL, DEFAULT_PG_URL)
    _check_pg_url(url)
    drop = _schema_dropper()
    schema = f"fencepost_test_{uuid.uuid4().hex[:20]}"
    # Dropped even if the test never opened the ledger: opening makes the schema, and a
    # failed open may have made part of it.
    try:
        yield f"{url}{'&' if '?' in url else '?'}schema={schema}"
    finally:
        try:
            drop(url, schema)
        except Exception as e:
            raise RuntimeError(
                f"fencepost.testing could not drop the test's schema {schema!r} at "
                f"{redact_target(url)} (if the test made it, it is left behind): {e}"
            ) from e


@pytest.fixture
def ledger(ledger_target: str, fake_clock: FakeClock) -> Iterator[Ledger]:
    """A fresh, empty :class:`fencepost.Ledger` on ``ledger_target`` whose clock is
    ``fake_clock``; closed after the test."""
    with Ledger.open(ledger_target, clock=fake_clock) as opened:
        yield opened

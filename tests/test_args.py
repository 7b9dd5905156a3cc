"""Input a hostile or careless caller sends, on every backend: secrets stay out of what is shown,
refused input writes nothing (byte for byte, for a refused file), text means the same on SQLite
and PostgreSQL, and every refusal is a ``fencepost`` error naming the argument."""

from __future__ import annotations

import hashlib
import pathlib
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

import fencepost as fp
from fencepost.ledger import redact_target
from tests.conftest import PG_URL, STEPS, FakeClock, pg_connect, pg_schema

SECRET = "s3cret-Pw"


def with_password(url: str) -> str:
    """``url`` with a password in its user part (the local server trusts, so it connects)."""
    scheme, rest = url.split("://", 1)
    user, at, host = rest.partition("@")
    assert at, "FENCEPOST_PG_URL names a user"
    return f"{scheme}://{user.split(':')[0]}:{SECRET}@{host}"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencepost", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def schema_exists(name: str) -> bool:
    with pg_connect(PG_URL) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,))
        return bool(row.fetchone()[0])


# ------------------------------------------------------------------ secrets


@pytest.mark.parametrize(
    ("shown", "hidden"),
    [
        ("postgresql://u:pw@h:5432/db?schema=s", "postgresql://u:***@h:5432/db?schema=s"),
        ("postgres://u:p:w@h/db", "postgres://u:***@h/db"),
        ("postgresql://h/db?user=u&password=pw&sslmode=disable",
         "postgresql://h/db?user=u&password=***&sslmode=disable"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("ledger.db", "ledger.db"),
    ],
)  # fmt: skip
def test_redact_target(shown: str, hidden: str) -> None:
    assert redact_target(shown) == hidden


@pytest.mark.postgres
def test_a_password_is_never_shown() -> None:
    with pg_schema() as url:
        secret_url = with_password(url)
        with fp.Ledger.open(secret_url) as ledger:
            shown = [repr(ledger), ledger.target, str(ledger.pragmas())]
            assert all(SECRET not in s for s in shown), shown
            assert ledger.target.startswith("postgresql://postgres@")
        for args in (["doctor", "--db", secret_url], ["doctor", "--json", "--db", secret_url]):
            done = cli(*args)
            assert done.returncode == 0, done.stderr
            assert SECRET not in done.stdout + done.stderr
            assert "postgres@127.0.0.1" in done.stdout
        # A URL fencepost cannot parse, and a server it cannot reach: the errors keep it too.
        for bad in (
            secret_url.replace(":5432", ":notaport"),
            secret_url.replace(":5432", ":1") + "&connect_timeout=2",
        ):
            with pytest.raises(fp.LedgerError) as info:
                fp.Ledger.open(bad)
            assert SECRET not in str(info.value)


def test_claim_and_preparation_repr_hide_the_token(ledger: Any) -> None:
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
    claim = ledger.claim(run.run_id, "controller-1", lease_ms=60_000, token="tok-" + "x" * 40)
    assert claim.token == "tok-" + "x" * 40  # still there to use
    assert "tok-" not in repr(claim)
    assert "token" not in repr(claim)
    assert "controller-1" in repr(claim)
    prep = fp.Preparation("claimed", run, claim)
    assert "tok-" not in repr(prep)


# ------------------------------------------------------------------ refused files


def foreign_sqlite(path: pathlib.Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes(body) VALUES ('mine')")
    db.commit()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()


def newer_fencepost(path: pathlib.Path) -> None:
    fp.Ledger.open(str(path)).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (99, 'x', 0)")
    db.commit()
    db.close()


def not_sqlite(path: pathlib.Path) -> None:
    path.write_bytes(b"not a database, just some text\n" * 200)


@pytest.mark.parametrize("make", [foreign_sqlite, newer_fencepost, not_sqlite])
@pytest.mark.parametrize("create", [True, False])
def test_a_refused_file_is_left_byte_for_byte(
    tmp_path: pathlib.Path, make: Any, create: bool
) -> None:
    path = tmp_path / "other.db"
    make(path)
    before = sha(path)
    expected = fp.SchemaError if make is newer_fencepost else fp.StoreError
    with pytest.raises(expected):
        fp.Ledger.open(str(path), create=create)
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm


@pytest.mark.postgres
def test_create_false_and_read_commands_never_make_a_schema() -> None:
    with pg_schema() as url:
        name = url.rsplit("schema=", 1)[1]
        with pytest.raises(fp.StoreError, match="no fencepost ledger"):
            fp.Ledger.open(url, create=False)
        assert not schema_exists(name)
        for command in (["runs"], ["events"], ["leases"], ["doctor"], ["show", "r1"]):
            done = cli(*command, "--db", url)
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert "no fencepost ledger" in done.stderr, done.stderr
            assert not schema_exists(name), command
        fp.Ledger.open(url).close()  # create=True (the default) makes it
        assert schema_exists(name)
        assert cli("runs", "--db", url).returncode == 0


# ------------------------------------------------------------------ text on both backends


def running(ledger: Any) -> tuple[Any, Any]:
    run = ledger.start_run("wf", scope_key="s", steps=STEPS, run_id="r1")
    return run, ledger.reserve_attempt(run.run_id, "u1", step_id="build", holder="w1")


def test_nul_in_text_is_refused_the_same_everywhere(ledger: Any) -> None:
    run, res = running(ledger)
    before = ledger.events(run.run_id)
    refusals = [
        ("failure_reason", lambda: ledger.finish_attempt(
            run.run_id, "u1", res.attempt, res.dispatch_id, status="failed",
            failure_reason="bad\x00byte")),
        ("failure_reason", lambda: ledger.finish_attempts([{
            "run_id": run.run_id, "unit_id": "u1", "attempt": res.attempt,
            "dispatch_id": res.dispatch_id, "status": "failed", "failure_reason": "\x00"}])),
        ("holder", lambda: ledger.reserve_attempt(run.run_id, "u2", step_id="build",
                                                   holder="w\x00")),
        ("notes", lambda: ledger.complete_step(run.run_id, "plan", notes="n\x00")),
        ("run_id", lambda: ledger.get_run("r1\x00")),
        ("run_id", lambda: ledger.events("r1\x00")),
        ("scope_key", lambda: ledger.start_run("wf2", scope_key="s\x00", steps=STEPS)),
        ("title", lambda: ledger.start_run("wf3", scope_key=None, force=True, steps=STEPS,
                                           title="t\x00")),
        ("steps", lambda: ledger.start_run("wf4", scope_key=None, force=True,
                                           steps=[{"id": "a", "title": "t\x00"}])),
    ]  # fmt: skip
    for argument, call in refusals:
        with pytest.raises(fp.InvalidArgument) as info:
            call()
        assert info.value.argument == argument
        assert "NUL" in str(info.value)
    # Nothing was written: the attempt still runs, no run or event was added.
    assert ledger.attempts(run.run_id, "u1")[0].status == "running"
    assert ledger.unit(run.run_id, "u2") is None
    assert [r.run_id for r in ledger.list_runs()] == ["r1"]
    assert ledger.events(run.run_id) == before
    # The worker with an odd failure reason can still finish that attempt once it cleans it.
    assert ledger.finish_attempt(
        run.run_id, "u1", res.attempt, res.dispatch_id, status="failed", failure_reason="bad"
    )


def test_keys_have_one_length_limit_everywhere(ledger: Any) -> None:
    longest = "k" * 1024
    ledger.start_run("wf", scope_key=longest, steps=STEPS, run_id="r1")
    assert ledger.find_scope_occupant(longest).run_id == "r1"
    for argument, call in [
        ("scope_key", lambda: ledger.start_run("wf", scope_key="k" * 10_000, steps=STEPS)),
        ("scope_key", lambda: ledger.find_scope_occupant("é" * 513)),  # 1026 bytes
        (
            "workflow_ref",
            lambda: ledger.start_run("w" * 1025, scope_key=None, force=True, steps=STEPS),
        ),
    ]:
        with pytest.raises(fp.InvalidArgument, match="at most 1024 bytes") as info:
            call()
        assert info.value.argument == argument
    assert len(ledger.list_runs()) == 1
    # Free text is not bounded.
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, title="t" * 50_000)
    assert run.workflow_name == "t" * 50_000


def test_json_strings_keep_nul_on_every_backend(ledger: Any) -> None:
    value = {"a\x00b": ["\x00", "x\x00y"], "n": 1}
    digest = ledger.put_json(value)
    assert digest == fp.digest(value)
    assert ledger.get_json(digest) == value
    run, res = running(ledger)
    assert (
        ledger.start_run("wf2", scope_key=None, force=True, steps=STEPS, params=value).params
        == value
    )
    assert ledger.finish_attempt(
        run.run_id, "u1", res.attempt, res.dispatch_id, status="completed", result=value
    )
    [r2] = ledger.reserve_attempts(run.run_id, [{"unit_id": "u2", "step_id": "build"}])
    assert ledger.finish_attempts([{
        "run_id": run.run_id, "unit_id": "u2", "attempt": r2.attempt,
        "dispatch_id": r2.dispatch_id, "status": "completed", "result": value,
    }]) == [True]  # fmt: skip
    assert ledger.unit(run.run_id, "u1").result == value
    assert ledger.unit(run.run_id, "u2").result == value


# ------------------------------------------------------------------ resolve_run_id


def test_resolve_run_id_is_exact_first_case_sensitive_and_bounded(ledger: Any) -> None:
    for run_id in ("deploy", "deploy-2", "deploy_3", "Zeta"):
        ledger.start_run("wf", scope_key=run_id, steps=STEPS, run_id=run_id)
    assert ledger.resolve_run_id("deploy") == "deploy"  # an exact id wins over longer ones
    assert ledger.resolve_run_id("deploy-") == "deploy-2"
    assert ledger.resolve_run_id("deploy_") == "deploy_3"  # `_` is literal
    assert ledger.resolve_run_id("Z") == "Zeta"
    with pytest.raises(fp.AmbiguousRunId) as info:
        ledger.resolve_run_id("dep")
    assert sorted(info.value.matches) == ["deploy", "deploy-2", "deploy_3"]
    for missing in ("DEPLOY", "zeta", "deploy%", "deploy-3"):
        with pytest.raises(fp.RunNotFound):
            ledger.resolve_run_id(missing)
    for bad, says in (("", "empty"), ("d" * 60_000, "1024 bytes"), ("d\x00", "NUL")):
        with pytest.raises(fp.InvalidArgument, match=says) as bad_info:
            ledger.resolve_run_id(bad)
        assert bad_info.value.argument == "prefix"


# ------------------------------------------------------------------ Python-level input


class RaisingEqKey(str):
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("hostile __eq__")


def test_bad_python_values_are_invalid_arguments(ledger: Any) -> None:
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
    cases: list[tuple[str, Any, str]] = [
        ("force", lambda: ledger.start_run("wf", scope_key="s", steps=STEPS, force=1),
         "True or False"),
        ("force", lambda: ledger.start_run("wf", scope_key="s", steps=STEPS, force=None),
         "True or False"),
        ("active_only", lambda: ledger.list_runs(active_only=0), "True or False"),
        ("include_children", lambda: ledger.list_runs(include_children=None), "True or False"),
        ("guard_refs", lambda: ledger.start_run("wf", scope_key=None, force=True, steps=STEPS,
                                                guard_refs=5), "iterable of str"),
        ("workflow_refs", lambda: ledger.list_runs(workflow_refs=5), "iterable of str"),
        ("workflow_refs", lambda: ledger.find_active_run(5, "s"), "iterable of str"),
        ("types", lambda: ledger.events(types=5), "iterable of str"),
        ("run_id", lambda: ledger.get_run("r\ud800"), "lone surrogate"),
        ("after_seq", lambda: ledger.events(after_seq=2**70), "64-bit"),
        ("target", lambda: fp.Ledger.open("led\ud800.db"), "lone surrogate"),
        ("target", lambda: fp.Ledger.open("led\x00.db"), "NUL"),
    ]  # fmt: skip
    for argument, call, says in cases:
        with pytest.raises(fp.InvalidArgument, match=says) as info:
            call()
        assert info.value.argument == argument, (argument, info.value)
        # Never the self-contradicting "must be a str, not str" / "must be an int, not int".
        assert "a str, not str" not in str(info.value)
        assert "an int, not int" not in str(info.value)
    assert [r.run_id for r in ledger.list_runs()] == [run.run_id]
    # A str subclass whose __eq__ raises is read as the str it is: no key lookup calls it.
    [res] = ledger.reserve_attempts(
        run.run_id, [{RaisingEqKey("unit_id"): "u1", RaisingEqKey("step_id"): "build"}]
    )
    assert (res.unit_id, res.kind) == ("u1", "reserved")
    with pytest.raises(fp.InvalidArgument, match='unknown key "bogus"') as info:
        ledger.reserve_attempts(run.run_id, [{"unit_id": "u2", RaisingEqKey("bogus"): 1}])
    assert info.value.argument == "units"
    with pytest.raises(fp.InvalidArgument, match="unknown key of type int"):
        ledger.reserve_attempts(run.run_id, [{"unit_id": "u2", 7: 1}])


@pytest.mark.parametrize("bad", [2**62, -(10**15), -1, 253_402_300_799_999])
def test_a_clock_outside_the_datetime_range_writes_nothing(bad: int, backend_target: str) -> None:
    clock = FakeClock()
    with fp.Ledger.open(backend_target, clock=clock) as ledger:
        run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
        events = ledger.events(run.run_id)
        good = clock.now
        clock.now = bad
        with pytest.raises(fp.InvalidArgument, match="outside the epoch milliseconds") as info:
            ledger.claim(run.run_id, "c1", lease_ms=1000)
        assert info.value.argument == "clock"
        with pytest.raises(fp.InvalidArgument):
            ledger.reserve_attempt(run.run_id, "u1", step_id="build")
        clock.now = good
        lease = ledger.lease(run.run_id)  # still readable: nothing out of range was stored
        assert (lease.generation, lease.owner_id) == (0, None)
        assert ledger.events(run.run_id) == events
        assert ledger.claim(run.run_id, "c1", lease_ms=1000) is not None
    clock.now = bad
    with pytest.raises(fp.InvalidArgument, match="clock"):
        fp.Ledger.open(backend_target, clock=clock)


@pytest.fixture(params=["sqlite", "postgres"])
def backend_target(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Any:
    if request.param == "sqlite":
        yield str(tmp_path / "ledger.db")
    else:
        with pg_schema() as url:
            yield url

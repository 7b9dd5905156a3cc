"""A ``Ledger`` belongs to the process that opened it. In a forked child an inherited ledger
(or ``AsyncLedger``) refuses every call with ``StoreError`` before it takes a lock or sends
anything, and closing or dropping it there closes nothing: the connection is the parent's,
which goes on working on the same PostgreSQL session. A ledger opened in the child works."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

import fencepost as fp
from fencepost.aio import AsyncLedger
from tests.conftest import PG_URL, REPO, pg_connect

FORK = multiprocessing.get_context("fork")

# The ledger's own threads (the SQLite checkpointer, the PostgreSQL listener, the writer's
# helper) are what makes forking with one open interesting: Python 3.12+ warns about it.
pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

REFUSED = re.compile(
    r"this Ledger was opened in process (\d+); open a new Ledger after fork "
    r"\(this is process (\d+)\)"
)

Outcome = tuple[str, str]


def _outcome(call: Callable[[], object]) -> Outcome:
    """``("ok", "")`` or the exception's class name and message."""
    try:
        call()
    except Exception as e:
        return type(e).__name__, str(e)
    return "ok", ""


def _calls(ledger: fp.Ledger, run_id: str) -> dict[str, Callable[[], object]]:
    """One call of each way into the core: the store directly (read and write), the writer's
    queue, the listening/polling wait, the statistics."""
    return {
        "get_run": lambda: ledger.get_run(run_id),
        "events": lambda: ledger.events(run_id),
        "start_run": lambda: ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}]),
        "reserve_attempt": lambda: ledger.reserve_attempt(run_id, "child", step_id="s"),
        "wait_events": lambda: ledger.wait_events(run_id, after_seq=10**9, timeout_s=0.2),
        "group_stats": lambda: ledger._core.group_stats(),
    }


def _assert_refused(outcomes: dict[str, Outcome], parent: int, child: int) -> None:
    for name, (kind, message) in outcomes.items():
        assert kind == "StoreError", (name, kind, message)
        pids = REFUSED.search(message)
        assert pids is not None, (name, message)
        assert (int(pids[1]), int(pids[2])) == (parent, child), (name, message)


def _own_sessions() -> set[int]:
    """The PostgreSQL backend pids of this process's fencepost sessions, found by the client
    ports of the TCP sockets this process holds."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    with pg_connect(PG_URL) as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE application_name = 'fencepost'"
        ).fetchall()
    return {pid for pid, port in rows if port in ports}


def _sessions(target: str) -> set[int]:
    return _own_sessions() if target.startswith("postgresql://") else set()


def _still_works(ledger: fp.Ledger, run_id: str, unit: str) -> None:
    """A write and reads on the parent's ledger, through the store and the writer."""
    res = ledger.reserve_attempt(run_id, unit, step_id="s")
    assert ledger.finish_attempt(run_id, unit, res.attempt, res.dispatch_id, status="completed")
    assert ledger.get_run(run_id) is not None
    assert [a.status for a in ledger.attempts(run_id, unit)] == ["completed"]
    assert ledger.wait_events(run_id, timeout_s=0)


def _fork(child: Callable[[], object]) -> Any:
    """Run ``child`` in a forked child and return what it returned (JSON through a pipe). The
    child leaves by ``os._exit`` whatever happens, so nothing of pytest runs in it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(r)
            os.write(w, json.dumps(child()).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        sent = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(sent)


def _open(target: str) -> tuple[fp.Ledger, str]:
    ledger = fp.Ledger.open(target)
    run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
    return ledger, run.run_id


def test_a_forked_child_is_refused_and_the_parent_keeps_its_session(target: str) -> None:
    ledger, run_id = _open(target)
    with ledger:
        _still_works(ledger, run_id, "before")
        # The listening connection too (PostgreSQL): a wait that times out starts it.
        assert ledger.wait_events(run_id, after_seq=10**9, timeout_s=0.05) == []
        sessions = _sessions(target)
        if target.startswith("postgresql://"):
            assert len(sessions) == 2  # the ledger's connection and its listener

        def child() -> object:
            got = {name: _outcome(call) for name, call in _calls(ledger, run_id).items()}
            return [got, os.getppid(), os.getpid()]

        got, parent, child_pid = _fork(child)
        assert parent == os.getpid()
        _assert_refused(got, parent, child_pid)
        _still_works(ledger, run_id, "after")
        assert _sessions(target) == sessions
        assert {u.unit_id for u in ledger.units(run_id)} == {"after", "before"}


def test_a_child_closing_an_inherited_ledger_leaves_the_parent_alone(target: str) -> None:
    ledger, run_id = _open(target)
    with ledger:
        _still_works(ledger, run_id, "before")
        sessions = _sessions(target)

        def child() -> object:
            ledger.close()
            with ledger:  # the with block's exit closes it again
                pass
            return _outcome(lambda: ledger.get_run(run_id))

        kind, message = _fork(child)
        assert kind == "StoreError"
        assert REFUSED.search(message), message
        _still_works(ledger, run_id, "after")
        assert _sessions(target) == sessions


def test_a_parent_thread_holding_the_store_does_not_hang_the_child(target: str) -> None:
    """The store's lock is held by a parent thread (a prune writing its archive) when the
    fork happens: the child's call is refused without waiting for a lock nobody will free."""
    clock_ms = [1_764_720_000_000]
    ledger = fp.Ledger.open(target, clock=lambda: clock_ms[0])
    with ledger:
        old = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        ledger.abandon_run(old.run_id, reason="done")
        clock_ms[0] += 60_000
        newest = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        writing, release = threading.Event(), threading.Event()

        class Archive:
            def write(self, data: bytes) -> int:
                writing.set()
                release.wait(30)
                return len(data)

            def flush(self) -> None:
                pass

        pruner = threading.Thread(
            target=ledger.prune,
            kwargs={"older_than": dt.timedelta(seconds=1), "archive": Archive()},
        )
        pruner.start()
        try:
            assert writing.wait(30)
            got = _fork(lambda: _outcome(lambda: ledger.get_run(newest.run_id)))
        finally:
            release.set()
            pruner.join(30)
        kind, message = got
        assert kind == "StoreError"
        assert REFUSED.search(message), message
        assert ledger.get_run(old.run_id) is None  # the prune went through
        _still_works(ledger, newest.run_id, "after")


_INHERITED: fp.Ledger | None = None


def _refused_in_pool_worker(run_id: str) -> tuple[Outcome, Outcome]:
    """A fork-started pool worker's calls on the ledger it inherited (a module global: a pool's
    arguments are pickled, and a ledger is not)."""
    ledger = _INHERITED
    assert ledger is not None
    return (
        _outcome(lambda: ledger.reserve_attempt(run_id, f"w{os.getpid()}", step_id="s")),
        _outcome(lambda: ledger.get_run(run_id)),
    )


def _refused_then_closed(run_id: str, queue: Any) -> None:
    """A fork-started process: the ledger inherited through a module global, refused, closed,
    then the process exits normally (``sys.exit``)."""
    ledger = _INHERITED
    assert ledger is not None
    queue.put(
        [
            _outcome(lambda: ledger.get_run(run_id)),
            _outcome(lambda: ledger.put_json({"a": 1})),
        ]
    )
    ledger.close()
    sys.exit(0)


def test_fork_started_processes_are_refused_and_the_parent_goes_on(target: str) -> None:
    global _INHERITED
    ledger, run_id = _open(target)
    with ledger:
        _still_works(ledger, run_id, "before")
        sessions = _sessions(target)
        _INHERITED = ledger
        try:
            queue = FORK.Queue()
            procs = [FORK.Process(target=_refused_then_closed, args=(run_id, queue)) for _ in "ab"]
            for p in procs:
                p.start()
            outcomes = [queue.get(timeout=60) for _ in procs]
            for p in procs:
                p.join(60)
                assert p.exitcode == 0
            with FORK.Pool(2) as pool:
                outcomes += pool.map(_refused_in_pool_worker, [run_id] * 4)
        finally:
            _INHERITED = None
        for pair in outcomes:
            for kind, message in pair:
                assert kind == "StoreError", message
                assert REFUSED.search(message), message
        _still_works(ledger, run_id, "after")
        assert _sessions(target) == sessions


def _open_in_child(target: str, run_id: str, queue: Any) -> None:
    with fp.Ledger.open(target) as own:
        res = own.reserve_attempt(run_id, "child", step_id="s")
        queue.put((res.kind, own.get_run(run_id) is not None))


def test_a_ledger_opened_in_the_child_works(target: str) -> None:
    ledger, run_id = _open(target)
    with ledger:
        _still_works(ledger, run_id, "before")
        queue = FORK.Queue()
        proc = FORK.Process(target=_open_in_child, args=(target, run_id, queue))
        proc.start()
        assert queue.get(timeout=60) == ("reserved", True)
        proc.join(60)
        assert proc.exitcode == 0
        assert [a.status for a in ledger.attempts(run_id, "child")] == ["running"]
        _still_works(ledger, run_id, "after")

        # A plain fork too, from a parent whose ledger is open.
        def child() -> object:
            with fp.Ledger.open(target) as own:
                return own.get_run(run_id) is not None and own.put_json([1]).startswith("sha256:")

        assert _fork(child) is True


def test_an_inherited_async_ledger_is_refused(target: str) -> None:
    async def parent_side() -> tuple[AsyncLedger, str]:
        aledger = await AsyncLedger.open(target)
        run = await aledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        # The writer's helper thread, the listener and the watcher thread all exist now.
        await aledger.reserve_attempt(run.run_id, "before", step_id="s")
        assert await aledger.wait_events(run.run_id, after_seq=10**9, timeout_s=0.05) == []
        return aledger, run.run_id

    aledger, run_id = asyncio.run(parent_side())

    async def child_side() -> dict[str, Outcome]:
        async def outcome(call: Any) -> Outcome:
            try:
                await call
            except Exception as e:
                return type(e).__name__, str(e)
            return "ok", ""

        got = {
            "reserve_attempt": await outcome(aledger.reserve_attempt(run_id, "c", step_id="s")),
            "get_run": await outcome(aledger.get_run(run_id)),
            "wait_events": await outcome(aledger.wait_events(run_id, timeout_s=0.2)),
        }
        await aledger.close()
        return got

    try:
        got = _fork(lambda: [asyncio.run(child_side()), os.getppid(), os.getpid()])
        outcomes, parent, child_pid = got
        _assert_refused(outcomes, parent, child_pid)
        _still_works(aledger.ledger, run_id, "after")
    finally:
        asyncio.run(aledger.close())


# A script, so that the child leaves through a normal interpreter exit (atexit hooks, the
# ledger dropped by finalization) rather than pytest's os._exit.
_SCRIPT = """
import asyncio, json, os, sys
import fencepost as fp
from fencepost.aio import AsyncLedger
from tests.test_fork import _own_sessions, _still_works

target, mode = sys.argv[1], sys.argv[2]
ledger = fp.Ledger.open(target)
run_id = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True).run_id
_still_works(ledger, run_id, "before")
ledger.wait_events(run_id, after_seq=10**9, timeout_s=0.05)
# An asynchronous call starts the writer's helper thread.
asyncio.run(AsyncLedger(ledger).reserve_attempt(run_id, "async", step_id="s"))
pg = target.startswith("postgresql://")
sessions = _own_sessions() if pg else set()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        ledger.get_run(run_id)
        refused = "not refused"
    except fp.StoreError as e:
        refused = str(e)
    os.write(w, refused.encode())
    os.close(w)
    if mode == "close":
        ledger.close()
    sys.exit(0)  # finalization drops the ledger
os.close(w)
with os.fdopen(r, "rb") as f:
    refused = f.read().decode()
_, status = os.waitpid(pid, 0)
_still_works(ledger, run_id, "after")
same = (_own_sessions() if pg else set()) == sessions
ledger.close()
print(json.dumps([refused, os.waitstatus_to_exitcode(status), same]))
"""


@pytest.mark.parametrize("mode", ["close", "drop"])
def test_a_child_exiting_through_the_interpreter_leaves_the_parent_alone(
    target: str, mode: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, target, mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    refused, child_exit, same_sessions = json.loads(done.stdout.strip().splitlines()[-1])
    assert REFUSED.search(refused), refused
    assert child_exit == 0
    assert same_sessions

"""PostgreSQL in production: a ledger on a multi-host URL over a real primary and its
synchronous standby (tests/pgcluster.py: ``initdb``, ``pg_basebackup -R``, ``pg_ctl`` on
loopback ports). A standby listed first is passed over for the writable server; a read-only
server refuses with a message that says so and writes nothing; and when the primary is killed
with ``kill -9`` and the standby promoted, a dispatcher process goes on through the same URL,
every write it was answered is on the new primary, no attempt is made twice, and a controller's
claim from before the failover is refused after it. ``durability="full"``: at ``normal``
PostgreSQL's ``synchronous_commit=off`` may lose the last answered writes by design."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator

import pytest

import fencepost as fp
from tests import pgcluster
from tests.conftest import pg_schema

needs_cluster = pytest.mark.skipif(
    pgcluster.missing() is not None,
    reason=f"needs servers of its own: {pgcluster.missing()}",
)

REPO = pathlib.Path(__file__).resolve().parent.parent


@needs_cluster
def test_a_standby_listed_first_is_passed_over_for_the_writable_server() -> None:
    with pgcluster.cluster() as c:
        both = c.url(c.standby_port, c.primary_port,
                     query="target_session_attrs=read-write&schema=fp_rw")  # fmt: skip
        with fp.Ledger.open(both) as ledger:
            ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r", force=True)
            # Every host is named, the password never.
            assert ledger.target == (
                f"postgresql://postgres@127.0.0.1:{c.standby_port},127.0.0.1:{c.primary_port}"
                "/postgres?schema=fp_rw"
            )
        with fp.Ledger.open(c.url(c.primary_port, query="schema=fp_rw")) as primary:
            assert primary.get_run("r") is not None
        # Without read-write the standby is taken as it is, and refuses to be written: the
        # error says why and what to do, and the ledger is not made.
        with pytest.raises(fp.StoreError) as info:
            fp.Ledger.open(c.url(c.standby_port, query="schema=fp_any"))
        message = str(info.value)
        assert "read-only" in message
        assert "target_session_attrs=read-write" in message
        assert f"127.0.0.1:{c.standby_port}" in message
        with pytest.raises(fp.StoreError, match="there is no fencepost ledger"):
            fp.Ledger.open(c.url(c.primary_port, query="schema=fp_any"), create=False)


def _read_log(path: pathlib.Path) -> list[list[str]]:
    return [line.split(" ", 4) for line in path.read_text().splitlines()]


def failover_round(c: pgcluster.Cluster, tmp: pathlib.Path) -> dict[str, int]:
    """One failover under a dispatcher's load; what it saw."""
    url = c.url(c.primary_port, c.standby_port,
                query="target_session_attrs=read-write&schema=fp_failover")  # fmt: skip
    with fp.Ledger.open(url, durability="full") as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="load", force=True)
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="held", force=True)
        stale = ledger.claim("held", "controller-a", lease_ms=1_500)
        assert stale is not None
    # A waiter on the same URL, listening before the failover.
    waiter = fp.Ledger.open(url)
    head = waiter.newest_event_seq()
    log, stop = tmp / "dispatcher.log", tmp / "stop"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.failover_dispatcher", url, "load", str(log), str(stop)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:

        def finished() -> int:
            return sum(1 for w in _read_log(log) if w[0] == "finished") if log.exists() else 0

        deadline = time.monotonic() + 60
        while finished() < 30:
            assert proc.poll() is None, "the dispatcher died"
            assert time.monotonic() < deadline, "the dispatcher made no progress"
            time.sleep(0.02)
        assert waiter.wait_events("load", after_seq=head, timeout_s=10)
        c.kill("primary")
        before = finished()
        c.promote("standby")
        deadline = time.monotonic() + 60
        while finished() < before + 30:
            assert proc.poll() is None, "the dispatcher died"
            assert time.monotonic() < deadline, "the dispatcher did not go on after the failover"
            time.sleep(0.02)
        stop.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = _read_log(log)
    assert lines[-1] == ["stopped"]
    reserved = {(w[1], int(w[2]), w[3]) for w in lines if w[0] == "reserved"}
    done = {w[1] for w in lines if w[0] == "finished"}
    errors = [" ".join(w) for w in lines if w[0] == "error"]
    assert errors, "the failover never reached the dispatcher"
    # Every answered write is on the promoted standby, and no unit was tried twice.
    new_primary = c.url(c.standby_port, query="schema=fp_failover")
    with fp.Ledger.open(new_primary, durability="full") as ledger:
        units = {u.unit_id: u for u in ledger.units("load", limit=10_000)}
        for unit, attempt, dispatch_id in reserved:
            assert attempt == 1
            mine = [a for a in ledger.attempts("load", unit) if a.dispatch_id == dispatch_id]
            assert mine, f"{unit}'s answered reservation is gone"
        for unit in done:
            assert units[unit].status == "completed", unit
        assert all(u.attempts == 1 for u in units.values())
        assert set(units) - {u for u, _, _ in reserved} <= {f"u{len(done)}"}
        # A controller's claim from before the failover is refused after it; the waiter,
        # through the same URL, hears of the new claim from the new primary.
        time.sleep(1.6)
        seen = waiter.events("held", after_seq=0, limit=1000)
        heard: list[fp.Event] = []
        listening = threading.Thread(target=lambda: heard.extend(waiter.wait_events(
            "held", after_seq=seen[-1].seq, timeout_s=30)))  # fmt: skip
        listening.start()
        taker = ledger.claim("held", "controller-b", lease_ms=60_000)
        assert taker is not None
        assert taker.generation == stale.generation + 1
        with pytest.raises(fp.LeaseLost):
            ledger.heartbeat(stale, lease_ms=1_000)
        listening.join(timeout=60)
        assert [e.type for e in heard][:1] == ["lease.claimed"]
        # Its LISTEN session is on the new primary.
        listens = c.run("psql", "-h", "127.0.0.1", "-p", str(c.standby_port), "-U", "postgres",
                        "-tAc", "SELECT count(*) FROM pg_stat_activity "
                        "WHERE query LIKE 'LISTEN fencepost_%'")  # fmt: skip
        assert int(listens) >= 1
    waiter.close()
    return {"finished": len(done), "errors": len(errors)}


@needs_cluster
def test_a_failover_to_the_promoted_standby(tmp_path: pathlib.Path) -> None:
    with pgcluster.cluster() as c:
        seen = failover_round(c, tmp_path)
    assert seen["finished"] >= 60


@needs_cluster
@pytest.mark.slow
def test_ten_failovers(tmp_path: pathlib.Path) -> None:
    for round_ in range(10):
        here = tmp_path / f"round-{round_}"
        here.mkdir()
        with pgcluster.cluster() as c:
            failover_round(c, here)


# ------------------------------------------------------------------ a session lost mid-write


class CuttingProxy:
    """A TCP proxy in front of the test server that, once armed, cuts both sides of a
    connection when the client sends a message holding ``marker``: after passing it on
    (``deliver``: the server gets it, and answers into the void) or before (it never arrives).
    It cuts once, then passes everything again."""

    def __init__(self, upstream: tuple[str, int], marker: bytes, deliver: bool) -> None:
        self.upstream, self.marker, self.deliver = upstream, marker, deliver
        self.armed = threading.Event()
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            cut = threading.Event()
            for src, dst, upward in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, upward, cut),
                                 daemon=True).start()  # fmt: skip

    def _pump(
        self, src: socket.socket, dst: socket.socket, upward: bool, cut: threading.Event
    ) -> None:
        try:
            while data := src.recv(65536):
                if cut.is_set():
                    # Nothing reaches the client once cut, answers included; the server's side
                    # stays open until the cut is made, so it reads all that was sent to it.
                    continue
                if upward and self.armed.is_set() and self.marker in data:
                    cut.set()
                    self.armed.clear()
                    self.cuts += 1
                    if self.deliver:
                        dst.sendall(data)
                        time.sleep(0.3)  # the server acts on it before the cut
                    for s in (src, dst):
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.listener.close()


def _proxied(url: str, proxy: CuttingProxy) -> str:
    """``url`` through the proxy, in plain text (the proxy must read the messages)."""
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}"
    query = parts.query + ("&" if parts.query else "") + "sslmode=disable"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _server(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5432


@contextlib.contextmanager
def _cut(marker: bytes, deliver: bool) -> Iterator[tuple[str, CuttingProxy, fp.Ledger]]:
    """A fresh schema, a proxy that cuts at ``marker`` once armed, and a ledger through it
    holding run ``r``: (the direct URL, the proxy, the ledger)."""
    with pg_schema() as url:
        proxy = CuttingProxy(_server(url), marker, deliver)
        try:
            with fp.Ledger.open(_proxied(url, proxy)) as ledger:
                ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r",
                                 force=True)  # fmt: skip
                yield url, proxy, ledger
        finally:
            proxy.close()


def test_a_session_lost_after_commit_says_the_write_may_have_committed() -> None:
    with _cut(b"COMMIT", deliver=True) as (url, proxy, ledger):
        proxy.armed.set()
        with pytest.raises(fp.StoreError) as info:
            ledger.reserve_attempt("r", "u1", step_id="s")
        message = str(info.value)
        assert "after COMMIT was sent" in message
        assert "may have committed" in message
        assert "reserve_attempt again reclaims" in message
        assert proxy.cuts == 1
        # It had committed, and nothing ran it again: one attempt. Repeating the call is safe:
        # it reclaims that attempt in place.
        again = ledger.reserve_attempt("r", "u1", step_id="s")
        assert (again.kind, again.attempt) == ("reclaimed", 1)
        with fp.Ledger.open(url) as direct:
            assert [a.attempt for a in direct.attempts("r", "u1")] == [1]


def test_a_session_lost_before_commit_is_run_again_on_a_new_one() -> None:
    with _cut(b"BEGIN", deliver=False) as (url, proxy, ledger):
        proxy.armed.set()
        got = ledger.reserve_attempt("r", "u1", step_id="s")
        assert proxy.cuts == 1
        assert (got.kind, got.attempt) == ("reserved", 1)
        # A read meets the same and is read again.
        proxy.armed.set()
        assert ledger.unit("r", "u1") is not None
        assert proxy.cuts == 2
        with fp.Ledger.open(url) as direct:
            assert [a.attempt for a in direct.attempts("r", "u1")] == [1]


def test_the_global_tail_reads_its_horizon_again_on_a_new_session() -> None:
    # The horizon is an autocommit statement of its own, before the read's snapshot.
    with _cut(b"events_seq_seq", deliver=False) as (_, proxy, ledger):
        proxy.armed.set()
        assert [e.type for e in ledger.events(after_seq=0)][:1] == ["run.started"]
        assert proxy.cuts == 1


def test_every_caller_of_a_group_lost_after_commit_is_told_so() -> None:
    with _cut(b"COMMIT", deliver=True) as (url, proxy, ledger):
        start = threading.Barrier(16)
        outcomes: dict[str, object] = {}

        def reserve(unit: str) -> None:
            start.wait()
            try:
                outcomes[unit] = ledger.reserve_attempt("r", unit, step_id="s")
            except fp.StoreError as e:
                outcomes[unit] = e

        threads = [threading.Thread(target=reserve, args=(f"u{i}",)) for i in range(16)]
        proxy.armed.set()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        failed = {u for u, o in outcomes.items() if isinstance(o, fp.StoreError)}
        assert len(outcomes) == 16
        assert failed, "no call was in the group that lost its session"
        for unit in failed:
            assert "may have committed" in str(outcomes[unit])
        with fp.Ledger.open(url) as direct:
            # The group had committed: each of its callers' attempts is there, once.
            for i in range(16):
                assert [a.attempt for a in direct.attempts("r", f"u{i}")] == [1]

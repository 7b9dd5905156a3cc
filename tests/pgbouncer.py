"""PgBouncer in transaction mode in front of the tests' PostgreSQL, on a loopback port of its
own, for the ledger's ``?pooler=transaction`` mode. Debian's ``pgbouncer`` (1.18, which keeps
no named prepared statement across transactions in this mode); when the tests run as root it
runs as the ``postgres`` user (``-u``), since PgBouncer will not run as root. Its directory
(configuration, log) lives under the system's temporary directory and is removed on exit."""

from __future__ import annotations

import contextlib
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator

from tests.pgcluster import free_port

# Enough server sessions for the race tests' processes, each holding one while in a
# transaction; far fewer than clients, as a pooler is used.
POOL_SIZE = 20


def missing() -> str | None:
    """Why PgBouncer cannot be started here, or ``None``."""
    if shutil.which("pgbouncer") is None:
        return (
            "pgbouncer is not installed: apt-get install pgbouncer (scripts/test installs it); "
            "the pooled half of the PostgreSQL suite needs it"
        )
    return None


@contextlib.contextmanager
def bouncer(server_url: str, pool_size: int = POOL_SIZE) -> Iterator[str]:
    """PgBouncer in transaction mode in front of ``server_url``'s server, with at most
    ``pool_size`` server sessions per database: yields the URL of the same database through it
    (no query: the caller adds ``?pooler=transaction``)."""
    why = missing()
    if why is not None:
        raise RuntimeError(why)
    parts = urllib.parse.urlsplit(server_url)
    user = parts.username or "postgres"
    database = parts.path.lstrip("/") or user
    port = free_port()
    root = pathlib.Path(tempfile.mkdtemp(prefix="fencepost-pgbouncer-"))
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 2000\n"
        # A server session goes back to the pool after each transaction as it is: nothing is
        # reset, which is what makes session state (named statements, SET) leak between
        # clients, and what the pooler mode must not rely on.
        "server_reset_query =\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
    )
    command = ["pgbouncer", str(root / "pgbouncer.ini")]
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in [root, *root.iterdir()]:
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        command[1:1] = ["-u", "postgres"]
    with open(root / "stdout.log", "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(port, proc, root)
        yield f"postgresql://{user}@127.0.0.1:{port}/{database}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def through(pooler_url: str, ledger_url: str) -> str:
    """``ledger_url``'s ledger (its query: schema and the rest) reached through the pooler at
    ``pooler_url``, in the ledger's pooler mode."""
    return f"{pooler_url}?{ledger_url.partition('?')[2]}&pooler=transaction"


def _wait_for(port: int, proc: subprocess.Popen[bytes], root: pathlib.Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = (root / "stdout.log").read_text(errors="replace")
            raise RuntimeError(f"pgbouncer exited ({proc.returncode}): {out}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on 127.0.0.1:{port} within 15 s")

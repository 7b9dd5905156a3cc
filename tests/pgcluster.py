"""A PostgreSQL primary and its synchronous standby of our own, for failover tests: ``initdb``,
``pg_basebackup -R`` and ``pg_ctl`` on 127.0.0.1 ports, run as the ``postgres`` user (the
server binaries refuse to run as root). Each cluster lives in a directory of its own under the
system's temporary directory (the tests' own ``tmp_path`` is not readable by that user), and is
stopped and removed on exit."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator


def bin_dir() -> pathlib.Path | None:
    """The newest installed PostgreSQL's server binaries (Debian keeps them off the PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_version, reverse=True)
    return pathlib.Path(found[0]).parent if found else None


def _version(path: str) -> int:
    part = pathlib.Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def missing() -> str | None:
    """Why a cluster cannot be made here, or ``None``."""
    if bin_dir() is None:
        return "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin): install postgresql"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "making a cluster needs root and runuser, to run the servers as user postgres"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "there is no postgres user to run the servers as"
    return None


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Cluster:
    root: pathlib.Path
    primary_port: int
    standby_port: int

    def url(self, *ports: int, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        return f"postgresql://postgres@{hosts}/postgres" + (f"?{query}" if query else "")

    def run(self, *args: str, timeout: float = 120) -> str:
        """A server binary, as user postgres; its output (raises with it on failure)."""
        tool = bin_dir()
        assert tool is not None
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(tool / args[0]), *args[1:]],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def start(self, name: str) -> None:
        data = self.root / name
        self.run("pg_ctl", "-D", str(data), "-l", str(self.root / f"{name}.log"), "-w", "start")

    def kill(self, name: str) -> None:
        """``kill -9`` of the server's postmaster (its backends notice and exit at once)."""
        pid = int((self.root / name / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port(name)), timeout=0.2).close()
                time.sleep(0.05)
                continue
            return
        raise AssertionError(f"{name} still answers after kill -9")

    def promote(self, name: str) -> None:
        self.run("pg_ctl", "-D", str(self.root / name), "-w", "promote")

    def port(self, name: str) -> int:
        return self.primary_port if name == "primary" else self.standby_port

    def stop(self) -> None:
        for name in ("standby", "primary"):
            if (self.root / name / "postmaster.pid").exists():
                with contextlib.suppress(Exception):
                    self.run("pg_ctl", "-D", str(self.root / name), "-m", "immediate", "stop",
                             timeout=30)  # fmt: skip


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """A primary and a synchronous standby, streaming, both up."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="fencepost-pg-"))
    user = pwd.getpwnam("postgres")
    os.chown(root, user.pw_uid, user.pw_gid)
    c = Cluster(root, free_port(), free_port())
    try:
        primary = root / "primary"
        c.run("initdb", "-D", str(primary), "-A", "trust", "-U", "postgres", "--no-sync")
        # fsync off: the tests kill server processes, never the machine, so the page cache
        # keeps every write; a synchronous standby is what holds an answered commit here.
        settings = (
            f"port = {c.primary_port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{root}'\nwal_level = replica\nmax_wal_senders = 5\n"
            "synchronous_standby_names = '*'\nfsync = off\nshared_buffers = 32MB\n"
        )
        with open(primary / "postgresql.conf", "a") as conf:
            conf.write(settings)
        c.start("primary")
        standby = root / "standby"
        c.run("pg_basebackup", "-D", str(standby), "-h", "127.0.0.1", "-p",
              str(c.primary_port), "-U", "postgres", "-R", "-X", "stream")  # fmt: skip
        # Promoted, it has no standby of its own: a synchronous one named would hold every
        # commit forever.
        with open(standby / "postgresql.conf", "a") as conf:
            conf.write(f"port = {c.standby_port}\nsynchronous_standby_names = ''\n")
        c.start("standby")
        deadline = time.monotonic() + 60
        query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        while c.run("psql", "-h", "127.0.0.1", "-p", str(c.primary_port), "-U", "postgres",
                    "-tAc", query).strip() != "1":  # fmt: skip
            assert time.monotonic() < deadline, "the standby never became synchronous"
            time.sleep(0.1)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)

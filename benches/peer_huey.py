"""The SQLite peer: huey (``SqliteHuey``'s storage), the job queue a Python user would put on
one SQLite file instead of fencepost.

Its unit of work is a task: ``enqueue`` (the producer's call), ``dequeue`` (a consumer taking
the next task) and ``execute`` (running it and storing its result). Like for like with
fencepost's default durability, its connections run WAL with ``synchronous=NORMAL`` (huey's
own default leaves SQLite's ``FULL``; its ``fsync=False`` would be ``OFF``).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from huey import Huey
from huey.storage import SqliteStorage


class NormalSyncStorage(SqliteStorage):  # type: ignore[misc]
    """huey's SQLite storage with ``synchronous=NORMAL`` on every connection it opens."""

    def _create_connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = super()._create_connection()
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn


def open_huey(path: str) -> tuple[Huey, Any]:
    """A huey instance on ``path`` and its one task, ``work(i) -> i``."""
    huey = Huey("bench", storage_class=NormalSyncStorage, filename=path)

    @huey.task()  # type: ignore[untyped-decorator]
    def work(i: int) -> int:
        return i

    return huey, work


def enqueue(work: Any, n: int) -> None:
    """What a producer does: put ``n`` tasks on the queue, one transaction each."""
    for i in range(n):
        work(i)


def take_and_run(huey: Huey) -> None:
    """What a huey consumer does per task: take the next one, run it, store its result."""
    task = huey.dequeue()
    assert task is not None
    huey.execute(task)

"""A real PostgreSQL job queue, pgqueuer, as the benchmark peer for fencepost's per-unit cost.

What is measured: the cost per job of **enqueue + dequeue + complete**, through pgqueuer's own
``Queries`` repository (the object its ``QueueManager`` worker drives) over one long-lived
asyncpg connection, on a private asyncio loop, with no handler code in between. So a number is
the library's client-side work plus its SQL and the server round trips, and nothing else:

* ``Queries.enqueue``: one ``INSERT ... RETURNING id`` into the queue table that also logs the
  job as 'queued' in the log table.
* ``Queries.dequeue``: the worker's pick-and-claim, ``SELECT ... FOR UPDATE SKIP LOCKED``, the
  ``UPDATE ... SET status = 'picked'`` and a 'picked' log row in one statement, with the same
  arguments ``QueueManager.fetch_jobs`` passes (entrypoint map, queue-manager id, heartbeat
  timeout).
* ``Queries.log_jobs``: completion. pgqueuer has no public ``complete(job)``; after a handler
  returns, ``QueueManager._dispatch`` puts ``(job, "successful", None)`` into its
  ``JobStatusLogBuffer``, whose flush calls ``Queries.log_jobs(items)``, one statement that
  deletes the rows from the queue table and inserts them into the log table. The peer calls
  ``log_jobs`` directly, as that flush does, rather than waiting on the buffer's timer.

Every one of those statements also fires pgqueuer's statement-level trigger on the queue table,
which ``pg_notify``s the worker channel (no one listens here; the peer needs no LISTEN
connection). That is part of the library's real cost and stays in.

Why it is the fair peer for "reserve + finish per unit": a queue's enqueue, claim and complete are
the durable steps a dispatcher pays for each unit of work, the same steps fencepost's reserve and
finish record in its ledger. Each step in ``cycle`` is its own autocommit statement, round-tripped
to the server before the next begins, one job at a time, as fencepost's per-unit API is timed.
``batch`` shows the best case the library offers when work is grouped.

The peer installs its tables, enum, trigger and function into a fresh schema of its own
(pgqueuer's ``DBSettings(db_schema=...)``, with the connection's ``search_path`` pinned to the same
schema as well), so it never touches ``public``; ``close`` drops that schema.

Needs, outside fencepost's own dependencies (a suite should ``pytest.importorskip`` it):
``pgqueuer[asyncpg]==1.6.0`` (pulls in asyncpg) and a server at ``FENCEPOST_PG_URL``.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import Coroutine
from datetime import timedelta
from importlib.metadata import version
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no stubs
from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
from pgqueuer.adapters.persistence.qb import (
    QueryBuilderEnvironment,
    QueryQueueBuilder,
    QuerySchedulerBuilder,
)
from pgqueuer.adapters.persistence.queries import Queries
from pgqueuer.domain import models
from pgqueuer.domain.settings import DBSettings, Durability
from pgqueuer.domain.types import Channel, QueueEntrypoint, QueueManagerId
from pgqueuer.ports.repository import EntrypointExecutionParameter

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
ENTRYPOINT = "fencepost_peer"
PAYLOAD = b"x"
# QueueManager.run's defaults; the heartbeat timeout only decides when a picked job counts as
# stale, and no job here stays picked for long.
HEARTBEAT_TIMEOUT = timedelta(seconds=30)
# The largest claim the batch path makes at once (QueueManager.run's batch_size is that knob).
MAX_DEQUEUE_BATCH = 1000

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

T = TypeVar("T")


def pg_url() -> str:
    """The server the postgres-marked benches use."""
    return os.environ.get("FENCEPOST_PG_URL", DEFAULT_URL)


class PgQueuePeer:
    """pgqueuer's enqueue / dequeue / complete, driven synchronously for pytest-benchmark."""

    name: str

    def __init__(
        self, url: str, schema: str, *, synchronous_commit: bool = True, install: bool = True
    ) -> None:
        """Install pgqueuer into the fresh schema ``schema`` (dropped first if a crashed run left
        it). ``synchronous_commit=False`` sets that server setting off for this connection, the
        server-side counterpart of a ledger that does not fsync every commit; the default waits
        for the WAL flush on every commit, like fencepost's ``durability="full"``.
        ``install=False`` joins a schema another peer installed (one worker process of
        several): nothing is created, and ``close`` leaves the schema to its installer."""
        if not _SCHEMA_RE.fullmatch(schema) or schema in ("public", "pg_catalog"):
            raise ValueError(f"schema must be a fresh lowercase identifier, not {schema!r}")
        self.name = f"pgqueuer {version('pgqueuer')}"
        self.schema = schema
        self._owns_schema = install
        self._loop = asyncio.new_event_loop()
        self._conn: asyncpg.Connection | None = None
        try:
            self._conn = self._run(
                asyncpg.connect(
                    url,
                    # asyncpg's default, like libpq's, is sslmode=prefer: TLS whenever the
                    # server offers it, a transport cost no in-process ledger pays. Off unless
                    # the URL asks for it.
                    ssl=None if "sslmode=" in url else False,
                    server_settings={
                        "search_path": schema,
                        "synchronous_commit": "on" if synchronous_commit else "off",
                    },
                )
            )
            # A leftover schema from a crashed run would make install fail half-way.
            if install:
                self._run(self._conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            # Explicit, so stray PGQUEUER_* environment variables cannot change what is timed:
            # "durable" (pgqueuer's default) keeps every table LOGGED, i.e. WAL-backed. NOTIFY
            # channels are database-wide, not per schema, so the channel is named after the
            # schema too, or any pgqueuer worker on this database would hear the peer.
            settings = DBSettings(
                db_schema=schema,
                prefix="",
                channel=Channel(f"ch_{schema}"),
                durability=Durability.durable,
            )
            self._queries = Queries(
                AsyncpgDriver(self._conn),
                qbe=QueryBuilderEnvironment(settings),
                qbq=QueryQueueBuilder(settings),
                qbs=QuerySchedulerBuilder(settings),
            )
            # Library install: CREATE SCHEMA, enum, tables, indexes, trigger, function.
            if install:
                self._run(self._queries.install(create_schema=True))
        except BaseException:
            self.close()
            raise
        self._queue_manager_id = QueueManagerId(uuid.uuid4())
        self._entrypoints = {
            QueueEntrypoint(ENTRYPOINT): EntrypointExecutionParameter(concurrency_limit=0)
        }

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    async def _dequeue(self, batch_size: int) -> list[models.Job]:
        # QueueManager.fetch_jobs' call, with no global concurrency limit (its default).
        return await self._queries.dequeue(
            batch_size=batch_size,
            entrypoints=self._entrypoints,
            queue_manager_id=self._queue_manager_id,
            global_concurrency_limit=None,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
        )

    async def _cycle(self, n: int) -> None:
        for _ in range(n):
            await self._queries.enqueue(ENTRYPOINT, PAYLOAD)
            jobs = await self._dequeue(1)
            if len(jobs) != 1:
                raise RuntimeError(f"dequeue returned {len(jobs)} jobs, expected 1")
            await self._queries.log_jobs([(jobs[0], "successful", None)])

    async def _batch(self, n: int) -> None:
        ids = await self._queries.enqueue([ENTRYPOINT] * n, [PAYLOAD] * n, [0] * n)
        if len(ids) != n:
            raise RuntimeError(f"enqueue returned {len(ids)} ids, expected {n}")
        left = n
        while left:
            jobs = await self._dequeue(min(left, MAX_DEQUEUE_BATCH))
            if not jobs:
                raise RuntimeError(f"dequeue found nothing with {left} jobs left")
            await self._queries.log_jobs([(job, "successful", None) for job in jobs])
            left -= len(jobs)

    def enqueue_many(self, n: int) -> None:
        """n jobs, enqueued 1000 at a time by the list form of ``enqueue``."""

        async def go() -> None:
            for start in range(0, n, MAX_DEQUEUE_BATCH):
                k = min(MAX_DEQUEUE_BATCH, n - start)
                await self._queries.enqueue([ENTRYPOINT] * k, [PAYLOAD] * k, [0] * k)

        self._run(go())

    def take(self) -> int:
        """One worker's pick: ``dequeue(batch_size=1)`` (the job claimed, ``picked``); the
        number of jobs it got (0 when the queue is drained)."""
        return len(self._run(self._dequeue(1)))

    def cycle(self, n: int) -> None:
        """n jobs, one at a time: enqueue one (INSERT), dequeue it (claim one), complete it
        (log_jobs with one entry): three autocommit statements and three round trips per job."""
        self._run(self._cycle(n))

    def batch(self, n: int) -> None:
        """n jobs enqueued by one list-form ``enqueue`` (one INSERT ... UNNEST), then claimed by
        ``dequeue(batch_size=min(n, 1000))`` and completed by one ``log_jobs`` per claimed batch,
        which is what a worker's JobStatusLogBuffer flush does with a full buffer: about three
        round trips per 1000 jobs."""
        self._run(self._batch(n))

    def completed(self) -> int:
        """Jobs the log table holds as 'successful' (pgqueuer's own queue_log read, which loads
        the whole log: for checks, not for timed loops). Each job leaves three log rows,
        'queued', 'picked' and 'successful'."""
        return sum(
            1 for entry in self._run(self._queries.queue_log()) if entry.status == "successful"
        )

    def queued(self) -> int:
        """Rows still in the queue table, whatever their status."""
        return sum(stat.count for stat in self._run(self._queries.queue_size()))

    def close(self) -> None:
        """Drop the peer's schema and close its connection and loop; safe to call twice."""
        if self._loop.is_closed():
            return
        try:
            if self._conn is not None and not self._conn.is_closed():
                if self._owns_schema:
                    self._run(self._conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE"))
                self._run(self._conn.close())
        finally:
            self._conn = None
            self._loop.close()

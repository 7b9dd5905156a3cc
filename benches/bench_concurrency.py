"""The concurrency curve: reserve + finish per unit from 1, 4, 16 and 64 threads sharing one
Ledger, with group commit on and off, and from 1 000 and 10 000 coroutines on one AsyncLedger,
on SQLite (normal and full) and PostgreSQL (normal and full); and in the same run the peers at
the same work, pgqueuer workers (enqueue + dequeue + complete per job, benches/peer_pg.py's
statements) at 1, 4 and 16 (and 16 at full), and huey consumers (enqueue, dequeue and execute
per task, benches/peer_huey.py) at 16, at synchronous NORMAL and at huey's default FULL.

Each size is one round of a fixed number of units split evenly over the callers (a throughput
figure, not a latency distribution): ``extra_info`` holds ``callers`` and ``units_per_s``, and
for fencepost the writer's counts (``groups``, ``calls``, ``max_group``, time in transaction),
the machine's CPU busy share and this process's share of it (the rest is PostgreSQL's backends
and the kernel); the coroutine rounds add the event loop's longest stall. benches/ratios.py
prints the curve. The rates are measured here, around the threads, so they are recorded with
``--benchmark-disable`` too.

In the same groups, the yardsticks the curve is read against: the batch path (one thread,
``reserve_attempts`` then ``finish_attempts`` on batches of 1, 16, 256 and 1 000 units; impl
``fencepost batch``, ``callers`` and ``batch`` the batch size), and 1, 4 and 8 processes of 16
threads each, every process its own Ledger on the same store and all on one run (impl
``fencepost processes``, ``callers`` and ``procs`` the process count).

Where a batch's units lie in the key space costs as much as the batching itself, so the batch
path is measured in two layouts. ``fencepost batch`` names each batch's units after the batch
(``b{batch}-{k}``): they sit side by side in every index, and a commit writes a few pages for
all of them. ``fencepost batch, callers' units`` takes the units that as many concurrent
callers hold at one moment (``w{caller}-{k}``, the names the threads and coroutines here
use): each lands on its own pages, as the callers' own units do (benches/RESULTS.md has what
the layout alone is worth). The callers are read against the batch of the same units
(``threads 16 / batch 16, same units``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest

import fencepost as fp
from benches.conftest import plaintext
from benches.dispatch import batch_round, cpu_ticks, dispatch_throughput
from benches.peer_pg import ENTRYPOINT, HEARTBEAT_TIMEOUT, PAYLOAD, PgQueuePeer, pg_url

CALLERS = [1, 4, 16, 64]
PEER_WORKERS = [1, 4, 16]
# Units per round, a multiple of 64: about a second at today's one-transaction-per-call rates.
UNITS = {
    "sqlite normal": 8192,
    "sqlite full": 640,
    "postgres normal": 1920,
    "postgres full": 1920,
}
COROUTINES = [1000, 10_000]
# Concurrent jobs per worker in the workers-with-coroutines comparison with pgqueuer.
WORKER_COROUTINES = 10
# The batch path: units per reserve_attempts / finish_attempts call, one thread.
BATCHES = [1, 16, 256, 1000]
BATCH_STORES = ["sqlite normal", "sqlite full", "postgres normal"]
# Processes on one run, each with its own Ledger and PROCESS_THREADS threads; units per round
# (a multiple of 8 x 16), about a second or two.
PROCESSES = [1, 4, 8]
PROCESS_THREADS = 16
PROCESS_UNITS = {"sqlite normal": 8192, "postgres normal": 3840}
PEER_JOBS = 1920
HUEY_TASKS = 640
STEPS = [{"id": "s"}]
GROUP = "concurrency {store}: reserve + finish per unit, N callers"


def _threads(n: int, work: Callable[[int], None]) -> dict[str, float]:
    """Run ``work(i)`` on ``n`` threads started together; the wall time from the start to the
    last thread's end, the machine's CPU busy share over it and this process's share of that."""
    barrier = threading.Barrier(n + 1)
    failed: list[BaseException] = []

    def main(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as e:  # re-raised below, in the bench's thread
            failed.append(e)

    threads = [threading.Thread(target=main, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    busy0, total0 = cpu_ticks()
    cpu0 = time.process_time()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(300)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    busy1, total1 = cpu_ticks()
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if failed:
        raise failed[0]
    busy_s = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
    return {
        "wall": wall,
        "cpu_busy": round((busy1 - busy0) / max(1, total1 - total0), 3),
        "client_cpu_share": round(min(1.0, cpu / busy_s), 3) if busy_s else 0.0,
    }


def _record(
    benchmark: Any, store: str, impl: str, callers: int, units: int, out: dict[str, Any]
) -> None:
    benchmark.group = GROUP.format(store=store)
    rate = units / out.pop("wall")
    benchmark.extra_info.update(
        impl=impl, store=store, callers=callers, units_per_s=round(rate), ops=units, **out
    )


# ------------------------------------------------------------------ fencepost


def _durability(store: str) -> Literal["normal", "full"]:
    return "full" if store.endswith("full") else "normal"


@contextlib.contextmanager
def _target(store: str, tmp_path: pathlib.Path) -> Iterator[str]:
    """What ``Ledger.open`` takes for a fresh store: a new SQLite file, or a new PostgreSQL
    schema (plaintext), dropped afterwards."""
    if store.startswith("postgres"):
        from tests.conftest import pg_schema

        with pg_schema() as url:
            yield plaintext(url)
        return
    yield str(tmp_path / "bench.db")


@contextlib.contextmanager
def _ledger(store: str, grouped: bool, tmp_path: pathlib.Path) -> Iterator[fp.Ledger]:
    with (
        _target(store, tmp_path) as target,
        fp.Ledger.open(target, durability=_durability(store), group_commit=grouped) as ledger,
    ):
        yield ledger


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
@pytest.mark.parametrize("callers", CALLERS)
@pytest.mark.parametrize("store", list(UNITS))
def bench_fencepost_threads(
    benchmark: Any, store: str, callers: int, grouped: bool, tmp_path: pathlib.Path
) -> None:
    """``callers`` threads on one Ledger, each reserving and finishing its own units one at a
    time, as a dispatcher's workers do."""
    units = UNITS[store]
    per = units // callers
    with _ledger(store, grouped, tmp_path) as ledger:
        run_id = ledger.start_run(
            "bench", scope_key=None, steps=STEPS, run_id=f"run-{uuid.uuid4().hex[:8]}", force=True
        ).run_id

        def work(i: int) -> None:
            for k in range(per):
                res = ledger.reserve_attempt(run_id, f"w{i}-{k}", step_id="s")
                won = ledger.finish_attempt(
                    run_id, res.unit_id, res.attempt, res.dispatch_id, status="completed"
                )
                assert won

        out: dict[str, Any] = {}
        benchmark.pedantic(lambda: out.update(_threads(callers, work)), rounds=1, iterations=1)
        out.update(ledger._core.group_stats())
        acc = ledger.accounting(run_id)
    assert acc.total_attempts == per * callers
    # Two covered calls per unit went through the writer.
    assert out["calls"] == 2 * per * callers
    if not grouped:
        assert out["max_group"] == 1
    impl = "fencepost grouped" if grouped else "fencepost ungrouped"
    _record(benchmark, store, impl, callers, per * callers, out)


@pytest.mark.parametrize("coroutines", COROUTINES)
@pytest.mark.parametrize("store", list(UNITS))
def bench_fencepost_coroutines(
    benchmark: Any, store: str, coroutines: int, tmp_path: pathlib.Path
) -> None:
    """``coroutines`` coroutines on one AsyncLedger (one event loop, one thread), each
    reserving and finishing one unit: the calls queue on the writer with a future each. Also
    records the loop's longest stall, seen by a ticker that sleeps 1 ms at a time."""
    from fencepost.aio import AsyncLedger

    with _ledger(store, True, tmp_path) as ledger:
        aledger = AsyncLedger(ledger)
        run_id = ledger.start_run(
            "bench", scope_key=None, steps=STEPS, run_id=f"run-{uuid.uuid4().hex[:8]}", force=True
        ).run_id

        async def one(i: int) -> None:
            res = await aledger.reserve_attempt(run_id, f"w{i}-0", step_id="s")
            won = await aledger.finish_attempt(
                run_id, res.unit_id, res.attempt, res.dispatch_id, status="completed"
            )
            assert won

        async def main() -> float:
            stall = 0.0
            done = False

            async def ticker() -> None:
                nonlocal stall
                last = time.perf_counter()
                while not done:
                    await asyncio.sleep(0.001)
                    now = time.perf_counter()
                    stall = max(stall, now - last)
                    last = now

            tick = asyncio.ensure_future(ticker())
            await asyncio.gather(*(one(i) for i in range(coroutines)))
            done = True
            await tick
            return stall

        out: dict[str, Any] = {}

        def go() -> None:
            stall: list[float] = []
            out.update(_threads(1, lambda _: stall.append(asyncio.run(main()))))
            out["max_stall_ms"] = round(stall[0] * 1000, 1)

        benchmark.pedantic(go, rounds=1, iterations=1)
        out.update(ledger._core.group_stats())
        acc = ledger.accounting(run_id)
    assert acc.total_attempts == coroutines
    _record(benchmark, store, "fencepost coroutines", coroutines, coroutines, out)


def _batch_units(layout: str, b: int, batch: int) -> list[str]:
    """The units of batch number ``b``: side by side (``b{b}-{k}``), or the ones ``batch``
    callers that each name their units ``w{caller}-{k}`` hold at the same moment."""
    if layout == "callers":
        return [f"w{i}-{b}" for i in range(batch)]
    return [f"b{b}-{k}" for k in range(batch)]


# The callers' layout at the sizes the callers are read against (16 threads; 1 000 coroutines
# against batches of 256).
BATCH_LAYOUTS = [
    pytest.param(batch, layout, id=f"{batch}-{layout}")
    for batch in BATCHES
    for layout in (["side", "callers"] if batch in (16, 256) else ["side"])
]


@pytest.mark.parametrize(("batch", "layout"), BATCH_LAYOUTS)
@pytest.mark.parametrize("store", BATCH_STORES)
def bench_fencepost_batch(
    benchmark: Any, store: str, batch: int, layout: str, tmp_path: pathlib.Path
) -> None:
    """One thread reserving ``batch`` units in one ``reserve_attempts`` call, then finishing
    them in one ``finish_attempts`` call, until the round's units are done: what the batch path
    gives one caller, beside what threads and coroutines get one unit at a time. ``layout``
    says where the units lie (see the module's docs)."""
    # The curve's units in whole batches, and at least eight batches.
    units = max(UNITS[store], 8 * batch) // batch * batch
    with _ledger(store, True, tmp_path) as ledger:
        run_id = ledger.start_run(
            "bench", scope_key=None, steps=STEPS, run_id=f"run-{uuid.uuid4().hex[:8]}", force=True
        ).run_id

        def work(_: int) -> None:
            for b in range(units // batch):
                won = batch_round(ledger, run_id, _batch_units(layout, b, batch))
                assert len(won) == batch
                assert all(won)

        out: dict[str, Any] = {}
        benchmark.pedantic(lambda: out.update(_threads(1, work)), rounds=1, iterations=1)
        out.update(ledger._core.group_stats())
        acc = ledger.accounting(run_id)
    assert acc.total_attempts == units
    # One writer call per batch, each way.
    assert out["calls"] == 2 * units // batch
    impl = "fencepost batch" if layout == "side" else "fencepost batch, callers' units"
    _record(benchmark, store, impl, batch, units, out)
    benchmark.extra_info.update(batch=batch, layout=layout)


@pytest.mark.parametrize("procs", PROCESSES)
@pytest.mark.parametrize("store", list(PROCESS_UNITS))
def bench_fencepost_processes(
    benchmark: Any, store: str, procs: int, tmp_path: pathlib.Path
) -> None:
    """``procs`` processes (spawned), each opening its own Ledger on the same SQLite file or
    PostgreSQL schema and running 16 threads that reserve and finish their own units one at a
    time, all on one run: the total rate from the common start to the last process's end
    (benches/dispatch.py's dispatchers, as bench_postgres.py runs them, on both stores)."""
    callers = procs * PROCESS_THREADS
    per = PROCESS_UNITS[store] // callers
    out: dict[str, Any] = {}
    with _target(store, tmp_path) as target:

        def go() -> None:
            out.update(dispatch_throughput(target, procs, PROCESS_THREADS, per, _durability(store)))

        benchmark.pedantic(go, rounds=1, iterations=1)
    units = out.pop("units")
    assert units == per * callers
    _record(benchmark, store, "fencepost processes", procs, units, out)
    benchmark.extra_info.update(procs=procs, callers_per_process=PROCESS_THREADS)


@pytest.mark.parametrize("workers", PEER_WORKERS)
def bench_fencepost_worker_coroutines(benchmark: Any, workers: int) -> None:
    """``workers`` Ledgers on one event loop (each its own connection, as each pgqueuer
    worker has), each with ``WORKER_COROUTINES`` coroutines on its AsyncLedger reserving and
    finishing one unit at a time: the shape of pgqueuer's workers with ``batch_size`` jobs in
    flight. PostgreSQL, normal durability."""
    from tests.conftest import pg_schema

    from fencepost.aio import AsyncLedger

    store = "postgres normal"
    coroutines = workers * WORKER_COROUTINES
    units = PEER_JOBS // coroutines * coroutines
    with contextlib.ExitStack() as stack:
        url = plaintext(stack.enter_context(pg_schema()))
        ledgers = [stack.enter_context(fp.Ledger.open(url)) for _ in range(workers)]
        run_id = (
            ledgers[0]
            .start_run("bench", scope_key=None, steps=STEPS, run_id="run-w", force=True)
            .run_id
        )
        aledgers = [AsyncLedger(ledger) for ledger in ledgers]

        async def one(a: AsyncLedger, c: int) -> None:
            for i in range(units // coroutines):
                res = await a.reserve_attempt(run_id, f"c{c}-{i}", step_id="s")
                won = await a.finish_attempt(
                    run_id, res.unit_id, res.attempt, res.dispatch_id, status="completed"
                )
                assert won

        async def main() -> None:
            await asyncio.gather(*(one(aledgers[c % workers], c) for c in range(coroutines)))

        out: dict[str, Any] = {}

        def go() -> None:
            out.update(_threads(1, lambda _: asyncio.run(main())))

        benchmark.pedantic(go, rounds=1, iterations=1)
        assert ledgers[0].accounting(run_id).total_attempts == units
    _record(benchmark, store, "fencepost worker coroutines", workers, units, out)


# ------------------------------------------------------------------ pgqueuer workers


class _PgWorkers:
    """N pgqueuer workers on one queue: each its own asyncpg connection driving pgqueuer's
    ``Queries`` (as ``QueueManager`` does), all on one event loop, as the coroutines of one
    worker process. The schema is installed (and dropped) by a ``PgQueuePeer``."""

    def __init__(self, url: str, schema: str, workers: int, *, synchronous_commit: bool) -> None:
        import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no stubs
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
        from pgqueuer.adapters.persistence.qb import (
            QueryBuilderEnvironment,
            QueryQueueBuilder,
            QuerySchedulerBuilder,
        )
        from pgqueuer.adapters.persistence.queries import Queries
        from pgqueuer.domain.settings import DBSettings, Durability
        from pgqueuer.domain.types import Channel, QueueEntrypoint, QueueManagerId
        from pgqueuer.ports.repository import EntrypointExecutionParameter

        self.peer = PgQueuePeer(url, schema, synchronous_commit=synchronous_commit)
        self.loop = asyncio.new_event_loop()
        # The peer's own settings, so the workers share its queue and channel.
        settings = DBSettings(
            db_schema=schema, prefix="", channel=Channel(f"ch_{schema}"),
            durability=Durability.durable,
        )  # fmt: skip

        async def connect() -> Any:
            conn = await asyncpg.connect(
                url,
                ssl=None if "sslmode=" in url else False,
                server_settings={
                    "search_path": schema,
                    "synchronous_commit": "on" if synchronous_commit else "off",
                },
            )
            return conn, Queries(
                AsyncpgDriver(conn),
                qbe=QueryBuilderEnvironment(settings),
                qbq=QueryQueueBuilder(settings),
                qbs=QuerySchedulerBuilder(settings),
            )

        self.workers = [self.loop.run_until_complete(connect()) for _ in range(workers)]
        self.entrypoints = {
            QueueEntrypoint(ENTRYPOINT): EntrypointExecutionParameter(concurrency_limit=0)
        }
        self.manager_ids = [QueueManagerId(uuid.uuid4()) for _ in range(workers)]

    async def _work(self, w: int, jobs: int, batch: int) -> None:
        _, queries = self.workers[w]
        for _ in range(jobs // batch):
            await queries.enqueue([ENTRYPOINT] * batch, [PAYLOAD] * batch, [0] * batch)
            picked: list[Any] = []
            # Another worker may have taken this worker's jobs; there are then others for it.
            for _spin in range(1000):
                picked += await queries.dequeue(
                    batch_size=batch - len(picked),
                    entrypoints=self.entrypoints,
                    queue_manager_id=self.manager_ids[w],
                    global_concurrency_limit=None,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                )
                if len(picked) == batch:
                    break
            assert len(picked) == batch
            await queries.log_jobs([(job, "successful", None) for job in picked])

    def run(self, jobs: int, batch: int = 1) -> None:
        """``jobs`` jobs split over the workers, each taking ``batch`` at a time: enqueue them,
        dequeue as many (``batch_size``), complete them together."""
        per = jobs // len(self.workers)

        async def all_workers() -> None:
            await asyncio.gather(*(self._work(w, per, batch) for w in range(len(self.workers))))

        self.loop.run_until_complete(all_workers())

    def close(self) -> None:
        for conn, _ in self.workers:
            self.loop.run_until_complete(conn.close())
        self.loop.close()
        self.peer.close()


@pytest.mark.parametrize(
    ("store", "workers", "batch"),
    [("postgres normal", w, b) for b in (1, WORKER_COROUTINES) for w in PEER_WORKERS]
    + [("postgres full", 16, 1)],
)
def bench_pgqueuer_workers(benchmark: Any, store: str, workers: int, batch: int) -> None:
    """``normal`` is ``synchronous_commit=off``, as fencepost's normal durability; ``full``
    waits for the WAL flush, as fencepost's full. ``batched``: each worker enqueues, dequeues
    (``batch_size``) and completes ``WORKER_COROUTINES`` jobs at a time, as a worker with that
    many concurrent jobs does (the shape `bench_fencepost_worker_coroutines` meets)."""
    schema = f"fpb_peer_{uuid.uuid4().hex[:12]}"
    full = store.endswith("full")
    peer = _PgWorkers(pg_url(), schema, workers, synchronous_commit=full)
    try:
        jobs = PEER_JOBS // (workers * batch) * workers * batch
        out: dict[str, Any] = {}

        def go() -> None:
            busy0, total0 = cpu_ticks()
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            peer.run(jobs, batch)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            busy1, total1 = cpu_ticks()
            busy_s = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
            out.update(
                wall=wall,
                cpu_busy=round((busy1 - busy0) / max(1, total1 - total0), 3),
                client_cpu_share=round(min(1.0, cpu / busy_s), 3) if busy_s else 0.0,
            )

        benchmark.pedantic(go, rounds=1, iterations=1)
        assert peer.peer.completed() == jobs
    finally:
        peer.close()
    impl = "pgqueuer" if batch == 1 else f"pgqueuer batch_size={batch}"
    _record(benchmark, store, impl, workers, jobs, out)


# ------------------------------------------------------------------ huey consumers


@pytest.mark.parametrize("sync", ["normal", "full"])
def bench_huey_consumers(benchmark: Any, sync: str, tmp_path: pathlib.Path) -> None:
    """16 threads on one huey, each enqueueing a task, then taking the next one and running
    it. ``full`` is SqliteHuey's default (synchronous FULL), ``normal`` the peer's setting."""
    from huey import SqliteHuey  # type: ignore[import-untyped]  # huey ships no stubs

    from benches.peer_huey import open_huey

    callers = 16
    path = str(tmp_path / "huey.db")
    if sync == "full":
        huey = SqliteHuey("bench", filename=path)

        @huey.task()  # type: ignore[untyped-decorator]
        def task(i: int) -> int:
            return i

    else:
        huey, task = open_huey(path)
    per = HUEY_TASKS // callers

    def work(i: int) -> None:
        for k in range(per):
            task(k)
            for _spin in range(10_000):
                got = huey.dequeue()
                if got is not None:
                    huey.execute(got)
                    break
            else:
                raise AssertionError("no task to take")

    out: dict[str, Any] = {}
    benchmark.pedantic(lambda: out.update(_threads(callers, work)), rounds=1, iterations=1)
    assert huey.pending_count() == 0
    _record(benchmark, f"sqlite {sync}", "huey", callers, per * callers, out)

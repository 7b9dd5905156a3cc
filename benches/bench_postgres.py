"""fencepost on PostgreSQL against a real PostgreSQL job queue, pgqueuer (benches/peer_pg.py), on
the same server in the same run: fencepost's reserve + finish per unit vs pgqueuer's enqueue +
dequeue + complete per job, one at a time and in batches, at both durabilities
(fencepost ``normal`` = ``synchronous_commit=off``, pgqueuer given the same session setting;
``full`` = ``on`` for both). Then claim cost and claim throughput with 1, 2, 4 and 8 processes,
and 1 and 4 dispatcher processes of 16 callers each on one run, with how long their groups
hold the run's lock.
The hot-path and controller suites (bench_attempts.py, bench_claims.py) run on PostgreSQL too,
as impl ``fencepost-postgres``. Every schema is fresh and dropped afterwards."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.conftest import pg_schema

import fencepost as fp
from benches.conftest import label, plaintext
from benches.dispatch import batch_round, cpu_ticks, dispatch_throughput
from benches.peer_pg import PgQueuePeer, pg_url

N = 200
BATCH = 1000
ROUNDS = 10
CTX = multiprocessing.get_context("spawn")
_ids = itertools.count()


@pytest.fixture(params=["normal", "full"])
def durability(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ledger(durability: str) -> Iterator[fp.Ledger]:
    with pg_schema() as url, fp.Ledger.open(plaintext(url), durability=durability) as opened:  # type: ignore[arg-type]
        yield opened


@pytest.fixture
def peer(durability: str) -> Iterator[PgQueuePeer]:
    schema = f"fpb_peer_{next(_ids)}_{int(time.time() * 1000) % 10**8}"
    p = PgQueuePeer(pg_url(), schema, synchronous_commit=durability == "full")
    yield p
    p.close()


def _run(ledger: fp.Ledger) -> str:
    run_id = f"run-{next(_ids)}"
    ledger.start_run("bench", scope_key=None, steps=[{"id": "s"}], run_id=run_id, force=True)
    return run_id


def bench_pg_cycle_fencepost(benchmark: Any, ledger: fp.Ledger, durability: str) -> None:
    label(benchmark, f"postgres {durability}: per unit/job, one at a time", "fencepost", N)

    benchmark.pedantic(_cycle, setup=lambda: ((ledger, _run(ledger)), {}), rounds=ROUNDS)


@pytest.mark.parametrize("transport", ["plaintext", "TLS"])
def bench_pg_cycle_transport(benchmark: Any, transport: str) -> None:
    """The one-at-a-time loop in plaintext and over TLS (``sslmode=require``, TLS 1.3 over
    loopback), side by side: what encryption adds per unit. Not compared with the peer, which
    runs plaintext."""
    group = "postgres normal: per unit, one at a time, plaintext vs TLS"
    label(benchmark, group, f"fencepost {transport}", N)
    with pg_schema() as url:
        url = plaintext(url) if transport == "plaintext" else url + "&sslmode=require"
        with fp.Ledger.open(url) as ledger:
            assert ledger.pragmas()["tls"].startswith("TLS") == (transport == "TLS")
            benchmark.pedantic(_cycle, setup=lambda: ((ledger, _run(ledger)), {}), rounds=ROUNDS)


def _cycle(ledger: fp.Ledger, run_id: str) -> None:
    for i in range(N):
        r = ledger.reserve_attempt(run_id, f"u{i}", step_id="s")
        assert ledger.finish_attempt(run_id, f"u{i}", r.attempt, r.dispatch_id, status="completed")


def bench_pg_cycle_pgqueuer(benchmark: Any, peer: PgQueuePeer, durability: str) -> None:
    label(benchmark, f"postgres {durability}: per unit/job, one at a time", "pgqueuer", N)
    benchmark.pedantic(peer.cycle, args=(N,), rounds=ROUNDS)
    assert peer.queued() == 0


def bench_pg_batch_fencepost(benchmark: Any, ledger: fp.Ledger, durability: str) -> None:
    label(benchmark, f"postgres {durability}: per unit/job, batches of {BATCH}", "fencepost", BATCH)

    def go(run_id: str) -> None:
        assert all(batch_round(ledger, run_id, [f"u{i}" for i in range(BATCH)]))

    benchmark.pedantic(go, setup=lambda: ((_run(ledger),), {}), rounds=ROUNDS)


def bench_pg_batch_pgqueuer(benchmark: Any, peer: PgQueuePeer, durability: str) -> None:
    label(benchmark, f"postgres {durability}: per unit/job, batches of {BATCH}", "pgqueuer", BATCH)
    benchmark.pedantic(peer.batch, args=(BATCH,), rounds=ROUNDS)
    assert peer.queued() == 0


# ------------------------------------------------------------------ claim throughput

RESOURCES = 200


def _claimer(i: int, url: str, seconds: float, start: Any, queue: Any) -> None:
    wins = refused = busy = 0
    with fp.Ledger.open(url) as ledger:
        start.wait()
        cpu = time.process_time()
        end = time.monotonic() + seconds
        k = i
        while time.monotonic() < end:
            k = (k * 1103515245 + 12345) % 2**31
            try:
                got = ledger.claim(f"c{k % RESOURCES}", f"host-{i}", lease_ms=1)
            except fp.StoreBusy:
                busy += 1
                continue
            if got is None:
                refused += 1
            else:
                wins += 1
        cpu = time.process_time() - cpu
    queue.put((wins, refused, busy, cpu))


def claim_throughput(url: str, procs: int, seconds: float = 2.0) -> dict[str, float]:
    """Winning claims per second, refusals and StoreBusy of `procs` processes claiming 200
    runs with 1 ms leases for `seconds`, and where the CPU went: the machine's busy share and
    the clients' share of it (the rest is the PostgreSQL backends and the kernel). Asserts one
    winner per (run, generation)."""
    start = CTX.Barrier(procs + 1)
    queue = CTX.Queue()
    ps = [CTX.Process(target=_claimer, args=(i, url, seconds, start, queue)) for i in range(procs)]
    for p in ps:
        p.start()
    start.wait()
    t0 = time.monotonic()
    busy0, total0 = cpu_ticks()
    results = [queue.get(timeout=120) for _ in ps]
    wall = time.monotonic() - t0
    busy1, total1 = cpu_ticks()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    wins = sum(r[0] for r in results)
    with fp.Ledger.open(url) as ledger:
        generations = sum(ledger.lease(f"c{r}").generation for r in range(RESOURCES))
    assert generations == wins  # every win is exactly one generation: one winner each
    busy_s = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
    client_s = sum(r[3] for r in results)
    return {
        "rate": wins / wall,
        "refused": sum(r[1] for r in results),
        "busy": sum(r[2] for r in results),
        "cpu_busy": (busy1 - busy0) / max(1, total1 - total0),
        "client_cpu_share": client_s / busy_s if busy_s else 0.0,
    }


@pytest.mark.parametrize("procs", [1, 2, 4, 8])
def bench_pg_claim_throughput(benchmark: Any, procs: int) -> None:
    benchmark.group = "postgres: claim throughput (per winning claim, N processes)"
    with pg_schema() as schema_url:
        url = plaintext(schema_url)
        with fp.Ledger.open(url) as ledger:
            for r in range(RESOURCES):
                ledger.reserve_run(
                    f"c{r}",
                    workflow_name="bench",
                    workflow_ref="bench@1",
                    source={"kind": "bench"},
                    definition_digest=fp.digest({"steps": []}),
                    definition={"steps": []},
                    input={},
                    launch_options={},
                    runner_id="host-0",
                    origin_session_id="bench",
                )
        out: dict[str, float] = {}

        def go() -> None:
            out.update(claim_throughput(url, procs))

        benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(
        impl=f"fencepost x{procs}", claims_per_s=out["rate"], refused=out["refused"],
        busy=out["busy"], cpu_busy=round(out["cpu_busy"], 3),
        client_cpu_share=round(out["client_cpu_share"], 3), ops=1,
    )  # fmt: skip
    assert out["busy"] == 0


# ------------------------------------------------------------------ dispatchers on one run

DISPATCH_THREADS = 16
DISPATCH_UNITS = 60  # per thread: a fixed amount of work, ~1 s per round at 2 000 units/s


@pytest.mark.parametrize("procs", [1, 4])
def bench_pg_dispatchers_one_run(benchmark: Any, procs: int) -> None:
    """``procs`` dispatcher processes x 16 callers, each process its own Ledger, all on the
    same schema and the same run (durability normal). A group takes the run's lock once, so
    more processes should not collapse the rate: the 4-process figure is compared with the
    1-process one, with how long each process's groups hold the lock."""
    group = f"postgres normal: {DISPATCH_THREADS} callers per process, all on one run"
    impl = f"fencepost {procs}x{DISPATCH_THREADS}"
    label(benchmark, group, impl, procs * DISPATCH_THREADS * DISPATCH_UNITS)
    with pg_schema() as schema_url:
        _dispatch_round(benchmark, plaintext(schema_url), procs)


def _dispatch_round(benchmark: Any, url: str, procs: int) -> None:
    """One timed round of ``procs`` dispatcher processes x 16 callers on ``url``, its figures
    in ``extra_info`` (benches/ratios.py's dispatcher table)."""
    out: dict[str, Any] = {}

    def go() -> None:
        out.update(dispatch_throughput(url, procs, DISPATCH_THREADS, DISPATCH_UNITS))

    benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info.update(
        procs=procs,
        callers_per_process=DISPATCH_THREADS,
        dispatch_units_per_s=round(out["units"] / out["wall"]),
        cpu_busy=out["cpu_busy"],
        per_process=out["per_process"],
    )


# ------------------------------------------------------------------ the controller's dequeue

QUEUED = 2000


def _fencepost_taker(i: int, url: str, start: Any, queue: Any) -> None:
    took = 0
    with fp.Ledger.open(url) as ledger:
        start.wait()
        while claims := ledger.claim_next(f"ctl-{i}", lease_ms=60_000):
            took += len(claims)
    queue.put(took)


def _pgqueuer_taker(i: int, url: str, schema: str, start: Any, queue: Any) -> None:
    peer = PgQueuePeer(url, schema, synchronous_commit=False, install=False)
    took = 0
    try:
        start.wait()
        while peer.take():
            took += 1
    finally:
        peer.close()
    queue.put(took)


def dequeue_throughput(target: Any, args: tuple[Any, ...], procs: int) -> float:
    """Items taken per second by `procs` processes draining a queue of QUEUED, one at a time;
    asserts every item was taken once."""
    start = CTX.Barrier(procs + 1)
    queue = CTX.Queue()
    ps = [CTX.Process(target=target, args=(i, *args, start, queue)) for i in range(procs)]
    for p in ps:
        p.start()
    start.wait()
    t0 = time.monotonic()
    took = [queue.get(timeout=300) for _ in ps]
    wall = time.monotonic() - t0
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert sum(took) == QUEUED
    return QUEUED / wall


@pytest.mark.parametrize("procs", [1, 4, 8])
def bench_pg_claim_next(benchmark: Any, procs: int) -> None:
    """``claim_next(limit=1)`` by `procs` controller processes over 2 000 queued runs: each a
    fenced claim (new generation, token hash, ``starting``, a ``lease.claimed`` event)."""
    label(
        benchmark,
        "postgres: take the next queued item (N processes)",
        f"fencepost x{procs}",
        QUEUED,
    )
    with pg_schema() as schema_url:
        url = plaintext(schema_url)
        definition: dict[str, Any] = {"steps": []}
        with fp.Ledger.open(url) as ledger:
            for r in range(QUEUED):
                ledger.reserve_run(
                    f"q{r:05d}", workflow_name="bench", workflow_ref="bench@1",
                    source={"kind": "bench"}, definition_digest=fp.digest(definition),
                    definition=definition, runner_id="host-0", origin_session_id="bench",
                )  # fmt: skip
        rate: list[float] = []
        benchmark.pedantic(
            lambda: rate.append(dequeue_throughput(_fencepost_taker, (url,), procs)),
            rounds=1,
            iterations=1,
        )
    benchmark.extra_info.update(items_per_s=round(rate[0]))


@pytest.mark.parametrize("procs", [1, 4, 8])
def bench_pg_pgqueuer_dequeue(benchmark: Any, procs: int) -> None:
    """pgqueuer's ``dequeue(batch_size=1)`` by `procs` worker processes over 2 000 jobs (each
    job moved to ``picked`` with a log row; ``synchronous_commit`` off, as fencepost's default
    durability sets it)."""
    label(
        benchmark, "postgres: take the next queued item (N processes)", f"pgqueuer x{procs}", QUEUED
    )
    url = pg_url()
    schema = f"bench_deq_{os.getpid()}_{procs}"
    owner = PgQueuePeer(url, schema, synchronous_commit=False)
    try:
        owner.enqueue_many(QUEUED)
        rate: list[float] = []
        benchmark.pedantic(
            lambda: rate.append(dequeue_throughput(_pgqueuer_taker, (url, schema), procs)),
            rounds=1,
            iterations=1,
        )
    finally:
        owner.close()
    benchmark.extra_info.update(items_per_s=round(rate[0]))


# ------------------------------------------------------------------ behind a transaction pooler


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[str]:
    """PgBouncer in transaction mode (tests/pgbouncer.py) in front of the benches' server."""
    from tests.pgbouncer import bouncer

    with bouncer(pg_url().partition("?")[0]) as url:
        yield url


# What the pooler mode costs: the same loops on a direct connection with prepared statements
# ("fencepost"), in the pooler mode on a direct connection (unnamed statements parsed and
# planned at every use, the settings SET LOCAL in every transaction: the mode's own cost), and
# in the pooler mode through PgBouncer (the mode plus the pooler's hop).
POOLER_IMPLS = ["fencepost", "fencepost pooler mode, direct", "fencepost pooler mode, pgbouncer"]


def _pooler_url(impl: str, pgbouncer: str, schema_url: str) -> str:
    """The URL of ``schema_url``'s schema the way ``impl`` opens it (plaintext)."""
    from tests.pgbouncer import through

    url = plaintext(schema_url)
    if impl.endswith("pgbouncer"):
        return through(pgbouncer, url)
    return url if impl == "fencepost" else url + "&pooler=transaction"


@contextlib.contextmanager
def _pooler_ledger(impl: str, pgbouncer: str) -> Iterator[fp.Ledger]:
    with pg_schema() as url, fp.Ledger.open(_pooler_url(impl, pgbouncer, url)) as ledger:
        yield ledger


@pytest.mark.parametrize("impl", POOLER_IMPLS)
def bench_pg_cycle_pooler(benchmark: Any, impl: str, pgbouncer: str) -> None:
    label(benchmark, "postgres normal: per unit, one at a time, direct vs pooler", impl, N)
    with _pooler_ledger(impl, pgbouncer) as ledger:
        benchmark.pedantic(_cycle, setup=lambda: ((ledger, _run(ledger)), {}), rounds=ROUNDS)


@pytest.mark.parametrize("impl", POOLER_IMPLS)
def bench_pg_batch_pooler(benchmark: Any, impl: str, pgbouncer: str) -> None:
    group = f"postgres normal: per unit, batches of {BATCH}, direct vs pooler"
    label(benchmark, group, impl, BATCH)
    with _pooler_ledger(impl, pgbouncer) as ledger:

        def go(run_id: str) -> None:
            assert all(batch_round(ledger, run_id, [f"u{i}" for i in range(BATCH)]))

        benchmark.pedantic(go, setup=lambda: ((_run(ledger),), {}), rounds=ROUNDS)


@pytest.mark.parametrize("impl", [POOLER_IMPLS[0], POOLER_IMPLS[2]])
def bench_pg_dispatchers_pooler(benchmark: Any, impl: str, pgbouncer: str) -> None:
    """4 dispatcher processes x 16 callers on one run, direct and through PgBouncer in the
    pooler mode: the shape a pooler is for (many clients), where group commit makes each
    process's concurrent calls one transaction and so pays each unnamed statement's parse
    once per group, not per call."""
    procs = 4
    group = f"postgres normal: {procs}x{DISPATCH_THREADS} callers on one run, direct vs pooler"
    label(benchmark, group, impl, procs * DISPATCH_THREADS * DISPATCH_UNITS)
    with pg_schema() as schema_url:
        _dispatch_round(benchmark, _pooler_url(impl, pgbouncer, schema_url), procs)

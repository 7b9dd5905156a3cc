"""What an operator sees: the ``fencepost`` logger, the fence's counts on the lease, and the
spans and instruments of :mod:`fencepost.otel`, read back through the OpenTelemetry SDK's
in-memory reader and exporter after a scripted run with one takeover and four refused stale
writes, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fencepost as fp
import fencepost.otel
from fencepost.aio import AsyncLedger
from tests.conftest import FakeClock

STALE_WRITES = 4


class Otel:
    """SDK providers of the test's own (the global ones can be set once per process), and
    what they collected."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def total(self, name: str, **attributes: Any) -> int:
        return sum(
            int(p.value if hasattr(p, "value") else p.count)
            for p in self.points().get(name, [])
            if all(p.attributes.get(k) == v for k, v in attributes.items())
        )


@pytest.fixture
def otel() -> Iterator[Otel]:
    made = Otel()
    fencepost.otel.instrument(
        tracer_provider=made.tracer_provider, meter_provider=made.meter_provider
    )
    try:
        yield made
    finally:
        fencepost.otel.uninstrument()


def scripted(ledger: fp.Ledger, clock: FakeClock) -> tuple[str, fp.Claim]:
    """One run: A claims it and reserves three units, A's lease expires, B takes over
    (the takeover), reclaims the unit A left running, finishes the units; then A, stale,
    tries four fenced writes, each refused. Returns the run id and B's claim."""
    run = ledger.start_run("wf/otel", scope_key=None, steps=[{"id": "s"}], force=True)
    a = ledger.claim(run.run_id, "host:a", lease_ms=1000)
    assert a is not None
    assert a.taken_from is None
    reserved = ledger.reserve_attempts(
        run.run_id, [{"unit_id": f"u{i}", "step_id": "s"} for i in range(3)], claim=a
    )
    ledger.finish_attempt(
        run.run_id, "u0", reserved[0].attempt, reserved[0].dispatch_id, status="completed",
        claim=a,
    )  # fmt: skip
    clock.advance(5000)
    b = ledger.claim(run.run_id, "host:b", lease_ms=60_000)
    assert b is not None
    assert b.taken_from == "host:a"
    again = ledger.reserve_attempt(run.run_id, "u1", step_id="s", claim=b)
    assert again.kind == "reclaimed"
    for r in (again, reserved[2]):
        assert ledger.finish_attempt(
            run.run_id, r.unit_id, r.attempt, r.dispatch_id, status="completed", claim=b
        )
    stale = [
        lambda: ledger.heartbeat(a, lease_ms=1000),
        lambda: ledger.set_outputs(run.run_id, {"stale": True}, claim=a),
        lambda: ledger.reserve_attempt(run.run_id, "u9", step_id="s", claim=a),
        lambda: ledger.set_status(run.run_id, "blocked", claim=a),
    ]
    assert len(stale) == STALE_WRITES
    for write in stale:
        with pytest.raises(fp.LeaseLost):
            write()
    return run.run_id, b


def test_the_lease_counts_its_takeovers_and_refused_writes(target: str, clock: FakeClock) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        run_id, _ = scripted(ledger, clock)
        lease = ledger.lease(run_id)
        assert (lease.takeovers, lease.refused_writes) == (1, STALE_WRITES)
        assert [(x.takeovers, x.refused_writes) for x in ledger.leases(owned_only=True)] == [
            (1, STALE_WRITES)
        ]
        claimed = [e for e in ledger.events(run_id) if e.type == "lease.claimed"]
        assert [e.payload.get("taken_from") for e in claimed] == [None, "host:a"]


def test_the_logger_reports_the_takeover_and_each_refused_write(
    target: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger="fencepost"),
        fp.Ledger.open(target, clock=clock) as ledger,
    ):
        run_id, _ = scripted(ledger, clock)
    records = [r for r in caplog.records if r.name == "fencepost"]
    by_event: dict[str, list[logging.LogRecord]] = {}
    for r in records:
        by_event.setdefault(r.__dict__["event"], []).append(r)
    (takeover,) = by_event["lease.takeover"]
    assert takeover.levelno == logging.WARNING
    assert (takeover.__dict__["run_id"], takeover.__dict__["taken_from"]) == (run_id, "host:a")
    assert takeover.__dict__["owner_id"] == "host:b"
    refused = by_event["fence.refused"]
    assert len(refused) == STALE_WRITES
    assert {r.__dict__["run_id"] for r in refused} == {run_id}
    assert {r.__dict__["expected_generation"] for r in refused} == {1}
    assert {r.__dict__["actual_generation"] for r in refused} == {2}
    (migrated,) = by_event["schema.migrated"]
    assert (migrated.__dict__["from_version"], migrated.__dict__["to_version"]) == (
        0,
        fp.SCHEMA_VERSION,
    )
    # The hot path says nothing at INFO: only the migration (once per new ledger) does.
    assert [r.__dict__["event"] for r in records if r.levelno == logging.INFO] == [
        "schema.migrated"
    ]


def test_the_library_prints_nothing_without_a_handler(tmp_path: Any) -> None:
    """A library leaves output to the application: a takeover's warning must not reach
    logging's last-resort handler (stderr) in a program that configured no logging."""
    script = textwrap.dedent(
        f"""
        import fencepost as fp
        now = [1_764_720_000_000]
        with fp.Ledger.open({str(tmp_path / "l.db")!r}, clock=lambda: now[0]) as ledger:
            run = ledger.start_run("wf", scope_key=None, steps=[{{"id": "s"}}], force=True)
            a = ledger.claim(run.run_id, "host:a", lease_ms=10)
            now[0] += 100
            assert ledger.claim(run.run_id, "host:b", lease_ms=10).taken_from == "host:a"
            try:
                ledger.heartbeat(a, lease_ms=10)
            except fp.LeaseLost:
                pass
        print("done")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert (out.stdout, out.stderr) == ("done\n", "")


def test_the_instruments_count_a_scripted_run(target: str, clock: FakeClock, otel: Otel) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        run_id, _ = scripted(ledger, clock)
    named = {name for name, *_ in fencepost.otel.INSTRUMENTS}
    # Every instrument recorded something, but busy retries and exhaustions: nothing contended,
    # and the run has no retry policy.
    assert set(otel.points()) == named - {
        "fencepost.store.busy_retries",
        "fencepost.units.exhausted",
        "fencepost.schedules.fired",
    }
    assert otel.total("fencepost.lease.takeovers") == 1
    assert otel.total("fencepost.fence.rejections") == STALE_WRITES
    assert otel.total("fencepost.fence.rejections", reason="superseded") == STALE_WRITES
    assert otel.total("fencepost.attempt.reclaims") == 1
    ops = "fencepost.operations"
    assert otel.total(ops, operation="claim", outcome="ok") == 2
    assert otel.total(ops, operation="finish_attempt", outcome="ok") == 3
    assert otel.total(ops, operation="reserve_attempts", outcome="ok") == 1
    assert otel.total(ops, operation="reserve_attempt", outcome="ok") == 1
    for op in ("heartbeat", "set_outputs", "reserve_attempt", "set_status"):
        assert otel.total(ops, operation=op, outcome="refused", **{"error.type": "LeaseLost"}) == 1
    # start_run, 2 claims, 1 + 1 reserves, 3 finishes, 4 refused writes.
    assert otel.total(ops) == 12
    assert otel.total("fencepost.operation.duration") == 12
    assert all(p.min >= 0 and p.max < 60 for p in otel.points()["fencepost.operation.duration"])
    # Every grouped write committed in a group of at least one.
    groups = otel.points()["fencepost.commit.group_size"]
    assert sum(p.count for p in groups) >= 7
    assert min(p.min for p in groups) >= 1

    spans = otel.exporter.get_finished_spans()
    assert len(spans) == 12
    failed = [s for s in spans if s.attributes.get("error.type") == "LeaseLost"]
    assert len(failed) == STALE_WRITES
    assert all(s.status.status_code == trace.StatusCode.ERROR for s in failed)
    claim = next(s for s in spans if s.name == "claim")
    assert claim.kind == trace.SpanKind.CLIENT
    assert claim.attributes["messaging.system"] == "fencepost"
    assert claim.attributes["fencepost.run_id"] == run_id


def test_an_exhausted_unit_is_counted_and_logged_once_committed(
    target: str, clock: FakeClock, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    once = {"max_attempts": 1, "initial_ms": 0}
    with (
        fp.Ledger.open(target, clock=clock) as ledger,
        caplog.at_level(logging.DEBUG, logger="fencepost"),
    ):
        run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True, retry=once)
        rs = ledger.reserve_attempts(run.run_id, [{"unit_id": u, "step_id": "s"} for u in "abc"])
        finish = [
            {"run_id": r.run_id, "unit_id": r.unit_id, "attempt": r.attempt,
             "dispatch_id": r.dispatch_id, "status": "failed"}
            for r in rs
        ]  # fmt: skip
        assert ledger.finish_attempt(**finish[0])
        assert ledger.finish_attempts(finish[1:]) == [True, True]
        # A finish that loses exhausts nothing.
        assert ledger.finish_attempts(finish) == [False, False, False]
    assert otel.total("fencepost.units.exhausted") == 3
    records = [r for r in caplog.records if r.__dict__.get("event") == "unit.exhausted"]
    assert [r.__dict__["unit_id"] for r in records] == ["a", "b", "c"]
    assert all(r.levelno == logging.WARNING and r.__dict__["attempts"] == 1 for r in records)
    assert all(r.__dict__["run_id"] == run.run_id for r in records)


def test_schedules_and_messages_are_spanned_counted_and_logged(
    target: str, clock: FakeClock, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.test_cron_schedules import TEMPLATE

    with (
        fp.Ledger.open(target, clock=clock) as ledger,
        caplog.at_level(logging.DEBUG, logger="fencepost"),
    ):
        ledger.put_schedule("h", cron="0 * * * *", workflow_name="w", template=TEMPLATE,
                            overlap="allow", catch_up=2)  # fmt: skip
        clock.advance(5 * 3_600_000)
        fired = ledger.tick_schedules()
        assert len(fired) == 3
        ledger.pause_schedule("h")
        claim = ledger.claim(fired[0].run_id, "host-a", lease_ms=10_000)
        assert claim is not None
        ledger.send(fired[0].run_id, "t", 1)
        assert len(ledger.receive(fired[0].run_id, "t", claim=claim)) == 1
    assert otel.total("fencepost.schedules.fired") == 3
    ops = "fencepost.operations"
    for op in ("put_schedule", "tick_schedules", "pause_schedule", "send", "receive"):
        assert otel.total(ops, operation=op, outcome="ok") == 1, op
    events = [r.__dict__.get("event") for r in caplog.records]
    assert events.count("schedule.fired") == 3
    assert {"schedule.put", "schedule.paused", "message.sent", "message.received"} <= set(events)
    [put] = [r for r in caplog.records if r.__dict__.get("event") == "schedule.put"]
    assert (put.levelno, put.__dict__["schedule"]) == (logging.INFO, "h")
    fires = [r for r in caplog.records if r.__dict__.get("event") == "schedule.fired"]
    assert [r.__dict__["run_id"] for r in fires] == [r.run_id for r in fired]
    assert {r.__dict__["schedule"] for r in fires} == {"h"}


def test_a_reserved_attempt_keeps_the_trace_context_and_links_back(
    target: str, clock: FakeClock, otel: Otel
) -> None:
    tracer = otel.tracer_provider.get_tracer("dispatcher")
    with fp.Ledger.open(target, clock=clock) as ledger:
        run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        with tracer.start_as_current_span("dispatch") as dispatch:
            one = ledger.reserve_attempt(run.run_id, "u1", step_id="s")
            many = ledger.reserve_attempts(
                run.run_id,
                [{"unit_id": "u2", "step_id": "s"}, {"unit_id": "u3", "step_id": "s"}],
            )
        mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        given = ledger.reserve_attempt(run.run_id, "u4", step_id="s", trace_context=mine)
        (attempt,) = ledger.attempts(run.run_id, "u1")
        assert ledger.attempts(run.run_id, given.unit_id)[0].trace_context == mine
        contexts = {u: ledger.attempts(run.run_id, u)[0].trace_context for u in ("u1", "u2", "u3")}
    trace_id = dispatch.get_span_context().trace_id
    for unit, tp in contexts.items():
        assert tp is not None, unit
        assert tp.split("-")[1] == f"{trace_id:032x}"
    reserve = next(s for s in otel.exporter.get_finished_spans() if s.name == "reserve_attempt")
    assert reserve.parent is not None
    assert reserve.parent.span_id == dispatch.get_span_context().span_id
    assert reserve.attributes["messaging.message.id"] == one.dispatch_id
    assert contexts["u1"].startswith(f"00-{trace_id:032x}-{reserve.context.span_id:016x}-")
    assert len(many) == 2
    assert len({contexts["u2"], contexts["u3"]}) == 1
    link = fencepost.otel.link(attempt)
    assert link is not None
    assert (link.context.trace_id, link.context.span_id) == (trace_id, reserve.context.span_id)
    assert fencepost.otel.link(None) is None


@pytest.mark.parametrize(
    "bad",
    ["", "00-xyz", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
     "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
     "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
     "<script>alert(1)</script>"],
)  # fmt: skip
def test_a_malformed_trace_context_is_refused_and_nothing_written(
    ledger: fp.Ledger, bad: str
) -> None:
    run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.reserve_attempt(run.run_id, "u1", step_id="s", trace_context=bad)
    assert err.value.argument == "trace_context"
    assert "traceparent" in str(err.value)
    assert ledger.attempts(run.run_id, "u1") == []


def test_async_operations_get_spans_and_counts(target: str, clock: FakeClock, otel: Otel) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(target, clock=clock) as ledger:
            run = await ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
            reserved = await asyncio.gather(
                *(ledger.reserve_attempt(run.run_id, f"u{i}", step_id="s") for i in range(5))
            )
            assert all(r.kind == "reserved" for r in reserved)
            assert (await ledger.attempts(run.run_id, "u0"))[0].trace_context is not None

    asyncio.run(main())
    ops = "fencepost.operations"
    assert otel.total(ops, operation="reserve_attempt", outcome="ok") == 5
    assert otel.total(ops, operation="start_run", outcome="ok") == 1
    assert otel.total(ops, operation="attempts", outcome="ok") == 1
    assert len(otel.exporter.get_finished_spans()) == 7


def test_nothing_is_emitted_once_uninstrumented(target: str, clock: FakeClock) -> None:
    made = Otel()
    fencepost.otel.instrument(
        tracer_provider=made.tracer_provider, meter_provider=made.meter_provider
    )
    fencepost.otel.uninstrument()
    assert not fencepost.otel.is_instrumented()
    assert fp.Ledger.reserve_attempt.__qualname__ == "Ledger.reserve_attempt"
    assert not hasattr(fp.Ledger.reserve_attempt, "__wrapped_by_fencepost__")
    with fp.Ledger.open(target, clock=clock) as ledger:
        run_id, _ = scripted(ledger, clock)
        assert ledger.attempts(run_id, "u0")[0].trace_context is None
    assert made.exporter.get_finished_spans() == ()
    assert made.points() == {}


def test_the_global_providers_are_used_once_set() -> None:
    """Instrumented before the application sets its providers, fencepost emits nothing, then
    emits through them once they are set (a process of its own: globals are set once)."""
    script = textwrap.dedent(
        """
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        import fencepost as fp, fencepost.otel

        fencepost.otel.instrument()
        with fp.Ledger.open(":memory:") as ledger:
            run = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
            exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            ledger.reserve_attempt(run.run_id, "u1", step_id="s")
        names = [s.name for s in exporter.get_finished_spans()]
        counted = [
            m.name
            for r in reader.get_metrics_data().resource_metrics
            for s in r.scope_metrics
            for m in s.metrics
        ]
        print(names, sorted(counted))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == (
        "['reserve_attempt'] ['fencepost.commit.group_size', 'fencepost.operation.duration', "
        "'fencepost.operations']"
    )


def test_a_write_that_waits_on_another_process_reports_its_retries(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, otel: Otel
) -> None:
    """Another process holds SQLite's write lock past the busy budget: the write's retries
    are counted and logged at DEBUG, and its giving up at WARNING."""
    path = tmp_path / "busy.db"
    with (
        caplog.at_level(logging.DEBUG, logger="fencepost"),
        fp.Ledger.open(str(path), busy_timeout_ms=300) as ledger,
    ):
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys, time\n"
                f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
                "c.execute('BEGIN IMMEDIATE')\n"
                "print('held', flush=True)\n"
                "sys.stdin.readline()\n",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(fp.StoreBusy):
                ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        finally:
            holder.communicate("\n", timeout=30)
        assert ledger.list_runs() == []
    events = [r.__dict__.get("event") for r in caplog.records if r.name == "fencepost"]
    assert "store.busy" in events
    retried = [r for r in caplog.records if r.__dict__.get("event") == "store.busy_retries"]
    assert retried
    assert all(r.levelno == logging.DEBUG for r in retried)
    counted = sum(r.__dict__["count"] for r in retried)
    assert counted >= 10  # 300 ms of sleeps of at most 4 ms
    assert otel.total("fencepost.store.busy_retries") == counted
    assert otel.total("fencepost.operations", operation="start_run", outcome="error") == 1


def test_a_reconnect_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    from tests.conftest import pg_connect, pg_schema

    with (
        caplog.at_level(logging.WARNING, logger="fencepost"),
        pg_schema() as url,
        fp.Ledger.open(url) as ledger,
    ):
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        with pg_connect(url) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'fencepost' AND pid <> pg_backend_pid() "
                "AND datname = current_database()"
            )
        with contextlib.suppress(fp.StoreError):
            ledger.get_run("r1")  # may meet the dead session
        assert ledger.get_run("r1") is not None
    reconnected = [r for r in caplog.records if r.__dict__.get("event") == "store.reconnected"]
    assert len(reconnected) >= 1
    assert reconnected[0].levelno == logging.WARNING


def test_a_prune_is_logged_with_its_counts(
    target: str, clock: FakeClock, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        old = ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        got = ledger.reserve_attempt(old.run_id, "u1", step_id="s")
        ledger.finish_attempt(old.run_id, "u1", got.attempt, got.dispatch_id, status="completed")
        assert ledger.abandon_run(old.run_id)
        clock.advance(40 * 86_400_000)
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        with caplog.at_level(logging.INFO, logger="fencepost"):
            dry = ledger.prune(older_than=dt.timedelta(days=30), dry_run=True)
            done = ledger.prune(older_than=dt.timedelta(days=30), archive=str(tmp_path / "a.jsonl"))
    assert dry.runs == done.runs == 1
    pruned = [r for r in caplog.records if r.__dict__.get("event") == "retention.pruned"]
    assert [(r.levelno, r.__dict__["dry_run"], r.__dict__["runs"]) for r in pruned] == [
        (logging.INFO, True, 1),
        (logging.INFO, False, 1),
    ]
    assert pruned[1].__dict__["attempts"] == done.attempts == 1
    assert pruned[1].__dict__["archive"] == str(tmp_path / "a.jsonl")


def test_the_run_id_attribute_names_the_run(target: str, clock: FakeClock, otel: Otel) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        run = ledger.start_run("wf/named", scope_key="sc", steps=[{"id": "s"}])
        claim = ledger.claim(run.run_id, "host:a", lease_ms=1000)
        assert claim is not None
        ledger.heartbeat(claim, lease_ms=1000)
        ledger.find_scope_occupant("sc")
        ledger.claim_next("host:b", lease_ms=1000)
    spans = {s.name: s.attributes for s in otel.exporter.get_finished_spans()}
    for name in ("start_run", "claim", "heartbeat"):
        assert spans[name]["fencepost.run_id"] == run.run_id, name
    # About no single run: a scope key or a runner id is not a run id.
    assert "fencepost.run_id" not in spans["claim_next"]
    assert spans["find_scope_occupant"]["fencepost.run_id"] == run.run_id  # the run it found


def test_a_cancelled_wait_is_cancelled_not_failed_and_counts_once(
    target: str, clock: FakeClock, otel: Otel
) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(target, clock=clock) as ledger:
            run = await ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
            got = await ledger.wait_events(run.run_id, after_seq=0, timeout_s=5)
            assert got
            seq = got[-1].seq
            waiting = asyncio.ensure_future(
                ledger.wait_events(run.run_id, after_seq=seq, timeout_s=30)
            )
            await asyncio.sleep(0.3)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting

    asyncio.run(main())
    ops = "fencepost.operations"
    assert otel.total(ops, operation="wait_events") == 2
    assert otel.total(ops, operation="wait_events", outcome="ok") == 1
    assert otel.total(ops, operation="wait_events", outcome="cancelled") == 1
    (cancelled,) = [
        s for s in otel.exporter.get_finished_spans() if s.attributes.get("fencepost.cancelled")
    ]
    assert cancelled.status.status_code != trace.StatusCode.ERROR
    assert "error.type" not in cancelled.attributes

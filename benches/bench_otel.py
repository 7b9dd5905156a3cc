"""What ``fencepost.otel`` costs the dispatcher's hot path, measured on the reserve + finish
cycle of benches/bench_attempts.py in one run:

- ``fencepost``: not instrumented (also what a process without the ``otel`` extra runs);
- ``fencepost + otel, no provider``: ``instrument()`` called, but the application has set no
  tracer or meter provider, so each call checks for one and runs as before;
- ``fencepost + otel SDK``: the OpenTelemetry SDK recording every span and instrument
  (in-memory exporter and reader), for scale: what the telemetry itself costs once it is on.

The first two must stay within 3% of each other (benches/RESULTS.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fencepost as fp
import fencepost.otel
from benches.conftest import label

N = 200
ROUNDS = 40
GROUP = "reserve+finish cycle, telemetry (2 tx)"
_ids = itertools.count()


@pytest.fixture(
    params=["fencepost", "fencepost + otel, no provider", "fencepost + otel SDK"],
)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    if name == "fencepost + otel, no provider":
        # The global providers of this process are never set (no bench or test sets them).
        fencepost.otel.instrument()
    elif name == "fencepost + otel SDK":
        spans = TracerProvider()
        spans.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        fencepost.otel.instrument(
            tracer_provider=spans,
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        )
    try:
        yield name
    finally:
        fencepost.otel.uninstrument()


def bench_reserve_finish_cycle_telemetry(benchmark: Any, mode: str, tmp_path: Any) -> None:
    label(benchmark, GROUP, mode, N)
    with fp.Ledger.open(str(tmp_path / "otel.db")) as ledger:

        def setup() -> tuple[tuple[str, list[str]], dict[str, Any]]:
            run = ledger.start_run(
                "bench", scope_key=None, steps=[{"id": "s"}], run_id=f"r{next(_ids)}", force=True
            )
            return (run.run_id, [f"unit-{i:05d}" for i in range(N)]), {}

        def go(run: str, units: list[str]) -> None:
            for u in units:
                r = ledger.reserve_attempt(run, u, step_id="s", holder="w1")
                assert ledger.finish_attempt(run, u, r.attempt, r.dispatch_id, status="completed")

        benchmark.pedantic(go, setup=setup, rounds=ROUNDS)

"""What retry policies cost, in one run:

- the dispatcher's failing cycle (``reserve_attempt`` of a fresh unit, then ``finish_attempt``
  with ``failed``) on a run without a policy and on a run with one, side by side in every
  round, SQLite and PostgreSQL (``policy_over_none``: with a policy over without, round by
  round; the target is at most 1.05x). Under a policy the finish also reads the step's and
  run's policy and writes the unit's ``retry_at``;
- ``due_units`` and ``exhausted_units`` on a ledger of 10 000 units and on a large one
  (100 000 by default, so the benches' CI pass stays quick; ``scripts/bench`` passes
  ``FENCEPOST_BENCH_RETRY_UNITS=1000000``), SQLite and PostgreSQL: the first page, a page
  from the middle of the due units, one run's page, and the dead letters, on both ledgers in
  each round (``large_over_small``: the large ledger over the small one, round by round; the
  target is within 10%).

The ledgers for the reads are made in SQL (20 runs started through the API, then their units
inserted as the finishes would leave them: each run's units together, as a dispatcher
reserves them; every unit failed under a policy, one in ten exhausted, and of the others half
due, each at its own millisecond, and half due tomorrow),
because a million reserve-and-fail cycles would take the benches' whole budget; the reads look
at the units alone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost as fp
from benches.conftest import Clock, label, plaintext

N = 200
ROUNDS = 30
# The reads are short and the machine shares its CPUs with the server: more rounds, and the
# plans settled (PostgreSQL makes its generic plan after five runs) before any is timed.
READ_ROUNDS = 100
WARMUP_ROUNDS = 10
SMALL = 10_000
LARGE = int(os.environ.get("FENCEPOST_BENCH_RETRY_UNITS", "100000"))
RUNS = 20
PAGE = 100
DAY_MS = 86_400_000
POLICY = {"max_attempts": 5, "initial_ms": 1_000, "jitter": 0.2}
# The reads' ledgers' clock: their units failed a minute before it.
NOW = 1_767_225_600_000
_ids = itertools.count()


@pytest.fixture(params=["fencepost", "fencepost-postgres"])
def target(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """A fresh SQLite file or PostgreSQL schema (plaintext, as the other PostgreSQL benches)."""
    from tests.conftest import pg_schema

    if request.param == "fencepost-postgres":
        with pg_schema() as url:
            yield plaintext(url)
        return
    yield str(tmp_path / "retries.db")


def bench_failing_cycle(benchmark: Any, target: str) -> None:
    """Each round runs ``N`` cycles on a fresh run without a policy and ``N`` on a fresh run
    with one, in one file (which goes first turns from round to round), each timed on its own:
    the target is the policy's time over none's, a few percent, and two figures taken a minute
    apart on this machine differ by more than that. ``extra_info``: per side the median µs
    per cycle, and ``policy_over_none``, the median of the rounds' own ratios."""
    backend = "postgres" if target.startswith("postgresql://") else "sqlite"
    label(benchmark, f"retries: reserve + failing finish, {backend} (2 tx, 2 runs)",
          "fencepost", 2 * N)  # fmt: skip
    times: dict[bool, list[float]] = {False: [], True: []}
    with fp.Ledger.open(target) as ledger:

        def cycles(policy: bool) -> float:
            run = ledger.start_run(
                "bench", scope_key=None, steps=[{"id": "s"}], run_id=f"r{next(_ids)}",
                force=True, retry=POLICY if policy else None,
            ).run_id  # fmt: skip
            start = time.perf_counter()
            for i in range(N):
                u = f"unit-{i:05d}"
                r = ledger.reserve_attempt(run, u, step_id="s", holder="w1")
                assert ledger.finish_attempt(run, u, r.attempt, r.dispatch_id, status="failed")
            elapsed = time.perf_counter() - start
            waiting = ledger.units(run, limit=1)
            assert (waiting[0].retry_at is not None) == policy
            return elapsed / N

        def go() -> None:
            for policy in (False, True) if len(times[False]) % 2 else (True, False):
                times[policy].append(cycles(policy))

        benchmark.pedantic(go, rounds=ROUNDS)
    ratios = [b / a for a, b in zip(times[False], times[True], strict=True)]
    benchmark.extra_info.update(
        backend=backend,
        us_per_cycle={k: round(statistics.median(t) * 1e6, 1)
                      for k, t in (("none", times[False]), ("policy", times[True]))},
        policy_over_none=round(statistics.median(ratios), 3),
    )  # fmt: skip


# ------------------------------------------------------------------ reads at size

_FILL = """
INSERT INTO units (run_id, unit_id, step_id, phase, status, attempts, first_started_at,
    started_at, finished_at, retry_at)
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1)
SELECT 'r' || CAST(i * 20 / ? AS TEXT), 'u' || CAST(i AS TEXT), 's', 'unit',
    CASE WHEN i % 10 = 9 THEN 'exhausted' ELSE 'failed' END, 1, ? - 60000, ? - 60000,
    ? - 60000,
    CASE WHEN i % 10 = 9 THEN NULL WHEN i % 2 = 0 THEN ? - 1000000 + i ELSE ? + ? + i END
FROM n
"""


def _build(target: str, units: int, clock: Clock) -> None:
    from tests.conftest import raw_db

    now = clock()
    with fp.Ledger.open(target, clock=clock) as ledger:
        for r in range(RUNS):
            ledger.start_run(
                "bench", scope_key=None, steps=[{"id": "s"}], run_id=f"r{r}", force=True,
                retry=POLICY,
            )  # fmt: skip
    fill = _FILL
    if target.startswith("postgresql://"):
        fill = fill.replace("%", "%%")  # psycopg's placeholders: a literal % is doubled
    with raw_db(target) as db:
        db.execute(fill, (units, units, now, now, now, now, now, DAY_MS))
        # PostgreSQL: vacuumed too, as autovacuum would soon, so that it does not start in the
        # middle of the timed reads, and the first reads do not set every row's hint bits.
        db.execute("VACUUM ANALYZE" if target.startswith("postgresql://") else "ANALYZE")
        db.commit()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[int, tuple[str, Clock]]]]:
    """Both ledgers of units waiting on their policy, the small and the large, on one backend,
    made once: size to (target, clock)."""
    from tests.conftest import pg_schema

    backend = str(request.param)
    with contextlib.ExitStack() as stack:
        ledgers: dict[int, tuple[str, Clock]] = {}
        for units in (SMALL, LARGE):
            clock = Clock()
            clock.now_ms = NOW
            if backend == "postgres":
                target = plaintext(stack.enter_context(pg_schema()))
            else:
                target = str(tmp_path_factory.mktemp("retries-reads") / "reads.db")
            _build(target, units, clock)
            ledgers[units] = (target, clock)
        yield backend, ledgers


def _group(ledger: fp.Ledger, units: int) -> None:
    """Every read of the group: the first page of due units, a page from the middle of them,
    one run's page and the dead letters' first page."""
    # A place half-way through the due units (unit i is due at NOW - 1 000 000 + i ms): the
    # page after it costs what the first does.
    middle = fp.Unit(
        run_id="r50", unit_id="u", step_id=None, phase="unit", status="failed", attempts=1,
        result=None, tokens=None, failure_reason=None, claim_holder=None,
        retry_at=fp.models.from_ms(NOW - 1_000_000 + units // 2),
    )  # fmt: skip
    assert len(ledger.due_units(limit=PAGE)) == PAGE
    assert len(ledger.due_units(limit=PAGE, after=middle)) == PAGE
    assert len(ledger.due_units("r8", limit=PAGE)) == PAGE
    assert len(ledger.exhausted_units(limit=PAGE)) == PAGE


def bench_retry_reads(benchmark: Any, built: tuple[str, dict[int, tuple[str, Clock]]]) -> None:
    """Each round runs the group of reads on the small ledger and on the large one, one after
    the other (which first turns from round to round), each timed on its own: the target is
    the large one's time over the small one's, and two figures taken a minute apart on this
    machine differ by more than the target's 10%, where two taken side by side move together.
    ``extra_info``: per size the median µs per read, and ``large_over_small``, the median of
    the rounds' own ratios."""
    backend, ledgers = built
    label(benchmark, f"retries: due and exhausted pages, {backend} (4 reads x 2 ledgers)",
          "fencepost", 8)  # fmt: skip
    times: dict[int, list[float]] = {units: [] for units in ledgers}
    with contextlib.ExitStack() as stack:
        opened = {
            units: stack.enter_context(fp.Ledger.open(target, clock=clock))
            for units, (target, clock) in ledgers.items()
        }
        order = list(opened)

        def go() -> None:
            for units in order if len(times[SMALL]) % 2 else order[::-1]:
                start = time.perf_counter()
                _group(opened[units], units)
                times[units].append((time.perf_counter() - start) / 4)

        benchmark.pedantic(go, rounds=READ_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    # With timings off (CI's single pass) the group ran once, untimed by the warm-up's count.
    timed = {units: t[WARMUP_ROUNDS:] or t for units, t in times.items()}
    ratios = [b / a for a, b in zip(timed[SMALL], timed[LARGE], strict=True)]
    benchmark.extra_info.update(
        backend=backend, small=SMALL, large=LARGE,
        us_per_read={str(u): round(statistics.median(t) * 1e6, 1) for u, t in timed.items()},
        large_over_small=round(statistics.median(ratios), 3),
    )  # fmt: skip

"""``claim_next``: the controller's dequeue. The oldest queued runs first (``created_at``, then
``run_id``), each claimed as ``claim`` does, on both backends; 8 processes draining 500 queued
runs claim each exactly once and skip none; on PostgreSQL a claimer never waits on a run
another transaction holds. That the read is a range of the queued-runs index is checked by the
Rust plan tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, pg_connect, pg_schema, queued
from tests.processes import outcome, run_all


@pytest.fixture
def ledger_target(target: str) -> str:
    """A SQLite file and PostgreSQL: the races below open the ledger from other processes."""
    return target


def _queue(ledger: fp.Ledger, clock: FakeClock, ids: list[str], name: str = "deploy") -> None:
    for run_id in ids:
        ledger.reserve_run(run_id, **queued(run_id, workflow_name=name))
        clock.advance(1)


def test_oldest_first_each_a_fenced_claim(ledger: fp.Ledger, clock: FakeClock) -> None:
    _queue(ledger, clock, ["q-c", "q-a"])
    # Two runs queued in the same millisecond: the run id decides, bytewise.
    _queue(ledger, clock, ["q-z"])
    clock.advance(-1)
    _queue(ledger, clock, ["q-b"])
    ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="not-queued", force=True)
    first = ledger.claim_next("ctl-1", lease_ms=10_000)
    assert [c.run_id for c in first] == ["q-c"]
    claim = first[0]
    assert (claim.generation, claim.owner_id) == (1, "ctl-1")
    run = ledger.get_run("q-c")
    assert run is not None
    assert run.status == "starting"
    assert [e.type for e in ledger.events("q-c")][-1] == "lease.claimed"
    # The claim is a real one: it fences writes, and the run is no longer handed out.
    assert ledger.set_status("q-c", "active", claim=claim).status == "active"
    rest = ledger.claim_next("ctl-2", lease_ms=10_000, limit=10)
    assert [c.run_id for c in rest] == ["q-a", "q-b", "q-z"]
    assert len({c.token for c in rest}) == 3  # each claim its own token
    assert ledger.claim_next("ctl-2", lease_ms=10_000, limit=10) == []
    assert ledger.get_run("not-queued").status == "active"  # type: ignore[union-attr]


def test_workflow_names_filter(ledger: fp.Ledger, clock: FakeClock) -> None:
    _queue(ledger, clock, ["d1", "d2"], name="deploy")
    _queue(ledger, clock, ["b1"], name="build")
    got = ledger.claim_next("ctl", lease_ms=1_000, workflow_names="build", limit=5)
    assert [c.run_id for c in got] == ["b1"]
    got = ledger.claim_next("ctl", lease_ms=1_000, workflow_names=["nope", "deploy"], limit=5)
    assert [c.run_id for c in got] == ["d1", "d2"]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": 2, "token": "fpt_" + "1" * 64}, "token"),
        ({"lease_ms": 0}, "lease_ms"),
        ({"workflow_names": 7}, "workflow_names"),
        ({"workflow_names": [""]}, "workflow_names"),
    ],
)
def test_bad_arguments_claim_nothing(
    ledger: fp.Ledger, clock: FakeClock, kwargs: dict[str, Any], argument: str
) -> None:
    _queue(ledger, clock, ["q1", "q2"])
    call: dict[str, Any] = {"lease_ms": 1_000, **kwargs}
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.claim_next("ctl", **call)
    assert info.value.argument == argument
    assert {ledger.get_run(r).status for r in ("q1", "q2")} == {"queued"}  # type: ignore[union-attr]


def test_a_given_token_is_the_claims(ledger: fp.Ledger, clock: FakeClock) -> None:
    _queue(ledger, clock, ["q1"])
    token = "fpt_" + "2" * 64
    (claim,) = ledger.claim_next("ctl", lease_ms=1_000, token=token)
    assert claim.token == token
    ledger.heartbeat(claim, lease_ms=1_000)


# ------------------------------------------------------------------ processes

QUEUED = 500


def _drainer(i: int, barrier: Any, queue: Any, target: str, batch: int) -> None:
    got: list[tuple[str, int]] = []
    errors: list[str] = []
    with fp.Ledger.open(target) as ledger:
        barrier.wait()
        while True:
            kind, claims = outcome(
                lambda: ledger.claim_next(f"ctl-{i}", lease_ms=50, limit=batch, rescue=False)
            )
            if kind != "ok":
                errors.append(f"{kind}: {claims}")
                continue
            if not claims:
                break
            got.extend((c.run_id, c.generation) for c in claims)
    queue.put((i, (got, errors)))


def test_eight_processes_claim_every_run_exactly_once(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        for n in range(QUEUED):
            ledger.reserve_run(f"r{n:03d}", **queued(f"r{n:03d}"))
    # Short leases that expire while the others drain: without rescue, claim_next hands out
    # queued runs only, so an expired claim is not handed out again.
    results = run_all(_drainer, [(target, 1 + i % 3) for i in range(8)])
    claimed: dict[str, int] = {}
    for got, errors in results:
        assert errors == []  # no StoreBusy and no raw error under contention
        for run_id, generation in got:
            assert run_id not in claimed, f"{run_id} handed out twice"
            assert generation == 1
            claimed[run_id] = generation
    assert sorted(claimed) == [f"r{n:03d}" for n in range(QUEUED)]
    assert sum(1 for got, _ in results if got) > 1  # the work was shared
    with fp.Ledger.open(target) as ledger:
        assert ledger.list_runs(status="queued") == []
        assert len(ledger.list_runs(status="starting", limit=1000)) == QUEUED


def test_postgres_claimer_skips_a_held_run_without_waiting(clock: FakeClock) -> None:
    with pg_schema() as url, fp.Ledger.open(url, clock=clock) as ledger:
        _queue(ledger, clock, ["oldest", "next-1", "next-2"])
        with pg_connect(url) as holder, holder.transaction():
            # Another transaction holds the oldest queued run's row, as a claimer mid-claim
            # would, until it ends.
            holder.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", ("oldest",))
            done: list[list[fp.Claim]] = []
            worker = threading.Thread(
                target=lambda: done.append(ledger.claim_next("ctl", lease_ms=1_000, limit=2))
            )
            started = time.monotonic()
            worker.start()
            worker.join(10)
            waited = time.monotonic() - started
        worker.join(10)
        assert done, "claim_next waited on the held row"
        assert [c.run_id for c in done[0]] == ["next-1", "next-2"]
        assert waited < 10
        # Released, the oldest is the next one handed out.
        assert [c.run_id for c in ledger.claim_next("ctl", lease_ms=1_000)] == ["oldest"]

"""The run queue (``queue``): ``reserve_run`` queues a controller's run with an unowned
lease, a continuation completes its parked parent, and ``prepare_or_adopt`` claims a new run or
adopts the one another controller prepared, writing nothing. Every refusal names the argument
or the reason and writes nothing. Expiry is driven by the injected clock, never by sleeping."""

from __future__ import annotations

from typing import Any

import pytest

import fencepost as fp
from tests.conftest import DEFINITION, FakeClock, counts, queued, started


@pytest.fixture
def ledger_target(target: str) -> str:
    """``nothing written`` is checked by counting rows behind the API's back (``counts``), so
    these tests run on the backends another connection can read: a SQLite file and
    PostgreSQL, not ``:memory:``."""
    return target


# ------------------------------------------------------------------ reserve_run


def test_reserve_run_queues_with_an_unowned_lease(ledger: fp.Ledger, target: str) -> None:
    run = ledger.reserve_run("run-1", **queued())
    assert run.status == "queued"
    assert run.origin_session_id == "session-1"
    assert run.workflow_ref == "deploy@3"
    assert run.workflow_name == "deploy"
    assert run.revision == 1
    lease = ledger.lease("run-1")
    assert (lease.generation, lease.owner_id, lease.expires_at) == (0, None, None)
    [event] = ledger.events("run-1")
    assert event.type == "run.queued"
    assert event.payload["definition_digest"] == fp.digest(DEFINITION)
    # Definition, source, input and launch options are stored by content.
    for value in (DEFINITION, queued()["source"], {"target": "prod"}, {"max_parallel": 8}):
        assert ledger.get_json(fp.digest(value)) == value


def test_reserve_run_defaults_input_to_null_and_options_to_empty(ledger: fp.Ledger) -> None:
    kw = queued()
    del kw["input"], kw["launch_options"]
    ledger.reserve_run("run-1", **kw)
    assert ledger.get_json(fp.digest(None)) is None
    assert ledger.get_json(fp.digest({})) == {}


def test_definition_digest_is_recomputed_not_trusted(ledger: fp.Ledger, target: str) -> None:
    # A caller-supplied digest that does not match the definition is refused: adoption compares
    # digests, so a wrong one would make two different definitions look the same.
    before = counts(target)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.reserve_run("run-1", **queued(definition_digest="sha256:" + "0" * 64))
    assert err.value.argument == "definition_digest"
    assert counts(target) == before
    assert ledger.get_run("run-1") is None


@pytest.mark.parametrize(
    ("overrides", "argument"),
    [
        ({"run_id": "has space"}, "run_id"),
        ({"run_id": ""}, "run_id"),
        ({"runner_id": ""}, "runner_id"),
        ({"origin_session_id": "a\nb"}, "origin_session_id"),
        ({"workflow_ref": ""}, "workflow_ref"),
        ({"parent_run_id": "bad/id"}, "parent_run_id"),
        ({"input": float("nan")}, "input"),
        ({"source": {1: "x"}}, "source"),
    ],
)
def test_reserve_run_bad_input_names_the_argument(
    ledger: fp.Ledger, target: str, overrides: dict[str, Any], argument: str
) -> None:
    overrides = dict(overrides)  # the parameter is shared by both backends' runs
    run_id = overrides.pop("run_id", "run-1")
    before = counts(target)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.reserve_run(run_id, **queued(**overrides))
    assert err.value.argument == argument
    assert counts(target) == before


def test_reserve_run_twice_is_refused(ledger: fp.Ledger, target: str) -> None:
    # A duplicate id.
    ledger.reserve_run("run-1", **queued())
    before = counts(target)
    with pytest.raises(fp.InvalidArgument, match="already reserved") as err:
        ledger.reserve_run("run-1", **queued())
    assert err.value.argument == "run_id"
    assert counts(target) == before


# ------------------------------------------------------------------ continuations


def parked(ledger: fp.Ledger, run_id: str = "parent") -> fp.Claim:
    claim = started(ledger, run_id)
    ledger.set_status(run_id, "parked", claim=claim)
    ledger.release(claim)
    return claim


def test_continuation_completes_a_parked_parent(ledger: fp.Ledger) -> None:
    parked(ledger)
    child = ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    assert child.parent_run_id == "parent"
    assert child.status == "queued"
    parent = ledger.get_run("parent")
    assert parent is not None
    assert parent.status == "completed"
    assert parent.completed_at is not None
    assert ledger.events("parent")[-1].type == "run.continued"
    assert ledger.events("parent")[-1].payload["continuation_run_id"] == "next"


def test_second_continuation_is_refused(ledger: fp.Ledger, target: str) -> None:
    # The reason says "already has a continuation", not the
    # status, and a merely completed parent gets a different reason.
    parked(ledger)
    ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    before = counts(target)
    with pytest.raises(fp.ContinuationRefused) as err:
        ledger.reserve_run("again", **queued("again", parent_run_id="parent"))
    assert err.value.parent_run_id == "parent"
    assert "already has a continuation" in err.value.reason
    assert counts(target) == before
    assert ledger.get_run("again") is None


@pytest.mark.parametrize("status", ["active", "queued", "completed"])
def test_continuation_of_a_parent_that_is_not_parked_is_refused(
    ledger: fp.Ledger, target: str, status: str
) -> None:
    if status == "queued":
        ledger.reserve_run("parent", **queued("parent"))
    else:
        claim = started(ledger, "parent")
        if status == "completed":
            ledger.set_status("parent", "completed", claim=claim)
    before = counts(target)
    with pytest.raises(fp.ContinuationRefused) as err:
        ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    assert status in err.value.reason
    assert counts(target) == before
    parent = ledger.get_run("parent")
    assert parent is not None
    assert parent.status == status


def test_continuation_from_another_session_is_refused(ledger: fp.Ledger, target: str) -> None:
    parked(ledger)
    before = counts(target)
    with pytest.raises(fp.ContinuationRefused, match="another session"):
        ledger.reserve_run(
            "next", **queued("next", parent_run_id="parent", origin_session_id="session-2")
        )
    assert counts(target) == before


def test_continuation_of_a_missing_parent_is_refused(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.ContinuationRefused, match="does not exist"):
        ledger.reserve_run("next", **queued("next", parent_run_id="ghost"))
    assert ledger.get_run("next") is None


def test_parked_parent_with_a_live_owner_blocks_until_expiry(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    # An owner that is still live blocks the continuation; an expired, never-released owner
    # does not block it forever (it can no longer write, so requiring a released lease would
    # strand the parent when its owner crashed).
    claim = started(ledger, "parent")
    ledger.set_status("parent", "parked", claim=claim)
    with pytest.raises(fp.ContinuationRefused, match="live owner"):
        ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    clock.advance(10_001)
    ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    parent = ledger.get_run("parent")
    assert parent is not None
    assert parent.status == "completed"


# ------------------------------------------------------------------ prepare_or_adopt


def test_prepare_claims_then_adopts_without_writing(ledger: fp.Ledger, target: str) -> None:
    # The winner claims at generation 1; the loser adopts and changes nothing at all.
    first = ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000, claim_token="w" * 40)
    assert first.state == "claimed"
    assert first.claim is not None
    assert first.claim.generation == 1
    assert first.claim.token == "w" * 40
    assert first.run.status == "starting"
    assert [e.type for e in ledger.events("run-1")] == ["run.queued", "lease.claimed"]
    before = (counts(target), ledger.get_run("run-1"), ledger.lease("run-1"))
    second = ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000, claim_token="l" * 40)
    assert second.state == "adopted"
    assert second.claim is None
    assert second.run == first.run
    assert (counts(target), ledger.get_run("run-1"), ledger.lease("run-1")) == before
    # The loser's token is worthless; the winner's works.
    loser = fp.Claim("run-1", 1, "l" * 40, "host-a", first.claim.expires_at)
    with pytest.raises(fp.LeaseLost):
        ledger.heartbeat(loser, lease_ms=5000)
    ledger.heartbeat(first.claim, lease_ms=5000)


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("workflow_name", {"workflow_name": "other"}),
        ("workflow_ref", {"workflow_ref": "deploy@4"}),
        ("source", {"source": {"kind": "builtin", "id": "deploy", "revision": 4}}),
        ("definition_digest", {"definition": {"name": "deploy", "version": 4}}),
        ("input", {"input": {"target": "staging"}}),
        ("launch_options", {"launch_options": {}}),
        ("origin_session_id", {"origin_session_id": "session-2"}),
        ("parent_run_id", {"parent_run_id": "another-parent"}),
    ],
)
def test_prepare_conflict_names_exactly_the_differing_field(
    ledger: fp.Ledger, target: str, field: str, change: dict[str, Any]
) -> None:
    # A typed conflict naming the field; nothing mutated.
    ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    before = (counts(target), ledger.get_run("run-1"), ledger.lease("run-1"))
    with pytest.raises(fp.PreparationConflict) as err:
        ledger.prepare_or_adopt("run-1", **queued(**change), lease_ms=5000)
    assert err.value.fields == [field]
    assert err.value.run_id == "run-1"
    assert (counts(target), ledger.get_run("run-1"), ledger.lease("run-1")) == before


def test_prepare_conflict_lists_every_differing_field(ledger: fp.Ledger) -> None:
    ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    with pytest.raises(fp.PreparationConflict) as err:
        ledger.prepare_or_adopt(
            "run-1", **queued(input=None, workflow_name="x", runner_id="host-z"), lease_ms=5000
        )
    assert err.value.fields == ["workflow_name", "input"]  # runner_id is not compared


def test_prepare_compares_canonical_json_not_key_order(ledger: fp.Ledger) -> None:
    ledger.prepare_or_adopt("run-1", **queued(input={"a": 1, "b": [1.0, 2]}), lease_ms=5000)
    again = ledger.prepare_or_adopt("run-1", **queued(input={"b": [1, 2.0], "a": 1}), lease_ms=5000)
    assert again.state == "adopted"


def test_prepare_refuses_to_adopt_a_terminal_run(ledger: fp.Ledger) -> None:
    # Adopting a finished run is an error, not a silent success: the caller would dispatch
    # work for a run that can no longer take it.
    first = ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    assert first.claim is not None
    ledger.set_status("run-1", "cancelled", claim=first.claim)
    with pytest.raises(fp.RunNotActive) as err:
        ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    assert err.value.status == "cancelled"


def test_prepare_with_a_bad_digest_writes_nothing(ledger: fp.Ledger, target: str) -> None:
    before = counts(target)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.prepare_or_adopt(
            "run-1", **queued(definition_digest="sha256:" + "0" * 64), lease_ms=5000
        )
    assert err.value.argument == "definition_digest"
    assert counts(target) == before


def test_prepare_or_adopt_validates_lease_and_token(ledger: fp.Ledger, target: str) -> None:
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.prepare_or_adopt("run-1", **queued(), lease_ms=0)
    assert err.value.argument == "lease_ms"
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.prepare_or_adopt("run-1", **queued(), lease_ms=10, claim_token="abc")
    assert err.value.argument == "claim_token"
    assert counts(target) == (0, 0, 0, 0)

"""The run queue, claims and fencing on every write (DESIGN §1.3, §3, §4 "Queue and leases";
issue: "Run queue, claims and fencing"). Ports PRIOR_ART part B scenarios (PW-xx) that fit §8,
and turns the part C weaknesses (C1.x, C3.1, C6.2) into tests that fail on the old behaviour.
Expiry is driven by the injected clock, never by sleeping."""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, pg_connect, pg_schema, raw_db

DEFINITION = {"name": "deploy", "steps": [{"id": "build"}, {"id": "ship"}], "version": 3}


def queued(run_id: str = "run-1", **overrides: Any) -> dict[str, Any]:
    """reserve_run keywords, with the digest computed the way a caller should."""
    definition = overrides.pop("definition", DEFINITION)
    kw: dict[str, Any] = {
        "workflow_name": "deploy",
        "workflow_ref": "deploy@3",
        "source": {"kind": "builtin", "id": "deploy", "revision": 3},
        "definition_digest": fp.digest(definition),
        "definition": definition,
        "input": {"target": "prod"},
        "launch_options": {"max_parallel": 8},
        "runner_id": "host-a",
        "origin_session_id": "session-1",
    }
    kw.update(overrides)
    return kw


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(target: str) -> str:
    """The ledger's target on each backend (conftest `target`: a SQLite file or a fresh
    PostgreSQL schema): every claim and fencing test runs on both."""
    return target


@pytest.fixture
def ledger(db: str, clock: FakeClock) -> Any:
    with fp.Ledger.open(str(db), clock=clock) as ledger:
        yield ledger


def counts(db: str) -> tuple[int, int, int, int]:
    """(runs, events, attempts, blobs): what 'nothing written' is checked against."""
    tables = ("runs", "events", "attempts", "blobs")
    if db.startswith("postgresql://"):
        with pg_connect(db) as conn:
            return tuple(  # type: ignore[return-value]
                conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables
            )
    # Closed explicitly: a second SQLite library in this process must not keep the file open
    # (README "Concurrency": POSIX locks are per process).
    with raw_db(db) as c:
        return tuple(  # type: ignore[return-value]
            c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables
        )


def started(ledger: fp.Ledger, run_id: str = "run-1", runner: str = "host-a") -> fp.Claim:
    """The controller's path to dispatch (DESIGN §8): reserve, claim, set active."""
    ledger.reserve_run(run_id, **queued(run_id))
    claim = ledger.claim(run_id, runner, lease_ms=10_000)
    assert claim is not None
    ledger.set_status(run_id, "active", claim=claim)
    return claim


# ------------------------------------------------------------------ reserve_run


def test_reserve_run_queues_with_an_unowned_lease(ledger: fp.Ledger, db: str) -> None:
    # PW-01
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


def test_definition_digest_is_recomputed_not_trusted(ledger: fp.Ledger, db: str) -> None:
    # C3.1(a): a caller-supplied digest that does not match the definition is refused.
    before = counts(db)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.reserve_run("run-1", **queued(definition_digest="sha256:" + "0" * 64))
    assert err.value.argument == "definition_digest"
    assert counts(db) == before
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
    ledger: fp.Ledger, db: str, overrides: dict[str, Any], argument: str
) -> None:
    overrides = dict(overrides)  # the parameter is shared by both backends' runs
    run_id = overrides.pop("run_id", "run-1")
    before = counts(db)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.reserve_run(run_id, **queued(**overrides))
    assert err.value.argument == argument
    assert counts(db) == before


def test_reserve_run_twice_is_refused(ledger: fp.Ledger, db: str) -> None:
    # PW-06: a duplicate id.
    ledger.reserve_run("run-1", **queued())
    before = counts(db)
    with pytest.raises(fp.InvalidArgument, match="already reserved") as err:
        ledger.reserve_run("run-1", **queued())
    assert err.value.argument == "run_id"
    assert counts(db) == before


# ------------------------------------------------------------------ continuations


def parked(ledger: fp.Ledger, run_id: str = "parent") -> fp.Claim:
    claim = started(ledger, run_id)
    ledger.set_status(run_id, "parked", claim=claim)
    ledger.release(claim)
    return claim


def test_continuation_completes_a_parked_parent(ledger: fp.Ledger) -> None:
    # PW-14 (first half)
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


def test_second_continuation_is_refused(ledger: fp.Ledger, db: str) -> None:
    # PW-14 (second half), and C6.2: the reason says "already has a continuation", not the
    # status, and a merely completed parent gets a different reason.
    parked(ledger)
    ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    before = counts(db)
    with pytest.raises(fp.ContinuationRefused) as err:
        ledger.reserve_run("again", **queued("again", parent_run_id="parent"))
    assert err.value.parent_run_id == "parent"
    assert "already has a continuation" in err.value.reason
    assert counts(db) == before
    assert ledger.get_run("again") is None


@pytest.mark.parametrize("status", ["active", "queued", "completed"])
def test_continuation_of_a_parent_that_is_not_parked_is_refused(
    ledger: fp.Ledger, db: str, status: str
) -> None:
    if status == "queued":
        ledger.reserve_run("parent", **queued("parent"))
    else:
        claim = started(ledger, "parent")
        if status == "completed":
            ledger.set_status("parent", "completed", claim=claim)
    before = counts(db)
    with pytest.raises(fp.ContinuationRefused) as err:
        ledger.reserve_run("next", **queued("next", parent_run_id="parent"))
    assert status in err.value.reason
    assert counts(db) == before
    parent = ledger.get_run("parent")
    assert parent is not None
    assert parent.status == status


def test_continuation_from_another_session_is_refused(ledger: fp.Ledger, db: str) -> None:
    parked(ledger)
    before = counts(db)
    with pytest.raises(fp.ContinuationRefused, match="another session"):
        ledger.reserve_run(
            "next", **queued("next", parent_run_id="parent", origin_session_id="session-2")
        )
    assert counts(db) == before


def test_continuation_of_a_missing_parent_is_refused(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.ContinuationRefused, match="does not exist"):
        ledger.reserve_run("next", **queued("next", parent_run_id="ghost"))
    assert ledger.get_run("next") is None


def test_parked_parent_with_a_live_owner_blocks_until_expiry(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    # C6.2: an owner that is still live blocks the continuation; an expired, never-released
    # owner does not block it forever (pi required a NULL owner).
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


def test_prepare_claims_then_adopts_without_writing(ledger: fp.Ledger, db: str) -> None:
    # PW-02: the winner claims at generation 1; the loser adopts and changes nothing at all.
    first = ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000, claim_token="w" * 40)
    assert first.state == "claimed"
    assert first.claim is not None
    assert first.claim.generation == 1
    assert first.claim.token == "w" * 40
    assert first.run.status == "starting"
    assert [e.type for e in ledger.events("run-1")] == ["run.queued", "lease.claimed"]
    before = (counts(db), ledger.get_run("run-1"), ledger.lease("run-1"))
    second = ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000, claim_token="l" * 40)
    assert second.state == "adopted"
    assert second.claim is None
    assert second.run == first.run
    assert (counts(db), ledger.get_run("run-1"), ledger.lease("run-1")) == before
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
    ledger: fp.Ledger, db: str, field: str, change: dict[str, Any]
) -> None:
    # PW-03, C3.1(d): a typed conflict naming the field; nothing mutated.
    ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    before = (counts(db), ledger.get_run("run-1"), ledger.lease("run-1"))
    with pytest.raises(fp.PreparationConflict) as err:
        ledger.prepare_or_adopt("run-1", **queued(**change), lease_ms=5000)
    assert err.value.fields == [field]
    assert err.value.run_id == "run-1"
    assert (counts(db), ledger.get_run("run-1"), ledger.lease("run-1")) == before


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
    # C3.1(c): adoption of a finished run is an error, not a silent success.
    first = ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    assert first.claim is not None
    ledger.set_status("run-1", "cancelled", claim=first.claim)
    with pytest.raises(fp.RunNotActive) as err:
        ledger.prepare_or_adopt("run-1", **queued(), lease_ms=5000)
    assert err.value.status == "cancelled"


def test_prepare_with_a_bad_digest_writes_nothing(ledger: fp.Ledger, db: str) -> None:
    before = counts(db)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.prepare_or_adopt(
            "run-1", **queued(definition_digest="sha256:" + "0" * 64), lease_ms=5000
        )
    assert err.value.argument == "definition_digest"
    assert counts(db) == before


# ------------------------------------------------------------------ claim


def test_claim_takes_generation_one_and_moves_queued_to_starting(ledger: fp.Ledger) -> None:
    # PW-09
    ledger.reserve_run("run-1", **queued())
    claim = ledger.claim("run-1", "session-9", lease_ms=30_000)
    assert claim is not None
    assert claim.generation == 1
    assert claim.owner_id == "session-9"
    assert claim.token.startswith("fpt_")
    assert len(claim.token) == 68
    run = ledger.get_run("run-1")
    assert run is not None
    assert run.status == "starting"
    lease = ledger.lease("run-1")
    assert (lease.generation, lease.owner_id, lease.owner_type) == (1, "session-9", "session")
    assert lease.expires_at == claim.expires_at
    event = ledger.events("run-1")[-1]
    assert (event.type, event.generation, event.actor_id) == ("lease.claimed", 1, "session-9")
    assert event.payload["generation"] == 1


def test_owner_type_follows_the_runner_id(ledger: fp.Ledger) -> None:
    ledger.reserve_run("run-1", **queued())
    assert ledger.claim("run-1", "host-7", lease_ms=100) is not None
    assert ledger.lease("run-1").owner_type == "host"


def test_claim_is_refused_while_another_owner_is_live(
    ledger: fp.Ledger, clock: FakeClock, db: str
) -> None:
    ledger.reserve_run("run-1", **queued())
    first = ledger.claim("run-1", "host-a", lease_ms=1000)
    assert first is not None
    before = counts(db)
    assert ledger.claim("run-1", "host-b", lease_ms=1000) is None
    assert counts(db) == before
    clock.advance(999)
    assert ledger.claim("run-1", "host-b", lease_ms=1000) is None
    clock.advance(1)  # expiry is judged with the ledger's clock: expires_at <= now is expired
    second = ledger.claim("run-1", "host-b", lease_ms=1000)
    assert second is not None
    assert second.generation == 2


def test_takeover_fences_the_old_owner_everywhere(ledger: fp.Ledger, clock: FakeClock) -> None:
    # PW-13, C7 "stale writer after takeover": every fenced write of the old owner is refused
    # with LeaseLost naming both generations; the new holder succeeds.
    old = started(ledger)
    reservation = ledger.reserve_attempt("run-1", "u1", step_id="s", claim=old)
    assert reservation.lease_generation == 1
    clock.advance(10_000)
    new = ledger.claim("run-1", "host-b", lease_ms=10_000)
    assert new is not None
    assert new.generation == 2
    stale_writes = [
        lambda: ledger.heartbeat(old, lease_ms=1000),
        lambda: ledger.release(old),
        lambda: ledger.set_status("run-1", "blocked", claim=old),
        lambda: ledger.reserve_attempt("run-1", "u2", step_id="s", claim=old),
        lambda: ledger.reserve_attempts("run-1", [{"unit_id": "u3", "step_id": "s"}], claim=old),
        lambda: ledger.finish_attempt(
            "run-1", "u1", 1, reservation.dispatch_id, status="completed", claim=old
        ),
        lambda: ledger.finish_attempts(
            [
                {
                    "run_id": "run-1",
                    "unit_id": "u1",
                    "attempt": 1,
                    "dispatch_id": reservation.dispatch_id,
                    "status": "failed",
                }
            ],
            claim=old,
        ),
        lambda: ledger.set_outputs("run-1", {"x": 1}, claim=old),
    ]
    for write in stale_writes:
        revision = ledger.get_run("run-1").revision  # type: ignore[union-attr]
        with pytest.raises(fp.LeaseLost) as err:
            write()
        assert (err.value.expected_generation, err.value.actual_generation) == (1, 2)
        assert ledger.get_run("run-1").revision == revision  # type: ignore[union-attr]
    assert ledger.unit("run-1", "u1").status == "running"  # type: ignore[union-attr]
    assert ledger.unit("run-1", "u2") is None
    assert ledger.get_run("run-1").outputs is None  # type: ignore[union-attr]
    # The new holder reclaims the in-flight attempt in place and finishes it.
    again = ledger.reserve_attempt("run-1", "u1", step_id="s", claim=new)
    assert (again.kind, again.dispatch_id, again.lease_generation) == (
        "reclaimed", reservation.dispatch_id, 2,
    )  # fmt: skip
    assert ledger.finish_attempt(
        "run-1", "u1", 1, reservation.dispatch_id, status="completed", claim=new
    )


def test_an_expired_claim_cannot_write_even_if_nobody_took_over(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    # PW-21 / pi renew semantics: expiry alone fences; the holder must claim again.
    claim = started(ledger)
    clock.advance(10_000)
    with pytest.raises(fp.LeaseLost):
        ledger.heartbeat(claim, lease_ms=10_000)
    with pytest.raises(fp.LeaseLost):
        ledger.set_status("run-1", "failed", claim=claim)
    again = ledger.claim("run-1", "host-a", lease_ms=10_000)
    assert again is not None
    assert again.generation == 2


def test_reclaiming_your_own_live_lease_fences_your_old_token(ledger: fp.Ledger) -> None:
    # C1.2: two processes sharing a runner id cannot both keep writing; DESIGN §4 documents
    # the new generation, and the old token (the other process) is refused from then on.
    first = started(ledger)
    second = ledger.claim("run-1", "host-a", lease_ms=10_000)
    assert second is not None
    assert second.generation == 2
    with pytest.raises(fp.LeaseLost):
        ledger.reserve_attempt("run-1", "u1", step_id="s", claim=first)
    ledger.reserve_attempt("run-1", "u1", step_id="s", claim=second)


def test_a_reused_token_does_not_revive_an_old_generation(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    # C1.1: pi verified only the token hash, so a caller reusing a token across claims passed
    # as the newer generation. The fence checks the generation too.
    ledger.reserve_run("run-1", **queued())
    token = "t" * 40
    old = ledger.claim("run-1", "host-a", lease_ms=1000, token=token)
    assert old is not None
    clock.advance(1000)
    new = ledger.claim("run-1", "host-a", lease_ms=1000, token=token)
    assert new is not None
    assert new.generation == 2
    with pytest.raises(fp.LeaseLost):
        ledger.heartbeat(old, lease_ms=1000)
    ledger.heartbeat(new, lease_ms=1000)


def test_claim_of_a_terminal_run_is_none(ledger: fp.Ledger, db: str) -> None:
    claim = started(ledger)
    ledger.set_status("run-1", "completed", claim=claim)
    before = counts(db)
    assert ledger.claim("run-1", "host-b", lease_ms=1000) is None
    assert counts(db) == before


def test_claim_works_on_runs_made_by_start_run(ledger: fp.Ledger) -> None:
    ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="orch", force=True)
    assert ledger.lease("orch").generation == 0
    claim = ledger.claim("orch", "host-a", lease_ms=1000)
    assert claim is not None
    assert claim.generation == 1
    run = ledger.get_run("orch")
    assert run is not None
    assert run.status == "active"
    ledger.complete_step("orch", "s", claim=claim)


def test_claim_of_a_missing_run_is_run_not_found(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.RunNotFound):
        ledger.claim("ghost", "host-a", lease_ms=1000)
    with pytest.raises(fp.RunNotFound):
        ledger.lease("ghost")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"lease_ms": 0}, "lease_ms"),
        ({"lease_ms": -5}, "lease_ms"),
        ({"lease_ms": True}, "lease_ms"),
        ({"lease_ms": 1.5}, "lease_ms"),
        ({"lease_ms": 86_400_001}, "lease_ms"),
        ({"lease_ms": 1000, "token": "short"}, "token"),
        ({"lease_ms": 1000, "token": "x" * 39 + " "}, "token"),
        ({"lease_ms": 1000, "runner_id": ""}, "runner_id"),
    ],
)
def test_claim_bad_arguments(
    ledger: fp.Ledger, db: str, kwargs: dict[str, Any], argument: str
) -> None:
    ledger.reserve_run("run-1", **queued())
    kwargs = dict(kwargs)  # the parameter is shared by both backends' runs
    runner = kwargs.pop("runner_id", "host-a")
    before = counts(db)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.claim("run-1", runner, **kwargs)
    assert err.value.argument == argument
    assert counts(db) == before
    assert ledger.lease("run-1").generation == 0


def test_prepare_or_adopt_validates_lease_and_token(ledger: fp.Ledger, db: str) -> None:
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.prepare_or_adopt("run-1", **queued(), lease_ms=0)
    assert err.value.argument == "lease_ms"
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.prepare_or_adopt("run-1", **queued(), lease_ms=10, claim_token="abc")
    assert err.value.argument == "claim_token"
    assert counts(db) == (0, 0, 0, 0)


def test_a_claim_argument_must_be_a_claim(ledger: fp.Ledger) -> None:
    started(ledger)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.heartbeat("not a claim", lease_ms=10)  # type: ignore[arg-type]
    assert err.value.argument == "claim"


# ------------------------------------------------------------------ heartbeat and release


def test_heartbeat_extends_the_lease_without_an_event(ledger: fp.Ledger, clock: FakeClock) -> None:
    claim = started(ledger)
    events = len(ledger.events("run-1"))
    clock.advance(9000)
    renewed = ledger.heartbeat(claim, lease_ms=10_000)
    assert renewed.generation == claim.generation
    assert renewed.token == claim.token
    assert fp.models.to_ms(renewed.expires_at) == clock.now + 10_000
    lease = ledger.lease("run-1")
    assert lease.heartbeat_at is not None
    assert fp.models.to_ms(lease.heartbeat_at) == clock.now
    assert len(ledger.events("run-1")) == events
    clock.advance(9000)  # past the first expiry, inside the renewed one
    ledger.set_status("run-1", "blocked", claim=claim)


def test_release_clears_the_owner_and_keeps_the_generation(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    claim = started(ledger)
    ledger.release(claim)
    lease = ledger.lease("run-1")
    assert (lease.generation, lease.owner_id, lease.expires_at) == (1, None, None)
    assert ledger.events("run-1")[-1].type == "lease.released"
    with pytest.raises(fp.LeaseLost):
        ledger.release(claim)  # twice: the second is stale (PW-16)
    with pytest.raises(fp.LeaseLost):
        ledger.reserve_attempt("run-1", "u", step_id="s", claim=claim)
    other = ledger.claim("run-1", "host-b", lease_ms=1000)  # free at once, no expiry wait
    assert other is not None
    assert other.generation == 2


# ------------------------------------------------------------------ set_status


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (["active", "blocked", "active", "parked", "completed"], True),
        (["active", "completed"], True),
        (["active", "failed"], True),
        (["cancelled"], True),
        (["active", "blocked", "cancelled"], True),
        (["queued"], False),
        (["completed"], False),
        (["active", "starting"], False),
        (["active", "parked", "active"], False),
        (["active", "active"], False),
    ],
)
def test_set_status_follows_the_lifecycle(
    ledger: fp.Ledger, db: str, path: list[str], allowed: bool
) -> None:
    ledger.reserve_run("run-1", **queued())
    claim = ledger.claim("run-1", "host-a", lease_ms=60_000)
    assert claim is not None
    *ok, last = path
    for status in ok:
        ledger.set_status("run-1", status, claim=claim)
    before = ledger.get_run("run-1")
    assert before is not None
    if allowed:
        run = ledger.set_status("run-1", last, claim=claim)
        assert run.status == last
        assert run.revision == before.revision + 1
        assert (run.completed_at is not None) == (last in ("completed", "failed", "cancelled"))
        event = ledger.events("run-1")[-1]
        assert (event.type, event.payload["from"], event.payload["to"]) == (
            "run.status", before.status, last,
        )  # fmt: skip
        assert event.generation == 1
    else:
        with pytest.raises(fp.InvalidArgument) as err:
            ledger.set_status("run-1", last, claim=claim)
        assert err.value.argument == "status"
        assert before.status in str(err.value)
        assert last in str(err.value)
        assert ledger.get_run("run-1") == before


def test_set_status_unknown_status(ledger: fp.Ledger) -> None:
    claim = started(ledger)
    with pytest.raises(fp.InvalidArgument, match="must be one of"):
        ledger.set_status("run-1", "running", claim=claim)


def test_set_status_cannot_break_the_scope_guard(ledger: fp.Ledger) -> None:
    # A queued run has no scope, so it never trips the guard; blocked -> active on a guarded
    # start_run run goes through the same transition and keeps the guard.
    ledger.start_run("wf", scope_key="s1", steps=[{"id": "a"}], run_id="one")
    claim = ledger.claim("one", "host-a", lease_ms=60_000)
    assert claim is not None
    ledger.set_status("one", "blocked", claim=claim)
    ledger.start_run("wf", scope_key="s1", steps=[{"id": "a"}], run_id="two")
    with pytest.raises(fp.ActiveRunExists) as err:
        ledger.set_status("one", "active", claim=claim)
    assert err.value.occupant_run_id == "two"


# ------------------------------------------------------------------ fenced orchestrator writes


def test_complete_step_and_set_outputs_are_fenced(ledger: fp.Ledger, clock: FakeClock) -> None:
    ledger.start_run("wf", scope_key=None, steps=[{"id": "a"}, {"id": "b"}], run_id="o", force=True)
    claim = ledger.claim("o", "host-a", lease_ms=1000)
    assert claim is not None
    ledger.complete_step("o", "a", claim=claim)
    ledger.set_outputs("o", {"ok": True}, claim=claim)
    clock.advance(1000)
    with pytest.raises(fp.LeaseLost):
        ledger.complete_step("o", "b", claim=claim)
    run = ledger.get_run("o")
    assert run is not None
    assert run.current_step_id == "b"
    assert run.outputs == {"ok": True}


def test_a_claim_for_another_run_is_refused(ledger: fp.Ledger) -> None:
    claim = started(ledger, "run-1")
    started(ledger, "run-2")
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.reserve_attempt("run-2", "u", step_id="s", claim=claim)
    assert err.value.argument == "claim"


# ------------------------------------------------------------------ leases


def test_expired_leases_lists_owned_expired_leases_on_live_runs(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    for run_id, lease_ms in (("a", 1000), ("b", 5000), ("c", 1000), ("d", 1000)):
        ledger.reserve_run(run_id, **queued(run_id))
        claim = ledger.claim(run_id, f"host-{run_id}", lease_ms=lease_ms)
        assert claim is not None
        if run_id == "c":
            ledger.set_status(run_id, "cancelled", claim=claim)  # terminal: not listed
        if run_id == "d":
            ledger.release(claim)  # unowned: not listed
    ledger.reserve_run("e", **queued("e"))  # never claimed: not listed
    assert ledger.expired_leases() == []
    clock.advance(1000)
    [a] = ledger.expired_leases()
    assert (a.run_id, a.owner_id, a.generation) == ("a", "host-a", 1)
    clock.advance(4000)
    assert [lease.run_id for lease in ledger.expired_leases()] == ["a", "b"]


def claim_many(ledger: fp.Ledger) -> list[str]:
    """20 claims with heartbeats and one prepare: the tokens handed out."""
    tokens = []
    for i in range(20):
        ledger.reserve_run(f"r{i}", **queued(f"r{i}"))
        claim = ledger.claim(f"r{i}", "host-a", lease_ms=1000)
        assert claim is not None
        ledger.heartbeat(claim, lease_ms=2000)
        tokens.append(claim.token)
    prep = ledger.prepare_or_adopt("p", **queued("p"), lease_ms=1000)
    assert prep.claim is not None
    tokens.append(prep.claim.token)
    return tokens


def test_the_token_never_reaches_postgresql(clock: FakeClock) -> None:
    """Every row of every table of the schema, as text: no token, only its SHA-256."""
    with pg_schema() as url:
        with fp.Ledger.open(url, clock=clock) as ledger:
            tokens = claim_many(ledger)
        with pg_connect(url) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema()"
                )
            ]
            assert "leases" in tables
            dump = "\n".join(
                str(row[0]) for t in tables for row in conn.execute(f"SELECT t::text FROM {t} t")
            )
    for token in tokens:
        assert token not in dump
        assert token[4:] not in dump
    assert hashlib.sha256(tokens[-1].encode()).hexdigest() in dump


def test_the_token_never_reaches_the_database_file(
    tmp_path: pathlib.Path, clock: FakeClock
) -> None:
    db = tmp_path / "ledger.db"
    with fp.Ledger.open(str(db), clock=clock) as ledger:
        tokens = claim_many(ledger)
        # Read while open (the -wal file holds the newest pages) and after close.
        raw_open = b"".join(p.read_bytes() for p in db.parent.iterdir() if p.is_file())
    raw_closed = db.read_bytes()
    for token in tokens:
        for raw in (raw_open, raw_closed):
            assert token.encode() not in raw
            assert token[4:].encode() not in raw
    # The scan does see lease rows: the SHA-256 of the newest token is there.
    assert hashlib.sha256(tokens[-1].encode()).hexdigest().encode() in raw_closed

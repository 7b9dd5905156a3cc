"""Leases and the fence (``leases``): a claim takes the next generation by compare-and-set
and hands out a token of which only the SHA-256 is stored; heartbeat extends it, release gives
it up; every write made with ``claim=`` re-checks generation, token and expiry inside its own
transaction, so an owner that was taken over, released, re-claimed or merely expired writes
nothing. Expiry is driven by the injected clock, never by sleeping."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, counts, pg_connect, pg_schema, queued, started


@pytest.fixture
def ledger_target(target: str) -> str:
    """``nothing written`` is checked by counting rows behind the API's back (``counts``), so
    these tests run on the backends another connection can read: a SQLite file and
    PostgreSQL, not ``:memory:``."""
    return target


# ------------------------------------------------------------------ claim


def test_claim_takes_generation_one_and_moves_queued_to_starting(ledger: fp.Ledger) -> None:
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
    ledger: fp.Ledger, clock: FakeClock, target: str
) -> None:
    ledger.reserve_run("run-1", **queued())
    first = ledger.claim("run-1", "host-a", lease_ms=1000)
    assert first is not None
    before = counts(target)
    assert ledger.claim("run-1", "host-b", lease_ms=1000) is None
    assert counts(target) == before
    clock.advance(999)
    assert ledger.claim("run-1", "host-b", lease_ms=1000) is None
    clock.advance(1)  # expiry is judged with the ledger's clock: expires_at <= now is expired
    second = ledger.claim("run-1", "host-b", lease_ms=1000)
    assert second is not None
    assert second.generation == 2


def test_takeover_fences_the_old_owner_everywhere(ledger: fp.Ledger, clock: FakeClock) -> None:
    # A stale writer after a takeover: every fenced write of the old owner is refused with
    # LeaseLost naming both generations; the new holder succeeds.
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
    # Expiry alone fences, even with no new owner: the holder must claim again, so a paused
    # process cannot resume writing on a lease that lapsed while it slept.
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
    # Two processes sharing a runner id cannot both keep writing: re-claiming takes a new
    # generation, and the old token (the other process's) is refused from then on.
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
    # Were only the token's hash checked, a caller reusing a token across claims would pass as
    # the newer generation. The fence checks the generation too.
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


def test_claim_of_a_terminal_run_is_none(ledger: fp.Ledger, target: str) -> None:
    claim = started(ledger)
    ledger.set_status("run-1", "completed", claim=claim)
    before = counts(target)
    assert ledger.claim("run-1", "host-b", lease_ms=1000) is None
    assert counts(target) == before


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
    ledger: fp.Ledger, target: str, kwargs: dict[str, Any], argument: str
) -> None:
    ledger.reserve_run("run-1", **queued())
    kwargs = dict(kwargs)  # the parameter is shared by both backends' runs
    runner = kwargs.pop("runner_id", "host-a")
    before = counts(target)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.claim("run-1", runner, **kwargs)
    assert err.value.argument == argument
    assert counts(target) == before
    assert ledger.lease("run-1").generation == 0


def test_a_claim_argument_must_be_a_claim(ledger: fp.Ledger) -> None:
    started(ledger)
    with pytest.raises(fp.InvalidArgument) as err:
        ledger.heartbeat("not a claim", lease_ms=10)  # type: ignore[arg-type]
    assert err.value.argument == "claim"
    assert "must be the Claim returned by ledger.claim()" in str(err.value)
    # The None a claim() answers while another owner's lease is live, passed on unchecked.
    assert ledger.claim("run-1", "host-b", lease_ms=10_000) is None
    with pytest.raises(fp.InvalidArgument) as none:
        ledger.set_status("run-1", "blocked", claim=None)  # type: ignore[arg-type]
    assert none.value.argument == "claim"
    assert "claim() returns None while another owner's lease" in str(none.value)


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
        ledger.release(claim)  # twice: the second is stale
    with pytest.raises(fp.LeaseLost):
        ledger.reserve_attempt("run-1", "u", step_id="s", claim=claim)
    other = ledger.claim("run-1", "host-b", lease_ms=1000)  # free at once, no expiry wait
    assert other is not None
    assert other.generation == 2


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


# ------------------------------------------------------------------ expired leases


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


# ------------------------------------------------------------------ the token stays secret


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


def test_lease_lost_says_why(ledger: fp.Ledger, clock: FakeClock) -> None:
    """``LeaseLost.reason``: released, expired, superseded or a token that is not the claim's;
    the message says which and what to do, and nothing is written in any case."""
    ledger.reserve_run("run-1", **queued())
    first = ledger.claim("run-1", "host-a", lease_ms=1_000)
    assert first is not None
    ledger.release(first)
    revision = ledger.get_run("run-1").revision  # type: ignore[union-attr]
    with pytest.raises(fp.LeaseLost) as released:
        ledger.heartbeat(first, lease_ms=1_000)
    assert (released.value.reason, released.value.actual_generation) == ("released", 1)
    assert "was released" in str(released.value)
    second = ledger.claim("run-1", "host-a", lease_ms=1_000)
    assert second is not None
    clock.advance(1_001)
    with pytest.raises(fp.LeaseLost) as expired:
        ledger.set_outputs("run-1", {"late": True}, claim=second)
    assert (expired.value.reason, expired.value.actual_generation) == ("expired", 2)
    assert "expired" in str(expired.value)
    third = ledger.claim("run-1", "host-b", lease_ms=1_000)
    assert third is not None
    with pytest.raises(fp.LeaseLost) as superseded:
        ledger.heartbeat(second, lease_ms=1_000)
    assert (superseded.value.reason, superseded.value.actual_generation) == ("superseded", 3)
    assert "another claim took generation 3" in str(superseded.value)
    forged = dataclasses.replace(third, token="fpt_" + "0" * 64)
    with pytest.raises(fp.LeaseLost) as token:
        ledger.release(forged)
    assert (token.value.reason, token.value.actual_generation) == ("token", 3)
    # Only the claims themselves wrote (two claims and a release): none of the refused calls.
    events = [e.type for e in ledger.events("run-1") if e.revision > revision]
    assert events == ["lease.claimed", "lease.claimed"], events


def test_leases_of_a_page_of_runs_in_one_read(ledger: fp.Ledger) -> None:
    claim = started(ledger, "run-1")
    started(ledger, "run-2")
    ledger.reserve_run("run-3", **queued("run-3"))
    got = ledger.leases(run_ids=["run-3", "run-1", "nope"])
    assert [le.run_id for le in got] == ["run-1", "run-3"]
    assert (got[0].generation, got[0].owner_id) == (claim.generation, "host-a")
    assert (got[1].generation, got[1].owner_id) == (0, None)
    assert got[0] == ledger.lease("run-1")
    assert ledger.leases(run_ids=[]) == []
    with pytest.raises(fp.InvalidArgument) as many:
        ledger.leases(run_ids=[f"r{i}" for i in range(10_001)])
    assert many.value.argument == "run_ids"

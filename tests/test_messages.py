"""Messages to a run: ``send`` (anyone, idempotent by key, a ``message.sent`` event that wakes
``wait_events``), ``receive`` (the owner only, fenced by its claim, oldest first, each message
taken once) and ``messages`` (a paged read, taken ones too). Every test runs on each backend;
8 processes receive from one mailbox at once and never take a message twice, and 8 processes
sending the same keys make one message per key."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import fencepost as fp
from fencepost.aio import AsyncLedger
from tests.conftest import FakeClock, queued, started
from tests.processes import run_all


def sent_events(ledger: fp.Ledger, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in ledger.events(run_id) if e.type == "message.sent"]


def test_send_receive_and_read_back(ledger: fp.Ledger, clock: FakeClock) -> None:
    claim = started(ledger, "r")
    first = ledger.send("r", "approval", {"ok": True}, key="ticket-1")
    assert (first.seq, first.run_id, first.topic, first.key, first.payload) == (
        1, "r", "approval", "ticket-1", {"ok": True}
    )  # fmt: skip
    assert first.sent_at == fp.models.from_ms(clock.now)
    assert (first.consumed_at, first.consumed_generation) == (None, None)
    clock.advance(10)
    ledger.send("r", "result", [1, 2.5, "x"])
    ledger.send("r", "approval", {"ok": False})
    assert sent_events(ledger, "r") == [
        {"key": "ticket-1", "run_id": "r", "seq": 1, "topic": "approval"},
        {"run_id": "r", "seq": 2, "topic": "result"},
        {"run_id": "r", "seq": 3, "topic": "approval"},
    ]
    clock.advance(10)
    # Oldest first, one topic at a time, each taken once.
    got = ledger.receive("r", "approval", claim=claim, limit=10)
    assert [(m.seq, m.payload) for m in got] == [(1, {"ok": True}), (3, {"ok": False})]
    assert {m.consumed_at for m in got} == {fp.models.from_ms(clock.now)}
    assert {m.consumed_generation for m in got} == {claim.generation}
    assert ledger.receive("r", "approval", claim=claim) == []
    [result] = ledger.receive("r", "result", claim=claim)
    assert result.payload == [1, 2.5, "x"]
    # A receive writes no event; messages lists taken ones too, and pages.
    assert [e.type for e in ledger.events("r")][-3:] == ["message.sent"] * 3
    assert [m.seq for m in ledger.messages("r")] == [1, 2, 3]
    assert all(m.consumed_at is not None for m in ledger.messages("r"))
    assert [m.seq for m in ledger.messages("r", topic="approval")] == [1, 3]
    assert [m.seq for m in ledger.messages("r", after_seq=1, limit=1)] == [2]
    assert [m.seq for m in ledger.messages("r", topic="approval", after_seq=1)] == [3]
    assert ledger.messages("nobody") == []


def test_limit_takes_the_oldest_and_leaves_the_rest(ledger: fp.Ledger) -> None:
    claim = started(ledger, "r")
    for i in range(5):
        ledger.send("r", "t", i)
    assert [m.payload for m in ledger.receive("r", "t", claim=claim, limit=2)] == [0, 1]
    assert [m.payload for m in ledger.receive("r", "t", claim=claim, limit=2)] == [2, 3]
    assert [m.payload for m in ledger.receive("r", "t", claim=claim, limit=2)] == [4]
    waiting = [m.seq for m in ledger.messages("r") if m.consumed_at is None]
    assert waiting == []


def test_a_repeated_key_answers_the_first_message_and_writes_nothing(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    claim = started(ledger, "r")
    first = ledger.send("r", "t", {"v": 1}, key="k")
    events = ledger.events("r")
    clock.advance(100)
    again = ledger.send("r", "t", {"v": 2}, key="k")
    assert again == first
    assert ledger.events("r") == events
    # The key belongs to its topic: another topic's same key is a new message.
    other = ledger.send("r", "u", {"v": 3}, key="k")
    assert (other.seq, other.topic) == (2, "u")
    # Taken or not, the key still answers the first message (now marked taken).
    [taken] = ledger.receive("r", "t", claim=claim)
    assert ledger.send("r", "t", {"v": 4}, key="k").consumed_at == taken.consumed_at
    assert len(ledger.messages("r")) == 2


def test_unknown_and_ended_runs(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.RunNotFound):
        ledger.send("nope", "t", 1)
    with pytest.raises(fp.NotFound):
        ledger.send("nope", "t", 1, key="k")
    claim = started(ledger, "r")
    ledger.send("r", "t", 1, key="early")
    ledger.set_status("r", "completed", claim=claim)
    events = ledger.events("r")
    with pytest.raises(fp.RunNotActive) as ended:
        ledger.send("r", "t", 2)
    assert ended.value.status == "completed"
    # A sender retrying a key it sent before the end still gets its answer.
    assert ledger.send("r", "t", 3, key="early").payload == 1
    with pytest.raises((fp.RunNotActive, fp.LeaseLost)):
        ledger.receive("r", "t", claim=claim)
    assert ledger.events("r") == events
    assert [m.consumed_at for m in ledger.messages("r")] == [None]


def test_receive_under_a_stale_claim_is_refused_and_takes_nothing(
    target: str, clock: FakeClock
) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        old = started(ledger, "r")
        ledger.send("r", "t", "a")
        clock.advance(20_000)
        new = ledger.claim("r", "host-b", lease_ms=10_000)
        assert new is not None
        with pytest.raises(fp.LeaseLost):
            ledger.receive("r", "t", claim=old)
        assert ledger.messages("r")[0].consumed_at is None
        [m] = ledger.receive("r", "t", claim=new)
        assert m.consumed_generation == new.generation == old.generation + 1
        # A claim for another run is refused by name.
        started(ledger, "s")
        with pytest.raises(fp.InvalidArgument) as wrong:
            ledger.receive("s", "t", claim=new)
        assert wrong.value.argument == "claim"


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda lg, c: lg.send("r", "", 1), "topic"),
        (lambda lg, c: lg.send("r", "t\n", 1), "topic"),
        (lambda lg, c: lg.send("r", "t", 1, key=""), "key"),
        (lambda lg, c: lg.send("r", "t", {1, 2}), "payload"),
        (lambda lg, c: lg.send("r", "t", float("nan")), "payload"),
        (lambda lg, c: lg.send("bad id!", "t", 1), "run_id"),
        (lambda lg, c: lg.send("r", 5, 1), "topic"),
        (lambda lg, c: lg.receive("r", "t", claim=c, limit=0), "limit"),
        (lambda lg, c: lg.receive("r", "t", claim=None), "claim"),
        (lambda lg, c: lg.receive("r", "", claim=c), "topic"),
        (lambda lg, c: lg.messages("r", limit=10_001), "limit"),
        (lambda lg, c: lg.messages("r", topic=""), "topic"),
    ],
)
def test_bad_arguments_name_themselves_and_write_nothing(
    ledger: fp.Ledger, call: Any, argument: str
) -> None:
    claim = started(ledger, "r")
    ledger.send("r", "t", "waiting")
    events = ledger.events()
    with pytest.raises(fp.LedgerError) as refused:
        call(ledger, claim)
    assert getattr(refused.value, "argument", argument) == argument
    assert argument in str(refused.value)
    assert ledger.events() == events
    assert [m.consumed_at for m in ledger.messages("r")] == [None]


def test_a_send_wakes_wait_events(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        started(ledger, "r")
        after = ledger.events("r")[-1].seq
        woke: list[list[fp.Event]] = []

        def wait() -> None:
            woke.append(ledger.wait_events("r", after_seq=after, types=["message.sent"],
                                           timeout_s=10))  # fmt: skip

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        with fp.Ledger.open(target) as sender:
            sender.send("r", "approval", {"ok": True})
        waiter.join(10)
        assert time.monotonic() - t0 < 5
        [[event]] = woke
        assert event.payload == {"run_id": "r", "seq": 1, "topic": "approval"}


def _receive_all(i: int, barrier: Any, queue: Any, target: str, claim: fp.Claim) -> None:
    run_id = claim.run_id
    got: list[int] = []
    with fp.Ledger.open(target) as ledger:
        barrier.wait()
        while True:
            taken = ledger.receive(run_id, "work", claim=claim, limit=3)
            if not taken:
                break
            got.extend(m.payload for m in taken)
    queue.put((i, got))


def test_eight_receivers_never_take_one_message_twice(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        ledger.reserve_run("r", **queued("r"))
        claim = ledger.claim("r", "host-a", lease_ms=600_000)
        assert claim is not None
        for i in range(200):
            ledger.send("r", "work", i)
    args = [(target, claim)] * 8
    results = run_all(_receive_all, args)
    taken = [p for got in results for p in got]
    assert sorted(taken) == list(range(200))
    # Each receiver took its messages oldest first.
    assert all(got == sorted(got) for got in results)
    with fp.Ledger.open(target) as ledger:
        assert all(m.consumed_at is not None for m in ledger.messages("r", limit=1000))


def _send_keys(i: int, barrier: Any, queue: Any, target: str) -> None:
    seqs = []
    with fp.Ledger.open(target) as ledger:
        barrier.wait()
        for k in range(40):
            seqs.append(ledger.send("r", "t", {"from": i, "k": k}, key=f"k{k}").seq)
    queue.put((i, seqs))


def test_eight_senders_of_the_same_keys_make_one_message_per_key(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        ledger.reserve_run("r", **queued("r"))
    results = run_all(_send_keys, [(target,)] * 8)
    # Every sender got the same answer for a key: the one message that key made.
    assert all(seqs == results[0] for seqs in results)
    with fp.Ledger.open(target) as ledger:
        stored = ledger.messages("r", limit=1000)
        assert sorted(m.key or "" for m in stored) == sorted(f"k{k}" for k in range(40))
        assert [m.seq for m in stored] == list(range(1, 41))
        assert len(sent_events(ledger, "r")) == 40


def test_async_ledger(target: str) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(target) as ledger:
            await ledger.reserve_run("r", **queued("r"))
            claim = await ledger.claim("r", "host-a", lease_ms=10_000)
            assert claim is not None
            await ledger.send("r", "t", 1, key="a")
            await ledger.send("r", "t", 2)
            got = await ledger.receive("r", "t", claim=claim, limit=5)
            assert [m.payload for m in got] == [1, 2]
            assert len(await ledger.messages("r", topic="t")) == 2

    asyncio.run(main())

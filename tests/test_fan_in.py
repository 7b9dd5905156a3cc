"""Fan-in: when a child's end leaves its parent no live child, the parent gets one
``children.settled`` event in the same transaction, whichever path ended the child (a status
move under a claim, the last step completed, an abandon, a cascade), and again each time a new
child ends the same way; ``child_summary`` counts the children by status. Every test runs on
each backend, and 50 children ended at once by 8 processes settle their parent exactly once."""

from __future__ import annotations

import contextlib
import datetime as dt
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, raw_db
from tests.processes import held_by_script, run_all

STEPS = [{"id": "a"}, {"id": "b"}]


def child(ledger: fp.Ledger, parent: str, key: str) -> fp.Run:
    return ledger.publish_child_run(
        parent, parent_unit_id="fan", invocation_key=key, workflow_ref="child", steps=STEPS
    )


def settled(ledger: fp.Ledger, parent: str) -> list[dict[str, Any]]:
    return [e.payload for e in ledger.events(parent) if e.type == "children.settled"]


def test_the_last_child_to_end_settles_its_parent_by_any_path(
    ledger: fp.Ledger, clock: FakeClock
) -> None:
    parent = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS).run_id
    assert ledger.child_summary(parent) == fp.ChildSummary(total=0, by_status={}, settled=True)
    kids = [child(ledger, parent, k).run_id for k in ("x", "y", "z")]
    assert ledger.child_summary(parent) == fp.ChildSummary(
        total=3, by_status={"active": 3}, settled=False
    )
    # A claim moves x to failed; y completes its last step; z is abandoned, last.
    claim = ledger.claim(kids[0], "host-a", lease_ms=10_000)
    assert claim is not None
    ledger.set_status(kids[0], "failed", claim=claim)
    ledger.complete_step(kids[1], "a")
    ledger.complete_step(kids[1], "b")
    assert ledger.get_run(kids[1]).status == "completed"  # type: ignore[union-attr]
    assert settled(ledger, parent) == []
    clock.advance(5)
    ledger.abandon_run(kids[2])
    [event] = [e for e in ledger.events(parent) if e.type == "children.settled"]
    assert event.payload == {
        "by_status": {"cancelled": 1, "completed": 1, "failed": 1},
        "child_run_id": kids[2],
        "total": 3,
    }
    assert fp.models.to_ms(event.ts) == clock.now
    assert ledger.child_summary(parent) == fp.ChildSummary(
        total=3, by_status={"completed": 1, "failed": 1, "cancelled": 1}, settled=True
    )
    # The event is the parent's next revision, in the log's order.
    revisions = [e.revision for e in ledger.events(parent)]
    assert revisions == list(range(1, len(revisions) + 1))
    # A new child makes the parent live again; its end settles it again.
    late = child(ledger, parent, "late").run_id
    assert not ledger.child_summary(parent).settled
    ledger.abandon_run(late)
    assert [p["child_run_id"] for p in settled(ledger, parent)] == [kids[2], late]
    assert settled(ledger, parent)[-1]["by_status"] == {"cancelled": 2, "completed": 1, "failed": 1}
    with pytest.raises(fp.RunNotFound):
        ledger.child_summary("no-such-run")


def test_a_cascade_settles_the_parent_before_it_ends(ledger: fp.Ledger) -> None:
    parent = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS).run_id
    kids = [child(ledger, parent, k).run_id for k in ("a", "b")]
    grandchild = child(ledger, kids[0], "g").run_id
    assert ledger.abandon_run(parent, reason="stop")
    # Whether or not the parent is live: each parent whose children all ended hears it once.
    assert [p["total"] for p in settled(ledger, parent)] == [2]
    assert [p["child_run_id"] for p in settled(ledger, kids[0])] == [grandchild]
    types = [e.type for e in ledger.events(parent)]
    assert types.index("children.settled") < len(types) - 1  # then the parent's own end
    assert ledger.get_run(parent).status == "cancelled"  # type: ignore[union-attr]
    # A child ending again (it cannot: terminal) or a run with no parent writes nothing more.
    assert not ledger.abandon_run(kids[1])
    assert len(settled(ledger, parent)) == 1


def test_a_waiter_wakes_on_the_settled_event(target: str, clock: FakeClock) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        parent = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS).run_id
        kid = child(ledger, parent, "k").run_id
        after = ledger.events(parent)[-1].seq
        got: list[list[fp.Event]] = []

        def wait() -> None:
            with fp.Ledger.open(target, clock=clock) as other:
                got.append(
                    other.wait_events(
                        parent, after_seq=after, types=["children.settled"], timeout_s=20
                    )
                )

        waiter = threading.Thread(target=wait)
        waiter.start()
        ledger.abandon_run(kid)
        waiter.join(30)
    [[event]] = got
    assert event.payload["child_run_id"] == kid


def _end(i: int, barrier: Any, queue: Any, target: str, kids: list[str]) -> None:
    """End every child of this share but one, then, when every process is there, the last:
    the parent's last eight live children end at the same moment, one per process."""
    with fp.Ledger.open(target) as ledger:
        barrier.wait()
        ended = [ledger.abandon_run(k) for k in kids[:-1]]
        barrier.wait()
        ended.append(ledger.abandon_run(kids[-1]))
    queue.put((i, ended))


def test_fifty_children_ended_at_once_settle_their_parent_once(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        parent = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS).run_id
        kids = [child(ledger, parent, f"k{i:02}").run_id for i in range(50)]
    shares = [(target, kids[i::8]) for i in range(8)]
    results = run_all(_end, shares)
    assert sum(sum(r) for r in results) == 50
    with fp.Ledger.open(target) as ledger:
        [payload] = settled(ledger, parent)
        assert payload["total"] == 50
        assert payload["by_status"] == {"cancelled": 50}
        assert payload["child_run_id"] in kids
        assert ledger.child_summary(parent).settled


_END_HELD = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute(
    "UPDATE runs SET status = 'cancelled', completed_at = 1, updated_at = 1 WHERE run_id = ?",
    (sys.argv[2],),
)
print("ended", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""


@contextlib.contextmanager
def end_held_open(target: str, run_id: str) -> Iterator[None]:
    """End ``run_id`` in a transaction held open while the body runs, committed after it: on
    SQLite from another process (see ``held_by_script``), on PostgreSQL from a connection
    here."""
    end = "UPDATE runs SET status = 'cancelled', completed_at = 1, updated_at = 1 WHERE run_id = ?"
    if target.startswith("postgresql://"):
        with raw_db(target) as db:
            db.execute("BEGIN")
            db.execute(end, (run_id,))
            yield
            db.execute("COMMIT")
        return
    with held_by_script(_END_HELD, target, run_id, ready="ended"):
        yield


def test_two_ends_in_flight_together_settle_the_parent_once(target: str) -> None:
    """The race made certain: one child's end is held open in another connection while the
    ledger ends the other child. The second end must wait for the first (PostgreSQL: the
    parent's row lock; SQLite: the one writer) and then see it, or neither would see the other's
    end and the parent would never hear."""
    with fp.Ledger.open(target) as ledger:
        parent = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS).run_id
        first, second = (child(ledger, parent, k).run_id for k in ("first", "second"))
        ended: list[bool] = []
        with end_held_open(target, first):
            waiter = threading.Thread(target=lambda: ended.append(ledger.abandon_run(second)))
            waiter.start()
            time.sleep(0.5)
            assert not ended, "the second end waited for the first"
        waiter.join(30)
        assert ended == [True]
        [payload] = settled(ledger, parent)
        assert payload["child_run_id"] == second
        assert payload["by_status"] == {"cancelled": 2}


def test_a_restored_tree_writes_no_event(
    target: str, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    with fp.Ledger.open(target, clock=clock) as ledger:
        parent = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS).run_id
        child(ledger, parent, "k")
        assert ledger.abandon_run(parent)
        before = [(e.type, e.revision) for e in ledger.events(parent)]
        clock.advance(40 * 86_400_000)
        pruned = ledger.prune(older_than=dt.timedelta(days=30), archive=tmp_path / "a.jsonl")
        assert pruned.runs == 2
        assert ledger.restore(tmp_path / "a.jsonl") == 2
        assert [(e.type, e.revision) for e in ledger.events(parent)] == before
        assert len(settled(ledger, parent)) == 1

"""fencepost behind the function names of shared/reference/ref_ledger.py, so that
shared/reference/bench.py runs fencepost and the pure-Python reference through identical loops:

    cd ../shared/reference
    PYTHONPATH=../../main/benches python3 bench.py --impl ref_ledger --impl ref_adapter \\
        --only a,b,h,f,g

bench.py reserves attempts on run ids it never created; the adapter starts each such run once
(unscoped, ``force=True``) the first time it sees it, outside the timed loops' hot path after
that. ``claim_lease`` and ``prepare_or_adopt`` arrive with the queue and fencing issue.
"""

from __future__ import annotations

from typing import Any

import fencepost as fp

STEP = [{"id": "s"}]


class Conflict(Exception):
    """prepare_or_adopt: the run exists with a different definition/input/options."""


class Handle:
    __slots__ = ("known", "ledger")

    def __init__(self, ledger: fp.Ledger) -> None:
        self.ledger = ledger
        self.known: set[str] = set()

    def run(self, run_id: str) -> str:
        if run_id not in self.known:
            if self.ledger.get_run(run_id) is None:
                self.ledger.start_run(
                    "bench", scope_key=None, steps=STEP, run_id=run_id, force=True
                )
            self.known.add(run_id)
        return run_id


def connect(path: str, synchronous: str = "NORMAL") -> Handle:
    durability = "full" if synchronous.upper() == "FULL" else "normal"
    return Handle(fp.Ledger.open(path, durability=durability))


def close(h: Handle) -> None:
    h.ledger.close()


def canonical_digest(obj: Any) -> str:
    return fp.digest(obj)


def reserve_attempt(h: Handle, run_id: str, unit_id: str, holder: str) -> tuple[int, str, bool]:
    r = h.ledger.reserve_attempt(h.run(run_id), unit_id, step_id="s", holder=holder)
    return r.attempt, r.dispatch_id, r.kind == "reclaimed"


def reserve_attempts_batch(
    h: Handle, run_id: str, unit_ids: list[str], holder: str
) -> list[tuple[int, str, bool]]:
    units = [{"unit_id": u, "step_id": "s", "holder": holder} for u in unit_ids]
    return [
        (r.attempt, r.dispatch_id, r.kind == "reclaimed")
        for r in h.ledger.reserve_attempts(h.run(run_id), units)
    ]


def finish_attempt(
    h: Handle, run_id: str, unit_id: str, attempt: int, dispatch_id: str, status: str
) -> bool:
    return h.ledger.finish_attempt(run_id, unit_id, attempt, dispatch_id, status=status)

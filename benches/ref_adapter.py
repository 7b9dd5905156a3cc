"""fencepost behind the function names of shared/reference/ref_ledger.py, so that
shared/reference/bench.py runs fencepost and the pure-Python reference through identical loops:

    cd ../shared/reference
    PYTHONPATH=../../main/benches python3 bench.py --impl ref_ledger --impl ref_adapter \\
        --only a,b,h,f,g

bench.py reserves attempts on run ids it never created; the adapter starts each such run once
(unscoped, ``force=True``) the first time it sees it, outside the timed loops' hot path after
that. ``claim_lease`` does the same with a queued run (``reserve_run``) the first time it sees a
resource, so "claim_lease (new resource)" costs fencepost two transactions where the reference
inserts one lease row; the takeover and refusal rows compare like with like. ``now_ms`` is fed
to the ledger through its injectable clock.
"""

from __future__ import annotations

import time
from typing import Any

import fencepost as fp

STEP = [{"id": "s"}]


class Conflict(Exception):
    """prepare_or_adopt: the run exists with a different definition/input/options."""


class Handle:
    __slots__ = ("known", "ledger", "now_ms", "queued")

    def __init__(self, path: str, durability: str) -> None:
        self.now_ms: int | None = None
        self.ledger = fp.Ledger.open(path, durability=durability, clock=self._clock)  # type: ignore[arg-type]
        self.known: set[str] = set()
        self.queued: set[str] = set()

    def _clock(self) -> int:
        return time.time_ns() // 1_000_000 if self.now_ms is None else self.now_ms

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
    return Handle(path, durability)


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


DEFINITION_SOURCE = {"kind": "builtin", "id": "bench"}


def _queued(definition: Any, input: Any, options: Any) -> dict[str, Any]:
    return {
        "workflow_name": "bench",
        "workflow_ref": "bench",
        "source": DEFINITION_SOURCE,
        "definition_digest": fp.digest(definition),
        "definition": definition,
        "input": input,
        "launch_options": options,
        "runner_id": "host-bench",
        "origin_session_id": "bench-session",
    }


def claim_lease(
    h: Handle, resource_id: str, owner: str, lease_ms: int, now_ms: int
) -> tuple[int, str] | None:
    h.now_ms = now_ms
    try:
        if resource_id not in h.queued:
            if h.ledger.get_run(resource_id) is None:
                try:
                    h.ledger.reserve_run(resource_id, **_queued({}, None, {}))
                except fp.InvalidArgument:  # another process reserved it first
                    if h.ledger.get_run(resource_id) is None:
                        raise
            h.queued.add(resource_id)
        claim = h.ledger.claim(resource_id, owner, lease_ms=lease_ms)
    finally:
        h.now_ms = None
    return None if claim is None else (claim.generation, claim.token)


def prepare_or_adopt(h: Handle, run_id: str, definition: Any, input: Any, options: Any) -> str:
    try:
        prep = h.ledger.prepare_or_adopt(
            run_id, **_queued(definition, input, options), lease_ms=30_000
        )
    except fp.PreparationConflict as e:
        raise Conflict(str(e)) from e
    return prep.state

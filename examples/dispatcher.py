"""A fan-out dispatcher: hand N units of work to subprocess workers, record each result once.

What it shows:

- an orchestrator run with one step (``fan-out``), whose units are reserved in one
  transaction with ``reserve_attempts``: each reservation carries a ``dispatch_id``, the key
  a downstream system dedupes on;
- the work done by worker subprocesses (``asyncio.create_subprocess_exec``), at most
  ``--workers`` at a time, driven from one event loop through ``fencepost.aio.AsyncLedger``;
- each result recorded with ``finish_attempt``, a compare-and-set: a failed attempt is
  followed by a new one (attempt n+1, a new dispatch id), and a finish that comes back
  ``False`` changed nothing (the attempt was already finished);
- the step completed (``complete_step``) once every unit is, which completes the run;
- resuming: ``--run-id`` of a run an earlier dispatcher left half done skips the completed
  units and *reclaims* the still-running ones in place (same attempt, same dispatch id).

Run it (a SQLite file, or a ``postgresql://`` URL)::

    python examples/dispatcher.py --db dispatch.db --units 50 --workers 4
    python examples/dispatcher.py --db dispatch.db --units 50 --flaky 10   # some retries
    fencepost units RUN_ID --db dispatch.db                               # what it recorded

Progress goes to stderr; the last line on stdout is a JSON summary. The exit status is 0 when
every unit is completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import fencepost as fp
from fencepost.aio import AsyncLedger

STEP = "fan-out"

# The worker: a separate Python process that reads its job as JSON on stdin and writes its
# result as JSON on stdout. A real worker would call a model, run a build, send an email...
# and pass `dispatch_id` downstream as the idempotency key, so that a unit dispatched twice
# (at-least-once) has its effect once. `fail` makes it fail, to show a retry.
WORKER = """
import hashlib, json, sys
job = json.load(sys.stdin)
if job["fail"]:
    sys.exit("simulated failure of " + job["unit_id"] + " attempt " + str(job["attempt"]))
digest = hashlib.sha256(job["unit_id"].encode()).hexdigest()
json.dump({"unit_id": job["unit_id"], "sha256": digest}, sys.stdout)
"""


async def run_worker(job: dict[str, Any]) -> tuple[bool, Any]:
    """Run one worker process on ``job``: ``(True, result)`` or ``(False, why it failed)``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate(json.dumps(job).encode())
    finally:
        if proc.returncode is None:  # cancelled (Ctrl-C): leave no orphan worker behind
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        return False, err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
    try:
        return True, json.loads(out)
    except ValueError:
        return False, f"the worker's output is not JSON: {out[:100]!r}"


class Dispatcher:
    """Drives one run's units to completion with at most ``workers`` worker processes."""

    def __init__(self, aledger: AsyncLedger, run_id: str, flaky: int, max_attempts: int) -> None:
        self.aledger = aledger
        self.run_id = run_id
        self.flaky = flaky
        self.max_attempts = max_attempts
        self.completed = self.failed = self.retried = self.duplicates = 0

    async def work(self, queue: asyncio.Queue[fp.Reservation], total: int) -> None:
        """One worker slot: take reservations off the queue until it is empty."""
        while not queue.empty():
            await self.drive(queue.get_nowait())
            done = self.completed + self.failed + self.duplicates
            # Progress on stderr, so stdout stays a clean JSON summary for scripts.
            if done % max(1, total // 10) == 0 or done == total:
                print(f"{done}/{total} units ({self.retried} retries)", file=sys.stderr)

    async def drive(self, res: fp.Reservation) -> None:
        """Run a unit's attempts until one completes or ``max_attempts`` have failed."""
        number = int(res.unit_id.rsplit("-", 1)[1])
        while True:
            fail = self.flaky > 0 and number % self.flaky == 0 and res.attempt == 1
            job = {"unit_id": res.unit_id, "attempt": res.attempt, "dispatch_id": res.dispatch_id}
            ok, outcome = await run_worker({**job, "fail": fail})
            # The compare-and-set on (run, unit, attempt, dispatch_id, running). If this call
            # fails on a lost connection, it may have committed: calling it again is safe, and
            # False then means "already finished", never a second result.
            finished = await self.aledger.finish_attempt(
                self.run_id,
                res.unit_id,
                res.attempt,
                res.dispatch_id,
                status="completed" if ok else "failed",
                result=outcome if ok else None,
                failure_reason=None if ok else str(outcome),
            )
            if not finished:
                # Someone else finished this attempt first (another dispatcher resuming the
                # same run, or abandon_run cancelling it): our result is not recorded.
                self.duplicates += 1
                return
            if ok:
                self.completed += 1
                return
            if res.attempt >= self.max_attempts:
                self.failed += 1
                print(f"{res.unit_id} gave up: {outcome}", file=sys.stderr)
                return
            # The attempt is finished (failed), so this reserves attempt n+1 with a new
            # dispatch id; had it still been running, we would have got it back in place.
            self.retried += 1
            res = await self.aledger.reserve_attempt(self.run_id, res.unit_id, step_id=STEP)


async def dispatch(
    target: str, units: int, workers: int, run_id: str | None, flaky: int, max_attempts: int
) -> dict[str, Any]:
    started = time.monotonic()
    async with await AsyncLedger.open(target) as aledger:
        run = await aledger.get_run(run_id) if run_id else None
        if run is None:
            # start_run with an existing run_id is refused (InvalidArgument), not returned:
            # look the run up first to resume it.
            run = await aledger.start_run(
                "examples/dispatcher",
                # No scope guard (scope_key=None needs force=True): any number of these runs
                # may be active at once.
                scope_key=None,
                force=True,
                steps=[{"id": STEP, "title": "Fan out to worker processes"}],
                params={"units": units},
                run_id=run_id,
            )
        # Units an earlier dispatcher of this run completed are not dispatched again.
        completed = {u.unit_id for u in await aledger.units(run.run_id, status="completed")}
        todo = [f"unit-{i:05d}" for i in range(units) if f"unit-{i:05d}" not in completed]
        print(f"run {run.run_id}: {len(todo)} of {units} units to do", file=sys.stderr)

        # One transaction per chunk. A unit whose latest attempt is still running (its
        # dispatcher died) comes back kind="reclaimed": same attempt, same dispatch_id.
        queue: asyncio.Queue[fp.Reservation] = asyncio.Queue()
        reclaimed = 0
        for start in range(0, len(todo), 1000):
            chunk = [{"unit_id": u, "step_id": STEP} for u in todo[start : start + 1000]]
            for res in await aledger.reserve_attempts(run.run_id, chunk):
                reclaimed += res.kind == "reclaimed"
                queue.put_nowait(res)

        d = Dispatcher(aledger, run.run_id, flaky, max_attempts)
        await asyncio.gather(*(d.work(queue, len(todo)) for _ in range(workers)))

        counts = await aledger.unit_counts(run.run_id)
        if run.status == "active" and counts["completed"] == units:
            # The fan-out is done: completing its (last) step completes the run.
            run = await aledger.complete_step(run.run_id, STEP, summary=f"{units} units")
        accounting = await aledger.accounting(run.run_id)
        return {
            "run_id": run.run_id,
            "status": run.status,
            "units": units,
            "completed": counts["completed"],
            "attempts": accounting.total_attempts,  # the run's, by earlier dispatchers too
            "reclaimed": reclaimed,
            "retried": d.retried,
            "gave_up": d.failed,
            "duplicate_finishes": d.duplicates,
            "seconds": round(time.monotonic() - started, 2),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URL")
    p.add_argument("--units", type=int, default=50, help="units to fan out (default 50)")
    p.add_argument("--workers", type=int, default=4, help="worker processes at once (4)")
    p.add_argument("--run-id", help="resume this run (or start it under this id)")
    p.add_argument(
        "--flaky", type=int, default=0, metavar="K", help="fail the first attempt of every Kth unit"
    )
    p.add_argument("--max-attempts", type=int, default=3, help="attempts per unit (3)")
    args = p.parse_args()
    if args.units < 1 or args.workers < 1 or args.max_attempts < 1:
        p.error("--units, --workers and --max-attempts must be at least 1")
    summary = asyncio.run(
        dispatch(args.db, args.units, args.workers, args.run_id, args.flaky, args.max_attempts)
    )
    print(json.dumps(summary))
    return 0 if summary["completed"] == args.units else 1


if __name__ == "__main__":
    sys.exit(main())

"""A controller service: take queued runs under a lease, heartbeat while working, rescue the
runs of a controller that died.

What it shows:

- ``reserve_run`` queues runs (``--queue N``); ``claim_next(runner_id, lease_ms=...,
  rescue=True)`` is the scheduler: it hands each run to one controller only, and also takes
  over runs whose owner's lease ran out;
- every write passes the claim (``set_status(..., claim=claim)``), and the ledger checks it
  inside the write's own transaction;
- a heartbeat thread renews the lease every third of ``--lease-ms`` while the work runs;
- ``release`` gives the lease back when the run is done;
- when nothing is due, ``wait_events(types=["run.queued"], ...)`` waits for the next queued
  run (or until the soonest lease could be rescued) instead of polling.

Try a crash and a rescue (lease 1.5 s so it takes seconds)::

    python examples/controller.py --db ctl.db --queue 3 --lease-ms 1500 --crash-after 1 \\
        --runner-id ctl-a --stale-claim stale.json
    python examples/controller.py --db ctl.db --lease-ms 1500 --runner-id ctl-b \\
        --until-idle --stale-claim stale.json
    fencepost events --db ctl.db

The first controller completes one run, claims the next and dies (``os._exit``) holding it.
The second completes the run still queued, then, once the dead owner's lease has expired,
takes its run over (``Claim.taken_from == "ctl-a"``, generation + 1) and finishes it. With
``--stale-claim`` the dead controller leaves its claim in a file and the rescuer replays it,
as an owner that was only paused would on waking up: the ledger refuses it (``LeaseLost``).
Each process prints a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import signal
import socket
import sys
import threading
import time
import uuid
from types import TracebackType
from typing import Any

import fencepost as fp

DEFINITION = {"steps": [{"id": "work"}]}
CRASH_STATUS = 3  # the exit status of --crash-after: the test tells a crash from an error


class Heartbeat:
    """Renews a claim on a thread of its own, every third of the lease, while the work runs.

    At a third, one late or failed beat does not cost the claim. If the claim is lost (we
    were paused past the lease and someone took over), ``lost`` says so and the work must
    stop: every further write with the claim would be refused anyway."""

    def __init__(self, ledger: fp.Ledger, claim: fp.Claim, lease_ms: int) -> None:
        self.ledger, self.claim, self.lease_ms = ledger, claim, lease_ms
        self.lost: fp.LeaseLost | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3 / 1000):
            try:
                # A Ledger is thread-safe: this thread and the main one share it.
                self.claim = self.ledger.heartbeat(self.claim, lease_ms=self.lease_ms)
                self.beats += 1
            except fp.LeaseLost as e:
                self.lost = e
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()


class Controller:
    """The service: one run at a time, from claim to release (run several processes to
    work on several runs at once: claim_next never hands a run to two of them)."""

    def __init__(self, ledger: fp.Ledger, args: argparse.Namespace) -> None:
        self.ledger, self.args = ledger, args
        self.runner_id: str = args.runner_id
        self.queued: list[str] = []
        self.completed: list[str] = []
        self.rescued: list[dict[str, Any]] = []
        self.stale_write: dict[str, Any] | None = None
        self.heartbeats = 0

    def queue(self, n: int) -> None:
        """Queue ``n`` runs, as a client of the service would."""
        for run_id in (f"job-{uuid.uuid4().hex[:8]}" for _ in range(n)):
            self.ledger.reserve_run(
                run_id,
                workflow_name="examples/controller",
                workflow_ref="examples/controller@1",
                source={"kind": "example"},
                # The ledger recomputes the digest and refuses a mismatch.
                definition_digest=fp.digest(DEFINITION),
                definition=DEFINITION,
                runner_id=self.runner_id,
                origin_session_id=f"queued-by-{self.runner_id}",
            )
            self.queued.append(run_id)

    def serve(self) -> None:
        """The loop: claim, drive, repeat; wait for work when there is none."""
        # Start waiting from the newest event: the runs queued before now are found by
        # claim_next itself, so there is no history to page through.
        after = self.ledger.newest_event_seq()
        while True:
            claims = self.ledger.claim_next(self.runner_id, lease_ms=self.args.lease_ms)
            if claims:
                self.drive(claims[0])
                continue
            timeout = self.idle_wait()
            if timeout is None:
                return  # --until-idle, and nothing is queued or owned by anyone
            seen = self.ledger.wait_events(after_seq=after, timeout_s=timeout, types=["run.queued"])
            after = seen[-1].seq if seen else after

    def idle_wait(self) -> float | None:
        """How long to wait for a newly queued run before trying again: until the soonest
        moment something could become claimable without an event announcing it (a live lease
        running out, whose run may then need rescuing; a run queued for later coming due), at
        most 5 s. ``None`` with ``--until-idle`` when nothing is left to claim."""
        now = dt.datetime.now(dt.UTC)
        expiries = [lease.expires_at for lease in self.ledger.leases(owned_only=True)]
        wake = [at for at in expiries if at is not None and at > now]
        wake += [run.due_at for run in self.ledger.queued_runs(lane="later", limit=1)]
        overview = self.ledger.queue_overview(count_max=1)
        queued = overview.due + overview.keyed + overview.later
        if self.args.until_idle and not queued and not wake and not self.ledger.expired_leases():
            return None
        soonest = min(wake, default=now + dt.timedelta(seconds=5))
        return min(5.0, max(0.05, (soonest - now).total_seconds() + 0.05))

    def drive(self, claim: fp.Claim) -> None:
        run_id = claim.run_id
        if claim.taken_from is not None:
            # A rescue: the previous owner stopped heartbeating. From now on its writes are
            # refused; pick up from what the ledger says (here: just do the work again).
            print(f"{run_id}: taken over from {claim.taken_from}", file=sys.stderr)
            self.rescued.append(
                {"run_id": run_id, "taken_from": claim.taken_from, "generation": claim.generation}
            )
            self.replay_stale_claim(run_id)
        run = self.ledger.get_run(run_id)
        if run is not None and run.status == "starting":  # a rescued run is already active
            self.ledger.set_status(run_id, "active", claim=claim)
        with Heartbeat(self.ledger, claim, self.args.lease_ms) as hb:
            if len(self.completed) == self.args.crash_after:
                self.crash(hb)
            deadline = time.monotonic() + self.args.work_ms / 1000
            while time.monotonic() < deadline and hb.lost is None:
                time.sleep(0.05)  # the "work"; a real controller does its steps here
        self.heartbeats += hb.beats
        if hb.lost is not None:
            print(f"{run_id}: lease lost ({hb.lost.reason}), leaving it", file=sys.stderr)
            return
        try:
            self.ledger.set_status(run_id, "completed", claim=hb.claim)
            self.ledger.release(hb.claim)  # a completed run needs no lease; free it now
        except fp.LeaseLost as e:  # lost between the last beat and these writes
            print(f"{run_id}: lease lost ({e.reason}), nothing written", file=sys.stderr)
            return
        self.completed.append(run_id)
        print(f"{run_id}: completed", file=sys.stderr)

    def crash(self, hb: Heartbeat) -> None:
        """--crash-after: die now, holding the claim, as a killed process would."""
        time.sleep(self.args.work_ms / 2000)  # half way through the work
        if self.args.stale_claim:
            # Only for the demo: a claim's token is its secret; never write it anywhere.
            c = hb.claim
            fields = {"run_id": c.run_id, "generation": c.generation, "token": c.token}
            pathlib.Path(self.args.stale_claim).write_text(
                json.dumps({**fields, "owner_id": c.owner_id, "expires_at": str(c.expires_at)})
            )
        crashed = {"crashed_holding": hb.claim.run_id, "generation": hb.claim.generation}
        print(json.dumps({**self.summary(), **crashed}), flush=True)
        os._exit(CRASH_STATUS)  # no cleanup, no release: the lease must expire

    def replay_stale_claim(self, run_id: str) -> None:
        """--stale-claim: write with the dead owner's claim, as if it had only been paused
        and woke up now. The fence refuses it: the lease is at a newer generation."""
        path = pathlib.Path(self.args.stale_claim or "")
        if not self.args.stale_claim or not path.exists():
            return
        old = json.loads(path.read_text())
        if old["run_id"] != run_id:
            return
        stale = fp.Claim(
            run_id=run_id,
            generation=old["generation"],
            token=old["token"],
            owner_id=old["owner_id"],
            expires_at=dt.datetime.fromisoformat(old["expires_at"]),
        )
        try:
            self.ledger.set_status(run_id, "completed", claim=stale)
            self.stale_write = {"run_id": run_id, "refused": None}  # would be a fencing bug
        except fp.LeaseLost as e:
            print(f"{run_id}: the stale claim was refused: {e}", file=sys.stderr)
            self.stale_write = {"run_id": run_id, "refused": e.reason}

    def summary(self) -> dict[str, Any]:
        return {
            "runner_id": self.runner_id,
            "queued": self.queued,
            "completed": self.completed,
            "rescued": self.rescued,
            "stale_write": self.stale_write,
            "heartbeats": self.heartbeats,
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URL")
    p.add_argument("--runner-id", default=f"{socket.gethostname()}:{os.getpid()}")
    p.add_argument("--queue", type=int, default=0, metavar="N", help="queue N runs first")
    p.add_argument("--lease-ms", type=int, default=30_000, help="lease length (30000)")
    p.add_argument("--work-ms", type=int, default=1000, help="how long each run's work takes")
    p.add_argument("--crash-after", type=int, metavar="N", help="die holding the run after N")
    p.add_argument("--stale-claim", metavar="FILE", help="crash: write the claim; else replay it")
    p.add_argument("--until-idle", action="store_true", help="exit when nothing is left to do")
    args = p.parse_args()
    # SIGTERM (a service manager stopping us) is handled like Ctrl-C: unwind, close the ledger.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with fp.Ledger.open(args.db) as ledger:
        controller = Controller(ledger, args)
        controller.queue(args.queue)
        try:
            controller.serve()
        except KeyboardInterrupt:
            # A held claim is not released here: a released lease is never rescued (the
            # run would sit unowned in its status), while an expired one is taken over by
            # the next controller's claim_next, the same path as a crash.
            print("stopped", file=sys.stderr)
        print(json.dumps(controller.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

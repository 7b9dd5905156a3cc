"""``fencepost demo``: the three guarantees, live, on an embedded SQLite file.

An orchestrator starts a run whose ``fan-out`` step publishes one *shard* child run per worker
(units are dealt round-robin). Each worker process claims its shard under a short lease,
reserves attempts in batches, "works" a moment, finishes them and heartbeats. One worker is
``kill -9``ed mid-batch: its lease blocks everyone until it expires, then the first worker
with nothing left to do claims that shard at the next generation and reclaims the in-flight
attempts *in place* (same dispatch ids). The demo then replays the dead worker's old claim —
a stale writer — and shows every write refused by the fence, and workers send a few duplicate
finishes, shown ignored. The report's invariants are read back from the database.

Per-worker child runs (rather than one run shared by all) show the guarantees best: a lease
has exactly one owner, so parallel workers need one leased run each, and the takeover of a
dead worker's shard is exactly the controller's path (claim after expiry, generation + 1).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any, TextIO

import fencepost as fp
from fencepost._format import key_values, write_json
from fencepost.ledger import redact_target

BATCH = 50
LEASE_MS = 1500
WORKFLOW = "demo/fan-out"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--units", type=_count(1, 1_000_000), default=10_000, help="units to fan out")
    p.add_argument("--workers", type=_count(1, 64), default=4, help="worker processes")
    p.add_argument("--no-kill", action="store_true", help="do not kill -9 a worker")
    p.add_argument(
        "--kill-one", action="store_true", help="kill -9 one worker mid-flight (the default)"
    )
    p.add_argument("--seed", type=int, default=7, help="random seed (kill moment, duplicates)")
    p.add_argument("--db", default=None, help="a new ledger file (default: a fresh temp file)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _count(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


def _shard_units(shard: int, workers: int, units: int) -> list[str]:
    return [f"unit-{i:06d}" for i in range(shard, units, workers)]


# ------------------------------------------------------------------ worker process


def _work_shard(
    ledger: fp.Ledger, shard_run: str, claim: fp.Claim, todo: list[str], rnd: random.Random,
    events: Any, worker: int,
) -> None:  # fmt: skip
    beat = time.monotonic()
    for start in range(0, len(todo), BATCH):
        batch = todo[start : start + BATCH]
        got = ledger.reserve_attempts(
            shard_run,
            [{"unit_id": u, "step_id": "work", "holder": f"worker-{worker}"} for u in batch],
            claim=claim,
        )
        reclaimed = sum(1 for r in got if r.kind == "reclaimed")
        events.send(("reserved", worker))  # the driver picks this moment for its kill -9
        time.sleep(0.005)  # the "work", during which the batch is in flight
        finishes = [
            {"run_id": shard_run, "unit_id": r.unit_id, "attempt": r.attempt,
             "dispatch_id": r.dispatch_id, "status": "completed", "tokens": 1}
            for r in got
        ]  # fmt: skip
        done = ledger.finish_attempts(finishes, claim=claim)
        duplicates = 0
        if rnd.random() < 0.2:  # a retried callback: the same finish again, must be ignored
            again = ledger.finish_attempts(finishes[:2], claim=claim)
            duplicates = sum(1 for ok in again if not ok)
        events.send(("progress", worker, sum(done), reclaimed, duplicates))
        if time.monotonic() - beat > LEASE_MS / 3000:
            claim = ledger.heartbeat(claim, lease_ms=LEASE_MS)
            beat = time.monotonic()


def _claim_when_free(ledger: fp.Ledger, run_id: str, worker: int, own: bool) -> fp.Claim | None:
    """Claim a shard, waiting out another owner's lease; None once the shard is finished.
    Another worker's shard is only taken over once it has had an owner (generation >= 1)
    whose lease lapsed: a shard nobody claimed yet is left to its own worker."""
    while True:
        run = ledger.get_run(run_id)
        if run is None or run.status != "active":
            return None
        if own or ledger.lease(run_id).generation >= 1:
            claim = ledger.claim(run_id, f"host-worker-{worker}", lease_ms=LEASE_MS)
            if claim is not None:
                return claim
        time.sleep(0.05)


def worker_main(db: str, parent: str, shards: list[str], worker: int, units: int,
                seed: int, events: Any) -> None:  # fmt: skip
    rnd = random.Random(seed * 1000 + worker)
    workers = len(shards)
    with fp.Ledger.open(db) as ledger:
        # Own shard first, then any shard left unfinished (a dead worker's, after expiry).
        order = [worker] + [s for s in range(workers) if s != worker]
        for shard in order:
            run_id = shards[shard]
            claim = _claim_when_free(ledger, run_id, worker, own=shard == worker)
            if claim is None:
                continue
            if shard != worker:
                events.send(("takeover", worker, shard, claim.generation))
            else:
                events.send(("claim", worker, run_id, claim.generation, claim.token))
            done = {u.unit_id for u in ledger.units(run_id) if u.status == "completed"}
            todo = [u for u in _shard_units(shard, workers, units) if u not in done]
            _work_shard(ledger, run_id, claim, todo, rnd, events, worker)
            ledger.complete_step(run_id, "work", claim=claim)  # completes the shard run
            ledger.release(claim)
    events.send(("exit", worker))


# ------------------------------------------------------------------ progress


class Progress:
    """A bar on a TTY (redrawn in place), periodic lines otherwise."""

    def __init__(self, out: TextIO, total: int) -> None:
        self.out, self.total = out, total
        self.tty = out.isatty()
        self.started = self.last = time.monotonic()

    def show(self, done: int, reclaims: int, refused: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < (0.1 if self.tty else 1.0):
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        stats = (
            f"{done}/{self.total} units  {rate:,.0f}/s  reclaims {reclaims}  "
            f"stale refused {refused}"
        )
        if self.tty:
            width = 30
            filled = int(width * done / max(self.total, 1))
            self.out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {stats}\033[K")
            if final:
                self.out.write("\n")
        else:
            self.out.write(stats + "\n")
        self.out.flush()


# ------------------------------------------------------------------ the demo


def _stale_writer(ledger: fp.Ledger, dead: tuple[str, int, str], unit: str) -> int:
    """Replay the killed worker's claim: every fenced write must be refused. Returns how many
    were refused (and raises if one got through)."""
    run_id, generation, token = dead
    expired = fp.models.from_ms(0)
    assert expired is not None
    old = fp.Claim(run_id, generation, token, "dead", expired)
    writes: list[Callable[[], object]] = [
        lambda: ledger.heartbeat(old, lease_ms=LEASE_MS),
        lambda: ledger.reserve_attempt(run_id, unit, step_id="work", claim=old),
        lambda: ledger.set_outputs(run_id, {"stale": True}, claim=old),
        lambda: ledger.release(old),
    ]
    refused = 0
    for write in writes:
        try:
            write()
        except fp.LeaseLost:
            refused += 1
    if refused != len(writes):
        raise AssertionError("a stale claim was allowed to write")
    return refused


def _invariants(
    ledger: fp.Ledger, parent: str, shards: list[str], units: int, takeovers: int, refused: int
) -> dict[str, bool]:
    finished_once = True
    seen = 0
    attempts = 0
    generations_ok = True
    for run_id in shards:
        for unit in ledger.units(run_id):
            seen += 1
            history = ledger.attempts(run_id, unit.unit_id)
            attempts += len(history)
            completed = [a for a in history if a.status == "completed"]
            if len(completed) != 1 or unit.status != "completed":
                finished_once = False
        claimed = [
            e.generation for e in ledger.events(run_id, limit=10_000, types=["lease.claimed"])
        ]
        if claimed != list(range(1, len(claimed) + 1)) or ledger.lease(run_id).generation != len(
            claimed
        ):
            generations_ok = False
    finished_events = 0
    after = 0
    while True:
        page = ledger.events(after_seq=after, limit=10_000, types=["unit.finished"])
        if not page:
            break
        finished_events += len(page)
        after = page[-1].seq
    leases = [ledger.lease(run_id) for run_id in shards]
    # Every claim of another worker's shard takes an expired lease over; the leases also count
    # a live worker's writes refused after its own lease lapsed, so theirs may be higher.
    fence_counted = (
        sum(lease.takeovers for lease in leases) == takeovers
        and sum(lease.refused_writes for lease in leases) >= refused
    )
    return {
        "every unit finished exactly once": finished_once and seen == units,
        "the leases count the takeovers and refused writes": fence_counted,
        "every attempt has its events": not ledger.orphan_attempts() and finished_events == units,
        "one owner per generation": generations_ok,
        "database integrity_check ok": ledger.integrity_check() == ["ok"],
    }


def run(args: argparse.Namespace, out: TextIO) -> int:
    err = sys.stderr
    if args.db is None:
        db = str(pathlib.Path(tempfile.mkdtemp(prefix="fencepost-demo-")) / "demo.db")
    else:
        db = args.db
        if pathlib.Path(db).exists():
            err.write(f"fencepost: {db} exists; the demo writes a new ledger (pick another --db)\n")
            return 2
    shown = redact_target(db)
    workers, units = args.workers, args.units
    rnd = random.Random(args.seed)
    started = time.monotonic()
    with fp.Ledger.open(db) as ledger:
        parent = ledger.start_run(
            WORKFLOW, scope_key="demo", steps=[{"id": "fan-out", "title": "Fan out"}],
            params={"units": units, "workers": workers}, force=True,
        ).run_id  # fmt: skip
        shards = [
            ledger.publish_child_run(
                parent, parent_unit_id=f"shard-{s}", invocation_key=f"shard-{s}",
                workflow_ref="demo/shard", steps=[{"id": "work"}],
            ).run_id
            for s in range(workers)
        ]  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    # One pipe per worker, not a shared queue: a queue's writers share a lock, and a worker
    # killed while holding it would block every other worker's next message forever.
    pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
    procs = [
        ctx.Process(target=worker_main, args=(db, parent, shards, w, units, args.seed, pipes[w][1]))
        for w in range(workers)
    ]
    readers = {pipes[w][0]: w for w in range(workers)}
    err.write(f"fencepost demo: {units} units, {workers} workers, ledger {shown}\n")
    for p in procs:
        p.start()
    for _, writer in pipes:
        writer.close()  # the children hold their ends; EOF then means "exited or killed"
    # The kill comes when the victim has finished 20-50% of its own shard and has just reserved
    # a batch: always mid-flight, whatever the other workers are doing.
    victim_units = len(_shard_units(0, workers, units))
    # (Rounded down to whole batches, so a shard of one batch is killed in its first.)
    share = int(victim_units * rnd.uniform(0.2, 0.5)) // BATCH * BATCH
    kill_at = None if args.no_kill or workers < 2 else share
    victim_done = 0
    victim = 0
    done = reclaims = duplicates = refused = 0
    claims: dict[int, tuple[str, int, str]] = {}
    takeovers: list[tuple[int, int, int]] = []
    killed = False
    exited: set[int] = set()
    bar = Progress(err, units)
    while len(exited) < workers - (1 if killed else 0):
        msgs: list[Any] = []
        for ready in wait(list(readers), timeout=0.2):
            conn = next(c for c in readers if c is ready)
            try:
                msgs.append(conn.recv())
            except EOFError:
                del readers[conn]
        in_flight = False
        for msg in msgs:
            kind = msg[0]
            if kind == "progress":
                done += msg[2]
                victim_done += msg[2] if msg[1] == victim else 0
                reclaims += msg[3]
                duplicates += msg[4]
            elif kind == "claim":
                claims[msg[1]] = (msg[2], msg[3], msg[4])
            elif kind == "takeover":
                takeovers.append((msg[1], msg[2], msg[3]))
            elif kind == "exit":
                exited.add(msg[1])
            # One message per worker per round: the victim's being "reserved" means its batch
            # is in flight right now.
            in_flight = in_flight or (kind == "reserved" and msg[1] == victim)
        if (
            kill_at is not None and not killed and victim_done >= kill_at and in_flight
            and victim in claims and procs[victim].is_alive()
        ):  # fmt: skip
            os.kill(procs[victim].pid, signal.SIGKILL)  # type: ignore[arg-type]
            procs[victim].join()
            killed = True
            bar.show(done, reclaims, refused, final=True)
            err.write(f"kill -9 worker {victim} (pid {procs[victim].pid}) mid-flight\n")
        for i, p in enumerate(procs):
            if not p.is_alive() and p.exitcode not in (0, None) and not (killed and i == victim):
                err.write(f"fencepost: worker {i} failed (exit {p.exitcode})\n")
                return 1
        bar.show(done, reclaims, refused)
    for p in procs:
        p.join()
    bar.show(done, reclaims, refused, final=True)
    wall = time.monotonic() - started
    with fp.Ledger.open(db) as ledger:
        if killed:
            unit = _shard_units(victim, workers, units)[0]
            refused += _stale_writer(ledger, claims[victim], unit)
        ledger.complete_step(parent, "fan-out", summary=f"{units} units")
        total_attempts = sum(ledger.accounting(s).total_attempts for s in shards)
        checks = _invariants(ledger, parent, shards, units, len(takeovers), refused)
    report = {
        "database": shown,
        "units": units,
        "workers": workers,
        "attempts": total_attempts,
        "reclaims": reclaims,
        "killed_worker": victim if killed else None,
        "takeovers": [{"worker": w, "shard": s, "generation": g} for w, s, g in takeovers],
        "stale_writes_refused": refused,
        "duplicate_finishes_ignored": duplicates,
        "wall_s": round(wall, 3),
        "units_per_s": round(units / wall, 1),
        "invariants": checks,
    }
    if args.json:
        write_json(report, out)
    else:
        lines = [
            ("units", f"{units} over {workers} workers (one leased shard run each)"),
            ("attempts", str(total_attempts)),
            ("reclaims", f"{reclaims} (in place: same attempt, same dispatch id)"),
            ("killed", "-" if not killed else f"worker {victim}, kill -9 mid-batch"),
            ("takeovers", ", ".join(f"shard {s} by worker {w} at generation {g}"
                                    for w, s, g in takeovers) or "-"),
            ("stale writes refused", f"{refused} (the dead worker's claim, replayed)"),
            ("duplicate finishes", f"{duplicates} ignored"),
            ("wall time", f"{wall:.2f} s"),
            ("throughput", f"{units / wall:,.0f} units/s"),
        ]  # fmt: skip
        key_values(lines, out)
        out.write("invariants (read back from the database):\n")
        for name, ok in checks.items():
            out.write(f"  {'ok  ' if ok else 'FAIL'} {name}\n")
        out.write(f"ledger: {shown}\n  try: fencepost show {parent} --db {shown}\n")
        out.write(f"       fencepost ui --db {shown}\n")
    return 0 if all(checks.values()) else 1

"""What the ledger reports about its own work: the ``fencepost`` logger, and the metrics of
:mod:`fencepost.otel` while they are on.

The core calls these functions (``rust/py/observe.rs``): a takeover when a claim that took
a lease reaches its caller, a refused write when its ``LeaseLost`` is raised, and the notices
queued on the writer's threads (busy retries, reconnects, migrations, group sizes, and the
units a failed attempt exhausted, once their transaction committed) on the next call's way
back. Every record carries its fields as ``extra=`` attributes (``event`` names what
happened), so a structured handler gets them as data rather than parsing the message.

Levels: a takeover, a refused write, a reconnect, a write that gave up on contention and an
exhausted unit are ``WARNING`` (each means something went wrong somewhere); a migration, a
prune, a schedule put, paused, resumed or deleted, and a schedule's fire are ``INFO`` (an
operator's action, or a run queued by the clock); busy retries, messages sent and messages
received are ``DEBUG`` (the retries in a row between two calls' returns are one record): under
load they are the hot path, and nothing there logs at ``INFO``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

logger = logging.getLogger("fencepost")
# A library leaves the output to the application: without a handler of its own the records
# would reach logging's last-resort handler and print warnings on stderr.
logger.addHandler(logging.NullHandler())


class Sink(Protocol):
    """Where the counts go while metrics are on (:mod:`fencepost.otel`)."""

    def takeover(self) -> None: ...
    def refused(self, reason: str) -> None: ...
    def busy_retries(self, count: int) -> None: ...
    def groups(self, sizes: Sequence[int]) -> None: ...
    def exhausted(self) -> None: ...
    def fired(self, count: int) -> None: ...


sink: Sink | None = None
"""Set by :func:`fencepost.otel.instrument`, cleared by ``uninstrument``."""


def takeover(run_id: str, generation: int, owner_id: str, taken_from: str) -> None:
    logger.warning(
        "run %s: %s took the lease over from %s, whose claim had expired (generation %d)",
        run_id,
        owner_id,
        taken_from,
        generation,
        extra={
            "event": "lease.takeover",
            "run_id": run_id,
            "generation": generation,
            "owner_id": owner_id,
            "taken_from": taken_from,
        },
    )
    if sink is not None:
        sink.takeover()


def refused(run_id: str, expected: int, actual: int, reason: str) -> None:
    logger.warning(
        "run %s: refused a write by a claim at generation %d (%s; the lease is at generation %d)",
        run_id,
        expected,
        reason,
        actual,
        extra={
            "event": "fence.refused",
            "run_id": run_id,
            "expected_generation": expected,
            "actual_generation": actual,
            "reason": reason,
        },
    )
    if sink is not None:
        sink.refused(reason)


def gave_up(waited_ms: int, retries: int) -> None:
    logger.warning(
        "a write gave up on contention after %d ms and %d retries (StoreBusy)",
        waited_ms,
        retries,
        extra={"event": "store.busy", "waited_ms": waited_ms, "retries": retries},
    )


def busy_retries(count: int, waited_ms: int) -> None:
    logger.debug(
        "contended writes tried again %d times (the longest had waited %d ms)",
        count,
        waited_ms,
        extra={"event": "store.busy_retries", "count": count, "waited_ms": waited_ms},
    )
    if sink is not None:
        sink.busy_retries(count)


def reconnected(reason: str) -> None:
    logger.warning(
        "reconnected to PostgreSQL: %s",
        reason,
        extra={"event": "store.reconnected", "reason": reason},
    )


def migrated(from_version: int, to_version: int) -> None:
    logger.info(
        "schema migrated from version %d to %d",
        from_version,
        to_version,
        extra={"event": "schema.migrated", "from_version": from_version, "to_version": to_version},
    )


def exhausted(run_id: str, unit_id: str, attempts: int) -> None:
    logger.warning(
        "run %s: unit %s is exhausted after %d attempts (its retry policy allows no more; "
        "retry_units gives it one more)",
        run_id,
        unit_id,
        attempts,
        extra={
            "event": "unit.exhausted",
            "run_id": run_id,
            "unit_id": unit_id,
            "attempts": attempts,
        },
    )
    if sink is not None:
        sink.exhausted()


def groups(sizes: Sequence[int]) -> None:
    if sink is not None:
        sink.groups(sizes)


def pruned(
    *, runs: int, attempts: int, events: int, dry_run: bool, archive: str | None, older_than: str
) -> None:
    logger.info(
        "%s %d runs older than %s (%d attempts, %d events)%s",
        "would prune" if dry_run else "pruned",
        runs,
        older_than,
        attempts,
        events,
        f", archived to {archive}" if archive else "",
        extra={
            "event": "retention.pruned",
            "runs": runs,
            "attempts": attempts,
            "events": events,
            "dry_run": dry_run,
            "archive": archive,
        },
    )


def schedule_changed(action: str, name: str) -> None:
    """``put``, ``paused``, ``resumed`` or ``deleted``."""
    logger.info(
        "schedule %s %s",
        name,
        action,
        extra={"event": f"schedule.{action}", "schedule": name},
    )


def fired(runs: Sequence[Any]) -> None:
    """The runs a tick queued: one record each, and the count."""
    for run in runs:
        # A fire's run id is the schedule's name, a colon and the slot (17 characters).
        name = run.run_id[:-18]
        logger.info(
            "schedule %s fired: queued run %s, due %s",
            name,
            run.run_id,
            run.not_before.isoformat() if run.not_before else "now",
            extra={"event": "schedule.fired", "schedule": name, "run_id": run.run_id},
        )
    if sink is not None and runs:
        sink.fired(len(runs))


def message_sent(message: Any) -> None:
    logger.debug(
        "run %s: message %d on %s",
        message.run_id,
        message.seq,
        message.topic,
        extra={"event": "message.sent", "run_id": message.run_id, "seq": message.seq,
               "topic": message.topic},
    )  # fmt: skip


def messages_received(run_id: str, topic: str, messages: Sequence[Any]) -> None:
    if messages:
        logger.debug(
            "run %s: received %d messages on %s",
            run_id,
            len(messages),
            topic,
            extra={"event": "message.received", "run_id": run_id, "topic": topic,
                   "seqs": [m.seq for m in messages]},
        )  # fmt: skip

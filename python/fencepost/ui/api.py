"""The dashboard's JSON API: one function per call, each made of a bounded number of public
``Ledger`` reads, so a page costs the same on a ledger of a thousand attempts and of millions.

Every answer is a dict ready for :func:`dumps`. Everything in it that came from the ledger
(ids, workflow refs, scope keys, JSON documents) is user data: it is sent as JSON strings and
numbers only, and the page renders it as text. Long JSON documents (params, results, payloads)
are sent as their JSON text, cut at a fixed length: a page of units must not carry a megabyte
result per row.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import fencepost as fp
from fencepost import _core, _doctor
from fencepost._format import iso

__all__ = [
    "PAGE_DEFAULT",
    "PAGE_MAX",
    "SEQ_MAX",
    "ApiError",
    "EventFeed",
    "RunTotals",
    "Throughput",
    "doctor",
    "dumps",
    "events_page",
    "find_run",
    "flag",
    "head_seq",
    "leases_page",
    "meta",
    "one",
    "parse_seq",
    "queue_page",
    "run_detail",
    "run_filter",
    "run_totals",
    "runs_page",
    "schedules_page",
    "unit_detail",
    "units_page",
]

Query = Mapping[str, Sequence[str]]

PAGE_DEFAULT = 50
PAGE_MAX = 200
# The largest event seq a read may start after: the ledger's seq is a signed 64-bit integer.
SEQ_MAX = 2**63 - 1
# The most attempts shown per unit: its latest ones (a unit retried without end stays one row).
ATTEMPTS_SHOWN = 20
# Children listed on a run's page; the total is given beside them.
CHILDREN_SHOWN = 100
# Leases with an owner listed per state list on the leases page.
LEASES_SHOWN = 100
# Keys with limits and paused workflows listed on the queue page; the queue's counts stop here
# (a count is a walk of an index, and the page repeats it every few seconds).
QUEUE_KEYS_SHOWN = 100
QUEUE_COUNT_MAX = 10_000
# Schedules listed on the schedules page, by name (one read carries their last runs' status).
SCHEDULES_SHOWN = 200
# JSON documents in lists (results, payloads) and on a run's page (params, outputs, evidence).
CLIP_LIST = 2_000
# The runs page's totals: each status's runs counted up to this (a walk of its index).
RUN_COUNT_MAX = 10_000
# Attempts shown on one unit's page, its newest.
UNIT_ATTEMPTS_SHOWN = 100
CLIP_DETAIL = 64_000
MINUTE_MS = 60_000
# A run's page reads its unit counts and accounting (each an aggregate over all of the run's
# units or attempts) at once up to this revision (about one event per reserve and per finish:
# some 200 000 attempts, each aggregate well within a page's 200 ms); past it, when asked.
TOTALS_AUTO_MAX_REVISION = 400_000


class ApiError(Exception):
    """A request the API answers with an error: ``status`` is the HTTP status, ``message`` says
    what was wrong in words fit to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------ encoding


def dumps(value: Any) -> bytes:
    """``value`` as JSON that is inert in any context: ``<``, ``>`` and ``&`` escaped (so no
    byte sequence of it can close a script or open a tag if it is ever embedded in HTML), and
    everything outside ASCII escaped too (so no encoding mix-up can change it)."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def clip(value: Any, limit: int = CLIP_LIST) -> str:
    """A JSON document as its text, cut to ``limit`` characters (marked with an ellipsis)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), sort_keys=False)
    return text if len(text) <= limit else text[:limit] + "\u2026"


def _ms(value: dt.datetime | None) -> int | None:
    return None if value is None else fp.models.to_ms(value)


# ------------------------------------------------------------------ query strings


def one(query: Query, name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise ApiError(400, f"give {name} once, not {len(values)} times")
    return values[0]


def _int(query: Query, name: str, default: int, low: int, high: int) -> int:
    text = one(query, name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{name} must be a whole number, not {text!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be from {low} to {high}, not {value}")
    return value


def parse_seq(text: str, name: str) -> int:
    """An event seq to read after, from ``name`` (a query field or a header): digits only,
    0 to :data:`SEQ_MAX`, the same rule for the event pages and the stream."""
    digits = text.lstrip("0")
    # The length first: int() refuses a string of thousands of digits with a ValueError.
    if not (text.isascii() and text.isdigit()) or len(digits) > 19 or int(text) > SEQ_MAX:
        raise ApiError(
            400, f"{name} must be an event seq, a whole number from 0 to {SEQ_MAX}, not {text!r}"
        )
    return int(text)


def run_filter(ledger: fp.Ledger, query: Query) -> str | None:
    """The run (``run``) that events are read for, if any, checked by the ledger's own rules
    (one read by primary key): an id the ledger refuses is a 400 whether or not the call goes
    on to read with it. A run that does not exist (yet) is no error: a tail may wait for it."""
    run_id = one(query, "run") or None
    if run_id is not None:
        ledger.get_run(run_id)
    return run_id


def flag(query: Query, name: str) -> bool:
    return (one(query, name) or "") in ("1", "true", "yes", "on")


def _limit(query: Query) -> int:
    return _int(query, "limit", PAGE_DEFAULT, 1, PAGE_MAX)


def _required(query: Query, name: str) -> str:
    value = one(query, name)
    if not value:
        raise ApiError(400, f"{name} is required")
    return value


# ------------------------------------------------------------------ records


def run_summary(run: fp.Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "workflow_ref": run.workflow_ref,
        "workflow_name": run.workflow_name,
        "scope_key": run.scope_key,
        "status": run.status,
        "current_step_id": run.current_step_id,
        "parent_run_id": run.parent_run_id,
        "revision": run.revision,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "completed_at": None if run.completed_at is None else iso(run.completed_at),
    }


def lease_record(lease: fp.Lease, now_ms: int) -> dict[str, Any]:
    """A lease with its state at ``now_ms``: ``free`` (no owner), ``live``, ``expiring`` (past
    two thirds of its term since the last heartbeat: its owner is late) or ``expired``; and
    what the fence did on it (``takeovers``, ``refused_writes``)."""
    expires = _ms(lease.expires_at)
    beat = _ms(lease.heartbeat_at)
    if lease.owner_id is None or expires is None:
        state, remaining = "free", None
    else:
        remaining = expires - now_ms
        term = expires - beat if beat is not None and beat < expires else None
        if remaining <= 0:
            state = "expired"
        elif term is not None and remaining * 3 < term:
            state = "expiring"
        else:
            state = "live"
    return {
        "run_id": lease.run_id,
        "generation": lease.generation,
        "owner_id": lease.owner_id,
        "owner_type": lease.owner_type,
        "expires_at": None if lease.expires_at is None else iso(lease.expires_at),
        "heartbeat_at": None if lease.heartbeat_at is None else iso(lease.heartbeat_at),
        "state": state,
        "remaining_ms": remaining,
        "takeovers": lease.takeovers,
        "refused_writes": lease.refused_writes,
    }


def attempt_record(a: fp.Attempt) -> dict[str, Any]:
    started, finished = _ms(a.started_at), _ms(a.finished_at)
    return {
        "attempt": a.attempt,
        "dispatch_id": a.dispatch_id,
        "status": a.status,
        "phase": a.phase,
        "holder": a.holder,
        "lease_generation": a.lease_generation,
        "reclaims": a.reclaims,
        "result": None if a.result is None else clip(a.result),
        "tokens": a.tokens,
        "failure_reason": a.failure_reason,
        "started_at": iso(a.started_at),
        "finished_at": None if a.finished_at is None else iso(a.finished_at),
        "duration_ms": None if started is None or finished is None else finished - started,
    }


def event_record(e: fp.Event) -> dict[str, Any]:
    payload = e.payload
    taken_from = None
    if e.type == "lease.claimed" and isinstance(payload, dict):
        owner = payload.get("taken_from")
        taken_from = owner if isinstance(owner, str) else None
    return {
        "seq": e.seq,
        "ts": iso(e.ts),
        "run_id": e.resource_id,
        "revision": e.revision,
        "type": e.type,
        "actor_type": e.actor_type,
        "actor_id": e.actor_id,
        "generation": e.generation,
        "payload": clip(payload),
        "taken_from": taken_from,
    }


# ------------------------------------------------------------------ calls


def meta(ledger: fp.Ledger, *, token_required: bool) -> dict[str, Any]:
    """What every page shows in its header, and the filters' choices."""
    return {
        "database": ledger.target,
        "version": fp.__version__,
        "run_statuses": list(_core.RUN_STATUSES),
        "unit_statuses": list(_core.UNIT_STATUSES),
        "read_only": True,
        "token_required": token_required,
        "page_max": PAGE_MAX,
        "totals_auto_max_revision": TOTALS_AUTO_MAX_REVISION,
    }


def runs_page(ledger: fp.Ledger, query: Query) -> dict[str, Any]:
    """A page of runs, most recently updated first, filtered by status (repeatable), scope and
    workflow ref (repeatable); ``after`` (a run id) is the last run of the page before."""
    limit = _limit(query)
    statuses: list[fp.RunStatus] = []
    for status in (s for s in query.get("status", []) if s):
        if status not in _core.RUN_STATUSES:
            raise ApiError(400, f"unknown run status {status!r}")
        statuses.append(cast("fp.RunStatus", status))
    workflows = [w for w in query.get("workflow", []) if w]
    scope = one(query, "scope")
    after = _after_run(one(query, "after"))
    # An empty range is the ledger's InvalidArgument, which the server answers with a 400.
    since, until = _time(query, "updated_after"), _time(query, "updated_before")
    # One more than asked says whether another page follows.
    runs = ledger.list_runs(
        scope_key=scope if scope else fp.ALL_SCOPES,
        workflow_refs=workflows or None,
        status=statuses or None,
        include_children=flag(query, "children"),
        limit=limit + 1,
        after=after,
        workflow_name=one(query, "name") or None,
        updated_after=since,
        updated_before=until,
    )
    shown = runs[:limit]
    return {
        "runs": [run_summary(r) for r in shown],
        "next": _cursor(shown[-1]) if len(runs) > limit else None,
        "limit": limit,
        # Every run by status, each count stopping at RUN_COUNT_MAX (a bounded walk each).
        "totals": ledger.run_counts(count_max=RUN_COUNT_MAX),
        "count_max": RUN_COUNT_MAX,
    }


def _time(query: Query, name: str) -> dt.datetime | None:
    """The query's ``name`` as an aware datetime (ISO 8601 with an offset), or a 400."""
    text = one(query, name)
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(400, f"{name} must be an ISO 8601 time, not {text!r}") from None
    if value.utcoffset() is None:
        raise ApiError(400, f"{name} must say its offset from UTC (end it with Z or +00:00)")
    return value


def find_run(ledger: fp.Ledger, query: Query) -> dict[str, Any]:
    """The runs whose id starts with ``prefix``: ``run_id`` when exactly one does (or one is
    the prefix itself), else ``matches`` (the first 100 in byte order; empty for none). One
    read of an index of run ids."""
    prefix = _required(query, "prefix")
    try:
        return {"run_id": ledger.resolve_run_id(prefix), "matches": []}
    except fp.errors.AmbiguousRunId as e:
        return {"run_id": None, "matches": list(e.matches)}
    except fp.errors.RunNotFound:
        return {"run_id": None, "matches": []}


def unit_detail(ledger: fp.Ledger, query: Query) -> dict[str, Any]:
    """One unit and its newest :data:`UNIT_ATTEMPTS_SHOWN` attempts, their results and failure
    reasons cut at :data:`CLIP_DETAIL` (where a page of units cuts them short): the view of
    one failure. Two reads, each of the unit's own rows."""
    run_id = _required(query, "run")
    unit_id = _required(query, "unit")
    unit = ledger.unit(run_id, unit_id)
    if unit is None:
        raise ApiError(404, f"run {run_id!r} has no unit {unit_id!r}")
    history = ledger.unit_attempts(run_id, [unit_id], latest=UNIT_ATTEMPTS_SHOWN)[unit_id]
    attempts = []
    for a in history:
        record = attempt_record(a)
        record["result"] = None if a.result is None else clip(a.result, CLIP_DETAIL)
        attempts.append(record)
    return {
        "run_id": run_id,
        "unit_id": unit.unit_id,
        "step_id": unit.step_id,
        "phase": unit.phase,
        "status": unit.status,
        "attempts": unit.attempts,
        "retry_at": iso(unit.retry_at) if unit.retry_at is not None else None,
        "failure_reason": unit.failure_reason,
        "result": None if unit.result is None else clip(unit.result, CLIP_DETAIL),
        "history": attempts,
        "shown": len(attempts),
    }


def _cursor(run: fp.Run) -> str:
    """The cursor of a page of runs that ends at ``run``: the position the page saw it at
    (updated, created, id), not the run itself, so the next page follows on from there even if
    the run changed (and moved to the top) or was pruned meanwhile."""
    return f"{fp.models.to_ms(run.updated_at)}.{fp.models.to_ms(run.created_at)}.{run.run_id}"


def _after_run(cursor: str | None) -> fp.Run | None:
    """``list_runs``' ``after`` for a cursor of :func:`_cursor`: a run at that position (the
    read looks at nothing else of it)."""
    if not cursor:
        return None
    # The first number is a time too: from_ms refuses one out of range.
    updated, created, run_id = _parse_cursor(
        cursor, "page cursor", lambda n: fp.models.from_ms(n) is not None
    )
    return _stand_in(run_id, updated=updated, created=created)


def _parse_cursor(
    cursor: str, what: str, first_ok: Callable[[int], bool]
) -> tuple[int, dt.datetime, str]:
    """A cursor of two numbers and a run id: the first number (``first_ok`` says whether it
    is in range, or raises), the second as a time, the run id (which may hold dots); a 400
    naming ``what`` if it is none."""
    parts = cursor.split(".", 2)
    try:
        if len(parts) != 3:
            raise ValueError(cursor)
        first, at = int(parts[0]), fp.models.from_ms(int(parts[1]))
        if not first_ok(first):
            raise ValueError(cursor)
    except (ValueError, OverflowError, fp.InvalidArgument):
        raise ApiError(400, f"not a {what}: {cursor!r}") from None
    return first, at, parts[2]


def _stand_in(
    run_id: str,
    *,
    updated: int | dt.datetime,
    created: dt.datetime,
    status: fp.RunStatus = "completed",
    not_before: dt.datetime | None = None,
    priority: int = 0,
) -> fp.Run:
    """A run at a cursor's place: the reads look at its id and the fields of their order."""
    updated_at = updated if isinstance(updated, dt.datetime) else fp.models.from_ms(updated)
    return fp.Run(
        run_id=run_id, workflow_ref="", workflow_name="", scope_key=None, status=status,
        current_step_id=None, parent_run_id=None, parent_unit_id=None, invocation_key=None,
        origin_session_id=None, params=None, outputs=None, revision=0, created_at=created,
        updated_at=updated_at, completed_at=None, not_before=not_before, priority=priority,
    )  # fmt: skip


def _run(ledger: fp.Ledger, query: Query, name: str) -> fp.Run:
    run_id = _required(query, name)
    run = ledger.get_run(run_id)
    if run is None:
        raise ApiError(404, f"no run {run_id!r}")
    return run


def run_detail(ledger: fp.Ledger, query: Query, now_ms: int) -> dict[str, Any]:
    """One run: the run, its steps, lease (with the fence's counts), parent and children.
    Its unit counts and accounting, which read every unit or attempt of the run, are
    :func:`run_totals`, a call of their own that the page makes at the same time."""
    run = _run(ledger, query, "id")
    steps = ledger.steps(run.run_id)
    lease = ledger.lease(run.run_id)
    children = ledger.child_runs(run.run_id)
    parent = ledger.get_run(run.parent_run_id) if run.parent_run_id else None
    return {
        "run": {
            **run_summary(run),
            "parent_unit_id": run.parent_unit_id,
            "invocation_key": run.invocation_key,
            "origin_session_id": run.origin_session_id,
            "params": clip(run.params, CLIP_DETAIL),
            "outputs": None if run.outputs is None else clip(run.outputs, CLIP_DETAIL),
        },
        "steps": [
            {
                "step_id": s.step_id,
                "title": s.title,
                "sequence_index": s.sequence_index,
                "status": s.status,
                "summary": s.summary,
                "notes": s.notes,
                "evidence": None if s.evidence is None else clip(s.evidence),
                "completed_at": None if s.completed_at is None else iso(s.completed_at),
            }
            for s in steps
        ],
        "lease": lease_record(lease, now_ms),
        "parent": None if parent is None else run_summary(parent),
        "children": [run_summary(c) for c in children[:CHILDREN_SHOWN]],
        "children_total": len(children),
    }


class RunTotals:
    """A run's unit counts and accounting, remembered by the run's revision.

    Both are aggregates over the run's units or attempts (a run of 500 000 units takes over
    100 ms each), and both change only when an attempt is reserved, reclaimed or finished,
    which appends one of the run's events and so moves its revision. Keyed by (run, revision),
    a remembered answer is exact, and viewing a run again (paging its units, a reload) costs a
    read of the run only."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], Any] = {}

    def get(self, run: fp.Run, kind: str) -> Any:
        with self._lock:
            return self._seen.get((run.run_id, run.revision, kind))

    def put(self, run: fp.Run, kind: str, value: Any) -> None:
        with self._lock:
            self._seen[(run.run_id, run.revision, kind)] = value
            while len(self._seen) > self.size:
                del self._seen[next(iter(self._seen))]


def run_totals(ledger: fp.Ledger, query: Query, totals: RunTotals) -> dict[str, Any]:
    """A run's units by status (``part=units``) or its attempt and token accounting
    (``part=accounting``): one aggregate each, so the page asks for both at once and a pool of
    connections answers them side by side."""
    run = _run(ledger, query, "run")
    part = one(query, "part")
    if part == "units":
        counts = totals.get(run, part)
        if counts is None:
            counts = ledger.unit_counts(run.run_id)
            totals.put(run, part, counts)
        return {"run_id": run.run_id, "total": sum(counts.values()), "by_status": counts}
    if part == "accounting":
        found = totals.get(run, part)
        if found is None:
            found = ledger.accounting(run.run_id)
            totals.put(run, part, found)
        return {
            "run_id": run.run_id,
            "total_attempts": found.total_attempts,
            "total_tokens": found.total_tokens,
            "dispatch_attempts": found.dispatch_attempts,
            "dispatch_tokens": found.dispatch_tokens,
            "gate_attempts": found.gate_attempts,
            "gate_tokens": found.gate_tokens,
        }
    raise ApiError(400, "part must be 'units' or 'accounting'")


SCANNED = 1_000
"""How many of a run's units one view of its running or completed units looks through."""
INDEXED_UNIT_STATUSES = frozenset(_core.UNIT_STATUSES) - {"running", "completed"}
"""The unit statuses ``Ledger.units`` reads by an index of their own (see its docstring)."""


def units_page(ledger: fp.Ledger, query: Query, totals: RunTotals | None = None) -> dict[str, Any]:
    """A page of a run's units (optionally of one step and status), each with its latest
    attempts; ``after`` is the last unit id of the page before. A status the run's counts
    (when known for its current revision) say it has no unit of is answered without reading:
    the read would walk all of the run's units to find none."""
    run = _run(ledger, query, "run")
    run_id = run.run_id
    limit = _limit(query)
    step = one(query, "step") or None
    status = one(query, "status") or None
    if status is not None and status not in _core.UNIT_STATUSES:
        raise ApiError(400, f"unknown unit status {status!r}")
    counts = None if totals is None or status is None else totals.get(run, "units")
    if counts is not None and not counts.get(status, 0):
        return {"units": [], "next": None, "limit": limit}
    after = one(query, "after") or None
    scanned: int | None = None
    if status is None:
        units = ledger.units(run_id, step_id=step, limit=limit + 1, after=after)
        shown = units[:limit]
        following = shown[-1].unit_id if len(units) > limit else None
    elif status in INDEXED_UNIT_STATUSES:
        units = ledger.units(
            run_id, step_id=step, status=cast("fp.UnitStatus", status), limit=limit + 1, after=after
        )
        shown = units[:limit]
        following = shown[-1].unit_id if len(units) > limit else None
    else:
        # Running and completed units are not indexed by status (every reserve and finish
        # would write that index): the view reads the next SCANNED units in order and keeps
        # the matches, rather than asking the ledger for them, which for a status only the
        # last of half a million units have would walk the whole run. Each view costs one
        # bounded read; the page says how far it looked.
        window = ledger.units(run_id, step_id=step, limit=SCANNED, after=after)
        matched = [u for u in window if u.status == status]
        scanned = len(window)
        shown = matched[:limit]
        if len(matched) > limit:
            following = shown[-1].unit_id
            scanned = window.index(shown[-1]) + 1
        else:
            following = window[-1].unit_id if len(window) == SCANNED else None
    # The page's units' newest attempts in one read, not one per unit.
    histories = ledger.unit_attempts(run_id, [u.unit_id for u in shown], latest=ATTEMPTS_SHOWN)
    rows = []
    for u in shown:
        history = histories[u.unit_id]
        rows.append(
            {
                "unit_id": u.unit_id,
                "step_id": u.step_id,
                "phase": u.phase,
                "status": u.status,
                "attempts": u.attempts,
                "result": None if u.result is None else clip(u.result),
                "tokens": u.tokens,
                "failure_reason": u.failure_reason,
                "claim_holder": u.claim_holder,
                "history": [attempt_record(a) for a in history],
            }
        )
    return {"units": rows, "next": following, "limit": limit, "scanned": scanned}


def leases_page(ledger: fp.Ledger, query: Query, now_ms: int) -> dict[str, Any]:
    """The leases that have an owner now, by state (live, expiring, expired), the expired ones
    that still block a run that is not finished, and a page of the most recently updated runs'
    leases (``after``: the last run id of the page before) with their generations and the
    fence's counts."""
    limit = _limit(query)
    # Costs what the live owners do, however long the ledger's history (see Ledger.leases).
    owned = [lease_record(le, now_ms) for le in ledger.leases(owned_only=True)]
    states = {"live": 0, "expiring": 0, "expired": 0}
    for record in owned:
        states[record["state"]] += 1
    blocking = ledger.expired_leases()
    after = _after_run(one(query, "after"))
    runs = ledger.list_runs(include_children=True, limit=limit + 1, after=after)
    shown = runs[:limit]
    # The page's leases in one read, not one per run.
    by_run = {le.run_id: le for le in ledger.leases(run_ids=[r.run_id for r in shown])}
    recent = []
    for run in shown:
        record = lease_record(by_run[run.run_id], now_ms)
        record["run_status"] = run.status
        record["workflow_ref"] = run.workflow_ref
        recent.append(record)
    return {
        "now": iso(fp.models.from_ms(now_ms)),
        "counts": {**states, "owned": len(owned), "blocking": len(blocking)},
        "owned": owned[:LEASES_SHOWN],
        "blocking": [lease_record(le, now_ms) for le in blocking[:LEASES_SHOWN]],
        "recent": recent,
        "next": _cursor(shown[-1]) if len(runs) > limit else None,
        "limit": limit,
    }


def queue_page(ledger: fp.Ledger, query: Query, now_ms: int) -> dict[str, Any]:
    """The queue: its lanes counted (up to :data:`QUEUE_COUNT_MAX`), the keys with limits
    (their live and queued runs; ``keys_after``: the last key of the list before), the paused
    workflows, and a page of one lane (``lane``: ``due``, in claim order, or ``later``, soonest
    due first; ``after``: the cursor of the page before). Two reads, whatever the backlog."""
    limit = _limit(query)
    lane = one(query, "lane") or "due"
    if lane not in ("due", "later"):
        raise ApiError(400, f"lane must be due or later, not {lane!r}")
    overview = ledger.queue_overview(
        count_max=QUEUE_COUNT_MAX, limit=QUEUE_KEYS_SHOWN, after_key=one(query, "keys_after")
    )
    after = _after_queued(one(query, "after"))
    runs = ledger.queued_runs(
        lane="due" if lane == "due" else "later", limit=limit + 1, after=after
    )
    shown = runs[:limit]
    rows = []
    for r in shown:
        rows.append(
            {
                "run_id": r.run_id,
                "workflow_name": r.workflow_name,
                "priority": r.priority,
                "concurrency_key": r.concurrency_key,
                "due_at": iso(r.due_at),
                "due_in_ms": fp.models.to_ms(r.due_at) - now_ms,
                "created_at": iso(r.created_at),
            }
        )
    keys = overview.keys
    return {
        "now": iso(fp.models.from_ms(now_ms)),
        "counts": {"due": overview.due, "keyed": overview.keyed, "later": overview.later},
        "count_max": overview.count_max,
        "keys": [
            {"key": k.concurrency_key, "limit": k.limit, "live": k.live, "queued": k.queued}
            for k in keys
        ],
        "keys_next": keys[-1].concurrency_key if len(keys) == QUEUE_KEYS_SHOWN else None,
        "paused": [
            {"workflow_name": p.workflow_name, "paused_at": iso(p.paused_at), "queued": p.queued}
            for p in overview.paused
        ],
        "lane": lane,
        "runs": rows,
        "next": _queue_cursor(shown[-1]) if len(runs) > limit else None,
        "limit": limit,
    }


def retries_page(ledger: fp.Ledger, query: Query, now_ms: int) -> dict[str, Any]:
    """The units waiting on their retry policy: ``kind=due`` the failed units whose retry time
    has come, soonest first, or ``kind=exhausted`` the units out of attempts, by run and unit;
    of one run (``run``, its id) or of every run; ``after``: the cursor of the page
    before. One read by its own index, whatever the ledger holds."""
    limit = _limit(query)
    kind = one(query, "kind") or "due"
    if kind not in ("due", "exhausted"):
        raise ApiError(400, f"kind must be due or exhausted, not {kind!r}")
    run_id = _run(ledger, query, "run").run_id if one(query, "run") else None
    after = _after_unit(one(query, "after"), kind)
    if kind == "due":
        units = ledger.due_units(run_id, limit=limit + 1, after=after)
    else:
        units = ledger.exhausted_units(run_id, limit=limit + 1, after=after)
    shown = units[:limit]
    rows = [
        {
            "run_id": u.run_id,
            "unit_id": u.unit_id,
            "step_id": u.step_id,
            "status": u.status,
            "attempts": u.attempts,
            "failure_reason": u.failure_reason,
            "retry_at": iso(u.retry_at),
            "due_in_ms": None if u.retry_at is None else fp.models.to_ms(u.retry_at) - now_ms,
        }
        for u in shown
    ]
    return {
        "now": iso(fp.models.from_ms(now_ms)),
        "kind": kind,
        "run": run_id,
        "units": rows,
        "next": _unit_cursor(shown[-1], kind) if len(units) > limit else None,
        "limit": limit,
    }


def _unit_cursor(unit: fp.Unit, kind: str) -> str:
    """The cursor of a page of units that ends at ``unit``: its place in the read's order,
    ``RETRY_MS.RUN/UNIT`` for due units, ``RUN/UNIT`` for exhausted ones (a run id holds no
    ``/``; a unit id may, so the unit is what follows the first one)."""
    place = f"{unit.run_id}/{unit.unit_id}"
    if kind == "due":
        return f"{fp.models.to_ms(unit.retry_at) if unit.retry_at else 0}.{place}"
    return place


def _after_unit(cursor: str | None, kind: str) -> fp.Unit | None:
    """``due_units``' or ``exhausted_units``' ``after`` for a cursor of :func:`_unit_cursor`: a
    unit at that place (the reads look at nothing else of it)."""
    if not cursor:
        return None
    retry_at = None
    place = cursor
    try:
        if kind == "due":
            ms, _, place = cursor.partition(".")
            retry_at = fp.models.from_ms(int(ms))
        run_id, slash, unit_id = place.partition("/")
        if not (run_id and slash and unit_id):
            raise ValueError(cursor)
    except (ValueError, OverflowError, fp.InvalidArgument):
        raise ApiError(400, f"not a unit cursor: {cursor!r}") from None
    return fp.Unit(
        run_id=run_id, unit_id=unit_id, step_id=None, phase="unit", status="failed",
        attempts=0, result=None, tokens=None, failure_reason=None, claim_holder=None,
        retry_at=retry_at,
    )  # fmt: skip


def schedules_page(ledger: fp.Ledger, query: Query, now_ms: int) -> dict[str, Any]:
    """The cron schedules, by name: each with its next slot (and how far off it is at
    ``now_ms``), its newest fired slot and the status of the run that fire queued (``None``
    when that run is no longer in the ledger). No query fields.

    Reads: one, ``Ledger.schedules`` (made by hand, so few; it has no paging), which carries
    each last run's status; the first :data:`SCHEDULES_SHOWN` are shown (``more`` says
    whether there are others, ``total`` how many)."""
    schedules = ledger.schedules()
    shown = schedules[:SCHEDULES_SHOWN]
    rows = []
    for s in shown:
        next_ms = None if s.next_slot is None else fp.models.to_ms(s.next_slot)
        rows.append(
            {
                "name": s.name,
                "cron": s.cron,
                "timezone": s.timezone,
                "workflow_name": s.workflow_name,
                "overlap": s.overlap,
                "catch_up": s.catch_up,
                "paused": s.paused,
                "next_slot": None if s.next_slot is None else iso(s.next_slot),
                "next_in_ms": None if next_ms is None else next_ms - now_ms,
                "last_slot": None if s.last_slot is None else iso(s.last_slot),
                "last_run_id": s.last_run_id,
                "last_run_status": s.last_run_status,
            }
        )
    return {
        "now": iso(fp.models.from_ms(now_ms)),
        "schedules": rows,
        "total": len(schedules),
        "more": len(schedules) > len(shown),
        "shown_max": SCHEDULES_SHOWN,
    }


def _queue_cursor(run: fp.Run) -> str:
    """The cursor of a page of the queue that ends at ``run``: its place in the lane's order
    (priority, due time, id) as the page saw it."""
    return f"{run.priority}.{fp.models.to_ms(run.due_at)}.{run.run_id}"


def _after_queued(cursor: str | None) -> fp.Run | None:
    """``queued_runs``' ``after`` for a cursor of :func:`_queue_cursor`: a run at that place
    (the read looks at nothing else of it)."""
    if not cursor:
        return None
    priority, due, run_id = _parse_cursor(cursor, "queue cursor", lambda p: -1000 <= p <= 1000)
    return _stand_in(
        run_id, updated=due, created=due, status="queued", not_before=due, priority=priority
    )


def head_seq(ledger: fp.Ledger) -> int:
    """The newest event's ``seq`` (0 for an empty log): ``Ledger.newest_event_seq``, one probe
    of the log's primary key."""
    return ledger.newest_event_seq()


def events_page(ledger: fp.Ledger, query: Query) -> dict[str, Any]:
    """Events in commit order after ``after`` (a seq), optionally of one run; without
    ``after``, the last ``limit`` or so of the whole log (from the newest ``seq`` back: seqs
    are dense but may have gaps, so the page can be shorter), or for one run nothing yet (the
    page follows the stream from the head: a run's backlog from an arbitrary point would walk
    its whole history)."""
    limit = _limit(query)
    run_id = run_filter(ledger, query)
    after_text = one(query, "after")
    head = head_seq(ledger)
    if after_text is None or after_text == "":
        if run_id is not None:
            return {"events": [], "after": head, "head": head}
        after = max(0, head - limit)
    else:
        after = parse_seq(after_text, "after")
        if run_id is not None and not _is_event_of(ledger, after, run_id):
            # The run's index is entered at one of its own events (or its start); from any
            # other seq it walks the run's history, so read the log and keep the run's.
            page = ledger.events(after_seq=after, limit=limit)
            return {
                "events": [event_record(e) for e in page if e.resource_id == run_id],
                "after": page[-1].seq if page else after,
                "head": max(head, page[-1].seq if page else 0),
            }
    events = ledger.events(run_id, after_seq=after, limit=limit)
    return {
        "events": [event_record(e) for e in events],
        "after": events[-1].seq if events else after,
        "head": max(head, events[-1].seq if events else 0),
    }


def _is_event_of(ledger: fp.Ledger, seq: int, run_id: str) -> bool:
    """Whether ``seq`` is 0 or one of ``run_id``'s events (one primary-key probe)."""
    if seq == 0:
        return True
    found = ledger.events(after_seq=seq - 1, limit=1)
    return bool(found) and found[0].seq == seq and found[0].resource_id == run_id


class EventFeed:
    """The events a stream sends, waiting for them (``Ledger.wait_events``), optionally of one
    run. A run's events are read by its own index once the cursor is one of its events (its
    start, or an event of it a client resumes after); until then the whole log is read from
    the cursor and filtered, which costs what the log's new events do, where the run's index
    entered anywhere else would walk the run's whole history on every wake-up."""

    def __init__(self, ledger: fp.Ledger, run_id: str | None, after: int) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.after = after
        self.by_run = run_id is not None and _is_event_of(ledger, after, run_id)

    def wait(self, timeout_s: float, limit: int = 200) -> list[fp.Event]:
        if self.run_id is None or self.by_run:
            events = self.ledger.wait_events(
                self.run_id, after_seq=self.after, timeout_s=timeout_s, limit=limit
            )
            if events:
                self.after = events[-1].seq
            return events
        page = self.ledger.wait_events(after_seq=self.after, timeout_s=timeout_s, limit=limit)
        mine = [e for e in page if e.resource_id == self.run_id]
        if mine:
            self.after, self.by_run = mine[-1].seq, True
        elif page:
            self.after = page[-1].seq
        return mine


class Throughput:
    """Events per minute over the last hour (``minutes``, 5 to 180): ``Ledger.event_counts``,
    one read that finds each minute's boundary by probes of the log's primary key (exact when
    the range holds at most ``exact_max`` events), and the newest seq, one probe."""

    def __init__(self, exact_max: int = 5_000) -> None:
        self.exact_max = exact_max

    def __call__(self, ledger: fp.Ledger, query: Query, now_ms: int) -> dict[str, Any]:
        minutes = _int(query, "minutes", 60, 5, 180)
        current = now_ms // MINUTE_MS * MINUTE_MS
        since = fp.models.from_ms(current - (minutes - 1) * MINUTE_MS)
        counts = ledger.event_counts(since=since, minutes=minutes, exact_max=self.exact_max)
        return {
            "now": iso(fp.models.from_ms(now_ms)),
            "minutes": [{"start": iso(t), "count": c} for t, c in counts.minutes],
            "total": counts.total,
            "exact": counts.exact,
            "head": head_seq(ledger),
        }


def doctor(
    ledger: fp.Ledger, *, checks: Callable[[], _doctor.Checkup] | None = None
) -> dict[str, Any]:
    """``fencepost doctor``'s findings: settings and expired leases always (index reads); the
    integrity check and the orphan scan, which read the whole database, only through
    ``checks`` (the page asks for them with a button)."""
    found = _doctor.gather(ledger, checks=False) if checks is None else checks()
    report = found.report()
    expired = report["expired_leases_on_active_runs"]
    report["expired_leases_on_active_runs"] = expired[:LEASES_SHOWN]
    report["expired_leases_total"] = len(expired)
    report["checked"] = found.checked
    return report


def now_ms_of(clock: Callable[[], int] | None) -> int:
    """Epoch milliseconds from ``clock``, else the system's."""
    if clock is not None:
        return clock()
    return fp.models.to_ms(dt.datetime.now(dt.UTC))

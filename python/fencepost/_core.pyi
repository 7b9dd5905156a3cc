"""Stub for the compiled core (hand-written; checked by ``python -m mypy.stubtest``).

The facade (``fencepost.Ledger``) is the public API; these are the calls it makes. A method
with many keywords takes them as one dict, typed here by a ``TypedDict`` so mypy checks every
key and value the facade passes. Records come back as the models of :mod:`fencepost.models`;
``get_json`` returns canonical JSON bytes.

The calls the writer groups also take ``future=``: they then return ``None`` at once, and the
future (of the event loop the call is made on) gets the result or the exception.
"""

from asyncio import Future
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypedDict, final, overload

from fencepost.models import (
    Accounting,
    AdoptedPreparation,
    Attempt,
    Claim,
    ClaimedPreparation,
    Event,
    Lease,
    Message,
    Reservation,
    Run,
    Schedule,
    Step,
    Unit,
)

__version__: Final[str]
MAX_DEPTH: Final[int]
SCHEMA_VERSION: Final[int]
RUN_STATUSES: Final[tuple[str, ...]]
UNIT_STATUSES: Final[tuple[str, ...]]

def canonical_json(value: object) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of ``value``; raises ``CanonicalJsonError``."""

def digest(value: object) -> str:
    """``"sha256:" + hex(sha256(canonical_json(value)))``; raises ``CanonicalJsonError``."""

class _RunQuery(TypedDict):
    all_scopes: bool
    scope_key: str | None
    workflow_refs: list[str] | None
    active_only: bool
    include_children: bool
    statuses: list[str] | None
    limit: int | None
    after_updated_ms: int | None
    after_created_ms: int | None
    after_run_id: str | None
    workflow_name: str | None
    updated_after_ms: int | None
    updated_before_ms: int | None

class _PruneTotals(TypedDict):
    runs: int
    attempts: int
    events: int
    blobs: int
    archived_bytes: int
    dry_run: bool
    reclaimed_bytes: int
    transactions: int
    longest_transaction_ms: float

# The keyword sets passed as one dict (the facade's keywords of the same names).

class _StartRun(TypedDict):
    workflow_ref: str
    scope_key: str | None
    steps: Sequence[Mapping[str, Any]]
    params: object
    plan: object
    run_id: str | None
    title: str | None
    guard_refs: list[str] | None
    force: bool
    agent_harness: str | None
    agent_session_id: str | None
    retry: Mapping[str, Any] | None

class _ChildRun(TypedDict):
    parent_run_id: str
    parent_unit_id: str
    invocation_key: str
    workflow_ref: str
    steps: Sequence[Mapping[str, Any]]
    params: object
    plan: object
    run_id: str | None
    retry: Mapping[str, Any] | None

class _StepResult(TypedDict):
    status: str
    notes: str | None
    evidence: object
    summary: str | None

class _Unit(TypedDict):
    unit_id: str
    step_id: str
    node_id: str | None
    phase: str
    runner: str | None
    engine: str | None
    model: str | None
    input_hash: str | None
    worktree_path: str | None
    parent_unit_id: str | None
    holder: str | None
    trace_context: str | None
    force: bool

class _Finish(TypedDict):
    run_id: str
    unit_id: str
    attempt: int
    dispatch_id: str
    status: str
    result: object
    tokens: int | None
    failure_reason: str | None
    session_id: str | None

class _QueuedRun(TypedDict):
    run_id: str
    workflow_name: str
    workflow_ref: str
    source: object
    definition_digest: str
    definition: object
    input: object
    launch_options: object
    runner_id: str
    origin_session_id: str
    parent_run_id: str | None
    not_before_ms: int | None
    not_before_after_ms: int | None
    priority: int
    concurrency_key: str | None
    retry: Mapping[str, Any] | None

@final
class Ledger:
    def __new__(
        cls,
        path: str | None,
        url: str | None,
        schema: str | None,
        *,
        durability: str,
        busy_timeout_ms: int,
        clock: Callable[[], int] | None,
        create: bool,
        group_commit: bool = True,
        listen: bool = True,
    ) -> Ledger: ...
    def target(self) -> str: ...
    def close(self) -> None: ...
    def check_process(self) -> None: ...
    def group_stats(self) -> dict[str, int]: ...
    def wait_stats(self) -> dict[str, int]: ...
    def watch(self) -> Watch: ...
    def pragmas(self) -> dict[str, Any]: ...
    def integrity_check(self, *, quick: bool = False) -> list[str]: ...
    def orphan_attempts(self) -> list[tuple[str, str, int, str]]: ...
    def put_json(self, value: object) -> str: ...
    def get_json(self, digest: str) -> bytes: ...
    def start_run(self, run: _StartRun) -> Run: ...
    def publish_child_run(self, child: _ChildRun) -> Run: ...
    def get_run(self, run_id: str) -> Run | None: ...
    def resolve_run_id(self, prefix: str) -> str: ...
    def list_runs(self, query: _RunQuery) -> list[Run]: ...
    def find_active_run(
        self, workflow_refs: list[str] | None, scope_key: str, outside: bool
    ) -> Run | None: ...
    def find_scope_occupant(self, scope_key: str) -> Run | None: ...
    def child_runs(self, parent_run_id: str) -> list[Run]: ...
    def child_summary(self, parent_run_id: str) -> list[tuple[str, int]]: ...
    def run_counts(self, count_max: int) -> list[tuple[str, int]]: ...
    def steps(self, run_id: str) -> list[Step]: ...
    @overload
    def complete_step(
        self,
        run_id: str,
        step_id: str,
        result: _StepResult,
        claim: Claim | None,
        *,
        future: None = None,
    ) -> Run: ...
    @overload
    def complete_step(
        self,
        run_id: str,
        step_id: str,
        result: _StepResult,
        claim: Claim | None,
        *,
        future: Future[Run],
    ) -> None: ...
    def block_run(self, run_id: str, notes: str | None) -> Run: ...
    def resume_run(self, run_id: str) -> Run: ...
    def abandon_run(self, run_id: str, reason: str | None, cascade: bool) -> bool: ...
    def set_outputs(self, run_id: str, outputs: object, claim: Claim | None) -> None: ...
    @overload
    def reserve_attempt(
        self, run_id: str, unit: _Unit, claim: Claim | None, *, future: None = None
    ) -> Reservation: ...
    @overload
    def reserve_attempt(
        self, run_id: str, unit: _Unit, claim: Claim | None, *, future: Future[Reservation]
    ) -> None: ...
    @overload
    def reserve_attempts(
        self,
        run_id: str,
        units: Sequence[Mapping[str, Any]],
        claim: Claim | None,
        *,
        force: bool = False,
        future: None = None,
    ) -> list[Reservation]: ...
    @overload
    def reserve_attempts(
        self,
        run_id: str,
        units: Sequence[Mapping[str, Any]],
        claim: Claim | None,
        *,
        force: bool = False,
        future: Future[list[Reservation]],
    ) -> None: ...
    @overload
    def finish_attempt(
        self, finish: _Finish, claim: Claim | None, *, future: None = None
    ) -> bool: ...
    @overload
    def finish_attempt(
        self, finish: _Finish, claim: Claim | None, *, future: Future[bool]
    ) -> None: ...
    @overload
    def finish_attempts(
        self, finishes: Sequence[Mapping[str, Any]], claim: Claim | None, *, future: None = None
    ) -> list[bool]: ...
    @overload
    def finish_attempts(
        self,
        finishes: Sequence[Mapping[str, Any]],
        claim: Claim | None,
        *,
        future: Future[list[bool]],
    ) -> None: ...
    def attempts(self, run_id: str, unit_id: str) -> list[Attempt]: ...
    def unit_attempts(self, run_id: str, unit_ids: list[str], latest: int) -> list[Attempt]: ...
    def newest_event_seq(self) -> int: ...
    def event_counts(
        self, first_ms: int | None, minutes: int, exact_max: int
    ) -> tuple[int, list[int], bool]: ...
    def units(
        self,
        run_id: str,
        step_id: str | None,
        *,
        status: str | None,
        limit: int | None,
        after: str | None,
    ) -> list[Unit]: ...
    def due_units(
        self, run_id: str | None, limit: int, after: tuple[int, str, str] | None
    ) -> list[Unit]: ...
    def exhausted_units(
        self, run_id: str | None, limit: int, after: tuple[str, str] | None
    ) -> list[Unit]: ...
    def retry_units(self, run_id: str, unit_ids: list[str] | None, claim: Claim | None) -> int: ...
    def cancel_units(
        self, run_id: str, unit_ids: list[str] | None, reason: str | None, claim: Claim | None
    ) -> int: ...
    def send(self, run_id: str, topic: str, payload: object, key: str | None) -> Message: ...
    def receive(self, run_id: str, topic: str, claim: Claim, limit: int) -> list[Message]: ...
    def messages(
        self, run_id: str, topic: str | None, after_seq: int, limit: int
    ) -> list[Message]: ...
    def put_schedule(
        self,
        name: str,
        cron: str,
        timezone: str,
        overlap: str,
        catch_up: int,
        run: _QueuedRun,
    ) -> Schedule: ...
    def schedules(self) -> list[Schedule]: ...
    def pause_schedule(self, name: str) -> None: ...
    def resume_schedule(self, name: str) -> None: ...
    def delete_schedule(self, name: str) -> None: ...
    def tick_schedules(self) -> list[Run]: ...
    def unit_counts(self, run_id: str) -> list[tuple[str, int]]: ...
    def unit(self, run_id: str, unit_id: str) -> Unit | None: ...
    def accounting(self, run_id: str) -> Accounting: ...
    def reserve_run(self, run: _QueuedRun) -> Run: ...
    def prepare_or_adopt(
        self, run: _QueuedRun, lease_ms: int, claim_token: str | None
    ) -> ClaimedPreparation | AdoptedPreparation: ...
    def claim(
        self, run_id: str, runner_id: str, lease_ms: int, token: str | None
    ) -> Claim | None: ...
    def claim_next(
        self,
        runner_id: str,
        lease_ms: int,
        workflow_names: list[str] | None,
        limit: int,
        token: str | None,
        rescue: bool,
    ) -> list[Claim]: ...
    def set_concurrency_limit(self, concurrency_key: str, limit: int | None) -> None: ...
    def concurrency_limits(self) -> list[tuple[str, int]]: ...
    def pause_workflow(self, workflow_name: str) -> None: ...
    def resume_workflow(self, workflow_name: str) -> None: ...
    def paused_workflows(self) -> list[str]: ...
    def queued_runs(
        self, lane: str, limit: int, after: tuple[int, int, str] | None
    ) -> list[Run]: ...
    def queue_overview(
        self, count_max: int, limit: int, after_key: str | None
    ) -> tuple[int, int, int, list[tuple[str, int, int, int]], list[tuple[str, int, int]]]: ...
    @overload
    def heartbeat(self, claim: Claim, lease_ms: int, *, future: None = None) -> Claim: ...
    @overload
    def heartbeat(self, claim: Claim, lease_ms: int, *, future: Future[Claim]) -> None: ...
    def release(self, claim: Claim) -> None: ...
    @overload
    def set_status(self, run_id: str, status: str, claim: Claim, *, future: None = None) -> Run: ...
    @overload
    def set_status(
        self, run_id: str, status: str, claim: Claim, *, future: Future[Run]
    ) -> None: ...
    def lease(self, run_id: str) -> Lease: ...
    def expired_leases(self, active_only: bool) -> list[Lease]: ...
    def leases(self, owned_only: bool, run_ids: list[str] | None) -> list[Lease]: ...
    def events(
        self, run_id: str | None, after_seq: int, limit: int, types: list[str] | None
    ) -> list[Event]: ...
    def wait_events(
        self,
        run_id: str | None,
        after_seq: int,
        timeout_s: float,
        types: list[str] | None,
        limit: int,
    ) -> list[Event]: ...
    def prune(
        self,
        *,
        cutoff_ms: int | None,
        age_ms: int | None,
        statuses: list[str],
        limit: int | None,
        dry_run: bool,
        sink: Callable[[bytes], None] | None,
        progress: Callable[[_PruneTotals], None] | None,
    ) -> _PruneTotals: ...
    def restore(
        self, lines: Callable[[], Iterator[bytes]], *, progress: Callable[[int], None] | None
    ) -> int: ...
    def vacuum(self) -> None: ...

@final
class Watch:
    def next(self, timeout_s: float) -> bool: ...

def wait_timeout(timeout_s: float) -> float: ...
def observe_groups(on: bool) -> None:
    """Queue the size of every committed group for ``fencepost._observe`` (metrics), or stop."""

def notices_dropped() -> int:
    """Notices the core dropped because nothing drained its queue in time."""

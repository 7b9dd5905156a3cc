"""Stub for the compiled core (hand-written; checked by ``python -m mypy.stubtest``).

The facade (``fencepost.Ledger``) is the typed public API; these are its positional calls.
JSON values come back as canonical JSON bytes, times as epoch milliseconds.
"""

from collections.abc import Callable
from typing import Any, Final, final

__version__: Final[str]
MAX_DEPTH: Final[int]
SCHEMA_VERSION: Final[int]

def canonical_json(value: object) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of ``value``; raises ``CanonicalJsonError``."""

def digest(value: object) -> str:
    """``"sha256:" + hex(sha256(canonical_json(value)))``; raises ``CanonicalJsonError``."""

_RunRow = tuple[Any, ...]
_Reservation = tuple[str, str, str, int, str, int, int | None]
_Claim = tuple[str, int, str, str, int]
_Lease = tuple[str, int, str | None, str | None, int | None, int | None]

@final
class Ledger:
    def __new__(
        cls,
        path: object,
        durability: str,
        busy_timeout_ms: int,
        clock: Callable[[], int] | None,
        create: bool = True,
        url: object = None,
        schema: object = None,
    ) -> Ledger: ...
    def target(self) -> str: ...
    def close(self) -> None: ...
    def pragmas(self) -> dict[str, Any]: ...
    def integrity_check(self) -> list[str]: ...
    def orphan_attempts(self) -> list[tuple[str, str, int, str]]: ...
    def put_json(self, value: object) -> str: ...
    def get_json(self, digest: object) -> bytes: ...
    def start_run(
        self,
        workflow_ref: object,
        scope_key: object,
        steps: object,
        params: object,
        plan: object,
        run_id: object,
        title: object,
        guard_refs: object,
        force: object,
        agent_harness: object,
        agent_session_id: object,
    ) -> _RunRow: ...
    def publish_child_run(
        self,
        parent_run_id: object,
        parent_unit_id: object,
        invocation_key: object,
        workflow_ref: object,
        steps: object,
        params: object,
        plan: object,
        run_id: object,
    ) -> _RunRow: ...
    def get_run(self, run_id: object) -> _RunRow | None: ...
    def resolve_run_id(self, prefix: object) -> str: ...
    def list_runs(
        self,
        all_scopes: bool,
        scope_key: object,
        workflow_refs: object,
        active_only: object,
        include_children: object,
    ) -> list[_RunRow]: ...
    def find_active_run(
        self, workflow_refs: object, scope_key: object, outside: bool
    ) -> _RunRow | None: ...
    def find_scope_occupant(self, scope_key: object) -> _RunRow | None: ...
    def child_runs(self, parent_run_id: object) -> list[_RunRow]: ...
    def steps(self, run_id: object) -> list[tuple[Any, ...]]: ...
    def complete_step(
        self,
        run_id: object,
        step_id: object,
        status: object,
        notes: object,
        evidence: object,
        summary: object,
        claim: object,
    ) -> _RunRow: ...
    def block_run(self, run_id: object, notes: object) -> _RunRow: ...
    def resume_run(self, run_id: object) -> _RunRow: ...
    def abandon_run(self, run_id: object) -> bool: ...
    def set_outputs(self, run_id: object, outputs: object, claim: object) -> None: ...
    def reserve_attempt(
        self,
        run_id: object,
        unit_id: object,
        step_id: object,
        node_id: object,
        phase: object,
        runner: object,
        engine: object,
        model: object,
        input_hash: object,
        worktree_path: object,
        parent_unit_id: object,
        holder: object,
        claim: object,
    ) -> _Reservation: ...
    def reserve_attempts(
        self, run_id: object, units: object, claim: object
    ) -> list[_Reservation]: ...
    def finish_attempt(
        self,
        run_id: object,
        unit_id: object,
        attempt: object,
        dispatch_id: object,
        status: object,
        result: object,
        tokens: object,
        failure_reason: object,
        session_id: object,
        claim: object,
    ) -> bool: ...
    def finish_attempts(self, finishes: object, claim: object) -> list[bool]: ...
    def attempts(self, run_id: object, unit_id: object) -> list[tuple[Any, ...]]: ...
    def units(self, run_id: object, step_id: object) -> list[tuple[Any, ...]]: ...
    def unit(self, run_id: object, unit_id: object) -> tuple[Any, ...] | None: ...
    def accounting(self, run_id: object) -> tuple[int, int, int, int, int, int]: ...
    def reserve_run(
        self,
        run_id: object,
        workflow_name: object,
        workflow_ref: object,
        source: object,
        definition_digest: object,
        definition: object,
        input: object,
        launch_options: object,
        runner_id: object,
        origin_session_id: object,
        parent_run_id: object,
    ) -> _RunRow: ...
    def prepare_or_adopt(
        self,
        run_id: object,
        workflow_name: object,
        workflow_ref: object,
        source: object,
        definition_digest: object,
        definition: object,
        input: object,
        launch_options: object,
        runner_id: object,
        origin_session_id: object,
        parent_run_id: object,
        lease_ms: object,
        claim_token: object,
    ) -> tuple[str, _RunRow, _Claim | None]: ...
    def claim(
        self, run_id: object, runner_id: object, lease_ms: object, token: object
    ) -> _Claim | None: ...
    def heartbeat(self, claim: object, lease_ms: object) -> _Claim: ...
    def release(self, claim: object) -> None: ...
    def set_status(self, run_id: object, status: object, claim: object) -> _RunRow: ...
    def lease(self, run_id: object) -> _Lease: ...
    def expired_leases(self) -> list[_Lease]: ...
    def events(
        self, run_id: object, after_seq: object, limit: object, types: object
    ) -> list[tuple[Any, ...]]: ...

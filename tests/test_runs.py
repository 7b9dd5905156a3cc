"""Runs and steps, the orchestrator's API (``runs``): starting under the scope guard, idempotent
child runs, lookups, step progress, and the run lifecycle every status change goes through."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import STEPS, FakeClock, queued, started

UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def start(
    ledger: fp.Ledger, ref: str = "wf/build", scope: str | None = "dir:v1:/repo", **kw: Any
) -> fp.Run:
    return ledger.start_run(ref, scope_key=scope, steps=STEPS, **kw)


# ----------------------------------------------------------------------------- start_run


def test_start_run_creates_active_run_with_first_step(ledger: fp.Ledger, clock: FakeClock) -> None:
    run = start(ledger, params={"n": 1}, title="Build the thing")
    assert UUID7.fullmatch(run.run_id)
    assert run.status == "active"
    assert run.current_step_id == "plan"
    assert run.workflow_ref == "wf/build"
    assert run.workflow_name == "Build the thing"
    assert run.scope_key == "dir:v1:/repo"
    assert run.params == {"n": 1}
    assert run.outputs is None
    assert run.revision == 1
    assert run.parent_run_id is None
    assert run.invocation_key is None
    assert run.created_at == run.updated_at == fp.models.from_ms(clock.now)
    assert run.created_at.tzinfo is dt.UTC
    assert run.completed_at is None
    assert ledger.get_run(run.run_id) == run
    steps = ledger.steps(run.run_id)
    assert [(s.step_id, s.sequence_index, s.status) for s in steps] == [
        ("plan", 0, "active"),
        ("build", 1, "pending"),
        ("ship", 2, "pending"),
    ]
    assert steps[0].title == "Plan"
    assert steps[0].instructions == "Write the plan"
    assert steps[2].instructions == ""  # defaults to empty
    events = ledger.events(run.run_id)
    assert [(e.type, e.revision, e.resource_id) for e in events] == [("run.started", 1, run.run_id)]
    assert events[0].payload == {"run_id": run.run_id, "status": "active"}


def test_generated_run_ids_sort_by_time(ledger: fp.Ledger, clock: FakeClock) -> None:
    ids = []
    for i in range(5):
        clock.advance(1)
        ids.append(start(ledger, scope=f"s{i}").run_id)
    assert ids == sorted(ids)


def test_explicit_run_id_validated_and_unique(ledger: fp.Ledger) -> None:
    run = start(ledger, run_id="run-1.a:b_c")
    assert run.run_id == "run-1.a:b_c"
    with pytest.raises(fp.InvalidArgument) as info:
        start(ledger, run_id="run-1.a:b_c", scope="other")
    assert info.value.argument == "run_id"
    assert "already exists" in str(info.value)
    for bad in ["", "has space", "x" * 129, "slash/no", "é"]:
        with pytest.raises(fp.InvalidArgument) as info:
            start(ledger, run_id=bad, scope="other")
        assert info.value.argument == "run_id"


@pytest.mark.parametrize(
    "steps",
    [[], [{"title": "no id"}], [{"id": "a"}, {"id": "a"}], "notalist", [{"id": ""}]],
    ids=["empty", "missing id", "duplicate", "not a list", "empty id"],
)
def test_bad_steps_are_refused(ledger: fp.Ledger, steps: Any) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.start_run("wf", scope_key="s", steps=steps)
    assert info.value.argument == "steps"
    assert ledger.list_runs() == []


def test_bad_params_write_nothing(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.CanonicalJsonError) as info:
        start(ledger, params={"x": float("inf")})
    assert info.value.argument == "params"
    assert info.value.path == "$.x"
    assert ledger.list_runs() == []
    assert ledger.events() == []


def test_scope_guard_refuses_second_active_run(ledger: fp.Ledger) -> None:
    first = start(ledger)
    with pytest.raises(fp.ActiveRunExists) as info:
        start(ledger)
    assert info.value.scope_key == "dir:v1:/repo"
    assert info.value.occupant_run_id == first.run_id
    assert len(ledger.list_runs()) == 1
    # Other scopes and other refs are free; force skips the guard.
    start(ledger, scope="dir:v1:/other")
    start(ledger, ref="wf/other")
    forced = start(ledger, force=True)
    assert forced.status == "active"
    # guard_refs widens the guard to other workflow refs in the same scope.
    with pytest.raises(fp.ActiveRunExists):
        start(ledger, ref="wf/third", guard_refs=["wf/third", "wf/build"])


def test_scope_guard_ignores_blocked_and_terminal_runs(ledger: fp.Ledger) -> None:
    first = start(ledger)
    ledger.block_run(first.run_id, notes="waiting")
    second = start(ledger)  # the start guard ignores blocked runs
    assert ledger.abandon_run(second.run_id) is True
    third = start(ledger)
    assert third.status == "active"
    # Resuming the blocked one now would make two active runs in the scope.
    with pytest.raises(fp.ActiveRunExists) as info:
        ledger.resume_run(first.run_id)
    assert info.value.occupant_run_id == third.run_id
    assert ledger.get_run(first.run_id).status == "blocked"


def test_null_scope_with_guard_is_a_usage_error(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        start(ledger, scope=None)
    assert info.value.argument == "scope_key"
    assert start(ledger, scope=None, force=True).scope_key is None


# ----------------------------------------------------------------------------- children


def test_publish_child_run_is_idempotent(ledger: fp.Ledger) -> None:
    parent = start(ledger)
    child = ledger.publish_child_run(
        parent.run_id,
        parent_unit_id="u-7",
        invocation_key="k1",
        workflow_ref="wf/child",
        steps=[{"id": "only"}],
        params={"p": 2},
    )
    assert child.parent_run_id == parent.run_id
    assert child.parent_unit_id == "u-7"
    assert child.invocation_key == "k1"
    assert child.scope_key == parent.scope_key  # inherited
    assert child.status == "active"
    assert child.current_step_id == "only"
    # Same key, different candidate id and steps: the first child comes back.
    again = ledger.publish_child_run(
        parent.run_id,
        parent_unit_id="u-8",
        invocation_key="k1",
        workflow_ref="wf/child",
        steps=[{"id": "x"}, {"id": "y"}],
        run_id="candidate-2",
    )
    assert again == child
    assert ledger.get_run("candidate-2") is None
    # The same key for another workflow is a mistake, not a retry: refused, naming both.
    with pytest.raises(fp.InvalidArgument) as other:
        ledger.publish_child_run(
            parent.run_id,
            parent_unit_id="u-8",
            invocation_key="k1",
            workflow_ref="wf/other",
            steps=[{"id": "x"}],
            run_id="candidate-3",
        )
    assert other.value.argument == "workflow_ref"
    assert "wf/child" in str(other.value)
    assert "wf/other" in str(other.value)
    assert ledger.get_run("candidate-3") is None
    assert [e.type for e in ledger.events(child.run_id)] == ["run.started"]
    # The scope guard does not apply to children, and publishing leaves the parent untouched.
    assert ledger.get_run(parent.run_id) == parent
    assert ledger.child_runs(parent.run_id) == [child]


def _child(ledger: fp.Ledger, parent: str, key: str) -> fp.Run:
    return ledger.publish_child_run(
        parent, parent_unit_id="u", invocation_key=key, workflow_ref="wf/child", steps=STEPS
    )


def test_abandon_cancels_the_whole_live_tree_in_one_go(ledger: fp.Ledger) -> None:
    """Three levels, each with a running attempt: abandoning the root cancels every run and
    every running attempt (each with its ``unit.finished``); a finished child stays as it was;
    nothing new can be published below the cancelled runs, while a retry of an existing key
    still finds its child."""
    root = start(ledger, scope=None, force=True)
    mid = _child(ledger, root.run_id, "k-mid")
    leaf = _child(ledger, mid.run_id, "k-leaf")
    done = _child(ledger, root.run_id, "k-done")
    assert ledger.abandon_run(done.run_id)
    for r in (root, mid, leaf):
        ledger.reserve_attempt(r.run_id, "u1", step_id=r.current_step_id)
    assert ledger.abandon_run(root.run_id, reason="deploy called off") is True
    for r in (root, mid, leaf):
        got = ledger.get_run(r.run_id)
        assert got is not None
        assert got.status == "cancelled", r.run_id
        attempt = ledger.attempts(r.run_id, "u1")[0]
        assert (attempt.status, attempt.failure_reason) == ("cancelled", "deploy called off")
        status = [e for e in ledger.events(r.run_id) if e.type == "run.status"][-1]
        assert status.payload["reason"] == "deploy called off"
        assert status.payload["to"] == "cancelled"
    # The child cancelled before keeps its own (single) cancellation.
    assert [e.type for e in ledger.events(done.run_id)].count("run.status") == 1
    assert ledger.abandon_run(root.run_id) is False
    with pytest.raises(fp.RunNotActive) as refused:
        _child(ledger, mid.run_id, "k-new")
    assert (refused.value.run_id, refused.value.status) == (mid.run_id, "cancelled")
    assert [c.run_id for c in ledger.child_runs(mid.run_id)] == [leaf.run_id]
    assert _child(ledger, mid.run_id, "k-leaf") == ledger.get_run(leaf.run_id)


def test_abandon_without_cascade_leaves_the_children(ledger: fp.Ledger) -> None:
    root = start(ledger, scope=None, force=True)
    kid = _child(ledger, root.run_id, "k")
    assert ledger.abandon_run(root.run_id, cascade=False)
    assert ledger.get_run(kid.run_id).status == "active"  # type: ignore[union-attr]
    with pytest.raises(fp.InvalidArgument) as bad:
        ledger.abandon_run(kid.run_id, reason="x\x00y")
    assert bad.value.argument == "reason"
    assert ledger.get_run(kid.run_id).status == "active"  # type: ignore[union-attr]


def test_child_of_unknown_parent(ledger: fp.Ledger) -> None:
    with pytest.raises(fp.RunNotFound) as info:
        ledger.publish_child_run(
            "nope", parent_unit_id="u", invocation_key="k", workflow_ref="w", steps=[{"id": "a"}]
        )
    assert info.value.run_id == "nope"


def test_child_runs_order_and_empty(ledger: fp.Ledger, clock: FakeClock) -> None:
    parent = start(ledger)
    assert ledger.child_runs(parent.run_id) == []
    kids = []
    for key in ["b", "a", "c"]:
        clock.advance(5)
        kids.append(
            ledger.publish_child_run(
                parent.run_id,
                parent_unit_id="u",
                invocation_key=key,
                workflow_ref="wf/child",
                steps=[{"id": "s"}],
            )
        )
    assert [k.run_id for k in ledger.child_runs(parent.run_id)] == [k.run_id for k in kids]


# ----------------------------------------------------------------------------- lookups


def test_resolve_run_id(ledger: fp.Ledger) -> None:
    a = start(ledger, run_id="abc-1", scope="s1")
    start(ledger, run_id="abc-2", scope="s2")
    start(ledger, run_id="a_c-9", scope="s3")
    assert ledger.resolve_run_id("abc-1") == a.run_id
    with pytest.raises(fp.AmbiguousRunId) as info:
        ledger.resolve_run_id("abc")
    assert info.value.prefix == "abc"
    assert info.value.matches == ["abc-1", "abc-2"]
    # LIKE metacharacters are literal: "a_c" would otherwise also match "abc-1"/"abc-2".
    assert ledger.resolve_run_id("a_c") == "a_c-9"
    with pytest.raises(fp.RunNotFound) as missing:
        ledger.resolve_run_id("a%")
    assert missing.value.run_id == "a%"
    with pytest.raises(fp.RunNotFound):
        ledger.resolve_run_id("ab\\")


def test_resolve_run_id_is_exact_first_case_sensitive_and_bounded(ledger: fp.Ledger) -> None:
    for run_id in ("deploy", "deploy-2", "deploy_3", "Zeta"):
        ledger.start_run("wf", scope_key=run_id, steps=STEPS, run_id=run_id)
    assert ledger.resolve_run_id("deploy") == "deploy"  # an exact id wins over longer ones
    assert ledger.resolve_run_id("deploy-") == "deploy-2"
    assert ledger.resolve_run_id("deploy_") == "deploy_3"  # `_` is literal
    assert ledger.resolve_run_id("Z") == "Zeta"
    with pytest.raises(fp.AmbiguousRunId) as info:
        ledger.resolve_run_id("dep")
    assert sorted(info.value.matches) == ["deploy", "deploy-2", "deploy_3"]
    for missing in ("DEPLOY", "zeta", "deploy%", "deploy-3"):
        with pytest.raises(fp.RunNotFound):
            ledger.resolve_run_id(missing)
    for bad, says in (("", "empty"), ("d" * 60_000, "1024 bytes"), ("d\x00", "NUL")):
        with pytest.raises(fp.InvalidArgument, match=says) as bad_info:
            ledger.resolve_run_id(bad)
        assert bad_info.value.argument == "prefix"


def test_list_runs_filters_and_order(ledger: fp.Ledger, clock: FakeClock) -> None:
    r1 = start(ledger, ref="wf/a", scope="s1")
    clock.advance(10)
    r2 = start(ledger, ref="wf/b", scope="s1")
    clock.advance(10)
    r3 = start(ledger, ref="wf/a", scope="s2")
    clock.advance(10)
    ledger.block_run(r1.run_id)  # r1 is now the most recently updated
    child = ledger.publish_child_run(
        r3.run_id, parent_unit_id="u", invocation_key="k", workflow_ref="wf/a", steps=STEPS
    )
    ids = lambda runs: [r.run_id for r in runs]  # noqa: E731
    assert ids(ledger.list_runs()) == [r1.run_id, r3.run_id, r2.run_id]
    assert ids(ledger.list_runs(include_children=True))[0] == child.run_id
    assert ids(ledger.list_runs(scope_key="s1")) == [r1.run_id, r2.run_id]
    assert ids(ledger.list_runs(workflow_refs=["wf/a"])) == [r1.run_id, r3.run_id]
    assert ids(ledger.list_runs(active_only=True)) == [r3.run_id, r2.run_id]
    assert ids(
        ledger.list_runs(scope_key=fp.ALL_SCOPES, active_only=True, workflow_refs=["wf/b"])
    ) == [r2.run_id]


def test_find_active_run_and_outside_scope(ledger: fp.Ledger) -> None:
    here = start(ledger, ref="wf/a", scope="s1")
    assert ledger.find_active_run(["wf/a"], "s1") == here
    assert ledger.find_active_run("wf/a", "s1") == here
    assert ledger.find_active_run([], "s1") is None
    assert ledger.find_active_run(["wf/a"], "s2") is None
    # A same-scope row must never mask another scope's stale run.
    assert ledger.find_active_run_outside_scope(["wf/a"], "s1") is None
    stale = start(ledger, ref="wf/a", scope="s0")
    assert ledger.find_active_run_outside_scope(["wf/a"], "s1") == stale
    unscoped = start(ledger, ref="wf/z", scope=None, force=True)
    assert ledger.find_active_run_outside_scope(["wf/z"], "s1") == unscoped


def test_find_scope_occupant(ledger: fp.Ledger) -> None:
    assert ledger.find_scope_occupant("s1") is None
    run = start(ledger, scope="s1")
    ledger.block_run(run.run_id)
    occupant = ledger.find_scope_occupant("s1")
    assert occupant is not None
    assert occupant.run_id == run.run_id
    assert occupant.status == "blocked"
    ledger.abandon_run(run.run_id)
    assert ledger.find_scope_occupant("s1") is None


def test_unknown_run_reads(ledger: fp.Ledger) -> None:
    assert ledger.get_run("missing") is None
    with pytest.raises(fp.RunNotFound):
        ledger.steps("missing")


# ----------------------------------------------------------------------------- lifecycle


def test_complete_steps_advances_and_completes(ledger: fp.Ledger, clock: FakeClock) -> None:
    run = start(ledger)
    clock.advance(100)
    run = ledger.complete_step(
        run.run_id, "plan", notes="ok", evidence={"links": ["x"]}, summary="planned"
    )
    assert run.current_step_id == "build"
    assert run.status == "active"
    plan = ledger.steps(run.run_id)[0]
    assert (plan.status, plan.notes, plan.evidence, plan.summary) == (
        "completed",
        "ok",
        {"links": ["x"]},
        "planned",
    )
    assert plan.completed_at == fp.models.from_ms(clock.now)
    run = ledger.complete_step(run.run_id, "build", status="skipped")
    assert run.current_step_id == "ship"
    run = ledger.complete_step(run.run_id, "ship")
    assert run.status == "completed"
    assert run.completed_at == fp.models.from_ms(clock.now)
    assert run.current_step_id is None
    types = [e.type for e in ledger.events(run.run_id)]
    assert types == [
        "run.started",
        "step.completed",
        "step.completed",
        "step.completed",
        "run.status",
    ]
    revisions = [e.revision for e in ledger.events(run.run_id)]
    assert revisions == [1, 2, 3, 4, 5]
    assert run.revision == 5


def test_complete_step_refusals(ledger: fp.Ledger) -> None:
    run = start(ledger)
    with pytest.raises(fp.InvalidArgument) as info:
        ledger.complete_step(run.run_id, "build")  # not the current step
    assert info.value.argument == "step_id"
    assert "plan" in str(info.value)
    with pytest.raises(fp.NotFound) as nf:
        ledger.complete_step(run.run_id, "nope")
    assert nf.value.kind == "step"
    with pytest.raises(fp.InvalidArgument) as st:
        ledger.complete_step(run.run_id, "plan", status="done")
    assert st.value.argument == "status"
    with pytest.raises(fp.CanonicalJsonError) as cj:
        ledger.complete_step(run.run_id, "plan", evidence={1: 2})
    assert cj.value.argument == "evidence"
    assert ledger.get_run(run.run_id) == run  # nothing written by any refusal
    ledger.abandon_run(run.run_id)
    with pytest.raises(fp.RunNotActive) as na:
        ledger.complete_step(run.run_id, "plan")
    assert (na.value.run_id, na.value.status) == (run.run_id, "cancelled")


def test_block_resume_reopens_current_step(ledger: fp.Ledger) -> None:
    run = start(ledger)
    blocked = ledger.block_run(run.run_id, notes="need input")
    assert blocked.status == "blocked"
    assert blocked.revision == 2
    step = ledger.steps(run.run_id)[0]
    assert (step.status, step.notes) == ("blocked", "need input")
    with pytest.raises(fp.RunNotActive):
        ledger.block_run(run.run_id)
    resumed = ledger.resume_run(run.run_id)
    assert resumed.status == "active"
    assert resumed.current_step_id == "plan"
    step = ledger.steps(run.run_id)[0]
    assert (step.status, step.notes, step.evidence) == ("active", None, None)
    # A failed step blocks the run until resumed.
    failed = ledger.complete_step(run.run_id, "plan", status="failed", notes="boom")
    assert failed.status == "blocked"
    assert ledger.steps(run.run_id)[0].status == "failed"
    assert ledger.resume_run(run.run_id).status == "active"
    assert [e.type for e in ledger.events(run.run_id)].count("run.status") == 4


def test_terminal_runs_cannot_be_revived(ledger: fp.Ledger) -> None:
    run = start(ledger)
    assert ledger.abandon_run(run.run_id) is True
    assert ledger.abandon_run(run.run_id) is False
    abandoned = ledger.get_run(run.run_id)
    assert abandoned.status == "cancelled"
    assert abandoned.completed_at is not None
    for op in (ledger.resume_run, ledger.block_run):
        with pytest.raises(fp.RunNotActive) as info:
            op(run.run_id)
        assert info.value.status == "cancelled"
    assert ledger.get_run(run.run_id) == abandoned
    with pytest.raises(fp.RunNotFound):
        ledger.abandon_run("missing")


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (["active", "blocked", "active", "parked", "completed"], True),
        (["active", "completed"], True),
        (["active", "failed"], True),
        (["cancelled"], True),
        (["active", "blocked", "cancelled"], True),
        (["queued"], False),
        (["completed"], False),
        (["active", "starting"], False),
        (["active", "parked", "active"], False),
        (["active", "active"], False),
    ],
)
def test_set_status_follows_the_lifecycle(
    ledger: fp.Ledger, path: list[str], allowed: bool
) -> None:
    ledger.reserve_run("run-1", **queued())
    claim = ledger.claim("run-1", "host-a", lease_ms=60_000)
    assert claim is not None
    *ok, last = path
    for status in ok:
        ledger.set_status("run-1", status, claim=claim)
    before = ledger.get_run("run-1")
    assert before is not None
    if allowed:
        run = ledger.set_status("run-1", last, claim=claim)
        assert run.status == last
        assert run.revision == before.revision + 1
        assert (run.completed_at is not None) == (last in ("completed", "failed", "cancelled"))
        event = ledger.events("run-1")[-1]
        assert (event.type, event.payload["from"], event.payload["to"]) == (
            "run.status", before.status, last,
        )  # fmt: skip
        assert event.generation == 1
    else:
        with pytest.raises(fp.InvalidArgument) as err:
            ledger.set_status("run-1", last, claim=claim)
        assert err.value.argument == "status"
        assert before.status in str(err.value)
        assert last in str(err.value)
        assert ledger.get_run("run-1") == before


def test_set_status_unknown_status(ledger: fp.Ledger) -> None:
    claim = started(ledger)
    with pytest.raises(fp.InvalidArgument, match="must be one of"):
        ledger.set_status("run-1", "running", claim=claim)


def test_set_status_cannot_break_the_scope_guard(ledger: fp.Ledger) -> None:
    # A queued run has no scope, so it never trips the guard; blocked -> active on a guarded
    # start_run run goes through the same transition and keeps the guard.
    ledger.start_run("wf", scope_key="s1", steps=[{"id": "a"}], run_id="one")
    claim = ledger.claim("one", "host-a", lease_ms=60_000)
    assert claim is not None
    ledger.set_status("one", "blocked", claim=claim)
    ledger.start_run("wf", scope_key="s1", steps=[{"id": "a"}], run_id="two")
    with pytest.raises(fp.ActiveRunExists) as err:
        ledger.set_status("one", "active", claim=claim)
    assert err.value.occupant_run_id == "two"


def test_set_outputs(ledger: fp.Ledger) -> None:
    run = start(ledger)
    ledger.set_outputs(run.run_id, {"artifact": "s3://x", "score": 0.5})
    assert ledger.get_run(run.run_id).outputs == {"artifact": "s3://x", "score": 0.5}
    with pytest.raises(fp.CanonicalJsonError) as info:
        ledger.set_outputs(run.run_id, {"bad": float("nan")})
    assert info.value.argument == "outputs"
    with pytest.raises(fp.RunNotFound):
        ledger.set_outputs("missing", {})


def test_results_survive_reopen(tmp_path: Any, clock: FakeClock) -> None:
    path = str(tmp_path / "persist.db")
    with fp.Ledger.open(path, clock=clock) as ledger:
        run = start(ledger)
        ledger.complete_step(run.run_id, "plan")
    with fp.Ledger.open(path, clock=clock) as again:
        assert again.get_run(run.run_id).current_step_id == "build"
        assert [s.status for s in again.steps(run.run_id)] == ["completed", "active", "pending"]

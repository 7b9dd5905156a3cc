"""The examples, each run as a real subprocess on the ledger the fencepost.testing plugin makes.

    python -m pytest -q examples -p fencepost.testing --fencepost-backend=all -p no:cacheprovider

``--fencepost-backend=all`` runs each test on a SQLite file and on a PostgreSQL schema of its
own (dropped afterwards); the in-memory backend is skipped, since a subprocess cannot open
the test's in-memory database. The outcomes are read back from the ledger, not taken from the
examples' word.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import fencepost as fp

EXAMPLES = pathlib.Path(__file__).resolve().parent


@pytest.fixture
def shared_target(ledger_target: str, fencepost_backend: str) -> str:
    """The plugin's ``ledger_target``, on a backend a subprocess can open too."""
    if fencepost_backend == "memory":
        pytest.skip(
            "the examples run as subprocesses, and every Ledger.open(':memory:') is a "
            "database of its own: use file or postgres"
        )
    return ledger_target


def run_example(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``examples/NAME`` to its end; killed if it outlives ``timeout`` or the test."""
    cmd = [sys.executable, str(EXAMPLES / name), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def last_json(out: str) -> Any:
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ dispatcher


def test_dispatcher_completes_every_unit_once(shared_target: str) -> None:
    done = run_example(
        "dispatcher.py", "--db", shared_target, "--units", "50", "--workers", "4", "--flaky", "10"
    )
    assert done.returncode == 0, done.stderr
    summary = last_json(done.stdout)
    # Units 0, 10, 20, 30 and 40 fail their first attempt and complete their second.
    assert (summary["units"], summary["completed"], summary["attempts"]) == (50, 50, 55)
    assert summary["status"] == "completed"  # the step, and with it the run
    assert (summary["retried"], summary["gave_up"], summary["duplicate_finishes"]) == (5, 0, 0)
    assert "50/50 units" in done.stderr  # the progress

    with fp.Ledger.open(shared_target) as ledger:
        units = ledger.units(summary["run_id"])
        assert len(units) == 50
        assert {u.status for u in units} == {"completed"}
        history = ledger.unit_attempts(summary["run_id"], [u.unit_id for u in units])
        dispatch_ids: set[str] = set()
        for unit_id, attempts in history.items():
            statuses = [a.status for a in attempts]
            flaky = int(unit_id.rsplit("-", 1)[1]) % 10 == 0
            assert statuses == (["failed", "completed"] if flaky else ["completed"]), unit_id
            assert attempts[-1].result["unit_id"] == unit_id
            dispatch_ids.update(a.dispatch_id for a in attempts)
        assert len(dispatch_ids) == 55  # a new dispatch id per attempt


def test_dispatcher_resumes_a_run_in_place(shared_target: str) -> None:
    with fp.Ledger.open(shared_target) as ledger:
        # A dispatcher that died: it reserved five units and recorded the result of one.
        ledger.start_run(
            "examples/dispatcher",
            scope_key=None,
            force=True,
            steps=[{"id": "fan-out"}],
            run_id="resumed",
        )
        units = [{"unit_id": f"unit-{i:05d}", "step_id": "fan-out"} for i in range(5)]
        left = {r.unit_id: r for r in ledger.reserve_attempts("resumed", units)}
        first = left["unit-00000"]
        result = {"by": "the first dispatcher"}
        assert ledger.finish_attempt(
            "resumed", first.unit_id, 1, first.dispatch_id, status="completed", result=result
        )

        done = run_example(
            "dispatcher.py", "--db", shared_target, "--units", "20", "--run-id", "resumed"
        )
        assert done.returncode == 0, done.stderr
        summary = last_json(done.stdout)
        # 19 to do; the four left running come back in place, not as second attempts.
        assert (summary["completed"], summary["attempts"], summary["reclaimed"]) == (20, 20, 4)
        assert summary["status"] == "completed"
        unit0 = ledger.unit("resumed", "unit-00000")
        assert unit0 is not None
        assert unit0.result == result  # the first dispatcher's: not done again
        for unit_id, reservation in left.items():
            [attempt] = ledger.attempts("resumed", unit_id)
            assert (attempt.attempt, attempt.dispatch_id) == (1, reservation.dispatch_id)
            assert attempt.status == "completed"

        # Once more: nothing left to do, nothing dispatched.
        again = run_example(
            "dispatcher.py", "--db", shared_target, "--units", "20", "--run-id", "resumed"
        )
        assert again.returncode == 0, again.stderr
        rerun = last_json(again.stdout)
        assert (rerun["attempts"], rerun["reclaimed"], rerun["status"]) == (20, 0, "completed")
        assert ledger.accounting("resumed").total_attempts == 20


# ------------------------------------------------------------------ controller


def test_controller_crash_and_rescue(shared_target: str, tmp_path: pathlib.Path) -> None:
    stale = tmp_path / "stale-claim.json"
    common = ["--db", shared_target, "--lease-ms", "1500", "--work-ms", "1000"]
    common += ["--stale-claim", str(stale)]

    # The first controller queues three runs, completes one, claims the next and dies.
    a = run_example(
        "controller.py", *common, "--runner-id", "ctl-a", "--queue", "3", "--crash-after", "1"
    )
    assert a.returncode == 3, a.stderr  # os._exit(3): no cleanup, the claim still held
    crashed = json.loads(a.stdout)
    held = crashed["crashed_holding"]
    assert len(crashed["queued"]) == 3
    assert len(crashed["completed"]) == 1
    assert crashed["heartbeats"] >= 1  # it renewed its lease while working

    with fp.Ledger.open(shared_target) as ledger:
        lease = ledger.lease(held)
        assert (lease.owner_id, lease.generation) == ("ctl-a", crashed["generation"])

        # The second controller takes the queued run, then the dead one's after its expiry.
        b = run_example("controller.py", *common, "--runner-id", "ctl-b", "--until-idle")
        assert b.returncode == 0, b.stderr
        rescuer = json.loads(b.stdout)
        assert rescuer["rescued"] == [
            {"run_id": held, "taken_from": "ctl-a", "generation": crashed["generation"] + 1}
        ]
        # The dead owner's claim, replayed, was refused by the fence.
        assert rescuer["stale_write"] == {"run_id": held, "refused": "superseded"}
        assert sorted(crashed["completed"] + rescuer["completed"]) == sorted(crashed["queued"])

        for run_id in crashed["queued"]:
            run = ledger.get_run(run_id)
            assert run is not None
            assert run.status == "completed"
            lease = ledger.lease(run_id)
            assert lease.owner_id is None  # released after completing
            if run_id != held:
                assert (lease.generation, lease.takeovers, lease.refused_writes) == (1, 0, 0)
        lease = ledger.lease(held)
        assert (lease.generation, lease.takeovers, lease.refused_writes) == (2, 1, 1)
        [takeover] = [e for e in ledger.events(held, types=["lease.claimed"]) if e.generation == 2]
        assert (takeover.actor_id, takeover.payload["taken_from"]) == ("ctl-b", "ctl-a")


# ------------------------------------------------------------------ webhook

# Straight to the server: an http_proxy in the environment must not get in the way.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(url: str, body: Any) -> tuple[int, Any]:
    """POST ``body`` as JSON: the status and the decoded answer, errors included."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with OPENER.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def test_webhook_finishes_each_attempt_once(shared_target: str, tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(shared_target) as ledger:
        run = ledger.start_run("hooks", scope_key=None, force=True, steps=[{"id": "s"}])
        r1, r2 = (ledger.reserve_attempt(run.run_id, u, step_id="s") for u in ("u1", "u2"))
        log = (tmp_path / "webhook.log").open("w")
        server = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "webhook.py"), "--db", shared_target, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        try:
            assert server.stdout is not None
            url = json.loads(server.stdout.readline())["url"]
            body = {
                "run_id": run.run_id,
                "unit_id": "u1",
                "attempt": r1.attempt,
                "dispatch_id": r1.dispatch_id,
                "status": "completed",
                "result": {"answer": 42},
            }
            assert post(url, body) == (200, {"finished": True})
            assert post(url, body) == (200, {"finished": False})  # the caller's retry
            [attempt] = ledger.attempts(run.run_id, "u1")
            assert (attempt.status, attempt.result) == ("completed", {"answer": 42})
            assert len(ledger.events(run.run_id, types=["unit.finished"])) == 1

            # Eight deliveries of one finish at once, on the server's threads: one wins.
            body2 = {**body, "unit_id": "u2", "dispatch_id": r2.dispatch_id}
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: post(url, body2), range(8)))
            assert sorted(a[1]["finished"] for a in answers) == [False] * 7 + [True]
            assert {a[0] for a in answers} == {200}

            for bad, argument in [
                ({**body, "attempt": "one"}, "attempt"),
                ({**body, "status": "done"}, "status"),
                ({**body, "result": [1, {"a": [2**60]}]}, "result"),
                ({k: v for k, v in body.items() if k != "dispatch_id"}, "dispatch_id"),
                ({**body, "reslt": {}}, "reslt"),
            ]:
                status, answer = post(url, bad)
                assert (status, answer["argument"]) == (400, argument), answer
                assert argument in answer["error"]
            assert post(url, ["not", "an", "object"])[0] == 400

            status, answer = post(url, {**body, "run_id": "no-such-run"})
            assert status == 404
            assert "no-such-run" in answer["error"]
            assert ledger.attempts(run.run_id, "u1") == [attempt]  # nothing else written
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if server.stdout is not None:
                server.stdout.close()
            log.close()
        assert server.returncode == 0, (tmp_path / "webhook.log").read_text()

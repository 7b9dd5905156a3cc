"""Hostile values for the canonical JSON walk: user code that mutates or frees what is being
walked must never crash the interpreter, and every such value is either canonicalized or
refused with ``InvalidArgument``.

The walk reads Python objects through borrowed references; these tests run it in child
processes under ``PYTHONMALLOC=debug`` (freed memory is poisoned, so a stale read is caught)
and check the exit status, which is how a use-after-free shows itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


def _run_child(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONMALLOC": "debug", "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _describe(proc: subprocess.CompletedProcess[str]) -> str:
    status = proc.returncode
    status_text = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit {status}"
    return f"{status_text}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"


# A key whose __repr__ (called to describe the bad key) clears the dict holding the large key
# above it; the walk used to re-read that freed key while unwinding.
REPRODUCER = textwrap.dedent(
    """
    import fencepost

    class K:
        def __hash__(s): return 1
        def __eq__(s, o): return s is o
        def __repr__(s):
            outer.clear()
            return "K"

    outer = {"".join(["k"] * (2 << 20)): {K(): 1}}
    try:
        fencepost.{call}(outer)
    except fencepost.InvalidArgument as e:
        assert e.argument == "value", e.argument
        assert "dict key K is K, not str" in str(e), str(e)
        assert e.path.startswith('$.kkkk'), e.path[:40]
        print("refused")
    """
)


@pytest.mark.parametrize("call", ["digest", "canonical_json"])
def test_mutating_repr_of_a_bad_key_does_not_crash(call: str) -> None:
    proc = _run_child(["-c", REPRODUCER.replace("{call}", call)])
    assert proc.returncode == 0, _describe(proc)
    assert proc.stdout.strip() == "refused"


BIG_INT_STR = textwrap.dedent(
    """
    import fencepost

    class Big(int):
        def __str__(s):
            outer.clear()
            return "big"
        __repr__ = __str__

    outer = {"".join(["k"] * (2 << 20)): [1, {"x": Big(2 ** 80)}]}
    try:
        fencepost.digest(outer)
    except fencepost.InvalidArgument as e:
        assert "big" in str(e), str(e)
        assert e.path.endswith("[1].x"), e.path[-20:]
        print("refused")
    """
)


def test_mutating_str_of_an_out_of_range_int_does_not_crash() -> None:
    proc = _run_child(["-c", BIG_INT_STR])
    assert proc.returncode == 0, _describe(proc)
    assert proc.stdout.strip() == "refused"


GC_FINALIZER = textwrap.dedent(
    """
    import gc
    import fencepost

    class Cyclic:
        def __init__(self):
            self.me = self
        def __del__(self):
            outer.clear()

    outer = {"".join(["k"] * (2 << 20)): {"bad": "\\ud800"}}
    gc.disable()
    for _ in range(100):
        Cyclic()
    gc.set_threshold(1, 1, 1)
    gc.enable()
    try:
        fencepost.digest(outer)
    except fencepost.InvalidArgument as e:
        assert "lone surrogate" in str(e), str(e)
        print("refused", gc.isenabled())
    """
)


def test_collector_finalizers_do_not_run_during_the_walk() -> None:
    # The lone surrogate raises inside the walk (an allocation); a collection then could run
    # the finalizer, which frees the big key the walk still borrows. The collector is paused
    # for the walk and back on afterwards.
    proc = _run_child(["-c", GC_FINALIZER])
    assert proc.returncode == 0, _describe(proc)
    assert proc.stdout.strip() == "refused True"


def test_a_paused_collector_stays_paused() -> None:
    code = "import gc, fencepost; gc.disable(); fencepost.digest({'a': [1]}); print(gc.isenabled())"
    proc = _run_child(["-c", code])
    assert proc.returncode == 0, _describe(proc)
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize("seed", range(4))
def test_mutation_fuzz_never_crashes(seed: int) -> None:
    proc = _run_child(["-m", "tests.hostile_walk", str(seed), "150"])
    assert proc.returncode == 0, _describe(proc)
    last = proc.stdout.strip().splitlines()[-1].split()
    assert last[0] == "ok", _describe(proc)
    returned, refused = int(last[1]), int(last[2])
    assert returned + refused == 150
    # The generator makes both outcomes: a fuzz that only ever refused would test one path.
    assert returned > 0, _describe(proc)
    assert refused > 0, _describe(proc)

"""The exception hierarchy (``errors``): bases, structured fields, messages that say what to do
next, and pickling (errors cross process boundaries in multiprocessing workers)."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import pytest

import fencepost as fp
from fencepost import errors

# (class, expected extra bases, keyword fields, a fragment the default message must contain)
CASES: list[tuple[type[fp.LedgerError], tuple[type[BaseException], ...], dict[str, Any], str]] = [
    (fp.NotFound, (LookupError,), {"kind": "blob", "key": "sha256:00"}, "no blob"),
    (fp.RunNotFound, (fp.NotFound, LookupError), {"run_id": "r-1"}, "fencepost runs"),
    (fp.AmbiguousRunId, (LookupError,), {"prefix": "r", "matches": ["r1", "r2"]}, "r1, r2"),
    (fp.InvalidArgument, (ValueError,), {"argument": "lease_ms"}, "lease_ms"),
    (
        fp.CanonicalJsonError,
        (fp.InvalidArgument, ValueError),
        {"argument": "params", "path": "$.a", "reason": "NaN is not a JSON number"},
        "params is not canonical JSON at $.a",
    ),
    (fp.ActiveRunExists, (), {"scope_key": "s", "occupant_run_id": "r-9"}, "force=True"),
    (fp.RunNotActive, (), {"run_id": "r-1", "status": "blocked"}, "resume_run"),
    (fp.PreparationConflict, (), {"run_id": "r", "fields": ["input", "source"]}, "input, source"),
    (fp.ContinuationRefused, (), {"parent_run_id": "p", "reason": "already continued"}, "p"),
    (
        fp.LeaseLost,
        (),
        {"run_id": "r", "expected_generation": 3, "actual_generation": 4},
        "another claim took generation 4",
    ),
    (
        fp.LeaseLost,
        (),
        {"run_id": "r", "expected_generation": 3, "actual_generation": 3, "reason": "expired"},
        "heartbeat more often",
    ),
    (
        fp.LeaseLost,
        (),
        {"run_id": "r", "expected_generation": 3, "actual_generation": 3, "reason": "released"},
        "was released; claim the run again",
    ),
    (
        fp.LeaseLost,
        (),
        {"run_id": "r", "expected_generation": 3, "actual_generation": 3, "reason": "token"},
        "pass the Claim that claim() returned",
    ),
    (fp.StoreBusy, (TimeoutError,), {"waited_ms": 5000, "retries": 7}, "busy_timeout_ms"),
    (fp.SchemaError, (), {"database_version": 9, "library_version": 1}, "upgrade fencepost"),
    (fp.StoreError, (), {"operation": "opening x.db"}, "fencepost doctor"),
]


@pytest.mark.parametrize(
    ("cls", "bases", "fields", "fragment"), CASES, ids=[c[0].__name__ for c in CASES]
)
def test_error_fields_bases_message_and_pickle(
    cls: type[fp.LedgerError],
    bases: tuple[type[BaseException], ...],
    fields: dict[str, Any],
    fragment: str,
) -> None:
    err = cls(**fields)
    assert isinstance(err, fp.LedgerError)
    assert isinstance(err, Exception)
    for base in bases:
        assert isinstance(err, base)
    for name, value in fields.items():
        assert getattr(err, name) == value
    assert fragment in err.message
    assert str(err) == err.message
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls
    assert copy.message == err.message
    for name, value in fields.items():
        assert getattr(copy, name) == value


def test_explicit_message_wins() -> None:
    err = fp.RunNotFound("custom text", run_id="x")
    assert str(err) == "custom text"
    assert err.run_id == "x"


def test_every_public_error_is_exported_and_rooted() -> None:
    names = set(errors.__all__)
    assert names <= set(fp.__all__)
    for name in names:
        cls = getattr(fp, name)
        assert issubclass(cls, fp.LedgerError), name


def _raise_in_child(queue: Any) -> None:
    try:
        fp.canonical_json({"bad": float("nan")})
    except fp.LedgerError as e:
        queue.put(e)


def test_errors_cross_process_boundaries() -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_raise_in_child, args=(queue,))
    proc.start()
    err = queue.get(timeout=60)
    proc.join(timeout=60)
    assert isinstance(err, fp.CanonicalJsonError)
    assert err.path == "$.bad"
    assert proc.exitcode == 0

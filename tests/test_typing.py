"""Uses the public API the way a user would; `mypy --strict` checks this file (STYLE §5), and its
asserts also run as a smoke test."""

from __future__ import annotations

import fencepost as fp


def test_public_surface_types() -> None:
    body: bytes = fp.canonical_json({"b": [1, 2.5, None], "a": True})
    digest: str = fp.digest(("x", {"y": 1}))
    version: str = fp.__version__
    depth: int = fp.MAX_DEPTH
    assert body == b'{"a":true,"b":[1,2.5,null]}'
    assert digest.startswith("sha256:")
    assert len(digest) == 71
    assert version.count(".") == 2
    assert depth == 512


def test_errors_are_typed() -> None:
    try:
        fp.canonical_json(float("nan"))
    except fp.CanonicalJsonError as err:
        path: str = err.path
        reason: str = err.reason
        argument: str = err.argument
        assert (path, argument) == ("$", "value")
        assert reason
    else:
        raise AssertionError("NaN was accepted")
    lost = fp.LeaseLost(run_id="r", expected_generation=1, actual_generation=2)
    generations: tuple[int, int] = (lost.expected_generation, lost.actual_generation)
    assert generations == (1, 2)
    busy: TimeoutError = fp.StoreBusy(waited_ms=1, retries=2)
    assert isinstance(busy, fp.LedgerError)

"""Canonical JSON digest: fencepost vs rfc8785 (the RFC 8785 baseline) vs orjson sort_keys
(faster, not RFC 8785), side by side in one run. Documents come from benches/documents.py.

    bash scripts/bench            # runs these and prints the ratio table
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest
import rfc8785

import fencepost as fp


def rfc8785_digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def orjson_digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


CANDIDATES = {
    "fencepost.digest": fp.digest,
    "rfc8785.dumps+sha256": rfc8785_digest,
    "orjson.dumps(OPT_SORT_KEYS)+sha256": orjson_digest,
}


@pytest.mark.parametrize("impl", list(CANDIDATES))
def bench_digest(benchmark: Any, document: Any, impl: str) -> None:
    size = len(rfc8785.dumps(document)) // 1024
    benchmark.group = f"digest {size}KB"
    benchmark.extra_info["impl"] = impl
    fn = CANDIDATES[impl]
    result = benchmark(fn, document)
    # Same bytes as RFC 8785 (orjson differs only where its key order or floats do).
    if impl != "orjson.dumps(OPT_SORT_KEYS)+sha256":
        assert result == rfc8785_digest(document)


def bench_canonical_json(benchmark: Any, document: Any) -> None:
    size = len(rfc8785.dumps(document)) // 1024
    benchmark.group = f"canonical_json {size}KB"
    assert benchmark(fp.canonical_json, document) == rfc8785.dumps(document)

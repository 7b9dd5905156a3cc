"""Deterministic workflow-definition-like JSON documents for the benchmarks.

A definition is a list of steps, each with an id, a kind, dependencies on the two steps
before it, retry settings, a float timeout, a small environment and tags: the mix of short
keys, ints, floats, booleans, nulls and non-ASCII text that definitions a controller hashes
have. Steps are added until the compact JSON reaches the requested size.
"""

from __future__ import annotations

import json
import random
from typing import Any

WORDS = ["fetch", "transform", "load", "validate", "notify", "retry", "shard", "merge"]
WORDS += ["sänd", "日本", "emoji🙂"]


def _step(rnd: random.Random, i: int) -> dict[str, Any]:
    return {
        "id": f"step-{i}",
        "kind": rnd.choice(WORDS),
        "after": [f"step-{j}" for j in range(max(0, i - 2), i)],
        "retry": {
            "max": rnd.randint(0, 5),
            "backoff_ms": rnd.randint(100, 60_000),
            "jitter": rnd.random() < 0.5,
        },
        "timeout_s": round(rnd.uniform(0.5, 900), 3),
        "env": {f"K{k}": rnd.choice(WORDS) * 2 for k in range(3)},
        "tags": rnd.sample(WORDS, 3),
        "optional": None,
    }


def definition(size_bytes: int, seed: int) -> dict[str, Any]:
    """A definition of at least ``size_bytes`` of compact UTF-8 JSON, the same for a seed."""
    rnd = random.Random(seed)
    doc: dict[str, Any] = {
        "name": "bench-workflow",
        "version": 3,
        "steps": [],
        "meta": {"owner": "platform", "labels": {"tier": "gold"}},
    }
    while len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()) < size_bytes:
        doc["steps"].append(_step(rnd, len(doc["steps"])))
    return doc

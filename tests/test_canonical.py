"""RFC 8785 canonical JSON and digests (``canonical``).

Every vector in tests/vectors/jcs (vendored), every rejection with its JSON path, and a property
test against the `rfc8785` package.
"""

from __future__ import annotations

import collections
import enum
import gzip
import hashlib
import json
import math
import pathlib
import pickle
import re
import struct
import subprocess
import sys
import threading
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

import fencepost as fp
from tests.conftest import JCS_DIR

CASES = JCS_DIR / "cases"
CASE_NAMES = sorted(p.name.removesuffix(".input.json") for p in CASES.glob("*.input.json"))
INVALID = sorted((JCS_DIR / "invalid").glob("*.json"))


def test_vector_folder_is_complete() -> None:
    # Guards against a silently empty parametrization.
    assert len(CASE_NAMES) >= 14
    assert len(INVALID) >= 13


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_vector(name: str) -> None:
    value = json.loads((CASES / f"{name}.input.json").read_text(encoding="utf-8"))
    expected = (CASES / f"{name}.expected.json").read_bytes()
    assert fp.canonical_json(value) == expected
    assert fp.digest(value) == "sha256:" + hashlib.sha256(expected).hexdigest()


def _number_failures(lines: list[tuple[str, str]]) -> list[str]:
    failures = []
    for hexbits, want in lines:
        value = struct.unpack(">d", bytes.fromhex(hexbits.rjust(16, "0")))[0]
        got = fp.canonical_json(value)
        if got != want.encode():
            failures.append(f"{hexbits}: got {got!r}, want {want!r}")
    return failures


def test_numbers_tsv(jcs_dir: pathlib.Path) -> None:
    rows = [tuple(line.split("\t")) for line in (jcs_dir / "numbers.tsv").read_text().splitlines()]
    assert len(rows) > 20_000
    assert _number_failures(rows) == []  # type: ignore[arg-type]


def test_es6_numbers_100k(jcs_dir: pathlib.Path) -> None:
    with gzip.open(jcs_dir / "es6numbers-100k.txt.gz", "rt", encoding="ascii") as fh:
        rows = [tuple(line.rstrip("\n").split(",")) for line in fh]
    assert len(rows) == 100_000
    assert _number_failures(rows) == []  # type: ignore[arg-type]


def test_check_script_passes(jcs_dir: pathlib.Path) -> None:
    """The vectors' own runner agrees (it also covers must_accept and deep nesting)."""
    proc = subprocess.run(
        [sys.executable, str(jcs_dir / "check.py"), "fencepost:canonical_json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, 0 failed", last), proc.stdout[-2000:]
    assert proc.returncode == 0


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_vector_rejected(path: pathlib.Path) -> None:
    value = json.loads(path.read_text(encoding="utf-8"))
    with pytest.raises(fp.CanonicalJsonError):
        fp.canonical_json(value)
    with pytest.raises(fp.CanonicalJsonError):
        fp.digest(value)


def _cycle_list() -> list[Any]:
    items: list[Any] = [1]
    items.append({"back": items})
    return items


def _cycle_dict() -> dict[str, Any]:
    d: dict[str, Any] = {"a": {}}
    d["a"]["b"] = d
    return d


class Opaque:
    pass


REJECTIONS: list[tuple[str, Any, str, str]] = [
    # (id, value, expected path, a fragment of the reason)
    ("nan", math.nan, "$", "NaN is not a JSON number"),
    ("inf", math.inf, "$", "inf is not a JSON number"),
    ("-inf", {"x": [-math.inf]}, "$.x[0]", "-inf is not a JSON number"),
    ("nested nan", {"a": [1, {"b": math.nan}]}, "$.a[1].b", "NaN"),
    ("2**53", 2**53, "$", "outside ±(2^53-1)"),
    ("-(2**53)", [-(2**53)], "$[0]", "outside ±(2^53-1)"),
    ("huge int", {"n": 10**400}, "$.n", "outside ±(2^53-1)"),
    ("int beyond str limit", [10**5000], "$[0]", "more than 4300 digits"),
    ("lone surrogate", {"k": "\ud800"}, "$.k", "lone surrogate"),
    ("lone surrogate key", {"ok": {"\udc00": 1}}, "$.ok", "lone surrogate"),
    ("swapped pair", ["\ude00\ud83d"], "$[0]", "lone surrogate"),
    ("int key", {"a": {1: 2}}, "$.a", "dict key 1 is int, not str"),
    ("tuple key", {(1,): 2}, "$", "dict key (1,) is tuple, not str"),
    ("None key", {None: 2}, "$", "is NoneType, not str"),
    ("bytes", {"b": b"x"}, "$.b", "unsupported type bytes"),
    ("set", [{1, 2}], "$[0]", "unsupported type set"),
    ("object", {"o": Opaque()}, "$.o", "unsupported type Opaque"),
    ("cyclic list", _cycle_list(), "$[1].back", "cycle"),
    ("cyclic dict", _cycle_dict(), "$.a.b", "cycle"),
    ("odd key path", {"two words": {"x\n": math.nan}}, '$["two words"]["x\\n"]', "NaN"),
]


@pytest.mark.parametrize(
    ("value", "path", "reason"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS]
)
def test_rejection_names_path_and_reason(value: Any, path: str, reason: str) -> None:
    with pytest.raises(fp.CanonicalJsonError) as info:
        fp.canonical_json(value)
    err = info.value
    assert err.path == path
    assert reason in err.reason
    assert err.argument == "value"
    assert path in str(err)
    assert err.reason in str(err)
    # The hierarchy: a CanonicalJsonError is an InvalidArgument, a ValueError and a LedgerError.
    assert isinstance(err, fp.InvalidArgument)
    assert isinstance(err, ValueError)
    assert isinstance(err, fp.LedgerError)
    with pytest.raises(fp.CanonicalJsonError):
        fp.digest(value)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_depth_limit_is_documented_and_exact() -> None:
    assert fp.MAX_DEPTH == 512
    ok = _nested(fp.MAX_DEPTH)
    assert fp.canonical_json(ok) == b"[" * fp.MAX_DEPTH + b"]" * fp.MAX_DEPTH
    with pytest.raises(fp.CanonicalJsonError) as info:
        fp.canonical_json(_nested(fp.MAX_DEPTH + 1))
    assert "deeper than 512" in info.value.reason
    assert info.value.path == "$" + "[0]" * fp.MAX_DEPTH


def test_100k_deep_list_is_a_clear_error_not_a_crash() -> None:
    deep = _nested(100_000)
    with pytest.raises(fp.CanonicalJsonError):
        fp.canonical_json(deep)
    # Deep dicts too, in a thread (smaller stack than the main thread).
    d: dict[str, Any] = {}
    for _ in range(100_000):
        d = {"k": d}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fp.digest(d)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert len(errors) == 1
    assert isinstance(errors[0], fp.CanonicalJsonError)


class Color(enum.IntEnum):
    RED = 1


class MyDict(dict):  # type: ignore[type-arg]
    pass


class MyList(list):  # type: ignore[type-arg]
    pass


class MyStr(str):
    __slots__ = ()


class MyFloat(float):
    pass


ACCEPTED: list[tuple[str, Any, bytes]] = [
    ("bools are not numbers", [True, False, 1, 0], b"[true,false,1,0]"),
    ("bool keys values", {"t": True}, b'{"t":true}'),
    ("tuple is an array", (1, "a", None), b'[1,"a",null]'),
    ("nested tuples", {"t": ((1,), ())}, b'{"t":[[1],[]]}'),
    ("largest safe integer", 2**53 - 1, b"9007199254740991"),
    ("smallest safe integer", -(2**53 - 1), b"-9007199254740991"),
    ("float 2**53 is fine", 2.0**53, b"9007199254740992"),
    ("negative zero", -0.0, b"0"),
    ("integral float", 56.0, b"56"),
    ("exponent floats", [1e21, 1e-7, 1e20], b"[1e+21,1e-7,100000000000000000000]"),
    ("empty containers", {"a": [], "b": {}}, b'{"a":[],"b":{}}'),
    ("dict subclass", MyDict(b=1, a=2), b'{"a":2,"b":1}'),
    ("OrderedDict", collections.OrderedDict([("z", 1), ("a", 2)]), b'{"a":2,"z":1}'),
    ("list subclass", MyList([3, 2]), b"[3,2]"),
    ("str subclass value and key", {MyStr("k"): MyStr("v")}, b'{"k":"v"}'),
    ("int subclass", [Color.RED], b"[1]"),
    ("float subclass", MyFloat(2.5), b"2.5"),
    ("shared (non-cyclic) reference", [[1], [1]], b"[[1],[1]]"),
    ("utf16 key order", {"\ue000": 1, "\U0001f600": 2}, '{"\U0001f600":2,"\ue000":1}'.encode()),
    ("integer-like keys sort as strings", {"b": 1, "10": 2, "9": 3}, b'{"10":2,"9":3,"b":1}'),
    ("controls escaped minimally", "\x00\x1f\x7f\u2028/", b'"\\u0000\\u001f\x7f\xe2\x80\xa8/"'),
]


@pytest.mark.parametrize(
    ("value", "expected"), [a[1:] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED]
)
def test_accepted(value: Any, expected: bytes) -> None:
    assert fp.canonical_json(value) == expected


def test_shared_containers_are_not_cycles() -> None:
    leaf = {"x": [1, 2]}
    assert fp.canonical_json([leaf, leaf, {"again": leaf}]) == (
        b'[{"x":[1,2]},{"x":[1,2]},{"again":{"x":[1,2]}}]'
    )


def test_repeated_strings_and_shapes_keep_their_own_order() -> None:
    # The walk stores each string object once and the writer reuses a sorted key order for
    # objects whose keys are the same string objects in the same order (literal keys are
    # interned): objects of one key set in different orders, an empty key (its text place is
    # the next string's), values that are keys elsewhere, and many objects of many shapes so
    # the caches evict and refill.
    a, b, empty = "a", "b", ""
    value: list[Any] = [{b: 1, a: 2}, {a: 3, b: 4}, {empty: 5, b: 6}, {b: 7, empty: 8}, [a, b, a]]
    value += [{f"k{i % 97}": i, a: {b: i, f"k{i % 89}": [b, empty]}, "\uff61": 0, "\U0001f600": 1}
              for i in range(3000)]  # fmt: skip
    assert fp.canonical_json(value) == rfc8785.dumps(value)
    assert fp.canonical_json(value[:5]) == (
        b'[{"a":2,"b":1},{"a":3,"b":4},{"":5,"b":6},{"":8,"b":7},["a","b","a"]]'
    )


def test_digest_format() -> None:
    d = fp.digest({"hello": "world"})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", d)
    assert d == "sha256:" + hashlib.sha256(b'{"hello":"world"}').hexdigest()
    # Equal values, different insertion order: one digest.
    assert fp.digest({"z": 1, "a": [True, "x"]}) == fp.digest({"a": [True, "x"], "z": 1})


def test_large_document_digest_streams_correctly() -> None:
    # Larger than the writer's 16 KiB hash chunk, with escapes and non-ASCII across chunks.
    doc = {f"k{i}": ['é\n"' * (i % 7), i, i / 7, {"\U0001f600": None}] for i in range(5000)}
    body = fp.canonical_json(doc)
    assert len(body) > 200_000
    assert body == rfc8785.dumps(doc)
    assert fp.digest(doc) == "sha256:" + hashlib.sha256(body).hexdigest()


def test_rust_raised_error_pickles_with_fields() -> None:
    with pytest.raises(fp.CanonicalJsonError) as info:
        fp.digest({"a": [math.nan]})
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is fp.CanonicalJsonError
    assert (copy.path, copy.reason, copy.argument) == ("$.a[0]", info.value.reason, "value")
    assert str(copy) == str(info.value)


def test_threads_share_the_canonicalizer() -> None:
    docs = [{"i": i, "s": "x" * i, "l": list(range(i))} for i in range(200)]
    expected = [rfc8785.dumps(d) for d in docs]
    results: dict[int, list[bytes]] = {}

    def run(k: int) -> None:
        results[k] = [fp.canonical_json(d) for d in docs]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[k] == expected for k in range(4))


# ----------------------------------------------------------------- property test against rfc8785

SAFE_INT = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
# Text without surrogates (hypothesis' default excludes category Cs), including the astral planes.
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
KEYS = st.one_of(TEXT, st.sampled_from(["", "a", "10", "9", "\ue000", "\U0001f600", "\uff61"]))
JSON = st.recursive(
    st.none() | st.booleans() | SAFE_INT | FLOATS | TEXT,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(KEYS, children, max_size=6)
        | st.tuples(children, children)
    ),
    max_leaves=40,
)


@settings(max_examples=10_000)
@given(JSON)
def test_matches_rfc8785_package(value: Any) -> None:
    expected = rfc8785.dumps(value)
    assert fp.canonical_json(value) == expected
    assert fp.digest(value) == "sha256:" + hashlib.sha256(expected).hexdigest()


@settings(max_examples=2_000)
@given(FLOATS)
def test_floats_match_rfc8785_package(value: float) -> None:
    assert fp.canonical_json(value) == rfc8785.dumps(value)


def test_recycled_buffers_carry_nothing_over() -> None:
    # Each thread reuses the tape and output buffers of its previous call: a failed walk
    # (partial tape), a large document and a small one after each other must not mix.
    big = {f"k{i}": ["x" * (i % 40), i, i / 3] for i in range(5000)}
    small = {"b": [1, 2.5, "é"], "a": None}
    with pytest.raises(fp.CanonicalJsonError):
        fp.digest({"ok": [1, 2, {"bad": float("nan")}]})
    assert fp.canonical_json(small) == rfc8785.dumps(small)
    assert fp.digest(big) == "sha256:" + hashlib.sha256(rfc8785.dumps(big)).hexdigest()
    assert fp.canonical_json(small) == b'{"a":null,"b":[1,2.5,"\xc3\xa9"]}'
    assert fp.canonical_json(big) == rfc8785.dumps(big)
    assert fp.digest(small) == "sha256:" + hashlib.sha256(rfc8785.dumps(small)).hexdigest()

"""Content-addressed JSON (``blobs``): ``put_json`` stores a value's RFC 8785 bytes under their
digest, so two spellings of one value are one row; an unknown digest is ``NotFound``; a value
that is not canonical JSON writes nothing."""

from __future__ import annotations

import pathlib

import pytest

import fencepost as fp
from tests.conftest import raw_db


def test_blobs_are_content_addressed(tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(str(tmp_path / "b.db")) as ledger:
        a = ledger.put_json({"z": 1, "a": [True, "x", 1.5, None]})
        b = ledger.put_json({"a": [True, "x", 1.5, None], "z": 1})
        assert a == b == fp.digest({"z": 1, "a": [True, "x", 1.5, None]})
        assert ledger.get_json(a) == {"a": [True, "x", 1.5, None], "z": 1}
    with raw_db(tmp_path / "b.db") as db:
        rows = db.execute("SELECT digest, bytes FROM blobs").fetchall()
    assert rows == [(a, fp.canonical_json({"a": [True, "x", 1.5, None], "z": 1}))]


def test_unknown_blob_is_not_found(tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(str(tmp_path / "b.db")) as ledger:
        missing = fp.digest("never stored")
        with pytest.raises(fp.NotFound) as info:
            ledger.get_json(missing)
        assert (info.value.kind, info.value.key) == ("blob", missing)
        with pytest.raises(fp.InvalidArgument) as bad:
            ledger.get_json("md5:abc")
        assert bad.value.argument == "digest"


def test_bad_json_writes_nothing(tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(str(tmp_path / "b.db")) as ledger:
        with pytest.raises(fp.CanonicalJsonError) as info:
            ledger.put_json({"ok": [1, float("nan")]})
        assert info.value.path == "$.ok[1]"
    with raw_db(tmp_path / "b.db") as db:
        assert db.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0

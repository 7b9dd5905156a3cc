"""The SQLite store (``store/sqlite``): opening a file in WAL mode with its settings read back,
the target forms (a path, ``sqlite:///``, ``:memory:``), clear errors for files and arguments it
cannot use, close semantics, the injected clock on every row, and small pages for new files.
Migrations are tested in test_store_migrate.py, the bounded write-ahead log in
test_store_sqlite_checkpoint.py."""

from __future__ import annotations

import datetime as dt
import pathlib
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, applied_migrations, raw_db


def test_open_file_creates_schema_in_wal(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ledger.db"
    with fp.Ledger.open(str(path)) as ledger:
        pragmas = ledger.pragmas()
        assert pragmas["journal_mode"] == "wal"
        assert pragmas["synchronous"] == "normal"
        assert pragmas["busy_timeout"] == 5000
        assert pragmas["foreign_keys"] is True
        assert pragmas["schema_version"] == fp.SCHEMA_VERSION
    rows = applied_migrations(path)
    assert [v for v, _ in rows] == list(range(1, fp.SCHEMA_VERSION + 1))
    with raw_db(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_durability_full_and_busy_timeout_read_back(tmp_path: pathlib.Path) -> None:
    with fp.Ledger.open(str(tmp_path / "x.db"), durability="full", busy_timeout_ms=1234) as ledger:
        assert ledger.pragmas()["synchronous"] == "full"
        assert ledger.pragmas()["busy_timeout"] == 1234


@pytest.mark.parametrize("form", ["sqlite:///{p}", "{p}"])
def test_target_forms(tmp_path: pathlib.Path, form: str) -> None:
    path = tmp_path / "forms.db"
    with fp.Ledger.open(form.format(p=path)) as ledger:
        ledger.put_json({"x": 1})
    assert path.exists()


@pytest.mark.parametrize("target", [":memory:", "sqlite:///:memory:"])
def test_memory_target(target: str) -> None:
    with fp.Ledger.open(target) as ledger:
        assert ledger.pragmas()["journal_mode"] == "memory"
        digest = ledger.put_json([1, 2])
        assert ledger.get_json(digest) == [1, 2]


def test_non_sqlite_file_is_a_clear_store_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database\n" * 100)
    with pytest.raises(fp.StoreError) as info:
        fp.Ledger.open(str(path))
    assert isinstance(info.value, fp.LedgerError)
    assert "not a fencepost database" in str(info.value)
    assert str(path) in str(info.value)
    assert path.read_text() == "this is not a database\n" * 100


def test_missing_directory_is_a_clear_store_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(fp.StoreError) as info:
        fp.Ledger.open(str(tmp_path / "no" / "such" / "dir" / "x.db"))
    assert "x.db" in str(info.value)


BAD_OPEN: list[tuple[str, dict[str, Any], str]] = [
    ("durability", {"durability": "sometimes"}, "durability"),
    ("busy negative", {"busy_timeout_ms": -1}, "busy_timeout_ms"),
    ("busy not int", {"busy_timeout_ms": "5"}, "busy_timeout_ms"),
    ("clock", {"clock": 5}, "clock"),
]


@pytest.mark.parametrize(
    ("kwargs", "argument"), [b[1:] for b in BAD_OPEN], ids=[b[0] for b in BAD_OPEN]
)
def test_bad_open_arguments(tmp_path: pathlib.Path, kwargs: dict[str, Any], argument: str) -> None:
    path = tmp_path / "bad.db"
    with pytest.raises(fp.InvalidArgument) as info:
        fp.Ledger.open(str(path), **kwargs)
    assert info.value.argument == argument
    assert not path.exists()  # nothing written


@pytest.mark.parametrize("target", ["", "mysql://x/y", 42])
def test_bad_targets(target: Any) -> None:
    with pytest.raises(fp.InvalidArgument) as info:
        fp.Ledger.open(target)
    assert info.value.argument == "target"


@pytest.mark.parametrize(
    "target",
    ["postgresql:/broken", "postgres:/x", "postgresql//x", "postgres//u:secret@h/db",
     "postgresql:", "sqlite:x.db", "sqlite://x.db", "PostgreSQL:/x"],
)  # fmt: skip
@pytest.mark.parametrize("create", [True, False])
def test_a_mistyped_url_is_refused_not_taken_for_a_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, target: str, create: bool
) -> None:
    """A target that begins like a URL this library reads but is not one names the forms it
    takes, quotes no more of itself than the scheme (the rest may hold a password), and
    creates nothing, even where the text read as a path names a file that could be made."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "postgresql").mkdir()
    (tmp_path / "postgres").mkdir()
    with pytest.raises(fp.InvalidArgument) as info:
        fp.Ledger.open(target, create=create)
    assert info.value.argument == "target"
    message = str(info.value)
    assert message.startswith("target beginning ")
    assert "'postgresql://user@host:port/db'" in message
    assert "'sqlite:///path'" in message
    assert "secret" not in message
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["postgres", "postgresql"]


def test_close_is_idempotent_and_closed_ledger_refuses(tmp_path: pathlib.Path) -> None:
    ledger = fp.Ledger.open(str(tmp_path / "c.db"))
    ledger.close()
    ledger.close()
    with pytest.raises(fp.LedgerError, match="closed"):
        ledger.put_json({})
    with fp.Ledger.open(str(tmp_path / "c.db")) as other:
        pass
    with pytest.raises(fp.LedgerError, match="closed"):
        other.get_json(fp.digest({}))


def test_injected_clock_stamps_rows(tmp_path: pathlib.Path, clock: FakeClock) -> None:
    with fp.Ledger.open(str(tmp_path / "t.db"), clock=clock) as ledger:
        ledger.put_json({"t": 1})
    with raw_db(tmp_path / "t.db") as db:
        assert db.execute("SELECT created_at FROM blobs").fetchone()[0] == clock.now
    assert fp.models.from_ms(clock.now) == dt.datetime(2025, 12, 3, 0, 0, tzinfo=dt.UTC)


def test_new_files_use_small_pages(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ledger.db"
    fp.Ledger.open(str(path)).close()
    with raw_db(path) as db:
        assert db.execute("PRAGMA page_size").fetchone()[0] == 1024

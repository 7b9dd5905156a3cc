"""Opening the store (DESIGN §6, issue: ledger core "Store"): targets, pragmas read back,
forward-only migrations, refusal of newer or foreign files, close semantics, blobs."""

from __future__ import annotations

import datetime as dt
import pathlib
import sqlite3
from typing import Any

import pytest

import fencepost as fp
from tests.conftest import FakeClock, raw_db


def _migrations(path: pathlib.Path) -> list[tuple[int, str]]:
    with raw_db(path) as db:
        return db.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()


def test_open_file_creates_schema_in_wal(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ledger.db"
    with fp.Ledger.open(str(path)) as ledger:
        pragmas = ledger.pragmas()
        assert pragmas["journal_mode"] == "wal"
        assert pragmas["synchronous"] == "normal"
        assert pragmas["busy_timeout"] == 5000
        assert pragmas["foreign_keys"] is True
        assert pragmas["schema_version"] == fp.SCHEMA_VERSION
    rows = _migrations(path)
    assert [v for v, _ in rows] == list(range(1, fp.SCHEMA_VERSION + 1))
    with raw_db(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_reopen_is_a_no_op(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ledger.db"
    fp.Ledger.open(str(path)).close()
    before = _migrations(path)
    with raw_db(path) as db:
        applied = db.execute("SELECT applied_at FROM schema_migrations").fetchall()
    fp.Ledger.open(str(path)).close()
    assert _migrations(path) == before
    with raw_db(path) as db:
        assert db.execute("SELECT applied_at FROM schema_migrations").fetchall() == applied


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


def test_newer_schema_is_refused_and_left_alone(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "newer.db"
    fp.Ledger.open(str(path)).close()
    with raw_db(path) as db:
        db.execute(
            "INSERT INTO schema_migrations(version, name, applied_at) VALUES (999, 'future', 0)"
        )
        db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = path.read_bytes()
    with pytest.raises(fp.SchemaError) as info:
        fp.Ledger.open(str(path))
    assert info.value.database_version == 999
    assert info.value.library_version == fp.SCHEMA_VERSION
    assert "upgrade fencepost" in str(info.value)
    assert _migrations(path)[-1] == (999, "future")
    assert path.read_bytes() == before


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


def test_injected_clock_stamps_rows(tmp_path: pathlib.Path, clock: FakeClock) -> None:
    with fp.Ledger.open(str(tmp_path / "t.db"), clock=clock) as ledger:
        ledger.put_json({"t": 1})
    with raw_db(tmp_path / "t.db") as db:
        assert db.execute("SELECT created_at FROM blobs").fetchone()[0] == clock.now
    assert fp.models.from_ms(clock.now) == dt.datetime(2025, 12, 3, 0, 0, tzinfo=dt.UTC)


def test_events_are_append_only_in_the_database(tmp_path: pathlib.Path) -> None:
    # seq is a plain rowid: it is never reused only because no event row can be deleted.
    path = tmp_path / "ledger.db"
    with fp.Ledger.open(str(path)) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
    with raw_db(path) as db:
        for statement in ("DELETE FROM events", "UPDATE events SET type = 'x'"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(statement)
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 1


def test_new_files_use_small_pages(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ledger.db"
    fp.Ledger.open(str(path)).close()
    with raw_db(path) as db:
        assert db.execute("PRAGMA page_size").fetchone()[0] == 1024


def test_write_ahead_log_stays_bounded_and_is_removed_at_close(tmp_path: pathlib.Path) -> None:
    # Checkpoints run on a background thread; the writer restarts the log past a hard limit
    # (rust/store/sqlite/checkpoint.rs: 4000 frames of 1 KiB + 24 bytes). Without the restart
    # the log would grow by every commit's frames for as long as writes keep coming.
    path = tmp_path / "ledger.db"
    wal = pathlib.Path(str(path) + "-wal")
    limit = 5000 * (1024 + 24)
    biggest = 0
    with fp.Ledger.open(str(path)) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], run_id="r1", force=True)
        for batch in range(120):
            got = ledger.reserve_attempts(
                "r1", [{"unit_id": f"u{batch}-{i}", "step_id": "s"} for i in range(50)]
            )
            ledger.finish_attempts(
                [
                    {"run_id": "r1", "unit_id": r.unit_id, "attempt": r.attempt,
                     "dispatch_id": r.dispatch_id, "status": "completed"}
                    for r in got
                ]
            )  # fmt: skip
            biggest = max(biggest, wal.stat().st_size)
        assert len(ledger.units("r1")) == 6000
    assert 0 < biggest < limit
    assert not wal.exists()
    with raw_db(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        done = db.execute("SELECT count(*) FROM attempts WHERE status = 'completed'").fetchone()
        assert done[0] == 6000

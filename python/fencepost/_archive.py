"""The archive file of ``Ledger.prune`` and ``Ledger.restore``: opening it, gzip or not, and
the age argument. The core writes and reads the lines; this module owns the file.

A path is created, never overwritten (an existing file is refused: it may hold the only copy of
runs a previous prune removed), gzip-compressed when it ends in ``.gz``, and after every batch
flushed and fsynced before the batch's rows are deleted. A binary file object is written as is
(wrap it in ``gzip.GzipFile`` to compress) and flushed after every batch. ``restore`` reads
either; gzip is recognized by its magic bytes, whatever the name.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import io
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO, Protocol, TypeAlias

from fencepost.errors import InvalidArgument

Archive: TypeAlias = "str | os.PathLike[str] | BinaryIO"
"""A path, or a binary file object."""

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MS = _dt.timedelta(milliseconds=1)
_GZIP_MAGIC = b"\x1f\x8b"


def cutoff(older_than: object) -> tuple[int | None, int | None]:
    """``(cutoff_ms, age_ms)``: an aware datetime is a cutoff, a timedelta an age (the core
    reads it against the ledger's clock and refuses a negative one)."""
    if isinstance(older_than, _dt.datetime):
        if older_than.tzinfo is None or older_than.utcoffset() is None:
            raise InvalidArgument(
                "older_than is a naive datetime, which names no instant; pass an aware one "
                "(datetime.now(UTC) - timedelta(days=30)) or a timedelta",
                argument="older_than",
            )
        return (older_than - _EPOCH) // _MS, None
    if isinstance(older_than, _dt.timedelta):
        return None, older_than // _MS
    raise InvalidArgument(
        f"older_than must be a timedelta (an age) or an aware datetime (a cutoff), not "
        f"{type(older_than).__name__}",
        argument="older_than",
    )


MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest archive line ``restore`` reads by default: each line is one run tree, and this
one holds a tree of about 150 000 attempts. A longer line is refused after reading this many
bytes of it, never whole; ``restore(max_line_bytes=...)`` raises the bound for an archive of
larger trees (it takes about five times the line in memory while the line is checked)."""


def _is_path(archive: object) -> bool:
    return isinstance(archive, (str, os.PathLike))


def _refuse_text(archive: object, mode: str) -> None:
    """An archive is bytes (gzip or JSON lines): a file opened in text mode cannot carry it."""
    if isinstance(archive, io.TextIOBase):
        raise InvalidArgument(
            f"archive is a text file ({type(archive).__name__}); open it in binary mode "
            f"(open(path, {mode!r})) or pass the path",
            argument="archive",
        )


@contextlib.contextmanager
def writer(archive: Archive, *, dry_run: bool) -> Iterator[Callable[[bytes], None]]:
    """A sink for the core's lines. A dry run opens nothing (the core only counts the bytes)."""
    if dry_run:
        yield lambda _lines: None
        return
    if not _is_path(archive):
        _refuse_text(archive, "wb")
        if not callable(getattr(archive, "write", None)):
            raise InvalidArgument(
                f"archive must be a path or a binary file opened for writing, not "
                f"{type(archive).__name__}",
                argument="archive",
            )
        stream: BinaryIO = archive  # type: ignore[assignment]

        def to_stream(lines: bytes) -> None:
            stream.write(lines)
            stream.flush()

        yield to_stream
        return
    path = os.fspath(archive)  # type: ignore[arg-type]
    try:
        raw = open(path, "xb")  # noqa: SIM115 - closed below, after the gzip trailer
    except FileExistsError:
        raise InvalidArgument(
            f"archive {path} exists; prune never overwrites an archive (it may hold the only "
            "copy of runs pruned before): name a new file",
            argument="archive",
        ) from None
    out: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb") if path.endswith(".gz") else raw  # type: ignore[assignment]

    def to_file(lines: bytes) -> None:
        out.write(lines)
        out.flush()
        if out is not raw:
            raw.flush()
        os.fsync(raw.fileno())

    try:
        yield to_file
    finally:
        # Whatever happened, what was written stays: its trees are gone from the ledger.
        if out is not raw:
            out.close()
        raw.flush()
        os.fsync(raw.fileno())
        raw.close()


def reader(archive: Archive, max_line_bytes: int = MAX_LINE_BYTES) -> Callable[[], Iterator[bytes]]:
    """A callable returning a fresh iterator of the archive's lines (the core reads twice)."""
    if (
        isinstance(max_line_bytes, bool)
        or not isinstance(max_line_bytes, int)
        or max_line_bytes < 1024
    ):
        raise InvalidArgument(
            f"max_line_bytes must be an int of at least 1024 (bytes), not {max_line_bytes!r}",
            argument="max_line_bytes",
        )
    if _is_path(archive):
        path = os.fspath(archive)  # type: ignore[arg-type]
        if not os.path.isfile(path):
            raise InvalidArgument(f"archive {path} is not a file", argument="archive")

        def from_path() -> Iterator[bytes]:
            with open(path, "rb") as raw:
                yield from _lines(raw, max_line_bytes)

        return from_path
    _refuse_text(archive, "rb")
    if not callable(getattr(archive, "read", None)):
        raise InvalidArgument(
            f"archive must be a path or a binary file opened for reading, not "
            f"{type(archive).__name__}",
            argument="archive",
        )
    stream: BinaryIO = archive  # type: ignore[assignment]
    if stream.seekable():
        start = stream.tell()
    else:
        stream = io.BytesIO(stream.read())
        start = 0

    def from_stream() -> Iterator[bytes]:
        stream.seek(start)
        yield from _lines(stream, max_line_bytes)

    return from_stream


class _Readlines(Protocol):
    """What a line source needs: a file or a ``GzipFile``."""

    def readline(self, size: int = -1, /) -> bytes: ...


def _lines(raw: BinaryIO, max_line_bytes: int) -> Iterator[bytes]:
    head = raw.read(2)
    raw.seek(-len(head), io.SEEK_CUR)
    if head == _GZIP_MAGIC:
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield from _bounded(unzipped, max_line_bytes)
        except (OSError, EOFError) as e:
            raise InvalidArgument(
                f"archive is a damaged gzip file ({e}); nothing was restored", argument="archive"
            ) from None
    else:
        yield from _bounded(raw, max_line_bytes)


def _bounded(lines: _Readlines, max_line_bytes: int) -> Iterator[bytes]:
    """Each line, read with a bound: a line longer than ``max_line_bytes`` is refused once that
    many bytes of it are in, so a small gzip that expands to one huge line costs the bound, not
    the line."""
    number = 0
    while True:
        line = lines.readline(max_line_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_line_bytes:
            raise InvalidArgument(
                f"line {number} of the archive is longer than {max_line_bytes} bytes, the most "
                "restore reads in one line (one run tree); pass max_line_bytes= a larger bound "
                "if the archive is yours and holds a tree that large; nothing was restored",
                argument="archive",
            )
        yield line

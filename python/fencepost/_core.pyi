"""Stub for the compiled core (hand-written; checked by ``python -m mypy.stubtest``)."""

from typing import Final

__version__: Final[str]
MAX_DEPTH: Final[int]

def canonical_json(value: object) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of ``value``; raises ``CanonicalJsonError``."""

def digest(value: object) -> str:
    """``"sha256:" + hex(sha256(canonical_json(value)))``; raises ``CanonicalJsonError``."""

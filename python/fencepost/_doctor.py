"""What ``fencepost doctor`` checks, gathered once for both of its readers: the command line
(``fencepost doctor``) and the dashboard's doctor page (``fencepost ui``).

The checks come in two costs. The settings and the expired leases are index reads, cheap at any
size; the integrity check and the orphan scan read the whole database (seconds on a large
file), so a caller that must stay quick (the dashboard) asks for them separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fencepost as fp
from fencepost._format import plain

__all__ = ["Checkup", "gather"]


@dataclass(frozen=True)
class Checkup:
    """The doctor's findings. ``integrity`` and ``orphans`` are ``None`` when the whole-database
    checks were not run."""

    target: str
    pragmas: dict[str, Any]
    expired: list[fp.Lease]
    integrity: list[str] | None
    integrity_mode: str
    orphans: list[tuple[str, str, int, str]] | None

    @property
    def checked(self) -> bool:
        """Whether the whole-database checks ran."""
        return self.integrity is not None

    @property
    def healthy(self) -> bool | None:
        """Sound file and no orphan attempts; ``None`` when that was not checked."""
        if self.integrity is None or self.orphans is None:
            return None
        return self.integrity == ["ok"] and not self.orphans

    def report(self) -> dict[str, Any]:
        """The JSON document of ``fencepost doctor --json``."""
        return {
            "database": self.target,
            "schema_version": self.pragmas["schema_version"],
            "library_schema_version": fp.SCHEMA_VERSION,
            "pragmas": self.pragmas,
            "integrity_check": self.integrity,
            "integrity_check_mode": self.integrity_mode,
            "orphan_attempts": [
                {"run_id": r, "unit_id": u, "attempt": a, "dispatch_id": d}
                for r, u, a, d in self.orphans or []
            ],
            "expired_leases_on_active_runs": plain(self.expired),
            "healthy": self.healthy,
        }


def gather(
    ledger: fp.Ledger, *, full: bool = False, checks: bool = True, vacuum: bool = False
) -> Checkup:
    """Read the doctor's findings from ``ledger``. ``checks=False`` leaves out the two
    whole-database reads (integrity and orphan attempts); ``full`` makes the integrity check
    SQLite's whole ``integrity_check`` instead of the quick one; ``vacuum`` first rewrites the
    database (the only write, and only when asked)."""
    if vacuum:
        ledger.vacuum()
    pragmas = ledger.pragmas()
    integrity = ledger.integrity_check(quick=not full) if checks else None
    orphans = ledger.orphan_attempts() if checks else None
    expired = ledger.expired_leases(active_only=True)
    return Checkup(
        target=ledger.target,
        pragmas=pragmas,
        expired=expired,
        integrity=integrity,
        integrity_mode="full" if full else "quick",
        orphans=orphans,
    )

"""``fencepost ui``: a read-only web dashboard over a ledger (runs, a run's units and attempts,
leases and fencing, a live event tail, throughput, doctor), served by the standard library's
HTTP server from files shipped in the wheel: no runtime dependency, nothing fetched from
elsewhere. See :func:`make_server`."""

from __future__ import annotations

from fencepost.ui.server import DashboardServer, is_loopback, make_server

__all__ = ["DashboardServer", "is_loopback", "make_server"]

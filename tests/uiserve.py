"""The dashboard (``fencepost ui``) served in a thread of the test process, and plain HTTP
requests to it: shared by the API tests (test_ui.py), the browser tests (test_ui_browser.py)
and the dashboard's bench."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fencepost.ui import DashboardServer, make_server


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str:
        return self.headers.get(name, "")


@contextlib.contextmanager
def served(
    target: str,
    *,
    token: str | None = None,
    clock: Callable[[], int] | None = None,
    readers: int = 2,
) -> Iterator[DashboardServer]:
    """``make_server`` on a free loopback port, serving in a thread until the block ends;
    then shut down and closed (the streams end, the ledgers close)."""
    server = make_server(target, host="127.0.0.1", port=0, token=token, clock=clock,
                         readers=readers)  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        assert not thread.is_alive()


def request(
    server: DashboardServer,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    params: dict[str, Any] | None = None,
    timeout: float = 30,
) -> Answer:
    """One request on a connection of its own."""
    host, port = server.server_address[:2]
    if params:
        path += "?" + urllib.parse.urlencode(params, doseq=True)
    conn = http.client.HTTPConnection(str(host), int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        res = conn.getresponse()
        return Answer(res.status, res.headers, res.read())
    finally:
        conn.close()


def get_json(server: DashboardServer, path: str, **params: Any) -> Any:
    """A GET that must succeed; its JSON."""
    answer = request(server, path, params=params)
    assert answer.status == 200, (answer.status, answer.body[:500])
    return answer.json()

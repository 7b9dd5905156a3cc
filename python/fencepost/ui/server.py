"""The dashboard's HTTP server: the standard library's ``ThreadingHTTPServer``, a read-only
JSON API (:mod:`fencepost.ui.api`), a server-sent event stream and the page's static files.

Read-only by construction: the ledger is opened with ``create=False``, only ``GET`` and
``HEAD`` are served (anything else is 405), and the handlers call nothing but the ledger's
reads. Bound to loopback by default; any other address needs a token, and with a token every
request must carry it (``Authorization: Bearer``, or the cookie a page load with ``?token=``
sets). Every response carries a Content-Security-Policy that allows the page's own script and
style only, so user data in the ledger cannot become script even if a page bug rendered it as
markup.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import importlib.resources
import ipaddress
import queue
import secrets
import select
import socket
import sys
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fencepost as fp
from fencepost import _doctor
from fencepost.ui import api

__all__ = ["Dashboard", "DashboardServer", "is_loopback", "make_server"]

COOKIE = "fencepost_ui"
# The largest request body a refused method's request may carry and still keep its connection.
MAX_DISCARD = 1 << 16
# Connections that serve the pages (one more serves the event streams).
READERS = 3
# Long-lived event streams at once; more are refused (503) rather than starving the pages.
MAX_STREAMS = 16
# How long one wait of a stream lasts: the most a stream takes to notice a shutdown. Each wait
# queries once when it starts, so this is also an idle stream's query rate.
STREAM_WAIT_S = 1.0
# A comment line this often keeps proxies and the browser from timing an idle stream out.
KEEPALIVE_S = 15.0
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
LOOPBACK_NAMES = ("localhost", "localhost.")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@functools.cache
def _static(name: str) -> bytes:
    return importlib.resources.files("fencepost.ui").joinpath("static", name).read_bytes()


class Dashboard:
    """What the handlers share: the ledger connections, the token, the throughput counter,
    the run totals' memory, and the open streams.

    One connection serves the event streams (a wait holds no connection while it waits, so
    they all share it) and a small pool serves the pages: a page asks for its parts at once
    (a run's unit counts and its accounting are each an aggregate over the run), and each
    part is read on a connection of its own, side by side."""

    def __init__(
        self,
        ledgers: list[fp.Ledger],
        *,
        target: str,
        token: str | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.ledgers = ledgers
        self.ledger = ledgers[0]
        self._readers: queue.SimpleQueue[fp.Ledger] = queue.SimpleQueue()
        for reader in ledgers[1:] or ledgers:
            self._readers.put(reader)
        self.target = target
        self.token = token
        self.clock = clock
        self.throughput = api.Throughput()
        self.totals = api.RunTotals()
        self.stopping = threading.Event()
        self.streams: set[threading.Thread] = set()
        self._streams_lock = threading.Lock()
        # The whole-database checks run one at a time, on a connection of their own, so a
        # check of a large file holds up no page.
        self._checks_lock = threading.Lock()
        # The port served (set once bound): cookies ignore ports, so it is in the cookie's
        # name, and two dashboards on one host keep their sessions apart.
        self.port = 0
        # Sessions are valid for this process only: a restart asks for the token again.
        self._session_key = secrets.token_bytes(32)

    @contextlib.contextmanager
    def reader(self) -> Iterator[fp.Ledger]:
        """A connection of the pool for one call (waits while all are in use)."""
        ledger = self._readers.get()
        try:
            yield ledger
        finally:
            self._readers.put(ledger)

    def close(self) -> None:
        for ledger in self.ledgers:
            ledger.close()

    def now_ms(self) -> int:
        return api.now_ms_of(self.clock)

    def cookie_name(self) -> str:
        return f"{COOKIE}_{self.port}"

    def cookie_value(self) -> str:
        """The session cookie: derived from the token and this process's key, so the token
        itself is never stored in the browser and a session ends with the server."""
        assert self.token is not None
        return hmac.new(self._session_key, self.token.encode(), hashlib.sha256).hexdigest()

    def run_checks(self) -> _doctor.Checkup:
        if not self._checks_lock.acquire(blocking=False):
            raise api.ApiError(409, "the checks are already running; try again when they finish")
        try:
            with fp.Ledger.open(self.target, create=False) as own:
                return _doctor.gather(own, checks=True)
        finally:
            self._checks_lock.release()

    def begin_stream(self) -> bool:
        with self._streams_lock:
            if len(self.streams) >= MAX_STREAMS or self.stopping.is_set():
                return False
            self.streams.add(threading.current_thread())
            return True

    def end_stream(self) -> None:
        with self._streams_lock:
            self.streams.discard(threading.current_thread())

    def join_streams(self, timeout: float) -> None:
        with self._streams_lock:
            streams = list(self.streams)
        for thread in streams:
            thread.join(timeout)


class DashboardServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with the dashboard attached; :meth:`server_close` ends the event
    streams (each notices within :data:`STREAM_WAIT_S`) before it closes the ledger."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        dashboard.port = int(self.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}/"

    def shutdown(self) -> None:
        self.dashboard.stopping.set()
        super().shutdown()

    def server_close(self) -> None:
        self.dashboard.stopping.set()
        super().server_close()
        self.dashboard.join_streams(timeout=5 * STREAM_WAIT_S + 1)
        self.dashboard.close()


def make_server(
    target: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8177,
    token: str | None = None,
    clock: Callable[[], int] | None = None,
    readers: int = READERS,
) -> DashboardServer:
    """Open the ledger at ``target`` (it must exist: nothing is created) and bind the server
    (``port`` 0: any free port; the bound one is in ``server.url``). A host other than
    loopback needs a ``token``. ``readers`` connections serve the pages, one more the event
    streams. Serve with ``serve_forever()``; stop with ``shutdown()`` from another thread,
    then ``server_close()``."""
    if token is not None and not token:
        raise ValueError("the token must not be empty")
    if token is None and not is_loopback(host):
        raise ValueError(
            f"serving on {host} (not loopback) needs a token: pass --token (or set "
            "FENCEPOST_UI_TOKEN), and open the printed URL"
        )
    if readers < 1:
        raise ValueError(f"readers must be at least 1, not {readers}")
    ledgers: list[fp.Ledger] = []
    try:
        for _ in range(readers + 1):
            ledgers.append(fp.Ledger.open(target, create=False, clock=clock))
        dashboard = Dashboard(ledgers, target=target, token=token, clock=clock)
        made = DashboardServer((host, port), dashboard)
    except BaseException:
        for ledger in ledgers:
            ledger.close()
        raise
    return made


class Handler(BaseHTTPRequestHandler):
    """One request: security headers on every response, GET and HEAD only, the token checked
    before anything is read."""

    server: DashboardServer
    server_version = "fencepost-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # An idle kept-alive connection is closed after this long (a stream writes keep-alives).
    timeout = 60

    # ------------------------------------------------------------------ plumbing

    @property
    def app(self) -> Dashboard:
        return self.server.dashboard

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a dashboard left open polls; errors are reported by :meth:`_fail`."""

    def _headers(self, status: int, content_type: str, length: int | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        *,
        cache: str = "no-store",
        extra: dict[str, str] | None = None,
    ) -> None:
        self._headers(status, content_type, len(body))
        self.send_header("Cache-Control", cache)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any, extra: dict[str, str] | None = None) -> None:
        self._send(status, api.dumps(value), "application/json; charset=utf-8", extra=extra)

    def _error(self, status: int, message: str, extra: dict[str, str] | None = None) -> None:
        self._json(status, {"error": message, "status": status}, extra)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line, headers too long) as JSON with
        the security headers, like every other answer, instead of its HTML page."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        self._error(code, message or phrase, {"Connection": "close"})

    def _fail(self, error: BaseException) -> None:
        """An error from the ledger or a bug, as a JSON error fit to show: the message of a
        fencepost error (they say what to do), never a traceback or a driver's raw text."""
        if isinstance(error, api.ApiError):
            self._error(error.status, error.message)
        elif isinstance(error, fp.NotFound):
            self._error(404, error.message)
        elif isinstance(error, fp.InvalidArgument):
            self._error(400, error.message)
        elif isinstance(error, fp.StoreBusy):
            self._error(503, "the database is busy; try again in a moment")
        elif isinstance(error, fp.StoreError):
            # Its message may carry the driver's words; the operation says enough.
            sys.stderr.write(f"fencepost ui: {type(error).__name__}: {error}\n")
            what = error.operation or "reading"
            self._error(503, f"the database failed while {what}; run `fencepost doctor`")
        elif isinstance(error, fp.LedgerError):
            self._error(500, error.message)
        else:
            sys.stderr.write("fencepost ui: internal error\n" + traceback.format_exc())
            self._error(500, "internal error in the dashboard (details in the server's log)")

    # ------------------------------------------------------------------ methods

    def do_GET(self) -> None:
        try:
            if self._has_body():
                self._refuse_body()
                return
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as error:
            try:
                self._fail(error)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    do_HEAD = do_GET

    def _has_body(self) -> bool:
        """Whether the request says it carries a body: a Content-Length other than 0, or any
        Transfer-Encoding."""
        if "Transfer-Encoding" in self.headers:
            return True
        lengths = self.headers.get_all("Content-Length") or []
        return any(v.strip().strip("0") or not v.strip() for v in lengths)

    def _discard_body(self) -> bool:
        """Read and drop a small body of known size (closing on unread bytes would reset the
        connection under the answer); ``False`` for a large one or one of unknown size, which
        only closing the connection gets rid of."""
        lengths = self.headers.get_all("Content-Length") or ["0"]
        try:
            length = int(lengths[0]) if len(set(lengths)) == 1 else -1
        except ValueError:
            length = -1
        if 0 <= length <= MAX_DISCARD and "Transfer-Encoding" not in self.headers:
            self.rfile.read(length)
            return True
        return False

    def _refuse_body(self) -> None:
        # A GET or HEAD has no body here. Were one ignored, its bytes would be read as the
        # connection's next request: a proxy that forwards GET bodies would carry a request
        # it never saw (smuggling). So it is refused and the connection closed, never reused.
        self._discard_body()
        self.close_connection = True
        self._error(
            400,
            f"a {self.command} request must not carry a body (Content-Length or "
            "Transfer-Encoding); send the query in the URL",
            {"Connection": "close"},
        )

    def _not_allowed(self) -> None:
        if not self._discard_body():
            self.close_connection = True
        self._error(
            405,
            f"{self.command} is not allowed: the dashboard is read-only (GET and HEAD only)",
            {"Allow": "GET, HEAD"},
        )

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def __getattr__(self, name: str) -> Any:
        # Any other method (http.server answers 501 for a method it has no do_X for): 405.
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    # ------------------------------------------------------------------ access

    def _host_ok(self) -> bool:
        """Without a token, only a loopback name may be asked for (``Host``), so a web page
        elsewhere cannot reach the dashboard by pointing a name of its own at 127.0.0.1 (DNS
        rebinding)."""
        if self.app.token is not None:
            return True
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name)

    def _authorized(self) -> bool:
        token = self.app.token
        if token is None:
            return True
        header = self.headers.get("Authorization", "")
        if header[:7].lower() == "bearer " and hmac.compare_digest(
            header[7:].strip().encode(), token.encode()
        ):
            return True
        # Split by hand: SimpleCookie stops at the first cookie it cannot parse, and cookies
        # ignore ports, so another application on this host could hide ours behind one.
        expected = self.app.cookie_value().encode()
        for pair in self.headers.get("Cookie", "").split(";"):
            name, _, value = pair.strip().partition("=")
            if name == self.app.cookie_name() and hmac.compare_digest(value.encode(), expected):
                return True
        return False

    def _token_login(self, path: str, query: dict[str, list[str]]) -> bool:
        """A page load with ``?token=``: a valid token sets the session cookie and redirects
        to the same page without it (so the token leaves the address bar and history)."""
        token = self.app.token
        given = query.get("token")
        if token is None or path not in ("/", "/index.html") or not given:
            return False
        if not hmac.compare_digest(given[-1].encode(), token.encode()):
            return False
        cookie = (
            f"{self.app.cookie_name()}={self.app.cookie_value()}; Path=/; HttpOnly; SameSite=Strict"
        )
        self._send(
            303, b"", "text/plain; charset=utf-8", extra={"Location": path, "Set-Cookie": cookie}
        )
        return True

    # ------------------------------------------------------------------ routes

    def _route(self) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = parsed.path
        try:
            query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True, max_num_fields=50)
        except ValueError:
            self._error(400, "too many query fields (at most 50)")
            return
        if self.headers.get("Sec-Fetch-Site", "") in ("cross-site", "same-site"):
            # A page of another site (or another port of this host) may not make a browser
            # call the dashboard: it could not read the answers, but it could keep the
            # whole-database checks busy.
            self._error(403, "requests from other sites are refused")
            return
        if not self._host_ok():
            self._error(421, "unexpected Host header: open the dashboard at its loopback URL")
            return
        if self._token_login(path, query):
            return
        if not self._authorized():
            if path.startswith("/api/"):
                self._error(401, "a token is required", {"WWW-Authenticate": "Bearer"})
            else:
                self._send(
                    401,
                    b"fencepost ui: a token is required; open the URL the server printed "
                    b"(it ends in ?token=...)\n",
                    "text/plain; charset=utf-8",
                    extra={"WWW-Authenticate": "Bearer"},
                )
            return
        if path in STATIC:
            name, content_type = STATIC[path]
            self._send(200, _static(name), content_type, cache="no-cache")
            return
        if path == "/api/stream":
            self._stream(query)
            return
        handler = ROUTES.get(path)
        if handler is None:
            self._error(404, f"no such page or call: {path}")
            return
        with self.app.reader() as ledger:
            answer = handler(self, ledger, query)
        self._json(200, answer)

    def _stream(self, query: dict[str, list[str]]) -> None:
        """Server-sent events: each new event as ``id: seq`` and one line of JSON. Resumes
        after ``Last-Event-ID`` (what EventSource sends on reconnecting) or ``after``; without
        either, from now. Ends when the client goes away or the server stops."""
        app = self.app
        run_id = api.run_filter(app.ledger, query)
        header = self.headers.get("Last-Event-ID")
        resume, name = (header, "Last-Event-ID") if header else (api.one(query, "after"), "after")
        after = api.parse_seq(resume, name) if resume else api.head_seq(app.ledger)
        if not app.begin_stream():
            raise api.ApiError(503, "too many open event streams; close a tail and try again")
        try:
            self.close_connection = True
            self._headers(200, "text/event-stream; charset=utf-8", None)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.send_header("X-Accel-Buffering", "no")
            self.end_headers()
            if self.command == "HEAD":
                return
            self.wfile.write(f"retry: 2000\n: resuming after {after}\n\n".encode())
            self.wfile.flush()
            feed = api.EventFeed(app.ledger, run_id, after)
            idle = 0.0
            while not app.stopping.is_set():
                try:
                    events = feed.wait(STREAM_WAIT_S)
                except Exception as e:  # the response has begun: say so in the stream, and end
                    sys.stderr.write(f"fencepost ui: event stream: {e!r}\n")
                    message = str(e) if isinstance(e, fp.LedgerError) else "internal error"
                    self.wfile.write(b"event: failure\ndata: %s\n\n" % api.dumps(message))
                    return
                if events:
                    chunks = [
                        b"id: %d\nevent: ledger\ndata: %s\n\n"
                        % (e.seq, api.dumps(api.event_record(e)))
                        for e in events
                    ]
                    self.wfile.write(b"".join(chunks))
                    idle = 0.0
                else:
                    if self._client_gone():
                        return
                    idle += STREAM_WAIT_S
                    if idle < KEEPALIVE_S:
                        continue
                    self.wfile.write(b": keep-alive\n\n")
                    idle = 0.0
                self.wfile.flush()
        finally:
            app.end_stream()

    def _client_gone(self) -> bool:
        """Whether the client of a stream closed its end. It sends nothing after its request,
        so a readable socket means end of file; without this check an abandoned stream would
        hold its thread (and its place among the streams) until its next keep-alive."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # ------------------------------------------------------------------ the API

    def api_meta(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.meta(ledger, token_required=self.app.token is not None)

    def api_runs(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.runs_page(ledger, query)

    def api_run(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.run_detail(ledger, query, self.app.now_ms())

    def api_run_totals(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.run_totals(ledger, query, self.app.totals)

    def api_units(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.units_page(ledger, query, self.app.totals)

    def api_find(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.find_run(ledger, query)

    def api_unit(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.unit_detail(ledger, query)

    def api_leases(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.leases_page(ledger, query, self.app.now_ms())

    def api_queue(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.queue_page(ledger, query, self.app.now_ms())

    def api_retries(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.retries_page(ledger, query, self.app.now_ms())

    def api_schedules(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.schedules_page(ledger, query, self.app.now_ms())

    def api_events(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return api.events_page(ledger, query)

    def api_throughput(self, ledger: fp.Ledger, query: api.Query) -> Any:
        return self.app.throughput(ledger, query, self.app.now_ms())

    def api_doctor(self, ledger: fp.Ledger, query: api.Query) -> Any:
        checks = self.app.run_checks if api.flag(query, "checks") else None
        return api.doctor(ledger, checks=checks)


ROUTES: dict[str, Callable[[Handler, fp.Ledger, api.Query], Any]] = {
    "/api/meta": Handler.api_meta,
    "/api/runs": Handler.api_runs,
    "/api/run": Handler.api_run,
    "/api/run/totals": Handler.api_run_totals,
    "/api/units": Handler.api_units,
    "/api/unit": Handler.api_unit,
    "/api/find": Handler.api_find,
    "/api/leases": Handler.api_leases,
    "/api/queue": Handler.api_queue,
    "/api/retries": Handler.api_retries,
    "/api/schedules": Handler.api_schedules,
    "/api/events": Handler.api_events,
    "/api/throughput": Handler.api_throughput,
    "/api/doctor": Handler.api_doctor,
}

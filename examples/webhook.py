"""A webhook that records workers' results idempotently: POST /finish -> finish_attempt.

What it shows:

- ``finish_attempt`` behind an HTTP endpoint that at-least-once callers may call again and
  again: the first delivery finishes the attempt (``{"finished": true}``), a repeat changes
  nothing and says so (``{"finished": false}``), with 200 both times so the caller stops
  retrying;
- fencepost's argument checks as the endpoint's validation: a bad field is a 400 whose body
  carries the ledger's message and the argument's name (``InvalidArgument.argument``);
- an unknown run is a 404 (``finish_attempt`` itself only answers ``False`` for it);
- one ``Ledger`` shared by all the server's threads: it is thread-safe, and finishes arriving
  together share a transaction (group commit).

Run it, with a run and two reserved attempts to finish (``--demo``; it prints curl commands)::

    python examples/webhook.py --db hooks.db --port 8080 --demo

The request body::

    {"run_id": "...", "unit_id": "...", "attempt": 1, "dispatch_id": "...",
     "status": "completed", "result": {"any": "JSON"}}

``status`` is completed, failed, cancelled or timed_out; ``result``, ``tokens`` and
``failure_reason`` are optional. The first stdout line is ``{"port": N, "url": ...}`` (useful
with ``--port 0``, which picks a free port). There is no authentication: it listens on
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fencepost as fp

REQUIRED = ("run_id", "unit_id", "attempt", "dispatch_id", "status")
OPTIONAL = ("result", "tokens", "failure_reason")


class FinishHandler(BaseHTTPRequestHandler):
    """Answers POST /finish. ``ledger`` is set by ``serve``: one Ledger for every thread."""

    ledger: fp.Ledger
    timeout = 30  # seconds: a caller that stalls mid-request cannot hold a thread for ever

    def do_POST(self) -> None:
        if self.path != "/finish":
            self.reply(404, {"error": f"no endpoint {self.path}; POST /finish"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError as e:
            self.reply(400, {"error": f"the body is not JSON: {e}"})
            return
        if not isinstance(body, dict):
            self.reply(400, {"error": "the body must be a JSON object"})
            return
        # Refuse missing and unknown fields here: fencepost checks the values, not the shape
        # of our request (a misspelt "reslt" would otherwise be dropped without a word).
        missing = [k for k in REQUIRED if k not in body]
        unknown = sorted(set(body) - set(REQUIRED) - set(OPTIONAL))
        if missing or unknown:
            field = (missing or unknown)[0]
            what = "missing" if missing else "unknown"
            self.reply(400, {"error": f"{what} field(s): {missing or unknown}", "argument": field})
            return
        self.record(body)

    def record(self, body: dict[str, Any]) -> None:
        # (Not named finish: that is the base class's per-request teardown.)
        try:
            finished = self.ledger.finish_attempt(
                body["run_id"],
                body["unit_id"],
                body["attempt"],
                body["dispatch_id"],
                status=body["status"],
                result=body.get("result"),
                tokens=body.get("tokens"),
                failure_reason=body.get("failure_reason"),
            )
        except fp.InvalidArgument as e:
            # A bad value (an attempt that is not an int, an unknown status, a result that
            # is not JSON...): the caller's mistake, which a retry will not fix.
            self.reply(400, {"error": str(e), "argument": e.argument})
            return
        except fp.LedgerError as e:
            # The database is busy or unreachable: 503 tells an at-least-once caller to try
            # again later, which is safe (the finish is a compare-and-set).
            self.reply(503, {"error": str(e)})
            return
        if not finished and self.ledger.get_run(body["run_id"]) is None:
            # finish_attempt answers False for a finish it cannot match, an unknown run
            # included; only on that (rare) path do we pay a read to tell the two apart.
            self.reply(404, {"error": f"no run {body['run_id']!r}"})
            return
        # False: already finished (the caller's retry, or a late duplicate), or not an
        # attempt of this run. Either way nothing was written, and retrying will not change
        # that, so it is a 200 too.
        self.reply(200, {"finished": finished})

    def reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    # On the way out, server_close waits for the requests in flight (their finishes commit
    # before the ledger closes); and a burst of callers may queue for accept() (the listen
    # backlog; socketserver's default is 5).
    daemon_threads = False
    request_queue_size = 128


def demo_attempts(ledger: fp.Ledger, url: str) -> None:
    """--demo: a run with two reserved attempts, and the curl commands that finish them."""
    run = ledger.start_run(
        "examples/webhook", scope_key=None, force=True, steps=[{"id": "call-out"}]
    )
    for unit in ("u1", "u2"):
        res = ledger.reserve_attempt(run.run_id, unit, step_id="call-out")
        body = {
            "run_id": run.run_id,
            "unit_id": unit,
            "attempt": res.attempt,
            "dispatch_id": res.dispatch_id,
            "status": "completed",
            "result": {"ok": True},
        }
        print(f"curl -s {url} -d '{json.dumps(body)}'", file=sys.stderr)
    print("(send one twice: the second answers finished false)", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--demo", action="store_true", help="make a run with attempts to finish")
    args = p.parse_args()
    # SIGTERM stops the server like Ctrl-C does, so the ledger is closed on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with fp.Ledger.open(args.db) as ledger:
        # A subclass per server carries the ledger: the handler class is instantiated per
        # request by http.server, so it cannot take constructor arguments.
        handler = type("Handler", (FinishHandler,), {"ledger": ledger})
        with Server((args.host, args.port), handler) as server:
            port = server.server_address[1]  # the bound port: --port 0 picks one
            url = f"http://{args.host}:{port}/finish"
            print(json.dumps({"port": port, "url": url}), flush=True)
            if args.demo:
                demo_attempts(ledger, url)
            # Ctrl-C (or SIGTERM) ends serve_forever; the with blocks then close the server
            # and the ledger.
            with contextlib.suppress(KeyboardInterrupt):
                server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

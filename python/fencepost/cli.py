"""The ``fencepost`` command line: inspection commands and the demo.

Every command takes ``--db TARGET`` (default ``$FENCEPOST_DB``, else ``./fencepost.db``) and
``--json``. Exit codes: 0 ok, 1 refused (not found, ambiguous, a failed check), 2 usage error.
Only ``restore`` creates a ledger (as ``Ledger.open`` does); every other command needs one
that exists: a missing file is an error, not an empty ledger.
Standard library only (``argparse``): the wheel has no runtime dependencies.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

import fencepost as fp
from fencepost import _archive, _core, _doctor, demo
from fencepost._format import iso, key_values, plain, table, write_json
from fencepost.ledger import _parse_target

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
# The largest page a read returns (runs, units, events); larger reads page with a cursor.
MAX_PAGE = 10_000


class Refused(Exception):
    """A command that cannot do what was asked (exit 1); the message is printed as is."""


def default_db() -> str:
    return os.environ.get("FENCEPOST_DB") or "fencepost.db"


def check_existing(target: str) -> None:
    """Refuse a target that is malformed (``InvalidArgument``: a usage error) or a file that
    does not exist, with a message that says how to name the ledger. Parsed as
    ``Ledger.open`` parses it, so both agree on what is a file."""
    path, _ = _parse_target(target)
    if path is not None and not pathlib.Path(path).is_file():
        raise Refused(
            f"no ledger at {path}; pass --db PATH or set FENCEPOST_DB (only restore creates one)"
        )


def open_existing(target: str) -> fp.Ledger:
    """Open a ledger that must already exist (reads, prune and the dashboard create none)."""
    check_existing(target)
    return fp.Ledger.open(target, create=False)


def _resolve(ledger: fp.Ledger, prefix: str) -> str:
    try:
        return ledger.resolve_run_id(prefix)
    except fp.AmbiguousRunId as e:
        raise Refused(
            f"run id prefix {prefix!r} matches {len(e.matches)} runs: "
            + ", ".join(e.matches[:10])
            + ("..." if len(e.matches) > 10 else "")
            + "; give more characters"
        ) from e
    except fp.RunNotFound as e:
        raise Refused(f"no run id starts with {prefix!r}; `fencepost runs` lists them") from e


# ------------------------------------------------------------------ commands


def cmd_runs(args: argparse.Namespace, out: TextIO) -> int:
    with open_existing(args.db) as ledger:
        after = None
        if args.after is not None:
            after = ledger.get_run(_resolve(ledger, args.after))
        runs = ledger.list_runs(
            scope_key=fp.ALL_SCOPES if args.scope is None else args.scope,
            active_only=args.active,
            include_children=args.children,
            status=["queued"] if args.queued else args.status,
            limit=args.limit,
            after=after,
        )
    if args.json:
        write_json(runs, out)
    elif args.queued:
        # What claim_next goes by: due time (not_before, else when it was queued), whether it
        # is due yet, priority, key.
        clock = datetime.datetime.now(datetime.UTC)
        queue = [
            (r.run_id, r.workflow_name, iso(r.due_at),
             "yes" if r.due_at <= clock else "no", r.priority,
             r.concurrency_key)
            for r in runs
        ]  # fmt: skip
        table(queue, ["RUN", "WORKFLOW", "DUE AT", "DUE", "PRIORITY", "KEY"], out)
    else:
        rows = [
            (r.run_id, r.status, r.workflow_ref, r.scope_key, r.current_step_id, r.revision,
             iso(r.updated_at))
            for r in runs
        ]  # fmt: skip
        table(rows, ["RUN", "STATUS", "WORKFLOW", "SCOPE", "STEP", "REV", "UPDATED"], out)
    if len(runs) == args.limit:
        # A full page may have more behind it: say how to read on, where a script's parser
        # of stdout does not see it.
        sys.stderr.write(
            f"{len(runs)} runs shown (--limit); the next page: --after {runs[-1].run_id}\n"
        )
    return EXIT_OK


def cmd_limits(args: argparse.Namespace, out: TextIO) -> int:
    """Show every key's limit, or set one (``none`` removes it)."""
    with open_existing(args.db) as ledger:
        if args.key is not None:
            if args.limit is None:
                raise Refused("give the key's limit (0 or more), or none to remove it")
            limit = None if args.limit.lower() == "none" else _count(args.limit)
            ledger.set_concurrency_limit(args.key, limit)
        limits = ledger.concurrency_limits()
    if args.json:
        write_json(limits, out)
    else:
        table(sorted(limits.items()), ["KEY", "LIMIT"], out)
    return EXIT_OK


def cmd_pause(args: argparse.Namespace, out: TextIO) -> int:
    """Pause or resume a workflow's claims; print the paused workflows."""
    with open_existing(args.db) as ledger:
        if args.command == "pause":
            ledger.pause_workflow(args.workflow)
        else:
            ledger.resume_workflow(args.workflow)
        paused = ledger.paused_workflows()
    if args.json:
        write_json(paused, out)
    else:
        table([(name,) for name in paused], ["PAUSED"], out)
    return EXIT_OK


def cmd_units(args: argparse.Namespace, out: TextIO) -> int:
    """A run's units, or the units due for a retry or exhausted (of a run, or of every run)."""
    if args.run_prefix is None and not (args.due or args.exhausted):
        raise Refused("give a run, or --due / --exhausted for the units of every run")
    with open_existing(args.db) as ledger:
        run_id = None if args.run_prefix is None else _resolve(ledger, args.run_prefix)
        after = None
        if args.after is not None:
            after_run, _, after_unit = args.after.partition("/")
            after = ledger.unit(_resolve(ledger, after_run), after_unit)
            if after is None:
                raise Refused(f"no unit {args.after!r}; give RUN/UNIT of the page's last unit")
        if args.due:
            units = ledger.due_units(run_id, limit=args.limit, after=after)
        elif args.exhausted:
            units = ledger.exhausted_units(run_id, limit=args.limit, after=after)
        else:
            assert run_id is not None
            units = ledger.units(
                run_id, limit=args.limit, after=None if after is None else after.unit_id
            )
    if args.json:
        write_json(units, out)
    else:
        rows = [
            (u.run_id, u.unit_id, u.step_id, u.status, u.attempts, iso(u.retry_at),
             (u.failure_reason or "")[:60])
            for u in units
        ]  # fmt: skip
        table(rows, ["RUN", "UNIT", "STEP", "STATUS", "ATTEMPTS", "RETRY AT", "REASON"], out)
    if len(units) == args.limit:
        last = units[-1]
        sys.stderr.write(
            f"{len(units)} units shown (--limit); the next page: "
            f"--after {last.run_id}/{last.unit_id}\n"
        )
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, out: TextIO) -> int:
    """retry_units or cancel_units on a run's units (those named, or all)."""
    with open_existing(args.db) as ledger:
        run_id = _resolve(ledger, args.run_prefix)
        units = args.units or None
        try:
            if args.command == "retry":
                moved = ledger.retry_units(run_id, units)
            else:
                moved = ledger.cancel_units(run_id, units, reason=args.reason)
        except fp.NotFound as e:
            raise Refused(f"{e}; `fencepost units {run_id}` lists the run's units") from e
        except fp.RunNotActive as e:
            raise Refused(str(e)) from e
    done = "retried" if args.command == "retry" else "cancelled"
    if args.json:
        write_json({"run_id": run_id, done: moved}, out)
    else:
        out.write(f"{done} {moved} unit{'s' if moved != 1 else ''} of run {run_id}\n")
    return EXIT_OK


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Refused(f"limit {text!r} is not a whole number; give 0 or more, or none") from None


def cmd_schedules(args: argparse.Namespace, out: TextIO) -> int:
    """List the schedules, after pausing, resuming or deleting one if asked."""
    with open_existing(args.db) as ledger:
        if args.pause is not None:
            ledger.pause_schedule(args.pause)
        elif args.resume is not None:
            ledger.resume_schedule(args.resume)
        elif args.delete is not None:
            ledger.delete_schedule(args.delete)
        schedules = ledger.schedules()
    if args.json:
        write_json(schedules, out)
    else:
        rows = [
            (s.name, s.cron, s.timezone, s.workflow_name, s.overlap, s.catch_up,
             "paused" if s.paused else iso(s.next_slot), s.last_run_id)
            for s in schedules
        ]  # fmt: skip
        headers = ["NAME", "CRON", "TIMEZONE", "WORKFLOW", "OVERLAP", "CATCH_UP", "NEXT"]
        table(rows, [*headers, "LAST_RUN"], out)
    return EXIT_OK


def cmd_tick(args: argparse.Namespace, out: TextIO) -> int:
    """Fire the due schedules once, or every ``--every`` until stopped; one line per run
    queued (a JSON object per line with ``--json``)."""

    def report(runs: list[fp.Run]) -> None:
        for run in runs:
            if args.json:
                out.write(json.dumps({"run_id": run.run_id, "workflow_name": run.workflow_name,
                                      "not_before": iso(run.not_before)}) + "\n")  # fmt: skip
            else:
                out.write(f"queued {run.run_id} ({run.workflow_name}, due {iso(run.not_before)})\n")
        out.flush()

    with open_existing(args.db) as ledger:
        if args.every is None:
            report(ledger.tick_schedules())
            return EXIT_OK
        if args.every <= datetime.timedelta(0):
            usage("--every must be more than 0s")

        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        # A service manager's SIGTERM stops the loop as cleanly as Ctrl-C does.
        previous = signal.signal(signal.SIGTERM, stop)
        period = args.every.total_seconds()
        try:
            while True:
                started = time.monotonic()
                report(ledger.tick_schedules())
                time.sleep(max(0.0, period - (time.monotonic() - started)))
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    with open_existing(args.db) as ledger:
        run_id = _resolve(ledger, args.run_prefix)
        run = ledger.get_run(run_id)
        assert run is not None
        steps = ledger.steps(run_id)
        counts = ledger.unit_counts(run_id)
        lease = ledger.lease(run_id)
        accounting = ledger.accounting(run_id)
    by_status = {k: v for k, v in counts.items() if v}
    total = sum(counts.values())
    if args.json:
        doc = {
            "run": plain(run),
            "steps": plain(steps),
            "units": {"total": total, "by_status": by_status},
            "lease": plain(lease),
            "accounting": plain(accounting),
        }
        write_json(doc, out)
        return EXIT_OK
    fields = [
        ("run", run.run_id), ("workflow", f"{run.workflow_ref} ({run.workflow_name})"),
        ("status", run.status), ("scope", run.scope_key), ("step", run.current_step_id),
        ("parent", run.parent_run_id), ("session", run.origin_session_id),
        ("revision", run.revision), ("created", iso(run.created_at)),
        ("updated", iso(run.updated_at)), ("completed", iso(run.completed_at)),
        ("lease", f"generation {lease.generation}, owner {lease.owner_id or '-'}"
                  f" ({lease.owner_type or '-'}), expires {iso(lease.expires_at)}"),
        ("fence", f"takeovers {lease.takeovers}, stale writes refused {lease.refused_writes}"),
        ("units", f"{total} " + " ".join(f"{k}={v}" for k, v in by_status.items())),
        ("attempts", f"{accounting.total_attempts} (unit {accounting.dispatch_attempts}, "
                     f"gate {accounting.gate_attempts}), tokens {accounting.total_tokens}"),
    ]  # fmt: skip
    key_values(fields, out)
    if steps:
        out.write("\n")
        table(
            [(s.sequence_index, s.step_id, s.status, iso(s.completed_at)) for s in steps],
            ["#", "STEP", "STATUS", "COMPLETED"],
            out,
        )
    return EXIT_OK


def _event_rows(events: list[fp.Event]) -> list[tuple[Any, ...]]:
    return [
        (e.seq, iso(e.ts), e.resource_id, e.revision, e.type,
         f"{e.actor_type}:{e.actor_id}" if e.actor_type else None, e.generation,
         json.dumps(e.payload, separators=(",", ":"), ensure_ascii=False)[:80])
        for e in events
    ]  # fmt: skip


EVENT_HEADERS = ["SEQ", "TS", "RUN", "REV", "TYPE", "ACTOR", "GEN", "PAYLOAD"]


def cmd_events(args: argparse.Namespace, out: TextIO) -> int:
    if args.after < 0:
        usage(f"--after must be 0 or a seq, not {args.after}")
    with open_existing(args.db) as ledger:
        run_id = None if args.run_prefix is None else _resolve(ledger, args.run_prefix)
        after = args.after
        events = ledger.events(run_id, after_seq=after, limit=args.limit)
        # Following prints one table in parts: the header once, columns kept lined up.
        widths: list[int] = []
        while True:
            if args.json:
                for e in events:
                    out.write(json.dumps(plain(e), ensure_ascii=False) + "\n")
            elif events or (args.follow and not widths):
                table(_event_rows(events), EVENT_HEADERS, out, widths=widths,
                      header=not widths)  # fmt: skip
            if events:
                after = events[-1].seq
            out.flush()
            if not args.follow:
                # A full page: one indexed probe says whether more follow, and how to read on.
                if len(events) == args.limit and ledger.events(run_id, after_seq=after, limit=1):
                    sys.stderr.write(
                        f"{len(events)} events shown (--limit); more follow: --after {after}\n"
                    )
                return EXIT_OK
            # Following: wake when something is committed, not on a timer.
            events = ledger.wait_events(
                run_id, after_seq=after, timeout_s=args.interval, limit=args.limit
            )


def cmd_leases(args: argparse.Namespace, out: TextIO) -> int:
    with open_existing(args.db) as ledger:
        expired = args.expired
        leases = ledger.expired_leases() if expired else ledger.leases(owned_only=args.owned)
    if args.json:
        write_json(leases, out)
        return EXIT_OK
    rows = [
        (le.run_id, le.generation, le.owner_id, le.owner_type, iso(le.expires_at),
         iso(le.heartbeat_at), le.takeovers, le.refused_writes)
        for le in leases
    ]  # fmt: skip
    table(rows, ["RUN", "GEN", "OWNER", "TYPE", "EXPIRES", "HEARTBEAT", "TAKEOVERS", "REFUSED"],
          out)  # fmt: skip
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace, out: TextIO) -> int:
    with open_existing(args.db) as ledger:
        found = _doctor.gather(ledger, full=args.full, vacuum=args.vacuum)
    pragmas, integrity = found.pragmas, found.integrity or []
    orphans, expired = found.orphans or [], found.expired
    healthy = bool(found.healthy)
    if args.json:
        write_json(found.report(), out)
    else:
        lines = [
            ("database", found.target),
            ("schema", f"{pragmas['schema_version']} (library {fp.SCHEMA_VERSION})"),
            ("journal_mode", pragmas["journal_mode"]),
            ("synchronous", pragmas["synchronous"]),
            ("busy_timeout", f"{pragmas['busy_timeout']} ms"),
            ("foreign_keys", "on" if pragmas["foreign_keys"] else "off"),
            *([("tls", pragmas["tls"])] if pragmas.get("tls") is not None else []),
            ("integrity", f"{'; '.join(integrity)} ({found.integrity_mode} check)"),
            ("orphan attempts", str(len(orphans))),
            ("expired leases on active runs", str(len(expired))),
        ]
        key_values(lines, out)
        for r, u, a, d in orphans:
            out.write(f"  orphan: run {r} unit {u} attempt {a} dispatch {d}\n")
        for le in expired:
            out.write(
                f"  expired: run {le.run_id} owner {le.owner_id} since {iso(le.expires_at)}\n"
            )
        out.write("healthy\n" if healthy else "NOT healthy\n")
    return EXIT_OK if healthy else EXIT_REFUSED


def cmd_ui(args: argparse.Namespace, out: TextIO) -> int:
    from fencepost import ui

    token = args.token if args.token is not None else os.environ.get("FENCEPOST_UI_TOKEN") or None
    if token is not None and (not token.strip() or token != token.strip()):
        usage("--token must not be empty or begin or end with spaces")
    if token is None and not ui.is_loopback(args.host):
        usage(
            f"--host {args.host} is not loopback: the dashboard would be open to the network. "
            "Pass --token T (or set FENCEPOST_UI_TOKEN) and every request must carry it, or "
            "keep the default --host 127.0.0.1"
        )
    check_existing(args.db)  # the clear message for a missing file
    try:
        server = ui.make_server(args.db, host=args.host, port=args.port, token=token)
    except OSError as e:
        # A port in use or a host that does not resolve: the user's to change, so a usage
        # error, not a refusal of the ledger's.
        usage(
            f"cannot listen on {args.host}:{args.port}: {e.strerror or e}; pass another "
            "--host or --port (--port 0: any free port)"
        )
    url = server.url + (f"?token={urllib.parse.quote(token, safe='')}" if token else "")
    out.write(f"fencepost ui: {server.dashboard.ledger.target} (read-only)\n")
    out.write(f"serving on {url}  (Ctrl-C stops)\n")
    out.flush()

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # A service manager's SIGTERM stops it as cleanly as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        out.write("stopping\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
    return EXIT_OK


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 0 to 65535, not {value}")
    return value


def _progress(verb: str) -> Callable[[str], None] | None:
    """A one-line progress display on stderr when it is a terminal (nothing otherwise)."""
    if not sys.stderr.isatty():
        return None

    def show(text: str) -> None:
        sys.stderr.write(f"\r{verb}: {text}\x1b[K")
        sys.stderr.flush()

    return show


def cmd_prune(args: argparse.Namespace, out: TextIO) -> int:
    show = _progress("dry run" if args.dry_run else "pruning")
    on_batch = (
        None
        if show is None
        else lambda r: show(
            f"{r.runs} runs, {r.attempts} attempts, {r.events} events"
            + (f", {r.reclaimed_bytes >> 20} MiB given back" if r.reclaimed_bytes else "")
        )
    )
    with open_existing(args.db) as ledger:
        report = ledger.prune(
            older_than=args.older_than,
            statuses=args.status or ("completed", "failed", "cancelled"),
            limit=args.limit,
            dry_run=args.dry_run,
            archive=args.archive,
            progress=on_batch,
        )
    if show is not None:
        sys.stderr.write("\n")
    if args.json:
        write_json(report, out)
        return EXIT_OK
    fields = [
        ("dry run" if report.dry_run else "pruned", f"{report.runs} runs"),
        ("attempts", str(report.attempts)), ("events", str(report.events)),
        ("blobs", str(report.blobs)),
        ("file", f"{report.reclaimed_bytes} bytes given back"),
        *([("archive", f"{args.archive} ({report.archived_bytes} bytes)")] if args.archive else []),
        ("transactions", f"{report.transactions}, longest {report.longest_transaction_ms:.1f} ms"),
    ]  # fmt: skip
    key_values(fields, out)
    return EXIT_OK


def cmd_restore(args: argparse.Namespace, out: TextIO) -> int:
    show = _progress("restoring")
    # A write: into a new ledger as into an existing one (an archive moves runs elsewhere).
    with fp.Ledger.open(args.db) as ledger:
        runs = ledger.restore(
            args.archive,
            progress=None if show is None else lambda n: show(f"{n} runs"),
            max_line_bytes=args.max_line_bytes,
        )
    if show is not None:
        sys.stderr.write("\n")
    if args.json:
        write_json({"runs": runs}, out)
    else:
        out.write(f"restored {runs} runs from {args.archive}\n")
    return EXIT_OK


# ------------------------------------------------------------------ parsing


def usage(message: str) -> NoReturn:
    sys.stderr.write(f"fencepost: error: {message}\n")
    raise SystemExit(EXIT_USAGE)


def _page(text: str) -> int:
    value = _positive(text)
    if value > MAX_PAGE:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_PAGE} (a page; read on with --after), not {value}"
        )
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``: a whole number and one unit."""
    number, unit = text[:-1], text[-1:].lower()
    if unit not in DURATION_UNITS or not number.isdigit():
        raise argparse.ArgumentTypeError(
            f"must be a whole number and a unit (s, m, h, d, w), such as 30d or 12h, not {text!r}"
        )
    return datetime.timedelta(seconds=int(number) * DURATION_UNITS[unit])


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=default_db(),
        help="the ledger: a SQLite file or a postgresql:// URL (default $FENCEPOST_DB, else "
        "./fencepost.db)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    top = argparse.ArgumentParser(
        prog="fencepost", description="Inspect a fencepost ledger, or run the demo."
    )
    top.add_argument("--version", action="version", version=f"fencepost {fp.__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="fan out units over worker processes, kill -9 one")
    demo.add_arguments(d)
    d.set_defaults(func=demo.run)

    r = sub.add_parser("runs", parents=[common], help="list runs, newest first")
    r.add_argument("--scope", help="only this scope key")
    r.add_argument("--active", action="store_true", help="only active runs")
    r.add_argument("--children", action="store_true", help="include child runs")
    r.add_argument(
        "--status",
        action="append",
        choices=_core.RUN_STATUSES,
        help="only runs in STATUS (repeatable)",
    )
    r.add_argument(
        "--limit", type=_page, default=1000, help="runs per page (at most 10000; default 1000)"
    )
    r.add_argument("--after", metavar="RUN_PREFIX", help="the page after this run")
    r.add_argument(
        "--queued",
        action="store_true",
        help="only queued runs, with their due time, priority and concurrency key",
    )
    r.set_defaults(func=cmd_runs)

    li = sub.add_parser(
        "limits", parents=[common], help="concurrency limits: show them, or set one"
    )
    li.add_argument("key", nargs="?", metavar="KEY", help="the concurrency key to set")
    li.add_argument("limit", nargs="?", metavar="LIMIT", help="live leases allowed, or none")
    li.set_defaults(func=cmd_limits)
    for name, says in (
        ("pause", "stop claim_next handing out a workflow's runs"),
        ("resume", "let claim_next hand out a paused workflow's runs again"),
    ):
        pa = sub.add_parser(name, parents=[common], help=says)
        pa.add_argument("workflow", metavar="WORKFLOW")
        pa.set_defaults(func=cmd_pause)

    un = sub.add_parser(
        "units", parents=[common], help="a run's units, or those due for a retry or exhausted"
    )
    un.add_argument("run_prefix", nargs="?", metavar="RUN_PREFIX", help="one run (default: all)")
    which = un.add_mutually_exclusive_group()
    which.add_argument("--due", action="store_true", help="failed units whose retry time came")
    which.add_argument("--exhausted", action="store_true", help="units out of attempts")
    un.add_argument(
        "--limit", type=_page, default=1000, help="units per page (at most 10000; default 1000)"
    )
    un.add_argument("--after", metavar="RUN/UNIT", help="the page after this unit")
    un.set_defaults(func=cmd_units)
    rt = sub.add_parser(
        "retry", parents=[common], help="make a run's failed and exhausted units due now"
    )
    rt.add_argument("run_prefix", metavar="RUN_PREFIX")
    rt.add_argument("units", nargs="*", metavar="UNIT", help="only these units (default: all)")
    rt.set_defaults(func=cmd_retry)
    cu = sub.add_parser(
        "cancel-units", parents=[common], help="cancel a run's units that are not done"
    )
    cu.add_argument("run_prefix", metavar="RUN_PREFIX")
    cu.add_argument("units", nargs="*", metavar="UNIT", help="only these units (default: all)")
    cu.add_argument("--reason", help="why, kept on each unit")
    cu.set_defaults(func=cmd_retry)

    sc = sub.add_parser(
        "schedules", parents=[common], help="the cron schedules: list them, or pause one"
    )
    act = sc.add_mutually_exclusive_group()
    act.add_argument("--pause", metavar="NAME", help="stop firing this schedule")
    act.add_argument("--resume", metavar="NAME", help="fire this schedule again")
    act.add_argument("--delete", metavar="NAME", help="delete this schedule (its runs stay)")
    sc.set_defaults(func=cmd_schedules)
    tk = sub.add_parser(
        "tick",
        parents=[common],
        help="queue the runs of the schedules' due slots (once, or a loop)",
    )
    tk.add_argument(
        "--every", type=_duration, metavar="DURATION",
        help="tick again every DURATION (1s, 30s, 1m) until stopped; default: once",
    )  # fmt: skip
    tk.set_defaults(func=cmd_tick)
    s = sub.add_parser("show", parents=[common], help="one run: steps, units, lease, accounting")
    s.add_argument("run_prefix", metavar="RUN_PREFIX")
    s.set_defaults(func=cmd_show)

    e = sub.add_parser("events", parents=[common], help="the event log, oldest first")
    e.add_argument("run_prefix", metavar="RUN_PREFIX", nargs="?")
    e.add_argument("--after", type=int, default=0, metavar="SEQ", help="only events after SEQ")
    e.add_argument(
        "--limit", type=_page, default=1000, help="events per page (at most 10000; default 1000)"
    )
    e.add_argument("--follow", action="store_true", help="keep printing new events (Ctrl-C)")
    e.add_argument("--interval", type=float, default=30.0, help=argparse.SUPPRESS)
    e.set_defaults(func=cmd_events)

    le = sub.add_parser("leases", parents=[common], help="the lease of every run")
    le.add_argument("--expired", action="store_true", help="only expired leases, live runs")
    le.add_argument("--owned", action="store_true", help="only leases with an owner now")
    le.set_defaults(func=cmd_leases)

    doc = sub.add_parser("doctor", parents=[common], help="check the database; exit 1 if not")
    doc.add_argument(
        "--full",
        action="store_true",
        help="SQLite's whole integrity_check (every index against its table; minutes on a "
        "large file) instead of the quick_check",
    )
    doc.add_argument(
        "--vacuum",
        action="store_true",
        help="first rewrite the database compactly (SQLite VACUUM, which also lets prune shrink "
        "a file made by an older fencepost; PostgreSQL VACUUM ANALYZE); holds the write lock",
    )
    doc.set_defaults(func=cmd_doctor)

    pr = sub.add_parser(
        "prune", parents=[common], help="remove finished run trees older than an age"
    )
    pr.add_argument(
        "--older-than", required=True, type=_duration, metavar="AGE",
        help="finished longer ago than AGE (30d, 12h, 90m, 2w)",
    )  # fmt: skip
    pr.add_argument(
        "--status", action="append", choices=["completed", "failed", "cancelled"],
        help="only trees whose runs all have these statuses (repeat; default all three)",
    )  # fmt: skip
    pr.add_argument("--limit", type=_positive, help="at most this many run trees")
    pr.add_argument("--archive", metavar="FILE", help="write each tree here first (.gz: gzip)")
    pr.add_argument("--dry-run", action="store_true", help="count only; change nothing")
    pr.set_defaults(func=cmd_prune)

    u = sub.add_parser("ui", help="serve a read-only web dashboard of the ledger")
    u.add_argument(
        "--db",
        default=default_db(),
        help="the ledger: a SQLite file or a postgresql:// URL (default $FENCEPOST_DB, else "
        "./fencepost.db)",
    )
    u.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    u.add_argument(
        "--port", type=_port, default=8177, help="port to listen on (default 8177; 0: any free)"
    )
    u.add_argument(
        "--token",
        help="require this token on every request (needed for a --host other than loopback; "
        "default $FENCEPOST_UI_TOKEN)",
    )
    u.set_defaults(func=cmd_ui)

    rs = sub.add_parser("restore", parents=[common], help="put back the runs of an archive")
    rs.add_argument("archive", metavar="FILE")
    rs.add_argument(
        "--max-line-bytes",
        type=int,
        default=_archive.MAX_LINE_BYTES,
        metavar="N",
        help="the longest line (one run tree) to read; longer ones are refused (default 64 MiB)",
    )
    rs.set_defaults(func=cmd_restore)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    func: Callable[[argparse.Namespace, TextIO], int] = args.func
    try:
        return func(args, sys.stdout)
    except Refused as e:
        sys.stderr.write(f"fencepost: {e}\n")
        return EXIT_REFUSED
    except fp.InvalidArgument as e:
        sys.stderr.write(f"fencepost: error: {e}\n")
        return EXIT_USAGE
    except fp.LedgerError as e:
        sys.stderr.write(f"fencepost: {e}\n")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

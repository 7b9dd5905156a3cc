"""A dispatcher for the failover tests, run as its own process: it reserves and finishes units
``u0``, ``u1``, ... of one run until the stop file appears, and writes a line for every answer
it got (one ``O_APPEND`` write each, so a line is whole or absent whatever happens to the
process). A call that fails (the server gone, a failover under way, an outcome the ledger
cannot know) is logged and made again: the calls it makes are the ones that are safe to
repeat (``reserve_attempt`` again reclaims a reserved attempt in place, ``finish_attempt``
again answers ``False`` for a finished one).

Usage: python -m tests.failover_dispatcher URL RUN_ID LOG STOP"""

from __future__ import annotations

import functools
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import fencepost as fp

T = TypeVar("T")


def main() -> None:
    url, run_id, log, stop = sys.argv[1:5]
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    def until_answered(call: Callable[[], T]) -> T:
        deadline = time.monotonic() + 120
        while True:
            try:
                return call()
            except fp.StoreError as e:
                say("error " + str(e).replace("\n", " "))
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    with fp.Ledger.open(url, durability="full") as ledger:
        i = 0
        while not pathlib.Path(stop).exists():
            unit = f"u{i}"
            got = until_answered(functools.partial(ledger.reserve_attempt, run_id, unit,
                                                   step_id="s"))  # fmt: skip
            say(f"reserved {unit} {got.attempt} {got.dispatch_id} {got.kind}")
            finish = functools.partial(ledger.finish_attempt, run_id, unit, got.attempt,
                                       got.dispatch_id, status="completed")  # fmt: skip
            done = until_answered(finish)
            say(f"finished {unit} {got.attempt} {done}")
            i += 1
    say("stopped")


if __name__ == "__main__":
    main()

"""Turn a pytest-benchmark JSON file into the ratio tables of benches/RESULTS.md.

    python benches/ratios.py bench.json

Every figure is a median from the same run. Benchmarks that time several operations per round
record ``extra_info["ops"]``; their figures are per operation.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
from collections import defaultdict
from typing import Any


def main(path: str) -> int:
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        info = b["extra_info"]
        if "units_per_s" in info or "cycles" in info or "backend" in info:
            continue  # one figure per caller count: the curves below
        impl = info.get("impl") or b["name"].split("[")[0]
        groups[b["group"] or b["name"]][impl] = b["stats"]["median"] * 1e6 / info.get("ops", 1)
    cpu = data["machine_info"].get("cpu", {})
    print(
        f"Machine: {cpu.get('brand_raw', '?')}, {cpu.get('count', '?')} cores, "
        f"Python {data['machine_info']['python_version']}, {data['datetime'][:10]}."
    )
    floor = groups.get("raw commit floor", {}).get("sqlite3")
    print()
    print("| group | impl | median µs/op | vs fencepost | fencepost / commit floor |")
    print("|---|---|--:|--:|--:|")
    for group, impls in sorted(groups.items()):
        base = impls.get("fencepost.digest") or impls.get("fencepost")
        for impl, us in sorted(impls.items(), key=lambda kv: kv[1]):
            ratio = f"{us / base:.2f}x" if base else "-"
            over_floor = (
                f"{us / floor:.2f}x" if floor and impl == "fencepost" and "tx" in group else ""
            )
            print(f"| {group} | {impl} | {us:.2f} | {ratio} | {over_floor} |")
    curve = [b["extra_info"] for b in data["benchmarks"] if "claims_per_s" in b["extra_info"]]
    if curve:
        print()
        print("| claimers | winning claims/s | machine CPU busy | clients' share of it |")
        print("|---|--:|--:|--:|")
        for info in curve:
            print(
                f"| {info['impl']} | {info['claims_per_s']:.0f} | {info['cpu_busy']:.0%} "
                f"| {info['client_cpu_share']:.0%} |"
            )
    concurrency([b["extra_info"] for b in data["benchmarks"] if "units_per_s" in b["extra_info"]])
    dispatchers(
        [b["extra_info"] for b in data["benchmarks"] if "dispatch_units_per_s" in b["extra_info"]]
    )
    waits([b["extra_info"] for b in data["benchmarks"]])
    queue([b["extra_info"] for b in data["benchmarks"] if "cycles" in b["extra_info"]])
    retry_reads([b["extra_info"] for b in data["benchmarks"]])
    return 0


def retry_reads(infos: list[dict[str, Any]]) -> None:
    """bench_retries: the failing cycle with a policy and without, and the reads on the small
    and the large ledger, each pair timed side by side, with the median of the rounds' own
    ratios."""
    for i in infos:
        if "policy_over_none" in i:
            us = i["us_per_cycle"]
            print()
            print(
                f"Failing cycle, {i['backend']}: {us['none']} µs without a policy, "
                f"{us['policy']} with one: {i['policy_over_none']:.2f}x"
            )
    rows = [i for i in infos if "large_over_small" in i]
    if not rows:
        return
    print()
    print("| due and exhausted pages | µs per read, small | µs per read, large | large / small |")
    print("|---|--:|--:|--:|")
    for i in rows:
        us = i["us_per_read"]
        print(
            f"| {i['backend']}, {i['small']:,} and {i['large']:,} units | {us[str(i['small'])]} "
            f"| {us[str(i['large'])]} | {i['large_over_small']:.2f}x |"
        )


def queue(infos: list[dict[str, Any]]) -> None:
    """bench_queue: items taken and finished per second by 1, 4 and 8 processes from a small
    and a large backlog, with and without key limits, fencepost and pgqueuer; then the ratios
    its targets are stated in, each taken within a cycle (a round on every backlog, side by
    side) and the median over cycles printed."""
    if not infos:
        return
    rate = {
        (b["impl"], b["backlog"], b["limits"], i["procs"]): b["queue_claims_per_s"]
        for i in infos
        for b in i["backlogs"]
    }
    cycles = {i["procs"]: i["cycles"] for i in infos}
    sizes = {b["backlog"] for i in infos for b in i["backlogs"]}
    small, large = min(sizes), max(sizes)

    def paired(procs: int, a: tuple[str, int, bool], b: tuple[str, int, bool]) -> str:
        """The median over cycles of backlog ``a``'s rate over backlog ``b``'s."""
        x, y = (f"{impl}-{n}-limits-{limits}" for impl, n, limits in (a, b))
        ratios = [c[x] / c[y] for c in cycles[procs] if c.get(x) and c.get(y)]
        return f"{statistics.median(ratios):.2f}x" if ratios else "-"

    print()
    print(f"claim_next vs pgqueuer dequeue, items/s (backlogs of {small:,} and {large:,})")
    print()
    print(
        "| limits | processes | fencepost small | fencepost large | large / small "
        "| pgqueuer small | pgqueuer large | fencepost / pgqueuer (small, large) "
        "| limits / none (small, large) |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for limits in (False, True):
        for procs in sorted(cycles):
            f = [rate.get(("fencepost", n, limits, procs), "-") for n in (small, large)]
            q = [rate.get(("pgqueuer", n, limits, procs), "-") for n in (small, large)]
            vs_peer = ", ".join(
                paired(procs, ("fencepost", n, limits), ("pgqueuer", n, limits))
                for n in (small, large)
            )
            vs_none = (
                " / ".join(
                    paired(procs, ("fencepost", n, True), ("fencepost", n, False))
                    for n in (small, large)
                )
                if limits
                else ""
            )
            grows = paired(procs, ("fencepost", large, limits), ("fencepost", small, limits))
            print(
                f"| {'on' if limits else 'off'} | {procs} | {f[0]} | {f[1]} | {grows} "
                f"| {q[0]} | {q[1]} | {vs_peer} | {vs_none} |"
            )


def waits(rows: list[dict[str, Any]]) -> None:
    """The controller's queue and waiting (bench_postgres.py, bench_wait.py): items taken per
    second by N processes, fencepost's ``claim_next`` over pgqueuer's dequeue; wake-up
    latency; an idle follower's statements per second; writers beside waiting listeners."""
    taken = {r["impl"]: r["items_per_s"] for r in rows if "items_per_s" in r}
    if taken:
        print()
        print("| processes | fencepost claim_next items/s | pgqueuer dequeue items/s | ratio |")
        print("|---|--:|--:|--:|")
        for n in sorted({int(k.rsplit("x", 1)[1]) for k in taken}):
            ours, peer = taken.get(f"fencepost x{n}"), taken.get(f"pgqueuer x{n}")
            ratio = f"{ours / peer:.2f}x" if ours and peer else ""
            print(f"| {n} | {ours} | {peer} | {ratio} |")
    wake = [r for r in rows if "wake" in r]
    if wake:
        print()
        print("| waiter | wake p50 ms | wake p99 ms |")
        print("|---|--:|--:|")
        for r in wake:
            print(f"| {r['impl']} | {r['wake']['p50_ms']} | {r['wake']['p99_ms']} |")
    idle = [r for r in rows if "idle" in r]
    if idle:
        print()
        print("| idle follower | events queries/s | change-mark reads/s |")
        print("|---|--:|--:|")
        for r in idle:
            print(f"| {r['impl']} | {r['idle']['queries_per_s']} | {r['idle']['checks_per_s']} |")
    writers = [r for r in rows if "writer_units_per_s" in r]
    if writers:
        print()
        print("| writers (4 x 16 callers) | units/s | listener wake-ups |")
        print("|---|--:|--:|")
        for r in writers:
            print(f"| {r['impl']} | {r['writer_units_per_s']} | {r['listener_wakeups']} |")


def dispatchers(rows: list[dict[str, Any]]) -> None:
    """Dispatcher processes on one PostgreSQL run (bench_postgres.py): units/s, the ratio to
    one process, and per process the calls per group and the time a group spends in its
    transaction (holding or waiting for the run's lock), mean and max."""
    if not rows:
        return
    one = next((r["dispatch_units_per_s"] for r in rows if r["procs"] == 1), None)
    print()
    print(
        "| dispatchers | units/s | vs 1 process | machine CPU busy "
        "| calls per group | group in transaction, mean / max µs |"
    )
    print("|---|--:|--:|--:|--|--|")
    for info in sorted(rows, key=lambda r: r["procs"]):
        rate = info["dispatch_units_per_s"]
        procs = info["per_process"]
        groups = ", ".join(str(p["mean_group"]) for p in procs)
        holds = ", ".join(f"{p['hold_us_mean']} / {p['hold_us_max']}" for p in procs)
        vs_one = f"{rate / one:.2f}x" if one else ""
        print(
            f"| {info['impl']} | {rate} | {vs_one} | {info['cpu_busy']:.0%} | {groups} | {holds} |"
        )


def concurrency(rows: list[dict[str, Any]]) -> None:
    """The concurrency curve (benches/bench_concurrency.py): units/s per caller count for each
    store and implementation, then the ratios the targets are stated in: grouped over
    ungrouped at the same count, grouped over its own single caller, and fencepost grouped over
    the peer at the same count (huey is measured at 16 only); then, where the run has them, the
    curve against its yardsticks: the batch path (one thread, ``callers`` the batch size) and
    processes on one run (``callers`` the process count, 16 threads each)."""
    if not rows:
        return
    rate: dict[tuple[str, str, int], float] = {}
    share: dict[tuple[str, str, int], str] = {}
    for info in rows:
        key = (info["store"], info["impl"], info["callers"])
        rate[key] = info["units_per_s"]
        if "cpu_busy" in info:
            client = info.get("client_cpu_share")
            share[key] = f"{info['cpu_busy']:.0%}" + (f" ({client:.0%})" if client else "")
    counts = sorted({c for _, _, c in rate})
    head = " | ".join(f"{c}" for c in counts)
    print()
    print(
        "Units/s (reserve + finish per unit, one round each) by callers (for fencepost batch: "
        "units per call, one thread; for fencepost processes: processes of 16 threads):"
    )
    print()
    print(f"| store | impl | {head} |")
    print("|---|---|" + "--:|" * len(counts))
    for store, impl in sorted({(s, i) for s, i, _ in rate}):
        cells = " | ".join(
            f"{rate[store, impl, c]:.0f}" if (store, impl, c) in rate else "" for c in counts
        )
        print(f"| {store} | {impl} | {cells} |")
    print()
    print("Machine CPU busy (this process's share of it) by callers:")
    print()
    print(f"| store | impl | {head} |")
    print("|---|---|" + "--:|" * len(counts))
    for store, impl in sorted({(s, i) for s, i, _ in share}):
        cells = " | ".join(share.get((store, impl, c), "") for c in counts)
        print(f"| {store} | {impl} | {cells} |")

    def ratio(a: tuple[str, str, int], b: tuple[str, str, int]) -> str:
        return f"{rate[a] / rate[b]:.2f}x" if a in rate and b in rate and rate[b] else ""

    print()
    print("| store | callers | grouped / ungrouped | grouped / grouped x1 | grouped / peer |")
    print("|---|--:|--:|--:|--:|")
    for store in sorted({s for s, _, _ in rate}):
        peers = sorted({i for s, i, _ in rate if s == store and not i.startswith("fencepost")})
        for c in counts:
            g = (store, "fencepost grouped", c)
            if g not in rate:
                continue
            vs_peer = ", ".join(
                f"{ratio(g, (store, p, c))} {p}" for p in peers if (store, p, c) in rate
            )
            print(
                f"| {store} | {c} | {ratio(g, (store, 'fencepost ungrouped', c))} "
                f"| {ratio(g, (store, 'fencepost grouped', 1))} | {vs_peer} |"
            )

    # (heading, numerator, denominator) as (impl, callers); "threads" are the grouped ones.
    # "same units": the batch of the units the callers hold at once (bench_concurrency.py).
    same = "fencepost batch, callers' units"
    yardsticks = [
        ("threads 16 / batch 16", ("fencepost grouped", 16), ("fencepost batch", 16)),
        ("threads 16 / batch 16, same units", ("fencepost grouped", 16), (same, 16)),
        ("coroutines 1000 / batch 256", ("fencepost coroutines", 1000), ("fencepost batch", 256)),
        ("coroutines 1000 / batch 256, same units", ("fencepost coroutines", 1000), (same, 256)),
        ("threads 16 / threads 1", ("fencepost grouped", 16), ("fencepost grouped", 1)),
        ("processes 4 / processes 1", ("fencepost processes", 4), ("fencepost processes", 1)),
    ]
    # Workers with 10 jobs in flight each: fencepost's coroutines against pgqueuer's batches.
    peer = "pgqueuer batch_size=10"
    yardsticks += [
        (f"{w} workers: coroutines / {peer}", ("fencepost worker coroutines", w), (peer, w))
        for w in (1, 4, 16)
    ]
    lines = []
    for store in sorted({s for s, _, _ in rate}):
        got = [ratio((store, *a), (store, *b)) for _, a, b in yardsticks]
        if any(got):
            lines.append(f"| {store} | " + " | ".join(got) + " |")
    if lines:
        print()
        print("| store | " + " | ".join(h for h, _, _ in yardsticks) + " |")
        print("|---|" + "--:|" * len(yardsticks))
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

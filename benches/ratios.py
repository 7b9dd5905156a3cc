"""Turn a pytest-benchmark JSON file into the ratio tables of benches/RESULTS.md.

    python benches/ratios.py bench.json

Every figure is a median from the same run. Benchmarks that time several operations per round
record ``extra_info["ops"]``; their figures are per operation.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections import defaultdict


def main(path: str) -> int:
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        info = b["extra_info"]
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
    curve = [b["extra_info"] for b in data["benchmarks"] if "cpu_busy" in b["extra_info"]]
    if curve:
        print()
        print("| claimers | winning claims/s | machine CPU busy | clients' share of it |")
        print("|---|--:|--:|--:|")
        for info in curve:
            print(
                f"| {info['impl']} | {info['claims_per_s']:.0f} | {info['cpu_busy']:.0%} "
                f"| {info['client_cpu_share']:.0%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Turn a pytest-benchmark JSON file into the ratio table of benches/RESULTS.md.

    python benches/ratios.py bench.json

Ratios compare medians measured in the same run: "x faster" = other / fencepost.
"""

from __future__ import annotations

import json
import pathlib
import platform
import sys
from collections import defaultdict


def main(path: str) -> int:
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        impl = b["extra_info"].get("impl") or b["name"].split("[")[0]
        groups[b["group"]][impl] = b["stats"]["median"] * 1e6
    info = data["machine_info"]
    print(
        f"Machine: {info.get('cpu', {}).get('brand_raw', platform.processor())}, "
        f"{info.get('cpu', {}).get('count', '?')} cores, Python {info['python_version']}, "
        f"{data['datetime'][:10]}."
    )
    print()
    print("| group | impl | median µs | fencepost speed-up |")
    print("|---|---|--:|--:|")
    for group, impls in sorted(groups.items()):
        base = impls.get("fencepost.digest") or next(iter(impls.values()))
        for impl, us in sorted(impls.items(), key=lambda kv: kv[1]):
            ratio = us / base
            print(f"| {group} | {impl} | {us:.2f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

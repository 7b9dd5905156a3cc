"""Checks of the release artifacts, run by scripts/test after building them.

    python scripts/check_dist.py wheel WHEEL   the wheel declares no runtime dependencies,
                                               holds the dashboard's static files, and
                                               `auditwheel show` finds it consistent with the
                                               manylinux tag in its name
    python scripts/check_dist.py sdist SDIST   the source archive holds what a build needs:
                                               Cargo.lock, rust/, python/ and both licenses

Each prints what it checked and exits non-zero on the first failure.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile


def fail(message: str) -> int:
    sys.stderr.write(f"check_dist: {message}\n")
    return 1


def glibc(tag: str) -> tuple[int, int] | None:
    """The glibc version a manylinux tag promises (``manylinux_2_17_x86_64``, or a legacy
    alias such as ``manylinux2014_x86_64``); None for any other tag."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    if m := re.match(r"manylinux_(\d+)_(\d+)_", tag):
        return int(m[1]), int(m[2])
    return legacy.get(tag.split("_", 1)[0])


# The dashboard's page (`fencepost ui`) is served from these files inside the package.
DASHBOARD_FILES = [
    f"fencepost/ui/static/{name}" for name in ("index.html", "app.js", "app.css", "favicon.svg")
]


def check_wheel(path: str) -> int:
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line
            for line in wheel.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    missing = [n for n in DASHBOARD_FILES if n not in names]
    if missing:
        return fail(f"the wheel lacks the dashboard's files: {missing}")
    # An optional extra (`fencepost[otel]`) is installed only when asked for.
    unconditional = [r for r in requires if "extra ==" not in r]
    if unconditional:
        return fail(f"the wheel declares runtime dependencies, it must have none: {unconditional}")
    # name-version-python-abi-platform.whl; the platform part may hold several dotted tags.
    platforms = path.rsplit("/", 1)[-1].removesuffix(".whl").split("-")[-1].split(".")
    claimed = [v for v in map(glibc, platforms) if v is not None]
    if not claimed:
        return fail(f"{path} has no manylinux platform tag: {platforms}")
    shown = subprocess.run(
        ["auditwheel", "show", path], capture_output=True, text=True, check=False
    )
    print(shown.stdout.strip())
    if shown.returncode != 0:
        return fail(f"auditwheel show failed: {shown.stderr.strip()}")
    # `auditwheel show` names the most compatible tag the wheel's symbols allow; the tag the
    # wheel claims must not promise an older glibc than that.
    text = " ".join(shown.stdout.split())
    allowed = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    if allowed is None or (limit := glibc(allowed[1])) is None:
        return fail("auditwheel found no manylinux tag the wheel is consistent with")
    if min(claimed) < limit:
        return fail(f"the wheel claims {platforms}, but its symbols need {allowed[1]}")
    print(
        f"wheel ok: {platforms} (auditwheel: {allowed[1]}), no runtime dependencies, "
        "the dashboard's files"
    )
    return 0


def check_sdist(path: str) -> int:
    with tarfile.open(path) as archive:
        names = archive.getnames()
    # Members sit under one top folder, fencepost-VERSION/.
    inside = {n.split("/", 1)[1] for n in names if "/" in n}
    needed = ["Cargo.toml", "Cargo.lock", "pyproject.toml", "LICENSE-MIT", "LICENSE-APACHE"]
    missing = [n for n in needed if n not in inside]
    for folder, example in (("rust/", "rust/lib.rs"), ("python/", "python/fencepost/__init__.py")):
        if example not in inside:
            missing.append(folder)
    if missing:
        return fail(f"{path} lacks {missing}")
    print(f"sdist ok: {len(names)} members, with {', '.join(needed)}, rust/ and python/")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("wheel", "sdist"):
        return fail("usage: check_dist.py wheel WHEEL | sdist SDIST")
    return check_wheel(argv[1]) if argv[0] == "wheel" else check_sdist(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

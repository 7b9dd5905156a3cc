"""A smoke test of an installed fencepost wheel, run by scripts/test in a fresh virtualenv that
holds the wheel and nothing else: what a user gets from ``pip install fencepost`` imports,
digests, reserves and finishes an attempt, and its ``fencepost doctor`` passes.

Run it from outside the source tree, so ``import fencepost`` can only find the installed copy:

    VENV/bin/python scripts/smoke.py
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import sysconfig
import tempfile

import fencepost as fp

# The RFC 8785 digest of {"hello": "world"}: the canonical bytes are {"hello":"world"}.
HELLO_DIGEST = "sha256:93a23971a914e5eacbf0a8d25154cda309c3c1c72fbb9914d47c60f3cb681588"


def main() -> int:
    installed = pathlib.Path(fp.__file__).resolve()
    site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
    assert installed.is_relative_to(site), f"fencepost imported from {installed}, not {site}"
    assert fp.digest({"hello": "world"}) == HELLO_DIGEST, fp.digest({"hello": "world"})
    assert fp.canonical_json({"b": [1, 2.5], "a": "é"}) == '{"a":"é","b":[1,2.5]}'.encode()

    with tempfile.TemporaryDirectory(prefix="fencepost-smoke-") as tmp:
        db = str(pathlib.Path(tmp) / "smoke.db")
        with fp.Ledger.open(db) as ledger:
            run = ledger.start_run("smoke", scope_key=None, steps=[{"id": "s"}], force=True)
            res = ledger.reserve_attempt(run.run_id, "u1", step_id="s")
            assert (res.kind, res.attempt) == ("reserved", 1), res
            assert ledger.finish_attempt(
                run.run_id, "u1", res.attempt, res.dispatch_id, status="completed"
            )
            unit = ledger.unit(run.run_id, "u1")
            assert unit is not None
            assert unit.status == "completed", unit
        # The console script the wheel installed, beside this interpreter.
        script = pathlib.Path(sys.executable).with_name("fencepost")
        doctor = subprocess.run(
            [str(script), "doctor", "--db", db], capture_output=True, text=True, check=False
        )
        if doctor.returncode != 0:
            sys.stderr.write(doctor.stdout + doctor.stderr)
            return 1
    # The wheel alone has no OpenTelemetry: its module says how to get it, and nothing else
    # imported it.
    try:
        import fencepost.otel  # noqa: F401
    except ImportError as e:
        missing = str(e)
    else:
        raise AssertionError("fencepost.otel imported without the otel extra installed")
    assert "pip install 'fencepost[otel]'" in missing, missing
    assert "opentelemetry" not in sys.modules
    print(f"smoke test passed: fencepost {fp.__version__} from {installed.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

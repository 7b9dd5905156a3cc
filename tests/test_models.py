"""The public records (``models``): what their ``repr`` shows, on every backend. A claim's token
is a secret, so a logged ``Claim`` or ``Preparation`` must not carry it."""

from __future__ import annotations

import fencepost as fp
from tests.conftest import STEPS


def test_claim_and_preparation_repr_hide_the_token(ledger: fp.Ledger) -> None:
    run = ledger.start_run("wf", scope_key=None, force=True, steps=STEPS, run_id="r1")
    claim = ledger.claim(run.run_id, "controller-1", lease_ms=60_000, token="tok-" + "x" * 40)
    assert claim.token == "tok-" + "x" * 40  # still there to use
    assert "tok-" not in repr(claim)
    assert "token" not in repr(claim)
    assert "controller-1" in repr(claim)
    prep = fp.Preparation("claimed", run, claim)
    assert "tok-" not in repr(prep)

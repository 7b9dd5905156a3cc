"""``fencepost ui`` in a real browser: headless Chromium driven by Selenium over the ledger of
a real demo run (``fencepost demo``: two workers, one killed, its shard taken over, the dead
worker's stale writes refused), plus a run of hostile data.

It walks the pages a user would: the runs, click through to the taken-over shard and its
attempts, the leases, the live tail (an event written by the test while the page is open must
appear), throughput and doctor; the hostile run's markup must show as text and never run; the
browser must log no error (a Content-Security-Policy violation included).

Chromium and its driver come from the system (Debian's ``chromium`` and ``chromium-driver``,
which ``scripts/test`` installs); Selenium is pointed at both, so its manager downloads
nothing. With ``FENCEPOST_SCREENSHOTS=DIR`` each page is saved as ``DIR/<page>.png`` at
1280x900 (the screenshots in docs/operations.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencepost as fp
from fencepost._format import iso
from fencepost.ui import DashboardServer, api
from tests.uiserve import served

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 900)
HOSTILE = "<script>alert(1)</script>\"'& é🙂<img src=x onerror=window.__pwned=1>"


def _require_browser() -> None:
    missing = [
        name
        for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
        if not (os.access(path, os.X_OK) or shutil.which(name))
    ]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the browser tests need Chromium and its driver "
            "from the system; run scripts/test, which installs them (apt-get install chromium "
            "chromium-driver)",
            pytrace=False,
        )


@dataclasses.dataclass
class Demo:
    db: str
    report: dict[str, Any]
    taken_shard: str
    parent: str


@pytest.fixture(scope="module")
def demo_ledger(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """The demo's ledger (200 units, 2 workers, one killed), and one run a controller holds
    now (the demo releases every lease it took, and a live one belongs on the leases page)."""
    db = str(tmp_path_factory.mktemp("ui-demo") / "demo.db")
    done = subprocess.run(
        [sys.executable, "-m", "fencepost", "demo", "--units", "200", "--workers", "2",
         "--db", db, "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["takeovers"], report
    assert report["stale_writes_refused"] == 4
    with fp.Ledger.open(db) as ledger:
        parent = next(r for r in ledger.list_runs() if r.workflow_ref == "demo/fan-out")
        shards = ledger.child_runs(parent.run_id)
        taken = next(s for s in shards if ledger.lease(s.run_id).generation == 2)
        ledger.reserve_run(
            "nightly-report", workflow_name="report", workflow_ref="report@1",
            source={"kind": "builtin", "id": "report"}, definition_digest=fp.digest({}),
            definition={}, runner_id="controller-1", origin_session_id="session-1",
        )  # fmt: skip
        claim = ledger.claim("nightly-report", "controller-1", lease_ms=3_600_000)
        assert claim is not None
        ledger.set_status("nightly-report", "active", claim=claim)
    return Demo(db, report, taken.run_id, parent.run_id)


@pytest.fixture(scope="module")
def dashboard(demo_ledger: Demo) -> Iterator[DashboardServer]:
    with served(demo_ledger.db) as server:
        yield server


@pytest.fixture(scope="module")
def hostile_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    """A ledger of one run whose every free-text field holds markup, served."""
    db = str(tmp_path_factory.mktemp("ui-hostile") / "hostile.db")
    with fp.Ledger.open(db) as ledger:
        ledger.start_run(
            "wf/" + HOSTILE, scope_key="scope" + HOSTILE, run_id="hostile-run",
            steps=[{"id": "s" + HOSTILE, "title": "T" + HOSTILE}],
            params={"p" + HOSTILE: HOSTILE}, force=True,
        )  # fmt: skip
        got = ledger.reserve_attempt("hostile-run", "u" + HOSTILE, step_id="s" + HOSTILE,
                                     holder="h" + HOSTILE)  # fmt: skip
        ledger.finish_attempt(
            "hostile-run", "u" + HOSTILE, got.attempt, got.dispatch_id, status="failed",
            result={"r": HOSTILE}, failure_reason="f" + HOSTILE,
        )  # fmt: skip
    with served(db) as server:
        yield server


BUSY_MINUTES = [300 + int(250 * math.sin(i / 6)) + 40 * (i % 3) for i in range(60)]


@pytest.fixture(scope="module")
def busy_dashboard(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DashboardServer, dict[int, int]]]:
    """A ledger with an hour of work behind it (the demo's fits in a minute): a dispatcher's
    batches, written with a clock set to each of the last 60 minutes, served; and the events
    written in each minute (by its start, epoch ms)."""
    db = str(tmp_path_factory.mktemp("ui-busy") / "busy.db")
    now = time.time_ns() // 1_000_000
    current = now // 60_000 * 60_000
    at = [0]
    written: dict[int, int] = {}
    with fp.Ledger.open(db, clock=lambda: at[0]) as ledger:
        at[0] = current - 60 * 60_000
        ledger.start_run("dispatch/hourly", scope_key=None, steps=[{"id": "s"}],
                         run_id="hourly", force=True)  # fmt: skip
        written[at[0]] = 1  # run.started
        for minute, n in enumerate(BUSY_MINUTES):
            at[0] = current - (59 - minute) * 60_000 + 1_000
            written[at[0] - 1_000] = written.get(at[0] - 1_000, 0) + 2 * n
            got = ledger.reserve_attempts(
                "hourly", [{"unit_id": f"m{minute}-{i}", "step_id": "s"} for i in range(n)]
            )
            at[0] += 20_000
            ledger.finish_attempts([
                {"run_id": "hourly", "unit_id": r.unit_id, "attempt": r.attempt,
                 "dispatch_id": r.dispatch_id, "status": "completed"}
                for r in got
            ])  # fmt: skip
    with served(db) as server:
        yield server, written


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_browser()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: run scripts/test (the test group)", pytrace=False)
    # Selenium Manager is never needed (both paths are given); offline, it cannot download.
    os.environ.setdefault("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = (
        CHROMIUM if os.access(CHROMIUM, os.X_OK) else str(shutil.which("chromium"))
    )
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars",
                "--force-device-scale-factor=1", "--lang=en-US"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if os.access(CHROMEDRIVER, os.X_OK) else shutil.which("chromedriver")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(driver_path)))
    try:
        driver.set_window_size(*WINDOW)
        # The screenshots are of the page's viewport: make it the window's full size.
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        driver.set_window_size(2 * WINDOW[0] - inner[0], 2 * WINDOW[1] - inner[1])
        yield driver
    finally:
        driver.quit()


class Page:
    """The browser on the dashboard: open a page, wait for it to draw, find and read."""

    def __init__(self, driver: Any, server: DashboardServer) -> None:
        from selenium.webdriver.common.by import By

        self.driver, self.server, self.by = driver, server, By

    def open(self, route: str) -> None:
        self.driver.get(self.server.url + "#/" + route)
        self.ready(route.split("?")[0])

    def ready(self, page: str) -> None:
        self.until(
            lambda: self.driver.execute_script(
                "const m = document.getElementById('main');"
                "return m.dataset.page === arguments[0] && m.dataset.ready === 'true'",
                page,
            ),
            f"page {page} drawn",
        )
        error = self.driver.find_element(self.by.ID, "error")
        assert not error.is_displayed(), error.text

    def until(self, check: Callable[[], Any], what: str, timeout: float = 15) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def css(self, selector: str) -> Any:
        return self.driver.find_element(self.by.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[Any]:
        return list(self.driver.find_elements(self.by.CSS_SELECTOR, selector))

    def text(self) -> str:
        return str(self.css("main").text)

    def shot(self, name: str, scroll_to: str | None = None) -> None:
        """Save the viewport as ``name``.png in ``$FENCEPOST_SCREENSHOTS`` (if set), scrolled
        to the top or to the element ``scroll_to``."""
        where = os.environ.get("FENCEPOST_SCREENSHOTS")
        if not where:
            return
        folder = pathlib.Path(where)
        folder.mkdir(parents=True, exist_ok=True)
        if scroll_to is None:
            self.driver.execute_script("window.scrollTo(0, 0)")
        else:
            self.driver.execute_script(
                "document.querySelector(arguments[0]).scrollIntoView()", scroll_to
            )
        # The pictures show the ledger's file name, not the test's temporary folder.
        shown = self.server.dashboard.ledger.target
        folder_of_db = str(pathlib.Path(shown).parent) + os.sep
        if not shown.startswith("postgresql://"):
            self.driver.execute_script(
                "const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
                "for (let n = walk.nextNode(); n; n = walk.nextNode())"
                "  n.nodeValue = n.nodeValue.split(arguments[0]).join('');",
                folder_of_db,
            )
        # Let the scroll and any fresh-row highlight settle.
        time.sleep(0.3)
        assert self.driver.save_screenshot(str(folder / f"{name}.png"))

    def no_errors_logged(self) -> None:
        logs = self.driver.get_log("browser")
        severe = [e for e in logs if e["level"] == "SEVERE"]
        assert not severe, severe


@pytest.fixture
def page(browser: Any, dashboard: DashboardServer) -> Page:
    return Page(browser, dashboard)


def test_runs_then_the_taken_over_run(page: Page, demo_ledger: Demo) -> None:
    page.open("runs")
    rows = page.all("table.runs tbody tr")
    refs = [r.find_element(page.by.CSS_SELECTOR, "td.wf").text for r in rows]
    assert "demo/fan-out" in refs
    assert "demo/shard" not in refs  # children are left out unless asked for
    page.shot("runs")

    page.css("input[name=children]").click()
    page.until(lambda: "children=1" in page.driver.current_url, "the filter applied")
    page.ready("runs")
    shard_rows = [r for r in page.all("table.runs tbody tr") if r.get_attribute("data-run")
                  == demo_ledger.taken_shard]  # fmt: skip
    assert shard_rows
    shard_rows[0].find_element(page.by.CSS_SELECTOR, "a.id").click()
    page.ready("run")
    assert page.css("#run-id").text == demo_ledger.taken_shard

    # The fence, visible: generation 2 (a takeover), and the counts the lease keeps.
    fencing = page.css("#fencing")
    generation = fencing.find_element(page.by.CSS_SELECTOR, "[data-k=generation] .card-value")
    assert generation.text == "2"
    takeovers = fencing.find_element(page.by.CSS_SELECTOR, "[data-k=takeovers] .card-value")
    refused = fencing.find_element(page.by.CSS_SELECTOR, "[data-k=refused_writes] .card-value")
    assert takeovers.text == "1"
    assert refused.text == "4"
    page.until(lambda: page.all("#unit-total"), "the unit counts")
    assert page.css("#unit-total").text.startswith("100")

    # The attempts: the batch in flight when the worker died was reclaimed in place at
    # generation 2 by the other worker (same attempt, same dispatch id).
    units = page.all("tr.unit")
    assert len(units) == 50
    assert any("reclaimed at gen 2" in u.text for u in units)
    page.shot("run")
    page.css("#expand-all").click()
    reclaimed = page.all("tr.attempt.reclaimed")
    assert reclaimed
    cells = reclaimed[0].find_elements(page.by.CSS_SELECTOR, "td")
    assert cells[4].text == "2"  # lease generation
    assert cells[5].text == "reclaimed ×1"
    assert cells[1].text == reclaimed[0].get_attribute("data-dispatch")
    page.shot("attempts", scroll_to="#units")
    page.no_errors_logged()


def test_runs_totals_find_by_id_and_one_unit(page: Page, demo_ledger: Demo) -> None:
    with fp.Ledger.open(demo_ledger.db) as ledger:
        counts = ledger.run_counts()
        first_unit = ledger.units(demo_ledger.taken_shard, limit=1)[0]
    page.open("runs")
    cards = page.all("#run-totals .card")
    totals = {
        c.get_attribute("data-k"): c.find_element(page.by.CSS_SELECTOR, ".card-value").text
        for c in cards
    }
    assert totals == {status: f"{n:,}" for status, n in counts.items()}
    # A total is a link to its status's runs.
    page.css("#run-totals a[data-status=completed]").click()
    page.until(lambda: "status=completed" in page.driver.current_url, "the status filter")
    page.ready("runs")
    statuses = {r.find_elements(page.by.CSS_SELECTOR, "td")[1].text
                for r in page.all("table.runs tbody tr")}  # fmt: skip
    assert statuses == {"completed"}

    # Find: no match says so; a whole id opens the run.
    page.css("#find-run").send_keys("no-such-run-anywhere")
    page.css("#find-form button").click()
    page.until(lambda: "No run id starts with" in page.css("#find-result").text, "no match")
    box = page.css("#find-run")
    box.clear()
    box.send_keys(demo_ledger.taken_shard)
    page.css("#find-form button").click()
    page.until(lambda: "#/run?" in page.driver.current_url, "the run's page")
    page.ready("run")
    assert page.css("#run-id").text == demo_ledger.taken_shard

    # A unit's own page: its attempts, newest first.
    page.until(lambda: page.all("tr.unit a.unit-link"), "the units")
    link = next(a for a in page.all("tr.unit a.unit-link") if a.text == first_unit.unit_id)
    link.click()
    page.ready("unit")
    assert page.css("#unit-id").text == first_unit.unit_id
    attempts = [int(r.get_attribute("data-attempt")) for r in page.all("tr.attempt")]
    assert attempts == list(reversed(range(1, first_unit.attempts + 1)))
    page.shot("unit")
    page.no_errors_logged()


def test_a_large_runs_totals_wait_for_a_click(
    page: Page, demo_ledger: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every run counts as large: its totals are read only when asked for.
    monkeypatch.setattr(api, "TOTALS_AUTO_MAX_REVISION", 1)
    page.driver.get(page.server.url + "#/runs")  # a fresh load reads the threshold
    page.driver.refresh()
    page.ready("runs")
    page.open(f"run?id={demo_ledger.taken_shard}")
    assert not page.all("#unit-total")
    buttons = page.all("button.totals-button")
    assert [b.text for b in buttons] == ["Count the units", "Add up attempts and tokens"]
    for button in buttons:
        button.click()
    page.until(lambda: page.all("#unit-total"), "the unit counts")
    assert page.css("#unit-total").text.startswith("100")
    attempts = page.until(lambda: page.all("[data-k=attempts] .card-value"), "the accounting")
    assert attempts[0].text == "100"
    page.no_errors_logged()
    monkeypatch.undo()
    page.driver.refresh()  # the next tests' pages read the real threshold
    page.ready("run")


def test_leases_page(page: Page, demo_ledger: Demo) -> None:
    page.open("leases")
    row = page.until(
        lambda: [
            r
            for r in page.all("table.recent-leases tr.lease")
            if r.get_attribute("data-run") == demo_ledger.taken_shard
        ],
        "the taken-over shard's lease",
    )[0]
    cells = [c.text for c in row.find_elements(page.by.CSS_SELECTOR, "td")]
    assert cells[3] == "2"  # generation
    assert cells[-2:] == ["1", "4"]
    assert page.css("[data-k=live] .card-value").text == "1"  # the demo released its own
    owned = page.all("section.panel table tr.lease")
    assert owned[0].get_attribute("data-run") == "nightly-report"
    assert "live" in owned[0].text
    page.shot("leases")
    page.no_errors_logged()


def test_live_tail_shows_a_new_event(page: Page, demo_ledger: Demo) -> None:
    page.open("tail")
    page.until(lambda: page.css("#conn").text == "live", "the stream to connect")
    backlog = page.all("#events tr.event")
    assert 0 < len(backlog) <= 50
    seqs = [int(r.get_attribute("data-seq")) for r in backlog]
    assert seqs == sorted(seqs)
    with fp.Ledger.open(demo_ledger.db) as ledger:
        ledger.start_run("browser/seen", scope_key=None, steps=[{"id": "s"}],
                         run_id="seen-by-the-browser", force=True)  # fmt: skip
    row = page.until(
        lambda: [r for r in page.all("#events tr.event") if "seen-by-the-browser" in r.text],
        "the new event in the tail",
    )[0]
    assert row.get_attribute("data-type") == "run.started"
    assert int(row.get_attribute("data-seq")) > seqs[-1]
    page.shot("tail")
    page.no_errors_logged()


def test_a_headless_screenshot_of_the_live_tail_finishes(
    dashboard: DashboardServer, tmp_path: pathlib.Path
) -> None:
    """A screenshot tool waits for the page's network to go idle (here, the virtual time budget
    runs only while no request is open): the tail polls with short requests, so it does, where
    an open event stream kept it loading until killed."""
    _require_browser()
    shot = tmp_path / "tail.png"
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
         "--virtual-time-budget=5000", f"--screenshot={shot}", dashboard.url + "#/tail"],
        capture_output=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_throughput_page(page: Page) -> None:
    page.open("throughput")
    bars = page.all("svg.chart rect.bar")
    assert len(bars) == 60
    assert sum(int(b.get_attribute("data-count")) for b in bars) > 0
    assert int(page.css("[data-k=total] .card-value").text.replace(",", "")) > 0
    page.no_errors_logged()


def test_throughput_of_a_busy_hour(
    browser: Any, busy_dashboard: tuple[DashboardServer, dict[int, int]]
) -> None:
    server, written = busy_dashboard
    page = Page(browser, server)
    page.open("throughput")
    bars = page.all("svg.chart rect.bar")
    assert len(bars) == 60
    # Minute by minute (by start: a minute may have begun since the ledger was written), what
    # was written, within the counter's precision.
    for bar in bars:
        start = dt.datetime.fromisoformat(bar.get_attribute("data-start").replace("Z", "+00:00"))
        wrote = written.get(fp.models.to_ms(start), 0)
        got = int(bar.get_attribute("data-count"))
        assert abs(got - wrote) <= max(2, wrote // 100), (start, got, wrote)
    assert "seq positions" in page.text()  # over 5 000 events: counted by probes
    page.shot("throughput")
    page.no_errors_logged()


def test_doctor_page(page: Page) -> None:
    page.open("doctor")
    assert "journal_mode" in page.text()
    page.css("#run-checks").click()
    page.ready("doctor")
    assert page.css("#verdict").text == "healthy"
    page.shot("doctor")
    page.no_errors_logged()


def test_hostile_data_shows_as_text(browser: Any, hostile_dashboard: DashboardServer) -> None:
    page = Page(browser, hostile_dashboard)
    page.open("run?id=hostile-run")
    text = page.text()
    assert "wf/" + HOSTILE in text
    assert "scope" + HOSTILE in text
    assert "T" + HOSTILE in text
    page.css("#expand-all").click()
    text = page.text()
    assert "u" + HOSTILE in text
    assert "h" + HOSTILE in text
    assert "f" + HOSTILE in text
    # Nothing of it became markup or ran.
    found = page.driver.execute_script(
        "return [document.scripts.length, document.querySelectorAll('main img').length,"
        " typeof window.__pwned]"
    )
    assert found == [1, 0, "undefined"]
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert.text  # noqa: B018
    page.open("runs?workflow=" + urllib.parse.quote("wf/" + HOSTILE, safe=""))
    assert [r.get_attribute("data-run") for r in page.all("table.runs tbody tr")] == ["hostile-run"]
    page.no_errors_logged()


@pytest.fixture(scope="module")
def queue_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    """A ledger with a queue: 55 due runs of mixed priority (more than a page), 4 not due yet,
    a key at its limit, a key held at 0, a key whose name is markup, and a paused workflow."""
    db = str(tmp_path_factory.mktemp("ui-queue") / "queue.db")

    def queue(ledger: fp.Ledger, run_id: str, **scheduling: Any) -> None:
        ledger.reserve_run(
            run_id, workflow_name=scheduling.pop("workflow_name", "deploy"),
            workflow_ref="deploy@1", source={"kind": "builtin", "id": "deploy"},
            definition_digest=fp.digest({}), definition={}, runner_id="controller-1",
            origin_session_id="session-1", **scheduling,
        )  # fmt: skip

    with fp.Ledger.open(db) as ledger:
        for i in range(55):
            queue(ledger, f"due-{i:02}", priority=(i * 7) % 5 - 2)
        for hours in (3, 1, 4, 2):
            queue(ledger, f"later-{hours}h", not_before=dt.timedelta(hours=hours))
        ledger.set_concurrency_limit("gpu", 2)
        ledger.set_concurrency_limit("idle", 0)
        ledger.set_concurrency_limit(HOSTILE, 1)
        for i in range(5):
            queue(ledger, f"gpu-{i}", concurrency_key="gpu", priority=1000)
        queue(ledger, "idle-0", concurrency_key="idle")
        queue(ledger, "hostile-0", concurrency_key=HOSTILE, priority=1000)
        ledger.pause_workflow("nightly")
        for i in range(4):
            queue(ledger, f"nightly-{i}", workflow_name="nightly", priority=1000)
        # The controller takes the two gpu runs the key has room for, and the hostile key's.
        claimed = ledger.claim_next("controller-1", lease_ms=3_600_000, limit=3)
        assert sorted(c.run_id for c in claimed) == ["gpu-0", "gpu-1", "hostile-0"]
    with served(db) as server:
        yield server


def _rows(page: Page, selector: str, attribute: str) -> list[tuple[str, list[str]]]:
    """Each row of ``selector`` as (its ``attribute``, its cells' text), read in one script:
    the queue page redraws every few seconds, which would leave a row found first and read
    after stale."""
    rows = page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((r) =>"
        "  [r.getAttribute(arguments[1]), [...r.querySelectorAll('td')].map((c) => c.innerText)])",
        selector,
        attribute,
    )
    return [(key, cells) for key, cells in rows]


def _ids(page: Page) -> list[str]:
    """The runs the queue page lists, in its order."""
    return [run_id for run_id, _ in _rows(page, "table.queue-runs tr.queued", "data-run")]


def _click(page: Page, selector: str) -> None:
    """Click ``selector`` in one script (see :func:`_rows`)."""
    page.driver.execute_script("document.querySelector(arguments[0]).click()", selector)


def test_queue_page(browser: Any, queue_dashboard: DashboardServer) -> None:
    page = Page(browser, queue_dashboard)
    ledger = queue_dashboard.dashboard.ledger
    page.open("queue")

    def card(k: str) -> str:
        return str(
            page.driver.execute_script(
                "return document.querySelector(arguments[0]).innerText",
                f"[data-k={k}] .card-value",
            )
        )

    assert (card("due"), card("keyed"), card("later"), card("paused")) == ("55", "4", "4", "1")
    # The first page is what claim_next takes next, in its order; the next page follows on.
    first = [r.run_id for r in ledger.queued_runs(limit=50)]
    rows = _rows(page, "table.queue-runs tr.queued", "data-run")
    assert [run_id for run_id, _ in rows] == first
    assert rows[0][1][2] == "2"  # the highest priority among them
    page.shot("queue")
    _click(page, "a[rel=next]")
    page.ready("queue")
    rest = [r.run_id for r in ledger.queued_runs(limit=50, after=ledger.get_run(first[-1]))]
    assert len(first) + len(rest) == 55
    page.until(lambda: _ids(page) == rest, "the second page")
    # Not yet due: soonest first, each with how long until it is.
    _click(page, "a.tab[data-lane=later]")
    page.ready("queue")
    soonest = [f"later-{h}h" for h in (1, 2, 3, 4)]
    page.until(lambda: _ids(page) == soonest, "the runs not yet due, soonest first")
    assert _rows(page, "table.queue-runs tr.queued", "data-run")[0][1][3].startswith("in ")
    # Keys with their limits and live runs; the markup in a key is text.
    keys = dict(_rows(page, "table.queue-keys tr.key", "data-key"))
    assert keys == {
        "gpu": ["gpu", "2", "2", "3", "full"],
        "idle": ["idle", "0", "0", "1", "held"],
        HOSTILE: [HOSTILE, "1", "1", "0", "full"],
    }
    [(name, held)] = _rows(page, "table.queue-paused tr.paused", "data-workflow")
    assert name == held[0] == "nightly"
    assert held[2] == "4"
    # A claim made meanwhile shows at the next refresh.
    ledger.claim_next("controller-2", lease_ms=60_000, limit=2)
    page.until(lambda: card("due") == "53", "the due count to follow a claim", timeout=15)
    assert page.driver.execute_script("return window.__pwned === undefined")
    page.no_errors_logged()


@pytest.fixture(scope="module")
def retries_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    """A ledger with 60 units due for a retry over two runs (more than a page), one waiting
    an hour, and three exhausted units, one of them named in markup."""
    db = str(tmp_path_factory.mktemp("ui-retries") / "retries.db")
    steps = [{"id": "s"}]
    with fp.Ledger.open(db) as ledger:
        for run_id in ("run-a", "run-b"):
            ledger.start_run(
                "wf", scope_key=None, steps=steps, run_id=run_id, force=True,
                retry={"max_attempts": 2, "initial_ms": 0},
            )  # fmt: skip
        ledger.start_run(
            "wf", scope_key=None, steps=steps, run_id="run-slow", force=True,
            retry={"max_attempts": 2, "initial_ms": 3_600_000},
        )  # fmt: skip

        def fail(run_id: str, unit_id: str) -> None:
            r = ledger.reserve_attempt(run_id, unit_id, step_id="s")
            ledger.finish_attempt(
                run_id, unit_id, r.attempt, r.dispatch_id, status="failed", failure_reason="boom"
            )

        for i in range(60):
            fail("run-a" if i % 3 else "run-b", f"unit-{i:02}")
        fail("run-slow", "later")
        for run_id, unit_id in (("run-a", "dead-1"), ("run-b", "dead-2"), ("run-b", HOSTILE)):
            fail(run_id, unit_id)
            fail(run_id, unit_id)
    with served(db) as server:
        yield server


def test_retries_page(browser: Any, retries_dashboard: DashboardServer) -> None:
    page = Page(browser, retries_dashboard)
    ledger = retries_dashboard.dashboard.ledger

    def units() -> list[tuple[str, str]]:
        rows = page.driver.execute_script(
            "return [...document.querySelectorAll('table.retry-units tr.retry-unit')]"
            ".map((r) => [r.dataset.run, r.dataset.unit])"
        )
        return [(run, unit) for run, unit in rows]

    page.open("retries")
    first = [(u.run_id, u.unit_id) for u in ledger.due_units(limit=50)]
    page.until(lambda: units() == first, "the first page of due units, soonest first")
    cells = _rows(page, "table.retry-units tr.retry-unit", "data-unit")[0][1]
    assert (cells[3], cells[4]) == ("failed", "1")
    assert cells[5].startswith("due, ")
    assert cells[6] == "boom"
    page.shot("retries")
    _click(page, "a[rel=next]")
    page.ready("retries")
    assert len(first) == 50
    page.until(lambda: len(units()) == 10 and set(units()).isdisjoint(first), "the second page")
    assert ("run-slow", "later") not in units()
    # The dead letters, by run and unit; the markup in a unit id is text.
    _click(page, "a.tab[data-kind=exhausted]")
    page.ready("retries")
    dead = [("run-a", "dead-1"), ("run-b", HOSTILE), ("run-b", "dead-2")]
    dead.sort()
    page.until(lambda: units() == dead, "the exhausted units")
    assert HOSTILE in [c[1] for _, c in _rows(page, "table.retry-units tr.retry-unit", "data-unit")]
    # One run's, from its page's link.
    page.open("run?id=run-b")
    _click(page, "#run-retries")
    page.ready("retries")
    page.until(
        lambda: units() and {run for run, _ in units()} == {"run-b"}, "run-b's due units only"
    )
    # A retry made meanwhile shows at the next refresh.
    page.open("retries?kind=exhausted&run=run-a")
    page.until(lambda: units() == [("run-a", "dead-1")], "run-a's exhausted unit")
    assert ledger.retry_units("run-a", ["dead-1"]) == 1
    page.until(lambda: units() == [], "the retried unit to leave the dead letters", timeout=15)
    assert page.driver.execute_script("return window.__pwned === undefined")
    page.no_errors_logged()


@dataclasses.dataclass
class Schedules:
    server: DashboardServer
    fired: dict[str, str]  # schedule name -> the run its last fire queued


@pytest.fixture(scope="module")
def schedules_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Schedules]:
    """A ledger with four schedules made two days ago and ticked now: a nightly one (its run
    queued), an hourly one (its run cancelled), one paused after it fired, and one made now
    that has not fired, whose workflow name is markup. Served on the system's clock."""
    db = str(tmp_path_factory.mktemp("ui-schedules") / "schedules.db")
    now = time.time_ns() // 1_000_000
    at = [now - 2 * 86_400_000]
    template = {
        "workflow_ref": "report@1", "source": {"kind": "builtin", "id": "report"},
        "definition_digest": fp.digest({}), "definition": {}, "runner_id": "controller-1",
        "origin_session_id": "cron",
    }  # fmt: skip
    with fp.Ledger.open(db, clock=lambda: at[0]) as ledger:
        ledger.put_schedule("nightly", cron="0 3 * * *", workflow_name="report", template=template)
        ledger.put_schedule(
            "hourly", cron="0 * * * *", workflow_name="sync", template=template,
            timezone="Europe/Berlin", overlap="allow", catch_up=2,
        )  # fmt: skip
        ledger.put_schedule("often", cron="*/5 * * * *", workflow_name="poll", template=template)
        at[0] = now
        fired = {r.run_id.split(":")[0]: r.run_id for r in ledger.tick_schedules()}
        assert sorted(fired) == ["hourly", "nightly", "often"]
        ledger.pause_schedule("often")
        assert ledger.abandon_run(fired["hourly"])
        ledger.put_schedule("yearly", cron="0 0 1 1 *", workflow_name=HOSTILE, template=template)
    with served(db) as server:
        yield Schedules(server, fired)


def test_schedules_page(browser: Any, schedules_dashboard: Schedules) -> None:
    page = Page(browser, schedules_dashboard.server)
    fired = schedules_dashboard.fired

    def rows() -> dict[str, list[str]]:
        return dict(_rows(page, "table.schedules tr.schedule", "data-name"))

    # From the nav, after Retries.
    page.open("runs")
    nav = [a.get_attribute("data-page") for a in page.all("#nav a")]
    assert nav[nav.index("retries") + 1] == "schedules"
    _click(page, "#nav a[data-page=schedules]")
    page.ready("schedules")
    assert "current" in page.css("#nav a[data-page=schedules]").get_attribute("class")
    shown = rows()
    assert list(shown) == ["hourly", "nightly", "often", "yearly"]
    name, cron, workflow, overlap, next_fire, last_run = shown["nightly"]
    assert (name, cron, workflow, overlap) == (
        "nightly",
        "0 3 * * * UTC",
        "report",
        "skip, catch-up 0",
    )
    assert next_fire.startswith("in ")
    assert last_run.startswith(fired["nightly"] + " queued")
    assert "last slot" in last_run
    # The exact time of the next fire is the relative one's title.
    [schedule] = [
        s for s in schedules_dashboard.server.dashboard.ledger.schedules() if s.name == "nightly"
    ]
    assert schedule.next_slot is not None
    title = page.driver.execute_script(
        "return document.querySelector('tr.schedule[data-name=nightly] time').title"
    )
    assert title == iso(schedule.next_slot)
    assert shown["hourly"][1:4] == ["0 * * * * Europe/Berlin", "sync", "allow, catch-up 2"]
    assert shown["hourly"][5].startswith(fired["hourly"] + " cancelled")
    # Paused: a pill instead of a time; its last run still shown.
    assert shown["often"][4] == "paused"
    assert page.all("tr.schedule[data-name=often] .pill.s-paused")
    assert shown["often"][5].startswith(fired["often"] + " queued")
    # Never fired; the markup in its workflow name is text.
    assert shown["yearly"][2] == HOSTILE
    assert shown["yearly"][5] == "never fired"
    assert not page.all("tr.schedule[data-name=yearly] a")
    page.shot("schedules")

    # A pause made meanwhile shows at the next refresh.
    with fp.Ledger.open(schedules_dashboard.server.dashboard.target) as ledger:
        ledger.pause_schedule("nightly")
    page.until(lambda: rows()["nightly"][4] == "paused", "nightly's pause", timeout=15)

    # The last run's link opens the run's page.
    _click(page, "tr.schedule[data-name=nightly] a.id")
    page.ready("run")
    assert page.css("#run-id").text == fired["nightly"]
    assert page.driver.execute_script("return window.__pwned === undefined")
    page.no_errors_logged()


def test_schedules_page_when_there_are_none(
    browser: Any, hostile_dashboard: DashboardServer
) -> None:
    page = Page(browser, hostile_dashboard)
    page.open("schedules")
    assert not page.all("tr.schedule")
    assert page.css("table.schedules td.empty").text == (
        "No schedules. put_schedule creates one; fencepost tick fires them."
    )
    page.no_errors_logged()

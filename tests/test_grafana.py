"""docs/grafana/fencepost.json queries only what fencepost.otel records: every metric its
PromQL names is the Prometheus name of exactly one instrument of ``INSTRUMENTS`` (by the rules
of OpenTelemetry's "Prometheus and OpenMetrics Compatibility" specification, applied by
:func:`prometheus_names`), every label it uses is an attribute that instrument records, and
every instrument has a panel, so a renamed or added instrument fails here until the dashboard
follows. docs/grafana/README.md's table lists every instrument with the same names, and its
histogram views run."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import fencepost as fp
import fencepost._observe
import fencepost.otel
from tests.conftest import REPO, FakeClock
from tests.test_cron_schedules import TEMPLATE
from tests.test_otel import scripted

DASHBOARD = REPO / "docs" / "grafana" / "fencepost.json"
GUIDE = REPO / "docs" / "grafana" / "README.md"
INSTRUMENTS = fencepost.otel.INSTRUMENTS
NAMES = [name for name, *_ in INSTRUMENTS]

# The attributes each instrument records: fencepost.otel puts operation, outcome and (when the
# call raised) error.type on every call's count and duration, and a refused write's reason on
# its rejection; the core's other counts carry none. test_the_attributes_are_the_recorded_ones
# holds this table to what a run records.
ATTRIBUTES: dict[str, frozenset[str]] = {
    "fencepost.operations": frozenset({"operation", "outcome", "error.type"}),
    "fencepost.operation.duration": frozenset({"operation", "outcome", "error.type"}),
    "fencepost.fence.rejections": frozenset({"reason"}),
    "fencepost.lease.takeovers": frozenset(),
    "fencepost.attempt.reclaims": frozenset(),
    "fencepost.commit.group_size": frozenset(),
    "fencepost.store.busy_retries": frozenset(),
    "fencepost.units.exhausted": frozenset(),
    "fencepost.schedules.fired": frozenset(),
}

# Labels the pipeline puts on every series, whatever the instrument: the Collector makes them
# from the resource's service.name and service.instance.id, Prometheus from the scrape target.
TARGET_LABELS = frozenset({"job", "instance"})

# The specification's "abbreviations to full words", for the units fencepost could use; a unit
# missing here is an error rather than a guess, so a new instrument's unit gets looked up.
UNIT_WORDS = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
}


def _sanitize(name: str, allowed: str) -> str:
    """Every character outside ``allowed`` becomes ``_``, and runs of ``_`` one ``_``."""
    return re.sub(r"_{2,}", "_", re.sub(f"[^{allowed}]", "_", name))


def prometheus_label(attribute: str) -> str:
    """The label an attribute becomes: as a metric name, without ``:``."""
    return _sanitize(attribute, "a-zA-Z0-9_")


def prometheus_unit(unit: str) -> str:
    """The name suffix a UCUM unit becomes, ``""`` for none: the annotations in curly braces
    are dropped (a count of things is unitless), abbreviations are spelt out."""
    unit = re.sub(r"\{[^}]*\}", "", unit)
    if not unit:
        return ""
    if unit not in UNIT_WORDS:
        raise ValueError(f"unit {unit!r}: add its Prometheus word to UNIT_WORDS")
    return UNIT_WORDS[unit]


def prometheus_names(name: str, kind: str, unit: str) -> set[str]:
    """The series an instrument becomes in Prometheus ("OTLP Metric points to Prometheus"):
    the name sanitized, the unit appended unless the name already has it, then a counter's
    ``_total`` or a histogram's ``_bucket``, ``_sum`` and ``_count``. The ``_created`` series
    some exporters add (when a series started) are left out: no panel has a use for them."""
    base = _sanitize(name, "a-zA-Z0-9_:")
    suffix = prometheus_unit(unit)
    if suffix and suffix not in base.split("_"):
        base = f"{base}_{suffix}"
    if kind == "counter":
        return {base if base.endswith("_total") else f"{base}_total"}
    if kind == "histogram":
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    raise ValueError(f"{name}: no rule for a {kind}")


def instruments_of(series: str) -> list[str]:
    return [n for n, kind, unit, _ in INSTRUMENTS if series in prometheus_names(n, kind, unit)]


def labels_of(instrument: str, series: str) -> set[str]:
    labels = {prometheus_label(a) for a in ATTRIBUTES.get(instrument, ())} | TARGET_LABELS
    return labels | {"le"} if series.endswith("_bucket") else labels


# ------------------------------------------------------------------ reading PromQL

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_METRIC = re.compile(r"\bfencepost_[a-zA-Z0-9_:]*")
_SELECTOR = re.compile(r"\{([^{}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$", re.S)
_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def metrics_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The ``fencepost_`` metrics a PromQL expression names, and the labels it matches or
    groups on. String literals go first: a label value is not a name."""
    bare = _STRING.sub('""', expr)
    metrics = set(_METRIC.findall(bare))
    labels = {label for sel in _SELECTOR.findall(bare) for label in _MATCHER.findall(sel)}
    for group in _GROUPING.findall(bare):
        labels |= {label.strip() for label in group.split(",") if label.strip()}
    return metrics, labels


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, the ones inside collapsed rows too."""

    def walk(items: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard.get("panels", []))


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, set[str], bool]]:
    """``(where, expr, extra labels, from a panel)`` for every PromQL query: the panels'
    targets (the legend's ``{{label}}`` are labels too) and the query variables
    (``label_values(SELECTOR, LABEL)``)."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            where = f"panel {panel.get('title')!r} {target.get('refId')}"
            legend = set(_LEGEND_LABEL.findall(target.get("legendFormat", "")))
            yield where, target.get("expr", ""), legend, True
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query", "")
        query = query.get("query", "") if isinstance(query, dict) else query
        where = f"variable {variable.get('name')!r}"
        matched = _LABEL_VALUES.match(query)
        if matched:
            yield where, matched.group(1), {matched.group(2)}, False
        else:
            yield where, query, set(), False


def problems(dashboard: dict[str, Any]) -> list[str]:
    """What is wrong with the dashboard's queries: a metric that is no instrument's (or more
    than one's), a label its instrument does not carry (in an expression over several
    metrics, each must carry it), an instrument no panel queries."""
    found: list[str] = []
    charted: set[str] = set()
    for where, expr, extra, in_panel in queries(dashboard):
        metrics, labels = metrics_and_labels(expr)
        labels |= extra
        if not metrics:
            found.append(f"{where}: names no fencepost_ metric: {expr!r}")
        for metric in sorted(metrics):
            owners = instruments_of(metric)
            if len(owners) != 1:
                found.append(f"{where}: {metric} is the Prometheus name of {owners or 'nothing'}")
                continue
            if in_panel:
                charted.add(owners[0])
            for label in sorted(labels - labels_of(owners[0], metric)):
                found.append(f"{where}: {metric} ({owners[0]}) has no label {label!r}")
    found += [f"no panel queries {name}" for name in NAMES if name not in charted]
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


# ------------------------------------------------------------------ the tests


def test_prometheus_names_follow_the_specification() -> None:
    # A case of each rule: the unit spelt out, an annotation dropped, the type's suffixes.
    assert prometheus_names("http.server.duration", "histogram", "s") == {
        "http_server_duration_seconds_bucket",
        "http_server_duration_seconds_sum",
        "http_server_duration_seconds_count",
    }
    assert prometheus_names("system.network.dropped", "counter", "{packets}") == {
        "system_network_dropped_total"
    }
    assert prometheus_names("system.io", "counter", "By") == {"system_io_bytes_total"}
    # Neither a unit the name has nor a _total it ends with is appended twice.
    assert prometheus_names("queue.wait.seconds", "histogram", "s") >= {"queue_wait_seconds_sum"}
    assert prometheus_names("jobs.done_total", "counter", "{job}") == {"jobs_done_total"}
    assert prometheus_names("a..b", "counter", "") == {"a_b_total"}
    assert prometheus_label("error.type") == "error_type"
    with pytest.raises(ValueError, match="'Cel'"):
        prometheus_names("room.temperature", "histogram", "Cel")


def test_every_instrument_has_distinct_prometheus_names_and_known_attributes() -> None:
    assert set(ATTRIBUTES) == set(NAMES), "a new instrument: list the attributes it records"
    for series in {s for n, k, u, _ in INSTRUMENTS for s in prometheus_names(n, k, u)}:
        assert len(instruments_of(series)) == 1, series
    assert prometheus_names(*INSTRUMENTS[1][:3]) == {
        "fencepost_operation_duration_seconds_bucket",
        "fencepost_operation_duration_seconds_sum",
        "fencepost_operation_duration_seconds_count",
    }
    assert prometheus_names(*INSTRUMENTS[0][:3]) == {"fencepost_operations_total"}


def test_the_dashboard_is_importable_anywhere(dashboard: dict[str, Any]) -> None:
    assert (dashboard["title"], dashboard["uid"]) == ("fencepost", "fencepost")
    assert dashboard["schemaVersion"] >= 36
    assert dashboard.get("id") is None  # Grafana assigns its own on import
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    assert variables["operation"]["multi"]
    assert variables["operation"]["includeAll"]

    # No data source of the machine it was drawn on: every reference is the variable (the
    # built-in annotation's Grafana source aside).
    def references(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            if "datasource" in node:
                yield node["datasource"]
            for value in node.values():
                yield from references(value)
        elif isinstance(node, list):
            for value in node:
                yield from references(value)

    refs = list(references(dashboard))
    assert refs
    for ref in refs:
        assert isinstance(ref, dict), ref
        assert ref == {"type": "prometheus", "uid": "${datasource}"} or ref["type"] == "grafana"

    every = list(panels(dashboard))
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids))
    boxes = [p["gridPos"] for p in every]
    for i, a in enumerate(boxes):
        assert 0 <= a["x"] < a["x"] + a["w"] <= 24, a
        for b in boxes[i + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, (a, b)
    for panel in every:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["description"], panel["title"]


def test_every_query_is_of_an_instrument_and_every_instrument_has_a_panel(
    dashboard: dict[str, Any],
) -> None:
    assert problems(dashboard) == []
    exprs = [expr for _, expr, _, in_panel in queries(dashboard) if in_panel]
    assert any("fencepost_operation_duration_seconds_bucket" in e for e in exprs)
    assert any("by (operation, outcome)" in e for e in exprs)
    assert any("by (reason)" in e for e in exprs)


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        # The histogram's unit forgotten: the mistake the renaming invites.
        (
            "fencepost_operation_duration_seconds_bucket",
            "fencepost_operation_duration_bucket",
            "fencepost_operation_duration_bucket is the Prometheus name of nothing",
        ),
        ("fencepost_lease_takeovers_total", "fencepost_lease_takeovers", "of nothing"),
        # The attribute's OpenTelemetry name, not the label's.
        ("error_type", "error.type", "has no label 'error.type'"),
        # A label of another instrument.
        ("by (reason)", "by (operation)", "(fencepost.fence.rejections) has no label 'operation'"),
        # The only panels of an instrument pointed elsewhere.
        (
            "fencepost_schedules_fired_total",
            "fencepost_units_exhausted_total",
            "no panel queries fencepost.schedules.fired",
        ),
    ],
)
def test_a_wrong_metric_or_label_or_a_missing_panel_is_caught(
    old: str, new: str, complaint: str
) -> None:
    text = DASHBOARD.read_text(encoding="utf-8")
    assert old in text
    found = problems(json.loads(text.replace(old, new)))
    assert any(complaint in p for p in found), found


def record_everything(tmp_path: pathlib.Path, views: Sequence[Any] = ()) -> dict[str, list[Any]]:
    """Every instrument's points after a run that makes each record something: the scripted
    takeover, reclaim and refused writes of test_otel, a unit that exhausts its one attempt, a
    schedule's fires, and a busy retry."""
    reader = InMemoryMetricReader()
    fencepost.otel.instrument(meter_provider=MeterProvider(metric_readers=[reader], views=views))
    try:
        clock = FakeClock()
        with fp.Ledger.open(str(tmp_path / "ledger.db"), clock=clock) as ledger:
            scripted(ledger, clock)
            once = {"max_attempts": 1, "initial_ms": 0}
            run = ledger.start_run(
                "wf/dead", scope_key=None, steps=[{"id": "s"}], force=True, retry=once
            )
            r = ledger.reserve_attempt(run.run_id, "u", step_id="s")
            ledger.finish_attempt(run.run_id, "u", r.attempt, r.dispatch_id, status="failed")
            ledger.put_schedule("h", cron="0 * * * *", workflow_name="w", template=TEMPLATE,
                                overlap="allow", catch_up=2)  # fmt: skip
            clock.advance(5 * 3_600_000)
            assert ledger.tick_schedules()
        # One process does not contend with itself: report a retry as the store's busy
        # handler does.
        fencepost._observe.busy_retries(1, 5)
        data = reader.get_metrics_data()
    finally:
        fencepost.otel.uninstrument()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_the_attributes_are_the_recorded_ones(tmp_path: pathlib.Path) -> None:
    points = record_everything(tmp_path)
    assert sorted(points) == sorted(NAMES)
    recorded = {
        name: {key for p in found for key in p.attributes} for name, found in points.items()
    }
    assert recorded == ATTRIBUTES


def test_the_guide_lists_every_instrument_with_its_series_and_labels() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\| `(fencepost\.[a-z_.]+)` \|.*$", text, re.M)
    }
    assert sorted(rows) == sorted(NAMES)
    for name, kind, unit, _ in INSTRUMENTS:
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert cells[1:3] == [kind, f"`{unit}`"], name
        assert set(re.findall(r"`([^`]+)`", cells[3])) == prometheus_names(name, kind, unit)
        labels = set(re.findall(r"`([a-z_]+)`", cells[4])) - {"le", "_bucket"}
        assert labels == {prometheus_label(a) for a in ATTRIBUTES[name]}, name


def test_the_guides_views_give_the_histograms_their_boundaries(tmp_path: pathlib.Path) -> None:
    text = GUIDE.read_text(encoding="utf-8")
    [block] = [
        b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "FENCEPOST_VIEWS =" in b
    ]
    namespace: dict[str, Any] = {}
    exec(block, namespace)
    points = record_everything(tmp_path, namespace["FENCEPOST_VIEWS"])
    durations = points["fencepost.operation.duration"]
    [bounds] = {tuple(p.explicit_bounds) for p in durations}
    assert bounds[0] <= 0.00001
    assert bounds[-1] >= 5
    # With the SDK's default boundaries every call would sit in the first bucket.
    assert sum(p.bucket_counts[0] for p in durations) < sum(p.count for p in durations)
    assert sum(p.bucket_counts[-1] for p in durations) == 0
    assert {tuple(p.explicit_bounds) for p in points["fencepost.commit.group_size"]} == {
        (1, 2, 4, 8, 16, 32, 64, 128, 256)
    }

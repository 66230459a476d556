"""The Grafana dashboard (charts/elastic-gpu/dashboards/elastic-gpu.json) is a valid dashboard
whose every PromQL expression parses (promql-parser, the Rust parser's Python binding) and
reads only metrics, and labels, that docs/metrics.md lists (issue #18, must-show 3)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser as pq
import pytest

from egpu_testing.metricsdoc import MetricRow, metrics_table

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "charts" / "elastic-gpu" / "dashboards" / "elastic-gpu.json"
GRID_WIDTH = 24
#: Grafana's interval variables, replaced by a duration before parsing
INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
#: labels every series gets from the scrape, not from the exporter
SCRAPE_LABELS = {"job", "instance", "pod", "namespace", "container", "service", "endpoint"}


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every query: panels' targets and query variables."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['id']} ({panel['title']}) {target['refId']}", target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert match, f"variable {var['name']}: {query!r} is not label_values(expr, label)"
            yield f"variable {var['name']}", match[1]


def parse(expr: str) -> Any:
    return pq.parse(INTERVALS.sub("5m", expr))


def selectors(node: Any) -> Iterator[Any]:
    """Every vector selector of a parsed expression."""
    if isinstance(node, pq.VectorSelector):
        yield node
    elif isinstance(node, pq.MatrixSelector):
        yield node.vector_selector
    elif isinstance(node, pq.BinaryExpr):
        yield from selectors(node.lhs)
        yield from selectors(node.rhs)
    elif isinstance(node, pq.AggregateExpr):
        yield from selectors(node.expr)
        if node.param is not None:
            yield from selectors(node.param)
    elif isinstance(node, pq.Call):
        for arg in node.args:
            yield from selectors(arg)
    elif isinstance(node, (pq.ParenExpr, pq.UnaryExpr, pq.SubqueryExpr)):
        yield from selectors(node.expr)


def documented(name: str, table: dict[str, MetricRow]) -> MetricRow | None:
    if name in table:
        return table[name]
    for suffix in HISTOGRAM_SUFFIXES:
        row = table.get(name.removesuffix(suffix))
        if name.endswith(suffix) and row is not None and row.type == "histogram":
            return row
    return None


def test_the_dashboard_is_a_valid_grafana_dashboard() -> None:
    dashboard = load()
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in panels(dashboard)]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: dict[tuple[int, int], int] = {}
    for panel in panels(dashboard):
        assert panel["type"] and panel["title"], panel["id"]
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["y"] >= 0
        assert grid["x"] + grid["w"] <= GRID_WIDTH, f"panel {panel['id']} leaves the grid"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in occupied, \
                    f"panels {occupied[x, y]} and {panel['id']} overlap at {(x, y)}"
                occupied[x, y] = panel["id"]
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), f"panel {panel['id']}: refIds {refs}"
        assert panel["datasource"]["uid"] == "${datasource}"
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert "datasource" in names and len(names) == len(set(names))


def test_every_expression_parses_and_reads_only_documented_metrics() -> None:
    table = metrics_table()
    seen: set[str] = set()
    for where, expr in expressions(load()):
        try:
            parsed = parse(expr)
        except ValueError as err:
            pytest.fail(f"{where}: {expr!r} does not parse: {err}")
        found = list(selectors(parsed))
        assert found, f"{where}: {expr!r} reads no metric"
        for selector in found:
            assert selector.name, f"{where}: a selector without a metric name"
            row = documented(selector.name, table)
            assert row is not None, f"{where}: {selector.name} is not in docs/metrics.md"
            seen.add(row.name)
            allowed = row.labels | SCRAPE_LABELS | ({"le"} if row.type == "histogram" else set())
            for matcher in selector.matchers.matchers:
                assert matcher.name in allowed, \
                    f"{where}: {selector.name} has no label {matcher.name} (docs/metrics.md)"
    # what the issue asks the dashboard to show
    for needed in ("elasticgpu_scheduler_card_compute_allocated_millicards",
                   "elasticgpu_scheduler_waiting_pods",
                   "elasticgpu_scheduler_unschedulable_total",
                   "elasticgpu_agent_card_healthy"):
        assert needed in seen, f"the dashboard shows nothing of {needed}"


@pytest.mark.parametrize("bad", [
    "sum(rate(elasticgpu_scheduler_requests_total[5m])",  # unclosed
    'elasticgpu_scheduler_card_healthy{node="a"',  # unclosed matcher
    "rate(elasticgpu_scheduler_requests_total[5 minutes])",  # bad duration
])
def test_the_parser_refuses_broken_promql(bad: str) -> None:
    with pytest.raises(ValueError):
        parse(bad)


def test_a_metric_missing_from_the_table_is_caught() -> None:
    table = metrics_table()
    (selector,) = selectors(parse("sum(rate(elasticgpu_scheduler_no_such_thing_total[5m]))"))
    assert documented(selector.name, table) is None
    (bucket,) = selectors(parse("elasticgpu_scheduler_request_duration_seconds_bucket"))
    assert documented(bucket.name, table) is not None
    (not_a_histogram,) = selectors(parse("elasticgpu_scheduler_waiting_pods_count"))
    assert documented(not_a_histogram.name, table) is None

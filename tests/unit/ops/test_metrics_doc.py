"""docs/metrics.md's table follows the naming scheme, and the page check catches every kind of
disagreement (the integration test runs it against every running component)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from egpu_testing.metricsdoc import (
    COMPONENTS,
    check_page,
    metrics_table,
    table_problems,
)


def test_the_table_follows_the_naming_scheme() -> None:
    rows = metrics_table()
    assert table_problems(rows.values()) == []
    assert {row.component for row in rows.values()} == set(COMPONENTS)


def test_the_naming_rules_catch_a_bad_row(tmp_path: Path) -> None:
    doc = tmp_path / "metrics.md"
    doc.write_text("<!-- metrics-table:start -->\n| metric | type | unit | labels | component | "
                   "meaning |\n|---|---|---|---|---|---|\n"
                   "| `elasticgpu_x_memory` | gauge | bytes | node | agent | m |\n"
                   "| `elasticgpu_x_calls` | counter | calls | | agent | m |\n"
                   "| `egpu_y` | gauge | pods | | nowhere | |\n"
                   "<!-- metrics-table:end -->\n")
    problems = table_problems(metrics_table(doc).values())
    assert any("elasticgpu_x_memory: unit bytes" in p for p in problems)
    assert any("elasticgpu_x_calls: a counter" in p for p in problems)
    assert any("egpu_y: not elasticgpu_" in p for p in problems)
    assert any("egpu_y: component 'nowhere'" in p for p in problems)
    assert any("egpu_y: no meaning" in p for p in problems)


def _page(*, extra: bool = False, labels: tuple[str, ...] = ("node",),
          with_leader: bool = True) -> str:
    registry = CollectorRegistry()
    if with_leader:
        Gauge("elasticgpu_controller_leader", "x", registry=registry).set(1)
    depth = Gauge("elasticgpu_controller_queue_depth", "x", list(labels), registry=registry)
    depth.labels(*["v"] * len(labels)).set(1)
    Counter("elasticgpu_controller_reconciles", "x", ["controller", "result"],
            registry=registry)  # no samples yet: labels cannot be checked, the name can
    if extra:
        Gauge("elasticgpu_controller_secret_gauge", "x", registry=registry).set(1)
    Gauge("process_unrelated", "x", registry=registry).set(1)
    return generate_latest(registry).decode()


def test_the_page_check_catches_both_directions_types_and_labels(tmp_path: Path) -> None:
    doc = tmp_path / "metrics.md"
    doc.write_text("<!-- metrics-table:start -->\n| metric | type | unit | labels | component | "
                   "meaning |\n|---|---|---|---|---|---|\n"
                   "| `elasticgpu_controller_leader` | gauge | 0/1 | | controller | m |\n"
                   "| `elasticgpu_controller_queue_depth` | gauge | keys | controller | controller"
                   " | m |\n"
                   "| `elasticgpu_controller_reconciles_total` | counter | reconciles | controller,"
                   " result | controller | m |\n"
                   "| `elasticgpu_agent_card_healthy` | gauge | 0/1 | node | agent | m |\n"
                   "<!-- metrics-table:end -->\n")
    rows = metrics_table(doc)
    assert check_page(rows, "controller", _page(labels=("controller",))) == []
    assert check_page(rows, "controller", _page(labels=("node",))) == [
        "elasticgpu_controller_queue_depth: exposed with labels ['node'], the table says "
        "['controller']"]
    assert check_page(rows, "controller", _page(labels=("controller",), extra=True)) == [
        "controller exposes elasticgpu_controller_secret_gauge (gauge), not in "
        "docs/metrics.md"]
    assert check_page(rows, "controller", _page(labels=("controller",), with_leader=False)) == [
        "docs/metrics.md lists elasticgpu_controller_leader for controller; its /metrics page "
        "does not expose it"]
    # a family the table gives to another component
    agent_page = "# TYPE elasticgpu_agent_card_healthy gauge\nelasticgpu_agent_card_healthy 1\n"
    assert check_page(rows, "controller", _page(labels=("controller",)) + agent_page)[0] == (
        "controller exposes elasticgpu_agent_card_healthy (gauge), not in docs/metrics.md (the "
        "table says component agent)")
    counter_as_gauge = _page(labels=("controller",)).replace(
        "# TYPE elasticgpu_controller_leader gauge", "# TYPE elasticgpu_controller_leader counter")
    assert any("exposed as a" in p for p in check_page(rows, "controller", counter_as_gauge))

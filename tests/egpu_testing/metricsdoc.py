"""docs/metrics.md's table of metrics, and the check of a component's /metrics page against it.

The table is the contract: every `elasticgpu_` family a component exposes is a row naming that
component, and every row is exposed by the component it names, with the type and (where the
page has samples) exactly the labels the row lists. Rows added by any part of the project
(budgets, MIG moves) are checked the same way; nothing here lists names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METRICS_MD = ROOT / "docs" / "metrics.md"
PREFIX = "elasticgpu_"
START, END = "<!-- metrics-table:start -->", "<!-- metrics-table:end -->"
#: unit column -> the suffix a name in that unit ends with (before `_total` of a counter)
UNIT_SUFFIX = {"bytes": "_bytes", "seconds": "_seconds", "milli-cards": "_millicards",
               "cores": "_cores", "seconds (Unix time)": "_timestamp_seconds"}
TYPES = ("counter", "gauge", "histogram")
COMPONENTS = ("scheduler", "agent", "webhook", "controller")


@dataclass(frozen=True)
class MetricRow:
    name: str
    type: str
    unit: str
    labels: frozenset[str]
    component: str
    meaning: str

    @property
    def family(self) -> str:
        """The family name a parser reports (a counter's without `_total`)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


def metrics_table(path: Path = METRICS_MD) -> dict[str, MetricRow]:
    """The rows of the table between the markers, by metric name (a repeated name raises)."""
    text = path.read_text()
    body = text[text.index(START) + len(START):text.index(END)]
    rows: dict[str, MetricRow] = {}
    for line in body.strip().splitlines()[2:]:  # header and rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6:
            raise ValueError(f"docs/metrics.md: a row needs 6 cells: {line!r}")
        name, kind, unit, labels, component, meaning = cells
        name = name.strip("`")
        if name in rows:
            raise ValueError(f"docs/metrics.md: {name} is listed twice")
        rows[name] = MetricRow(name, kind, unit,
                               frozenset(x.strip() for x in labels.split(",") if x.strip()),
                               component, meaning)
    return rows


@dataclass(frozen=True)
class Exposed:
    type: str
    #: the label names of its samples (`le` of a histogram left out); None: no samples yet
    labels: frozenset[str] | None


def exposed_families(page: str) -> dict[str, Exposed]:
    """The `elasticgpu_` families of one /metrics page, by family name."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Exposed] = {}
    families = list(text_string_to_metric_families(page))
    counters = {f.name for f in families if f.type in ("counter", "histogram")}
    for family in families:
        if not family.name.startswith(PREFIX):
            continue
        if family.name.endswith("_created") and family.name.removesuffix("_created") in counters:
            continue  # prometheus_client's creation time of a counter without labels
        label_sets = {frozenset(k for k in s.labels if k != "le") for s in family.samples
                      if not s.name.endswith("_created")}
        if len(label_sets) > 1:
            raise ValueError(f"{family.name}: samples with different label names {label_sets}")
        out[family.name] = Exposed(family.type, next(iter(label_sets)) if label_sets else None)
    return out


def check_page(rows: Mapping[str, MetricRow], component: str, page: str) -> list[str]:
    """What disagrees between the table and `component`'s page (empty: nothing)."""
    problems = []
    exposed = exposed_families(page)
    mine = {row.family: row for row in rows.values() if row.component == component}
    others = {row.family: row for row in rows.values() if row.component != component}
    for family, seen in sorted(exposed.items()):
        row = mine.get(family)
        if row is None:
            where = (f" (the table says component {others[family].component})"
                     if family in others else "")
            problems.append(f"{component} exposes {family} ({seen.type}), not in docs/metrics.md"
                            f"{where}")
            continue
        if seen.type != row.type:
            problems.append(f"{row.name}: exposed as a {seen.type}, the table says {row.type}")
        if seen.labels is not None and seen.labels != row.labels:
            problems.append(f"{row.name}: exposed with labels {sorted(seen.labels)}, the table "
                            f"says {sorted(row.labels)}")
    for family, row in sorted(mine.items()):
        if family not in exposed:
            problems.append(f"docs/metrics.md lists {row.name} for {component}; its /metrics "
                            "page does not expose it")
    return problems


def table_problems(rows: Iterable[MetricRow]) -> list[str]:
    """Rule breaks of the naming scheme (docs/metrics.md, "Naming")."""
    problems = []
    for row in rows:
        if not re.fullmatch(r"elasticgpu_[a-z0-9_]+", row.name):
            problems.append(f"{row.name}: not elasticgpu_ and lower-case snake case")
        if row.type not in TYPES:
            problems.append(f"{row.name}: type {row.type!r} not one of {TYPES}")
        if row.component not in COMPONENTS:
            problems.append(f"{row.name}: component {row.component!r} not one of {COMPONENTS}")
        if (row.type == "counter") != row.name.endswith("_total"):
            problems.append(f"{row.name}: a counter's name and only a counter's ends in _total")
        suffix = UNIT_SUFFIX.get(row.unit)
        if suffix is not None and not row.family.endswith(suffix):
            problems.append(f"{row.name}: unit {row.unit} but the name does not end in {suffix}")
        if suffix is None and row.type == "histogram":
            problems.append(f"{row.name}: a histogram needs a unit ({sorted(UNIT_SUFFIX)})")
        if not row.meaning:
            problems.append(f"{row.name}: no meaning")
    return problems

"""The resource table in docs/architecture.md must say what the code does."""

import re
from pathlib import Path

from elastic_gpu.core.resources import RESOURCE_TABLE, Measure

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
UNIT = {Measure.COMPUTE: "milli-cards", Measure.MEMORY: "MiB", Measure.CARDS: "card",
        Measure.MIG: "instance", Measure.TFLOPS: "TFLOPS"}


def _doc_rows() -> dict[str, list[str]]:
    text = DOC.read_text()
    table = text.split("<!-- resource-table:start -->")[1].split("<!-- resource-table:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_table_row_is_documented_as_coded() -> None:
    rows = _doc_rows()
    for spec in RESOURCE_TABLE:
        measure, unit, rule, origin = rows.pop(spec.name)
        assert measure == spec.measure.value
        assert unit.startswith(str(spec.scale)) and UNIT[spec.measure] in unit
        assert rule == spec.rule.value
        assert origin == spec.origin
    assert list(rows) == ["nvidia.com/mig-<g>g.<m>gb"]


def test_the_scheduler_doc_lists_exactly_the_registered_policies() -> None:
    from elastic_gpu.core.policies import CARD_POLICIES, NODE_POLICIES

    text = (DOC.parent / "scheduler.md").read_text()
    listed = {}
    for line in text.splitlines():
        for key in ("nodePolicy", "cardPolicy"):
            if line.startswith(f"{key}:") and "tier:" in line:
                listed[key] = set(line.split("tier:")[1].split())
    assert listed["nodePolicy"] == set(NODE_POLICIES)
    assert listed["cardPolicy"] == set(CARD_POLICIES)


ROOT = DOC.parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(title: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but `-` and `_` dropped,
    each space a `-`."""
    text = re.sub(r"[`*]", "", title.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose(text: str) -> str:
    """The text outside fenced code blocks, where a `[x](y)` is a link."""
    return "".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M))
                   if i % 2 == 0)


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in _prose(path.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen[f"{slug}-{count}"] = 1
    return set(seen)


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return broken


def test_the_slug_is_githubs() -> None:
    assert _slug("`elasticgpu.io/gpu`: served as shares") == "elasticgpuiogpu-served-as-shares"
    assert _slug("When CPU is scarce: fgdx-auto, the default") == (
        "when-cpu-is-scarce-fgdx-auto-the-default")


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [problem for page in pages for problem in _broken_links(page)]
    assert broken == []

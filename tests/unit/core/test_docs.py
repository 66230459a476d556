"""The resource table in docs/architecture.md must say what the code does."""

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

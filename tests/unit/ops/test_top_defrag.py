"""`egpu top` shows the defragmentation controller's latest plan for each pod not bound yet,
read off the pods it already lists (`elasticgpu.io/defrag-plan`, `core.defrag.record`): what
would move where, for which pending pod; a bound pod's record and an unreadable one are not
shown."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from elastic_gpu.api.gpudevice import card_to_object
from elastic_gpu.cli.top import Objects, render, view_from_objects
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.record import PlannedMove, plan_record
from elastic_gpu.core.model import Card

AT = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def card(node: str) -> CardShare:
    return CardShare(0, f"GPU-{node}-0", 1000, 40960)


def held(node: str, milli: int) -> Assignment:
    return Assignment(node, {"main": (CardShare(0, f"GPU-{node}-0", milli, 0),)})


def pending(name: str, mode: str, node: str = "", **meta: Any) -> dict[str, Any]:
    record = plan_record(mode, AT, Assignment("gpu-a", {"main": (card("gpu-a"),)}),
                         [PlannedMove("ml/c", held("gpu-a", 400), held("gpu-b", 400))])
    return {"metadata": {"name": name, "namespace": "ml", **meta,
                         "annotations": {ann.DEFRAG_PLAN: record.to_json()}},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": "Pending"}}


def objects(*pods: dict[str, Any]) -> Objects:
    devices = [card_to_object(n, Card(0, f"GPU-{n}-0", "A100", 40960)) for n in ("gpu-a", "gpu-b")]
    return Objects(nodes=[], devices=devices, pods=list(pods), elasticgpus=[])


def shown(view: Any) -> list[str]:
    console = Console(record=True, width=300, color_system=None)
    console.print(render(view))
    return console.export_text().splitlines()


def test_a_report_modes_plan_is_shown_under_the_table() -> None:
    bound = pending("done", "report", node="gpu-a")
    forged = pending("forged", "report")
    forged["metadata"]["annotations"][ann.DEFRAG_PLAN] = '{"v": 1, "mode": "steal"}'
    view = view_from_objects(objects(pending("whole", "report"), bound, forged))
    assert [p.pod for p in view.plans] == ["ml/whole"]
    lines = shown(view)
    assert lines[-2] == "defrag plans for 1 pending pod:"
    assert lines[-1] == ("  ml/whole (report mode, nothing moved; planned 2027-01-15T08:00:00Z): "
                         "would move 1 pod(s): ml/c from node gpu-a card 0 to node gpu-b card 0; "
                         "then this pod fits on node gpu-a card 0")


def test_a_plan_being_carried_out_says_so_and_node_filters_keep_the_plans_they_touch() -> None:
    view = view_from_objects(objects(pending("whole", "move")))
    assert shown(view)[-1].startswith("  ml/whole (moving, planned 2027-01-15T08:00:00Z): move 1")
    assert [p.pod for p in view_from_objects(objects(pending("whole", "move")), ["gpu-b"]).plans] \
        == ["ml/whole"]  # the move's target
    assert view_from_objects(objects(pending("whole", "move")), ["gpu-z"]).plans == ()


def test_no_plan_no_section() -> None:
    lines = shown(view_from_objects(objects()))
    assert not any("defrag" in line for line in lines)

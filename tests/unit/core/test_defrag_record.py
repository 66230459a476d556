"""`core.defrag.record`: the plan record's form, its refusals, how it describes a plan (MIG
instances named) and which pods' records `egpu top` shows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.record import (
    MAX_MOVES,
    PlannedMove,
    PlanRecord,
    PlanRecordError,
    describe_cards,
    pending_plans,
    plan_record,
)

NOW = 1_800_000_000.0
WHOLE = Assignment("n1", {"main": (CardShare(0, "GPU-1", 1000, 81920),)})
FROM = Assignment("n1", {"main": (CardShare(0, "GPU-1", 400, 0),)})
TO = Assignment("n0", {"main": (CardShare(0, "GPU-0", 400, 0),)})
MIG = Assignment("m0", {"main": (CardShare(0, "GPU-m0", 0, 40960, "3g.40gb", "MIG-m0-1"),
                                 CardShare(0, "GPU-m0", 0, 40960, "3g.40gb", "MIG-m0-0"))})


def record() -> PlanRecord:
    return plan_record("report", NOW + 0.7, WHOLE, [PlannedMove("ml/c", FROM, TO)])


def test_written_and_read_back() -> None:
    r = record()
    assert r.at == NOW  # whole seconds
    text = r.to_json()
    assert json.loads(text)["at"] == "2027-01-15T08:00:00Z"
    assert PlanRecord.from_json(text) == r


def test_it_describes_the_plan_as_the_events_do() -> None:
    assert record().describe() == ("move 1 pod(s): ml/c from node n1 card 0 to node n0 card 0; "
                                   "then this pod fits on node n1 card 0")
    assert describe_cards(MIG) == "node m0 card 0 (MIG 3g.40gb MIG-m0-0, 3g.40gb MIG-m0-1)"
    two = Assignment("q", {"main": (CardShare(2, "G2", 1000, 1), CardShare(0, "G0", 1000, 1))})
    assert describe_cards(two) == "node q cards 0,2"


def body(**change: Any) -> str:
    data = json.loads(record().to_json())
    data.update(change)
    return json.dumps(data)


MOVE = json.loads(record().to_json())["moves"][0]


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"), ("[]", "JSON object"), (body(v=2), "version 2"),
    (body(mode="delete"), "mode 'delete'"), (body(at="soon"), "plan record time"),
    (body(moves=[]), "1-16 moves"), (body(moves=[MOVE] * (MAX_MOVES + 1)), "1-16 moves"),
    (body(moves=["x"]), r"moves\[0\] must be an object"),
    (body(moves=[{**MOVE, "pod": "no-namespace"}]), "<namespace>/<name>"),
    (body(moves=[{**MOVE, "pod": "a/" + "b" * 400}]), "<namespace>/<name>"),
    (body(moves=[{**MOVE, "to": "n0"}]), r"moves\[0\].to must be an assignment"),
    (body(placement={"v": 1, "node": ""}), "placement: assignment node"),
])
def test_unreadable_records_are_refused(text: str, message: str) -> None:
    with pytest.raises(PlanRecordError, match=message):
        PlanRecord.from_json(text)


def pod(name: str, note: str | None, node: str = "", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "annotations": {}}
    if note is not None:
        meta["annotations"][ann.DEFRAG_PLAN] = note
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def test_only_pods_not_bound_show_their_plan_and_a_bad_record_is_told() -> None:
    good = record().to_json()
    plans, bad = pending_plans([pod("z-wait", good), pod("bound", good, node="n1"),
                                pod("gone", good, deleting=True), pod("plain", None),
                                pod("a-wait", good), pod("forged", '{"v": 9}')])
    assert [p.pod for p in plans] == ["ml/a-wait", "ml/z-wait"]
    assert plans[0].record == record()
    assert bad == [("ml/forged", "plan record version 9 is not 1")]

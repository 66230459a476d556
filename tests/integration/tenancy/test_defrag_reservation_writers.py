"""Issue 30's reservation (`elasticgpu.io/defrag-reservation`) on a default sandbox (`egpu sandbox
up`): a tenant bound to `edit` can neither create a pod with it nor add it to a pod (nor the plan
record `elasticgpu.io/defrag-plan` that `egpu top` shows), and one the
system wrote (here the admin, who holds the system permission, as the defragmentation
controller's ServiceAccount does) keeps its cards from every other pod until its pod is gone.
The controller writing it during a real plan is `tests/integration/controller/
test_defragctl_sandbox.py`'s."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from egpu_testing.sandbox import kubectl
from egpu_testing.tenant import Tenant
from egpu_testing.waiting import wait_for
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.record import PlannedMove, plan_record
from elastic_gpu.core.defrag.reservation import DefragReservation

pytestmark = pytest.mark.integration

HOSTNAME = "kubernetes.io/hostname"
NODE = "gpu-node-003"  # the default sandbox: gpu-node-000..003, 8 cards each
CARDS = 8
DEADLINE_S = 180.0


def pod(name: str, limits: dict[str, str], *, selector: dict[str, str],
        annotations: dict[str, str] | None = None) -> str:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "nodeSelector": selector, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.example/cuda:12",
                        "resources": {"limits": limits}}]}})


def every_card(ttl_s: float) -> str:
    shares = tuple(CardShare(i, f"GPU-fake-{NODE}-{i}", 1000, 0) for i in range(CARDS))
    return DefragReservation(Assignment(NODE, {"main": shares}), time.time() + ttl_s).to_json()


def get_pod(tenant: Tenant, name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(tenant.ok("get", "pod", name, "-o", "json"))
    return result


def unschedulable(tenant: Tenant, name: str) -> bool:
    return any(c.get("reason") == "Unschedulable"
               for c in get_pod(tenant, name).get("status", {}).get("conditions", []))


def test_a_tenant_cannot_write_a_reservation(tenant: Callable[[], Tenant]) -> None:
    mine = tenant()
    nowhere = {"nowhere": "true"}
    refusal = mine.refused("create", "-f", "-", input=pod(
        "squatter", {"nvidia.com/gpu": "8"}, selector=nowhere,
        annotations={ann.DEFRAG_RESERVATION: every_card(600)}))
    assert f"{ann.DEFRAG_RESERVATION} is written only by the Elastic GPU controller" in refusal
    assert "remove it from your pod" in refusal, refusal
    mine.ok("create", "-f", "-", input=pod("waiting", {"nvidia.com/gpu": "8"},
                                           selector=nowhere))
    refusal = mine.refused("annotate", "pod", "waiting",
                           f"{ann.DEFRAG_RESERVATION}={every_card(600)}")
    assert "it may not be added, changed or removed" in refusal, refusal


def forged_plan() -> str:
    """A plan record `egpu top` would show: a move that frees NODE's cards for the pod."""
    shares = tuple(CardShare(i, f"GPU-fake-{NODE}-{i}", 1000, 0) for i in range(CARDS))
    held = Assignment(NODE, {"main": shares})
    return plan_record("report", time.time(), held,
                       [PlannedMove("victim/pod", held, Assignment("gpu-node-000", {}))]).to_json()


def test_a_tenant_cannot_write_a_plan_record_for_egpu_top(tenant: Callable[[], Tenant]) -> None:
    mine = tenant()
    nowhere = {"nowhere": "true"}
    refusal = mine.refused("create", "-f", "-", input=pod(
        "boaster", {"nvidia.com/gpu": "8"}, selector=nowhere,
        annotations={ann.DEFRAG_PLAN: forged_plan()}))
    assert f"{ann.DEFRAG_PLAN} is written only by the Elastic GPU controller" in refusal
    mine.ok("create", "-f", "-", input=pod("plain", {"nvidia.com/gpu": "8"}, selector=nowhere))
    refusal = mine.refused("annotate", "pod", "plain", f"{ann.DEFRAG_PLAN}={forged_plan()}")
    assert "it may not be added, changed or removed" in refusal, refusal
    assert ann.DEFRAG_PLAN not in (get_pod(mine, "plain")["metadata"].get("annotations") or {})


def test_the_systems_reservation_keeps_the_cards_until_its_pod_goes(
        sandbox: Any, tenant: Callable[[], Tenant]) -> None:
    mine = tenant()
    # a pod that cannot schedule (no node has the label), holding NODE's 8 cards by reservation
    mine.ok("create", "-f", "-", input=pod("holder", {"nvidia.com/gpu": "8"},
                                           selector={"nowhere": "true"}))
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "annotate", "pod", "holder",
            f"{ann.DEFRAG_RESERVATION}={every_card(600)}")
    mine.ok("create", "-f", "-", input=pod("one", {"nvidia.com/gpu": "1"},
                                           selector={HOSTNAME: NODE}))
    wait_for("one Unschedulable", lambda: unschedulable(mine, "one"), DEADLINE_S)
    # turned away by the extender (the node matches), its cards being held
    held = wait_for("the extender's reason", lambda: "0 of 8 cards are entirely free" in mine.ok(
        "get", "events", "--field-selector", "involvedObject.name=one,reason=FailedScheduling",
        "-o", "custom-columns=MESSAGE:.message"), DEADLINE_S)
    assert held and not get_pod(mine, "one")["spec"].get("nodeName")
    # the reservation's pod deleted: its cards are free again, and the waiting pod gets one
    mine.ok("delete", "pod", "holder", "--wait=false")
    wait_for("one Running", lambda: get_pod(mine, "one").get("status", {}).get("phase")
             == "Running", DEADLINE_S)
    assert get_pod(mine, "one")["spec"]["nodeName"] == NODE

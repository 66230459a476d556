"""Dynamic MIG through DRA on `egpu sandbox up` (issue 42, must-show "the same through DRA"): a
group in `gpuMode: dra` with `migDynamic: true`, four A100-SXM4-80GB cards, no layout.

1. a whole-card ResourceClaim is allocated one card (its pod binds); a claim of the MIG class
   asking `3g.40gb` by profile waits behind our DRA placement gate (no card offers one), the
   sandbox's controller reads it as demand and writes a MigLayout for another card, the
   stand-in DRA agent fences it (its devices tainted in the slice), carves it and republishes
   the partitionable devices and counters; our allocator (not kube-scheduler) allocates the
   new instance and the pod binds; the held card never changed, and no fence is left in the
   slices;
2. the other shapes a MIG claim is written in: a `firstAvailable` claim whose first subrequest
   no A100 can serve (`7g.141gb`) gets its second (`4g.40gb`), and a claim of `2g.20gb ||
   1g.10gb` gets the first written, each carved for it and allocated by our allocator;
3. the crash must-show on the DRA path: the stand-in agent is SIGKILLed right after its first
   published step (a card fenced and carved mid-change for a claim of two `3g.40gb`), then the
   controller; both restarted, the claim is allocated, and the independent ledger check
   (`egpu_testing.dra_ledger`) finds nothing held twice or lost, no fence left, and every
   MigLayout applied as the card really is.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra_ledger import dra_inventories, over_capacity
from egpu_testing.mig_sandbox import (
    allocation_sync,
    controller,
    create,
    get,
    sandbox_component,
    sandbox_up,
)
from egpu_testing.waiting import wait_for
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.devices import FENCE_TAINT
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.model import Health
from elastic_gpu.devcluster.dra_nodes import FAKE_FENCE_ANNOTATION

pytestmark = pytest.mark.integration

NODE = "dramig-000"
NS = "dramig"
CLUSTER_FILE = """\
nodeGroups:
- {name: dramig, count: 1, gpus: 4, model: A100-SXM4-80GB, memoryMiB: 81920, gpuMode: dra,
   migDynamic: true}
"""
DEADLINE_S = 180.0
ATTR = 'device.attributes["gpu.elasticgpu.io"].profile'


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from sandbox_up(tmp_path_factory.mktemp("migdra"), CLUSTER_FILE, NS)


def mig(expression: str, count: int = 1, **more: Any) -> dict[str, Any]:
    return {"deviceClassName": MIG_CLASS, "count": count,
            "selectors": [{"cel": {"expression": expression}}], **more}


def claim_pod(name: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    """A claim of one request (`exactly` or `firstAvailable`) and a pod using it."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", **request}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [{"name": "main", "image": "cuda:fake",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}
    return [claim, pod]


def results(box: Path, name: str) -> list[dict[str, Any]]:
    """The pod's claim's allocation results, once the pod is bound."""
    def placed() -> list[dict[str, Any]] | None:
        pod = get(box, "pod", name, "-n", NS)
        claim = get(box, "resourceclaim", name, "-n", NS)
        if not pod or not pod["spec"].get("nodeName") or not claim:
            return None
        found = ((claim.get("status") or {}).get("allocation") or {}).get(
            "devices", {}).get("results") or []
        return list(found) or None
    return list(wait_for(f"pod {name} bound", placed, timeout_s=DEADLINE_S))


def allocation_writers(claim: dict[str, Any]) -> set[str]:
    """Who wrote the claim's `status.allocation`, by the API server's managedFields."""
    found = {str(e.get("manager")) for e in claim["metadata"].get("managedFields") or []
             if e.get("subresource") == "status"
             and "f:allocation" in ((e.get("fieldsV1") or {}).get("f:status") or {})}
    assert found, claim["metadata"]
    return found


def bound_device(box: Path, name: str) -> str:
    return str(results(box, name)[0]["device"])


def slices(box: Path) -> list[dict[str, Any]]:
    return list(get(box, "resourceslices")["items"])


def tainted(box: Path) -> list[str]:
    return [d["name"] for s in slices(box) for d in s["spec"].get("devices") or []
            if any(t.get("key") == FENCE_TAINT for t in d.get("taints") or [])]


def ledger_problems(box: Path) -> list[str]:
    """The independent check: the claims' allocations (and pods') summed against the cards the
    node really has (its stand-in's inventory, not the slices), each MIG instance held once;
    no fence left; every MigLayout applied as its card is, and the slices showing it so."""
    nodes = dra_inventories(get(box, "nodes")["items"])
    problems = over_capacity(get(box, "pods", "-A")["items"],
                             get(box, "resourceclaims", "-A")["items"], nodes)
    real = {c.uuid: c for n in nodes for c in n.cards}
    published = {c.uuid: c for c in node_cards(slices(box)).get(NODE, [])}
    node = get(box, "node", NODE)
    if (node["metadata"].get("annotations") or {}).get(FAKE_FENCE_ANNOTATION, "[]") != "[]":
        problems.append(f"fence left: {node['metadata']['annotations'][FAKE_FENCE_ANNOTATION]}")
    problems += [f"{name} still tainted" for name in tainted(box)]
    for layout in get(box, "miglayouts")["items"]:
        status = layout.get("status", {})
        uuid = layout["spec"]["cardUUID"]
        have = sorted((m.profile.name, m.start) for m in real[uuid].mig)
        shown = sorted((m.profile.name, m.start) for m in published[uuid].mig)
        wanted = sorted((i["profile"], i["start"]) for i in layout["spec"]["instances"])
        if status.get("phase") != "Applied" or not have == shown == wanted:
            problems.append(f"MigLayout {layout['metadata']['name']}: {status}, card {have}, "
                            f"slices {shown}")
    return problems


def test_a_mig_claim_by_profile_carves_a_dra_card(box: Path) -> None:
    create(box, *claim_pod("whole", {"exactly": {"deviceClassName": CARD_CLASS}}))
    whole = bound_device(box, "whole")
    assert whole.startswith("gpu-") and "-mig-" not in whole
    ((card_whole,),) = [[c for c in node_cards(slices(box))[NODE]
                         if f"gpu-{c.index}" == whole]]

    create(box, *claim_pod("m3", {"exactly": mig(f'{ATTR} == "3g.40gb"')}))
    # gated by the webhook, it waits behind our gate while the card is carved for it
    assert get(box, "pod", "m3", "-n", NS)["spec"].get("schedulingGates") == [
        {"name": DRA_PLACEMENT_GATE}]
    device = bound_device(box, "m3")
    assert "-mig-" in device and device.endswith("3g-40gb")
    # our allocator placed it on the carved instance, not kube-scheduler's first fit
    assert "kube-scheduler" not in allocation_writers(get(box, "resourceclaim", "m3", "-n", NS,
                                                         "--show-managed-fields"))

    cards = {c.uuid: c for c in node_cards(slices(box))[NODE]}
    carved = [c for c in cards.values() if c.mig]
    assert len(carved) == 1 and carved[0].uuid != card_whole.uuid
    assert [m.profile.name for m in carved[0].mig] == ["3g.40gb"]
    assert cards[card_whole.uuid].mig == ()  # the held card never changed
    layouts = get(box, "miglayouts")["items"]
    assert [m["spec"]["cardUUID"] for m in layouts] == [carved[0].uuid]

    def settled() -> bool:  # the layout applied, and no device left tainted by the fence
        status = get(box, "miglayouts")["items"][0].get("status") or {}
        return status.get("phase") == "Applied" and not tainted(box)
    wait_for("the layout applied, no fence left", settled, timeout_s=DEADLINE_S)
    assert bound_device(box, "whole") == whole  # the whole card's claim kept its card


def test_first_available_and_or_claims_get_cards_carved(box: Path) -> None:
    create(box, *claim_pod("fa", {"firstAvailable": [
        {"name": "big", **mig(f'{ATTR} == "7g.141gb"')},
        {"name": "four", **mig(f'{ATTR} == "4g.40gb"')}]}))
    create(box, *claim_pod("either", {"exactly": mig(
        f'{ATTR} == "2g.20gb" || {ATTR} == "1g.10gb"')}))
    (fa,) = results(box, "fa")
    assert fa["request"] == "gpu/four" and fa["device"].endswith("4g-40gb")
    assert bound_device(box, "either").endswith("2g-20gb")  # the first written
    for name in ("fa", "either"):  # placed by our allocator once carved
        claim = get(box, "resourceclaim", name, "-n", NS, "--show-managed-fields")
        assert "kube-scheduler" not in allocation_writers(claim)
    wait_for("every layout applied, nothing held twice", lambda: ledger_problems(box) == [],
             timeout_s=DEADLINE_S)


def test_dra_agent_then_controller_killed_mid_change(box: Path) -> None:
    sync_pid, _, _ = sandbox_component(box, "allocation-sync")
    os.kill(sync_pid, signal.SIGKILL)
    crashing = allocation_sync(box, "crash.log", crash=True)
    crashing.start()
    create(box, *claim_pod("two", {"exactly": mig(f'{ATTR} == "3g.40gb"', count=2)}))
    wait_for("the agent's crash", lambda: crashing.process is not None
             and crashing.process.poll() == -signal.SIGKILL, timeout_s=DEADLINE_S)
    fenced = [c for c in node_cards(slices(box))[NODE] if c.health is Health.FENCED]
    assert fenced and tainted(box)  # a card fenced mid-change, its devices tainted
    assert any((m.get("status") or {}).get("phase") != "Applied"
               for m in get(box, "miglayouts")["items"])
    ctl_pid, ctl = controller(box, "controller.log")
    os.kill(ctl_pid, signal.SIGKILL)
    sync = allocation_sync(box, "sync.log")
    sync.start()
    try:
        ctl.start()
        two = results(box, "two")
        assert len({r["device"] for r in two}) == 2
        assert all(r["device"].endswith("3g-40gb") for r in two)
        wait_for("no fence left, every layout applied, nothing held twice or lost",
                 lambda: ledger_problems(box) == [], timeout_s=DEADLINE_S)
    finally:
        sync.stop()
        ctl.stop()

"""Dynamic MIG through DRA on `egpu sandbox up` (issue 42, must-show "the same through DRA"): a
group in `gpuMode: dra` with `migDynamic: true`, two A100-SXM4-80GB cards, no layout.

1. a whole-card ResourceClaim is allocated one card (its pod binds);
2. a claim of the MIG class asking `3g.40gb` by profile waits (no card offers one), the
   sandbox's controller reads it as demand and writes a MigLayout for the other card, the
   stand-in DRA agent fences it (its devices tainted in the slice), carves it and republishes
   the partitionable devices and counters; kube-scheduler allocates the new instance and the
   pod binds;
3. the held card never changed (no MigLayout for it, its claim still on its card device), and
   no fence is left in the slices.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.sandbox import egpu, kubectl, kubectl_run
from egpu_testing.waiting import wait_for
from elastic_gpu.core.dra.devices import FENCE_TAINT
from elastic_gpu.core.dra.sliceview import node_cards

pytestmark = pytest.mark.integration

NODE = "dramig-000"
NS = "dramig"
CLUSTER_FILE = """\
nodeGroups:
- {name: dramig, count: 1, gpus: 2, model: A100-SXM4-80GB, memoryMiB: 81920, gpuMode: dra,
   migDynamic: true}
"""
DEADLINE_S = 180.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("migdra")
    (where / "cluster.yaml").write_text(CLUSTER_FILE)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        kubectl(where / "kubeconfig", "create", "namespace", NS)
        yield where
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


def get(box: Path, *what: str) -> Any:
    result = kubectl_run(box / "kubeconfig", "get", *what, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def claim_pod(name: str, exactly: dict[str, Any]) -> list[dict[str, Any]]:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [{"name": "main", "image": "cuda:fake",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}
    return [claim, pod]


def create(box: Path, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        kubectl(box / "kubeconfig", "create", "-f", "-", input=json.dumps(obj))


def bound_device(box: Path, name: str) -> str:
    """The device the pod's claim was allocated, once the pod is bound."""
    def placed() -> str | None:
        pod = get(box, "pod", name, "-n", NS)
        claim = get(box, "resourceclaim", name, "-n", NS)
        if not pod or not pod["spec"].get("nodeName") or not claim:
            return None
        results = ((claim.get("status") or {}).get("allocation") or {}).get(
            "devices", {}).get("results") or []
        return str(results[0]["device"]) if results else None
    return str(wait_for(f"pod {name} bound", placed, timeout_s=DEADLINE_S))


def slices(box: Path) -> list[dict[str, Any]]:
    return list(get(box, "resourceslices")["items"])


def test_a_mig_claim_by_profile_carves_a_dra_card(box: Path) -> None:
    create(box, claim_pod("whole", {"deviceClassName": "gpu.elasticgpu.io"}))
    whole = bound_device(box, "whole")
    assert whole.startswith("gpu-") and "-mig-" not in whole
    ((card_whole,),) = [[c for c in node_cards(slices(box))[NODE]
                         if f"gpu-{c.index}" == whole]]

    create(box, claim_pod("m3", {
        "deviceClassName": "mig.gpu.elasticgpu.io",
        "selectors": [{"cel": {"expression":
                               'device.attributes["gpu.elasticgpu.io"].profile == "3g.40gb"'}}]}))
    device = bound_device(box, "m3")
    assert "-mig-" in device and device.endswith("3g-40gb")

    cards = {c.uuid: c for c in node_cards(slices(box))[NODE]}
    carved = [c for c in cards.values() if c.mig]
    assert len(carved) == 1 and carved[0].uuid != card_whole.uuid
    assert [m.profile.name for m in carved[0].mig] == ["3g.40gb"]
    assert cards[card_whole.uuid].mig == ()  # the held card never changed
    layouts = get(box, "miglayouts")["items"]
    assert [m["spec"]["cardUUID"] for m in layouts] == [carved[0].uuid]

    def settled() -> bool:  # the layout applied, and no device left tainted by the fence
        status = get(box, "miglayouts")["items"][0].get("status") or {}
        tainted = [d["name"] for s in slices(box) for d in s["spec"].get("devices") or []
                   if any(t.get("key") == FENCE_TAINT for t in d.get("taints") or [])]
        return status.get("phase") == "Applied" and not tainted
    wait_for("the layout applied, no fence left", settled, timeout_s=DEADLINE_S)
    assert bound_device(box, "whole") == whole  # the whole card's claim kept its card

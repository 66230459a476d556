"""kube-scheduler's retry in the turn (`core.dra.turn`, docs/dra.md "Claims placed by our
engine"): the shape that gave one MIG instance to two claims on the sandbox. A `gpuMode: dra`
group with `migDynamic: true` and no free instance; a claim by profile (gated, placed by our
allocator) and a MIG claim our reader hands to kube-scheduler (`profile != "7g.80gb"`) created
together. Dynamic MIG carves a `1g.10gb` for ours; the slice's change wakes kube-scheduler's
retry of the handed-over pod (found unschedulable) and our pass at once. Our lift now waits for
that retry, and its check before the lift reads MIG instances too (it read only the card
devices, so the instance given twice went unseen): ours is taken back while gated and placed on
the next carve. Both pods end on distinct instances, never on one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra_ledger import dra_inventories, over_capacity
from egpu_testing.mig_sandbox import create, get, sandbox_up
from egpu_testing.waiting import wait_for
from elastic_gpu.core.dra.classes import MIG_CLASS

pytestmark = pytest.mark.integration

NS = "draretry"
CLUSTER_FILE = """\
nodeGroups:
- {name: draretry, count: 1, gpus: 2, model: A100-SXM4-80GB, memoryMiB: 81920, gpuMode: dra,
   migDynamic: true}
"""
ATTR = 'device.attributes["gpu.elasticgpu.io"].profile'


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from sandbox_up(tmp_path_factory.mktemp("draretry"), CLUSTER_FILE, NS)


def claim_pod(name: str, expression: str) -> list[dict[str, Any]]:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                 "deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": expression}}]}}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": {"terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                    "containers": [{"name": "main", "image": "cuda:fake",
                                    "resources": {"claims": [{"name": "mig"}]}}]}}
    return [claim, pod]


def bound_devices(box: Path) -> list[str] | None:
    """Each pod's claim's devices once both pods are bound; None before."""
    out = []
    for name in ("ours", "theirs"):
        pod, claim = get(box, "pod", name, "-n", NS), get(box, "resourceclaim", name, "-n", NS)
        results = (((claim or {}).get("status") or {}).get("allocation") or {}).get(
            "devices", {}).get("results") or []
        if not pod or not pod["spec"].get("nodeName") or not results:
            return None
        out += [str(r["device"]) for r in results]
    return out


def test_a_carve_gives_no_instance_to_a_gated_and_a_handed_over_claim(box: Path) -> None:
    create(box, *claim_pod("ours", f'{ATTR} == "1g.10gb"'),
           *claim_pod("theirs", f'{ATTR} != "7g.80gb"'))
    devices = wait_for("both pods bound", lambda: bound_devices(box), timeout_s=240.0)
    assert len(devices) == 2 and len(set(devices)) == 2, devices  # never one instance for two
    assert all("-mig-" in d for d in devices), devices
    nodes = dra_inventories(get(box, "nodes")["items"])
    assert over_capacity(get(box, "pods", "-A")["items"],
                         get(box, "resourceclaims", "-A")["items"], nodes) == []

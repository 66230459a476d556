"""`core.request.limits_compute`: whether a share's isolation limits its compute, read from the
container's resources as the webhook leaves them (issue 40: a memory-only share is not held
to the 1 % of compute the ledger bills it)."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.facts import ClusterFacts, default_policies
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.request import container_request, limits_compute

NODE_POLICIES, CARD_POLICIES = default_policies()
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     smallest_card_memory_mib=81920,
                     largest_memory_node="big", models=frozenset({"A100-SXM4-80GB"}),
                     node_policies=NODE_POLICIES, card_policies=CARD_POLICIES)


def limited(limits: dict[str, str]) -> bool:
    return limits_compute(container_request("main", {"limits": limits}))


@pytest.mark.parametrize("limits", [
    {"elasticgpu.io/gpu-memory": "3000"},  # before the webhook (the simulator's form)
    {"elasticgpu.io/gpu-memory": "3000", "elasticgpu.io/gpu-core": "1"},  # after it
    {"gpushare.provisioner.elasticgpu.io/gpu-memory": "3000", "elasticgpu.io/gpu-core": "1"},
    # a multi-card memory-only share (HAMi's `nvidia.com/gpu: 2` with gpumem), as stored
    {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-memory": "3000",
     "elasticgpu.io/gpu-core": "1"},
], ids=["memory", "memory+device", "claim-memory+device", "multi-card"])
def test_a_memory_only_share_asks_no_compute(limits: dict[str, str]) -> None:
    assert not limited(limits)


@pytest.mark.parametrize("limits", [
    {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "3000"},
    {"elasticgpu.io/gpu-core": "2", "elasticgpu.io/gpu-memory": "3000"},
    {"elasticgpu.io/gpu-core": "1"},  # 1 % alone: compute is all it asked
    # gpu-manager's pair: vcuda-memory is a device plugin, so nobody added the 1 %
    {"tencent.com/vcuda-core": "1", "tencent.com/vcuda-memory": "4"},
    # another compute name than the one the webhook writes: asked by hand
    {"nano-gpu/gpu-percent": "1", "elasticgpu.io/gpu-memory": "3000"},
    {"elasticgpu.io/gpu-tflops": "100", "elasticgpu.io/gpu-memory": "3000"},
    {"nvidia.com/gpu": "1"},
    {"elasticgpu.io/gpu-core": "200"},
    {"nvidia.com/mig-1g.10gb": "1"},
    {},
])
def test_every_other_request_keeps_its_compute_limit(limits: dict[str, str]) -> None:
    assert limited(limits)


def admitted_container(pod: dict[str, Any]) -> dict[str, Any]:
    verdict = admit(pod, FACTS, mutate=True)
    assert verdict.allowed, verdict.refusals
    container: dict[str, Any] = apply_patch(pod, verdict.patch)["spec"]["containers"][0]
    return container


def gpu_pod(limits: dict[str, str], annotations: dict[str, str] | None = None,
            scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x",
                                            "resources": {"limits": dict(limits)}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": spec}


@pytest.mark.parametrize("pod", [
    gpu_pod({"elasticgpu.io/gpu-memory": "3000"}),
    # HAMi's examples/nvidia/example.yaml
    gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
    # HAMi's memory-fraction example: memory only, on two cards
    gpu_pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"}),
    # KAI's gpu-memory pod
    gpu_pod({}, {"gpu-memory": "3000"}, "kai-scheduler"),
], ids=["ours", "hami-example", "hami-memory-fraction", "kai-gpu-memory"])
def test_the_webhooks_memory_only_shares_are_read_as_asking_no_compute(
        pod: dict[str, Any]) -> None:
    """What the webhook stores for a memory-only share (the 1 % device it adds so that kubelet
    calls Allocate) is read as no compute asked, whichever dialect it was written in."""
    container = admitted_container(pod)
    request = container_request("main", container["resources"])
    assert request.compute_milli == 10  # the ledger bills the 1 %, as before
    assert not limits_compute(request)


def test_a_share_asking_compute_keeps_it_through_the_webhook() -> None:
    container = admitted_container(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                                            "nvidia.com/gpucores": "30"}))
    assert limits_compute(container_request("main", container["resources"]))

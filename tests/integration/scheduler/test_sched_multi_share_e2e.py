"""Multi-card shares on a real control plane (issue 40): the extender beside the real
kube-scheduler, a fake (kwok) node of two cards published by the agent's code.

`elasticgpu.io/gpu: 2` beside `gpu-core: 30` and `gpu-memory: 8192` is bound with a 30% and
8192 MiB share on each of the node's two cards; three such shares are turned away with the
sentence that says why. Pods are created as the admission webhook stores them (its own
mutation, `core.admission.admit`, applied here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.scenario import (
    create_pods,
    unschedulable_reason,
    wait_bound,
    wait_extender_knows,
)
from egpu_testing.workbench import ExtenderProcess, pod_manifest, running_extender
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.assignment import Assignment

pytestmark = pytest.mark.integration

#: what the webhook would know of a cluster whose largest node has 4 cards
FACTS = ClusterFacts(largest_cards=4, largest_cards_node="n", largest_card_memory_mib=32768,
                     largest_memory_node="n")


@pytest.fixture
def extender(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
             ) -> Iterator[ExtenderProcess]:
    install_crds(k8s_cluster)
    with running_extender(k8s_cluster, tmp_path, kube_scheduler=start_kube_scheduler) as process:
        yield process


def stored(pod: dict[str, Any], facts: ClusterFacts = FACTS) -> dict[str, Any]:
    """The pod as the webhook stores it."""
    verdict = admit(pod, facts, mutate=True)
    assert verdict.allowed, verdict.refusals
    out: dict[str, Any] = apply_patch(pod, verdict.patch)
    return out


def test_a_share_on_two_cards_binds_on_two_distinct_cards(
        k8s_cluster: Any, extender: ExtenderProcess, k8s_namespace: str,
        fake_gpu_nodes: Callable[..., list[str]]) -> None:
    (node,) = fake_gpu_nodes(1, gpus=2, gpu_model="A100", gpu_memory_mib=32768, prefix="mshare")
    wait_extender_knows(extender.url, [node], 2)
    client = k8s_cluster.client()
    share = {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "8192"}
    pods = [stored(pod_manifest(name, k8s_namespace,
                                limits={"elasticgpu.io/gpu": str(cards), **share},
                                scheduler_name=extender.scheduler_name))
            for name, cards in (("two", 2), ("three", 3))]
    # the webhook keeps the count: these are shares, not whole cards
    assert pods[0]["spec"]["containers"][0]["resources"]["limits"]["elasticgpu.io/gpu"] == "2"
    create_pods(client, pods)
    bound = wait_bound(client, k8s_namespace, ["two"])["two"]
    assert bound["spec"]["nodeName"] == node
    assignment = Assignment.from_json(bound["metadata"]["annotations"][ann.ASSIGNMENT])
    shares = assignment.containers["main"]
    assert sorted(s.index for s in shares) == [0, 1]
    assert all((s.milli, s.memory_mib) == (300, 8192) for s in shares)
    reason = unschedulable_reason(client, k8s_namespace, "three")
    assert "2/2 cards have 30% compute and 8192 MiB free" in reason, reason
    assert "container main needs 3 such cards" in reason, reason

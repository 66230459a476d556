"""Issues 41/42: DRA MIG claims placed by our engine, not kube-scheduler's first fit.

A kwok DRA node with two A100-SXM4-80GB cards carved alike (`3g.40gb`, `1g.10gb`, `1g.10gb`),
its instances published as this driver's partitionable devices. Card 1's `3g.40gb` is held
by a claim allocated before (a fact in the API, whoever wrote it). Through the real webhook,
the extender's DRA allocator and a stock kube-scheduler:

1. a pod of a claim asking `1g.10gb` by profile is gated by the webhook, and our allocator
   (the API server's managedFields name it, not kube-scheduler) gives it card 1's `1g.10gb`:
   the partly held card (`core.mig.pick`), where kube-scheduler's first fit in slice order
   takes card 0's, leaving two carved cards in use where one would do;
2. a `firstAvailable` claim (`7g.80gb`, which no carved card has, then `1g.10gb`) is allocated
   by us too, its result naming the subrequest, again on card 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.webhook import running_webhook, wait_in_force
from egpu_testing.workbench import ExtenderProcess, plain_kube_scheduler_config, running_extender
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.classes import MIG_CLASS
from elastic_gpu.core.dra.devices import DRIVER, mig_device
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.dra_nodes import as_dra, carve
from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_nodes, unregister_fake_node
from elastic_gpu.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

pytestmark = pytest.mark.integration

WEBHOOK_LABEL = "egpu-dra-mig"
PROFILE = 'device.attributes["gpu.elasticgpu.io"].profile'
LAYOUT = ["3g.40gb", "1g.10gb", "1g.10gb"]


@pytest.fixture
def mig_node(k8s_cluster: ControlPlane) -> Iterator[str]:
    name = unique_name("dramig")
    inventory = as_dra(fake_inventory(name, gpus=2, gpu_model="A100-SXM4-80GB",
                                      gpu_memory_mib=81920))
    inventory = carve(carve(inventory, 0, LAYOUT), 1, LAYOUT)
    client = k8s_cluster.kube()
    register_fake_nodes(client, [inventory])
    try:
        yield name
    finally:
        unregister_fake_node(client, name)


def _claim(namespace: str, name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", **request}]}}}


def _by(profile: str) -> dict[str, Any]:
    return {"deviceClassName": MIG_CLASS,
            "selectors": [{"cel": {"expression": f'{PROFILE} == "{profile}"'}}]}


def _pod(name: str, scheduler: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "cuda:fake",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def _writers(claim: dict[str, Any]) -> set[str]:
    """Who wrote the claim's `status.allocation`, by the API server's managedFields."""
    return {str(e.get("manager")) for e in claim["metadata"].get("managedFields") or []
            if e.get("subresource") == "status"
            and "f:allocation" in ((e.get("fieldsV1") or {}).get("f:status") or {})}


def _bound_result(kube: Any, namespace: str, name: str, timeout_s: float = 90.0
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        pod = kube.get(PODS.path(namespace, name))
        claim = kube.get(RESOURCE_CLAIMS.path(namespace, name))
        if pod["spec"].get("nodeName") and (claim.get("status") or {}).get("allocation"):
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            return claim, result
        assert time.monotonic() < deadline, (pod.get("status"), claim.get("status"))
        time.sleep(0.2)


@pytest.mark.usefixtures("dra_device_classes")
def test_mig_claims_are_gated_and_placed_by_our_engine_on_the_partly_held_card(
        k8s_cluster: ControlPlane, k8s_namespace: str, tmp_path: Path, mig_node: str,
        start_kube_scheduler: Callable[..., Any]) -> None:
    kube = k8s_cluster.kube()
    slices, _ = kube.list(RESOURCE_SLICES.path(), {"fieldSelector": f"spec.driver={DRIVER}"})
    cards = node_cards(slices)[mig_node]
    device = {(c.index, i.profile.name, i.start): mig_device(c.index, i)
              for c in cards for i in c.mig}
    (held,) = [d for (card, p, _), d in device.items() if card == 1 and p == "3g.40gb"]
    ones = {card: sorted(d for (k, p, _), d in device.items() if k == card and p == "1g.10gb")
            for card in (0, 1)}
    # card 1's 3g held: a claim allocated before (by whoever), read by our allocator as a fact
    kube.create(RESOURCE_CLAIMS.path(k8s_namespace), _claim(k8s_namespace, "held",
                                                            {"exactly": _by("3g.40gb")}))
    kube.patch(RESOURCE_CLAIMS.path(k8s_namespace, "held", "status"), {"status": {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
                                                 "pool": mig_node, "device": held}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In",
                            "values": [mig_node]}]}]}}}})
    with running_webhook(k8s_cluster, tmp_path, "dra-mig", WEBHOOK_LABEL) as hook, \
            running_extender(k8s_cluster, tmp_path, config={"nodePolicy": "binpack"},
                             start_timeout_s=120) as extender:
        _run(k8s_cluster, kube, k8s_namespace, hook.name, extender, mig_node, ones,
             start_kube_scheduler)


def _run(k8s_cluster: ControlPlane, kube: Any, namespace: str, hook: str,
         extender: ExtenderProcess, node: str, ones: dict[int, list[str]],
         start_kube_scheduler: Callable[..., Any]) -> None:
    k8s_cluster.kubectl("label", "namespace", namespace, f"{WEBHOOK_LABEL}={hook}")
    wait_in_force(k8s_cluster, namespace)
    start_kube_scheduler(plain_kube_scheduler_config(extender.scheduler_name))

    kube.create(RESOURCE_CLAIMS.path(namespace), _claim(namespace, "one",
                                                        {"exactly": _by("1g.10gb")}))
    created = kube.create(PODS.path(namespace), _pod("one", extender.scheduler_name, node))
    assert created["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]
    claim, result = _bound_result(kube, namespace, "one")
    # the partly held card 1, not card 0's first free instance (kube-scheduler's first fit)
    assert result["device"] in ones[1], (result, ones)
    assert (result["request"], result["pool"]) == ("gpu", node)
    writers = _writers(claim)
    assert writers and "kube-scheduler" not in writers, claim["metadata"]
    assert "kube-scheduler's to place" not in extender.log_path.read_text()

    kube.create(RESOURCE_CLAIMS.path(namespace), _claim(namespace, "fa", {"firstAvailable": [
        {"name": "whole", **_by("7g.80gb")}, {"name": "small", **_by("1g.10gb")}]}))
    created = kube.create(PODS.path(namespace), _pod("fa", extender.scheduler_name, node))
    assert created["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]
    claim, result = _bound_result(kube, namespace, "fa")
    assert result["request"] == "gpu/small" and result["device"] in ones[1], result
    assert {result["device"]} | {r["device"] for r in kube.get(RESOURCE_CLAIMS.path(
        namespace, "one"))["status"]["allocation"]["devices"]["results"]} == set(ones[1])
    writers = _writers(claim)
    assert writers and "kube-scheduler" not in writers, claim["metadata"]

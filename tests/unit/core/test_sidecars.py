"""Sidecars (KEP-753: init containers with `restartPolicy: Always`): what a pod with them asks
of its node, as kube-scheduler counts it, and their GPU shares, read, admitted and completed
like a regular container's; a classic init container asking a GPU is still refused."""

from __future__ import annotations

from typing import Any

import pytest

from egpu_testing.sidecars import with_init_container
from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import QUOTA_MUTATORS
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.admission.rules import AdmissionRule
from elastic_gpu.core.budget.ledger import container_runs
from elastic_gpu.core.budget.shares import container_shares
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import QUOTA_CORE
from elastic_gpu.core.request import (
    RequestKind,
    lifetime_containers,
    pod_host_requests,
    pod_request_from_manifest,
)
from elastic_gpu.core.resources import GPU_CORE, ResourceError

CORE = "elasticgpu.io/gpu-core"
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big")


def host_pod(main_cpu: str, *inits: tuple[str, str, bool], memory: str = "0") -> dict[str, Any]:
    """A pod with one container asking `main_cpu`, then init containers (name, CPU, sidecar)
    in that order; every container asks `memory`."""
    pod = pod_manifest("p", containers={"main": {"cpu": main_cpu, "memory": memory}})
    for name, cpu, sidecar in inits:
        pod = with_init_container(pod, name, {"cpu": cpu, "memory": memory}, sidecar=sidecar)
    return pod


# --- what the pod asks of its node: component-helpers resource.PodRequests ------------------


@pytest.mark.parametrize(("pod", "cpu"), [
    # the case: a sidecar runs beside the main container, so the two are summed
    (host_pod("4", ("proxy", "4", True)), 8000),
    # a classic init container runs beside the sidecars started before it ...
    (host_pod("1", ("proxy", "2", True), ("setup", "3", False)), 5000),
    # ... and not beside those started after it
    (host_pod("1", ("setup", "4", False), ("proxy", "2", True)), 4000),
    (host_pod("1", ("a", "1", True), ("setup", "5", False), ("b", "2", True)), 6000),
    # a classic init container alone: the larger of it and the containers, as before
    (host_pod("1", ("setup", "3", False)), 3000),
    (host_pod("3", ("setup", "1", False)), 3000),
])
def test_a_pods_cpu_follows_kube_schedulers_rule_for_sidecars(pod: dict[str, Any],
                                                              cpu: int) -> None:
    assert pod_host_requests(pod)[0] == cpu
    assert pod_request_from_manifest(pod).cpu_milli == cpu


def test_memory_is_summed_the_same_way_and_the_overhead_on_top() -> None:
    pod = host_pod("1", ("proxy", "1", True), ("setup", "1", False), memory="1Gi")
    pod["spec"]["overhead"] = {"cpu": "250m", "memory": "100Mi"}
    # the containers and the sidecar: 2 CPU, 2 GiB; setup beside the sidecar: 2 CPU, 2 GiB
    assert pod_host_requests(pod) == (2250, 2148)


# --- a sidecar's GPU share -----------------------------------------------------------------


def gpu_pod(sidecar: dict[str, str], *, classic: bool = False) -> dict[str, Any]:
    pod = pod_manifest("p", uid="u1", containers={"main": {CORE: "50", "cpu": "1"}})
    return with_init_container(pod, "proxy", sidecar, sidecar=not classic)


def test_a_sidecars_gpu_share_is_part_of_the_pods_request() -> None:
    request = pod_request_from_manifest(gpu_pod({CORE: "30", "cpu": "1"}))
    assert [(c.name, c.kind, c.compute_milli) for c in request.gpu_containers] == [
        ("proxy", RequestKind.SHARE, 300), ("main", RequestKind.SHARE, 500)]
    assert request.total_milli == 800
    assert request.cpu_milli == 2000


def test_a_classic_init_container_asking_a_gpu_is_refused_with_the_reason() -> None:
    with pytest.raises(ResourceError, match=r"init container proxy asks for a GPU.*"
                       r"restartPolicy: Always"):
        pod_request_from_manifest(gpu_pod({CORE: "30"}, classic=True))
    verdict = admit(gpu_pod({CORE: "30"}, classic=True), FACTS)
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.INIT_CONTAINER_GPU]
    assert verdict.message.startswith(f"init container proxy: {CORE}: GPUs are given to "
                                      "regular containers and sidecars")


def test_the_lifetime_containers_are_the_sidecars_then_the_containers_with_their_paths() -> None:
    pod = with_init_container(gpu_pod({CORE: "30"}), "setup", {"cpu": "1"}, sidecar=False)
    pod = with_init_container(pod, "log", {"cpu": "1"})
    assert [(c.field, c.index, c.name) for c in lifetime_containers(pod)] == [
        ("initContainers", 0, "proxy"), ("initContainers", 2, "log"), ("containers", 0, "main")]


def test_a_sidecar_share_is_admitted_and_completed_like_a_containers() -> None:
    pod = gpu_pod({"elasticgpu.io/gpu": "1"})  # whole cards, served as shares
    verdict = admit(pod, FACTS, mutate=True, mutators=QUOTA_MUTATORS)
    assert verdict.allowed and verdict.gpu
    stored = apply_patch(pod, list(verdict.patch))
    sidecar = stored["spec"]["initContainers"][0]["resources"]["limits"]
    assert sidecar[GPU_CORE] == "100" and "elasticgpu.io/gpu" not in sidecar
    # kube-scheduler and ResourceQuota sum a sidecar's with the containers': both counted
    assert (sidecar[NODE_CORE], sidecar[QUOTA_CORE]) == ("100", "100")
    main = stored["spec"]["containers"][0]["resources"]["limits"]
    assert (main[NODE_CORE], main[QUOTA_CORE]) == ("50", "50")


def test_a_sidecars_memory_only_share_asks_the_compute_kubelet_allocates() -> None:
    pod = gpu_pod({"elasticgpu.io/gpu-memory": "1024"})
    verdict = admit(pod, FACTS, mutate=True)
    stored = apply_patch(pod, list(verdict.patch))
    assert stored["spec"]["initContainers"][0]["resources"]["limits"][GPU_CORE] == "1"


def test_a_sidecars_gpu_time_is_billed_from_its_init_container_status() -> None:
    pod = gpu_pod({CORE: "30"})
    pod["status"] = {"initContainerStatuses": [
        {"name": "proxy", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
    assert set(container_shares(pod)) == {"proxy", "main"}
    assert list(container_runs(pod)) == ["proxy"]

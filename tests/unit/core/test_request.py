from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.request import (
    ContainerRequest,
    RequestKind,
    container_request,
    parse_model_list,
    pod_request_from_manifest,
)
from elastic_gpu.core.resources import MigProfile, ResourceError


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None,
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "annotations": annotations or {}}, "spec": spec}


def c(name: str, limits: dict[str, Any], requests: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits, "requests": requests or {}}}


@pytest.mark.parametrize(
    ("limits", "kind", "cards", "milli", "mib"),
    [
        ({"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "4096"},
         RequestKind.SHARE, 1, 300, 4096),
        ({"gpushare.provisioner.elasticgpu.io/gpu-core": "50",
          "gpushare.provisioner.elasticgpu.io/gpu-memory": "1024"}, RequestKind.SHARE, 1, 500, 1024),
        ({"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "8"}, RequestKind.SHARE, 1, 250, 2048),
        ({"tencent.com/vcuda-core": "200"}, RequestKind.WHOLE, 2, 1000, 0),
        ({"nano-gpu/gpu-percent": "400"}, RequestKind.WHOLE, 4, 1000, 0),
        ({"nano-gpu/gpu-percent": "5"}, RequestKind.SHARE, 1, 50, 0),
        ({"nvidia.com/gpu": 2}, RequestKind.WHOLE, 2, 1000, 0),
        ({"iluvatar.com/gpu": "1"}, RequestKind.WHOLE, 1, 1000, 0),
        ({"elasticgpu.io/gpu-memory": "2048"}, RequestKind.SHARE, 1, 0, 2048),
        ({"cpu": "2"}, RequestKind.NONE, 0, 0, 0),
    ],
)
def test_every_request_style_maps_onto_the_canonical_request(
        limits: dict[str, Any], kind: RequestKind, cards: int, milli: int, mib: int) -> None:
    request = container_request("main", {"limits": limits})
    got = (request.kind, request.cards, request.compute_milli, request.memory_mib)
    assert got == (kind, cards, milli, mib)


def test_mig_profile_request() -> None:
    request = container_request("m", {"limits": {"nvidia.com/mig-2g.20gb": 1}})
    assert request.kind is RequestKind.MIG and request.mig_profile == MigProfile(2, 20)


def test_limits_win_over_requests() -> None:
    request = container_request("x", {"requests": {"nano-gpu/gpu-percent": "10"},
                                      "limits": {"nano-gpu/gpu-percent": "20"}})
    assert request.compute_milli == 200


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ({"nvidia.com/gpu": 1, "tencent.com/vcuda-core": "50"}, "compute share, not both"),
        ({"tencent.com/vcuda-core": "50", "nano-gpu/gpu-percent": "50"}, "asks for compute twice"),
        ({"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1}, "MIG profile cannot be combined"),
        ({"tencent.com/vcuda-core": "120"}, "1-99"),
    ],
)
def test_conflicting_or_malformed_requests_are_refused(limits: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ResourceError, match=fragment):
        container_request("main", {"limits": limits})


def test_pod_totals_models_and_policies() -> None:
    manifest = pod(
        c("a", {"nvidia.com/gpu": 1, "cpu": "2", "memory": "4Gi"}),
        c("b", {"tencent.com/vcuda-core": "30"}, {"cpu": "500m", "memory": "1Mi"}),
        annotations={ann.GPU_MODEL_ALLOW: "A100|H100", ann.GPU_MODEL_DENY: "T4",
                     ann.NODE_POLICY: "spread", ann.CARD_POLICY: "binpack"},
    )
    request = pod_request_from_manifest(manifest)
    assert request.key == "ns/p" and request.uid == "u1"
    assert request.cpu_milli == 2500 and request.memory_mib == 4097
    assert [x.kind for x in request.gpu_containers] == [RequestKind.WHOLE, RequestKind.SHARE]
    assert request.total_milli == 1300
    assert request.accepts_model("A100") and not request.accepts_model("T4")
    assert not request.accepts_model("V100")
    assert (request.node_policy, request.card_policy) == ("spread", "binpack")


def test_init_containers_raise_host_reservation_but_may_not_take_gpus() -> None:
    manifest = pod(c("a", {"cpu": "1"}), init=[c("i", {"cpu": "3"})])
    assert pod_request_from_manifest(manifest).cpu_milli == 3000
    with pytest.raises(ResourceError, match="init container"):
        pod_request_from_manifest(pod(c("a", {}), init=[c("i", {"nvidia.com/gpu": 1})]))


def test_model_lists() -> None:
    assert parse_model_list("A|B, C") == frozenset({"A", "B", "C"})
    assert parse_model_list("") is None and parse_model_list(None) is None


@given(st.integers(min_value=1, max_value=99), st.integers(min_value=0, max_value=81920))
def test_shares_always_stay_below_one_card(percent: int, mib: int) -> None:
    request = container_request("x", {"limits": {"elasticgpu.io/gpu-core": str(percent),
                                                 "elasticgpu.io/gpu-memory": str(mib)}})
    assert request.kind is RequestKind.SHARE and 0 < request.compute_milli < 1000
    assert request.total_milli == percent * 10


def test_invalid_direct_construction_is_refused() -> None:
    with pytest.raises(ValueError):
        ContainerRequest("x", RequestKind.SHARE, 1, 1000, 0)
    with pytest.raises(ValueError):
        ContainerRequest("x", RequestKind.WHOLE, 0, 1000, 0)
    with pytest.raises(ValueError):
        ContainerRequest("x", RequestKind.MIG, 1)


def test_pod_level_requests_replace_the_containers_sum_for_what_they_name() -> None:
    """KEP-2837 (on by default since Kubernetes 1.34): kube-scheduler counts `spec.resources`
    instead of the containers' sum for each resource it names; the overhead still on top."""
    manifest = pod(c("a", {"cpu": "1", "memory": "1Gi"}), c("b", {"cpu": "1", "memory": "1Gi"}))
    manifest["spec"]["resources"] = {"requests": {"cpu": "3"}}
    manifest["spec"]["overhead"] = {"cpu": "250m"}
    request = pod_request_from_manifest(manifest)
    assert (request.cpu_milli, request.memory_mib) == (3250, 2048)
    # a pod-level limit alone is not read (kube-apiserver defaults the request from it)
    manifest["spec"]["resources"] = {"limits": {"cpu": "3"}}
    assert pod_request_from_manifest(manifest).cpu_milli == 2250

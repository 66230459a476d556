"""core.dra.nodemode: which GPU names a DRA-mode node serves, and the refusal for the rest."""

from __future__ import annotations

import pytest

from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.dra.nodemode import (
    DRA_EXTENDED_NAMES,
    GPU_MODE_LABEL,
    dra_refusal,
    is_dra_node,
)
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest


def _request(**limits: str) -> PodRequest:
    return pod_request_from_manifest(pod_manifest("p", limits=limits))


def test_the_label_marks_a_dra_node() -> None:
    assert is_dra_node({GPU_MODE_LABEL: "dra"})
    assert not is_dra_node({GPU_MODE_LABEL: "device-plugin"})
    assert not is_dra_node({})
    assert not is_dra_node(None)


def test_whole_cards_by_the_extended_resource_name_pass() -> None:
    assert {"nvidia.com/gpu"} == DRA_EXTENDED_NAMES
    assert dra_refusal(_request(**{"nvidia.com/gpu": "2"}), "n1") is None


@pytest.mark.parametrize("limits", [
    {"elasticgpu.io/gpu-core": "30"},
    {"elasticgpu.io/gpu-memory": "4096"},
    {"elasticgpu.io/gpu-core": "100"},  # a whole card, but by a name no DeviceClass maps
    {"elasticgpu.io/gpu-tflops": "50"},
    {"nvidia.com/mig-1g.10gb": "1"},
    {"nvidia.com/gpu": "1", "elasticgpu.io/gpu-memory": "4096"},
])
def test_every_other_gpu_name_is_refused_naming_the_way_to_ask(limits: dict[str, str]) -> None:
    reason = dra_refusal(_request(**limits), "n1")
    assert reason is not None
    assert reason.startswith("node n1 serves GPUs through DRA; ask for a share with a "
                             "ResourceClaim of class gpu.elasticgpu.io")
    for name in limits:
        if name != "nvidia.com/gpu":
            assert name in reason


def test_a_pod_naming_elasticgpu_claims_is_refused() -> None:
    reason = dra_refusal(_request(**{"nvidia.com/gpu": "1"}), "n1", names_claims=True)
    assert reason is not None and "ElasticGPUClaims" in reason

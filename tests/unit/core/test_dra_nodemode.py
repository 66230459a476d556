"""core.dra.nodemode: which GPU names a DRA-mode node serves, and the refusal for the rest
(a typed fit failure of the "dra-mode" check, made a sentence by `core.fit.describe`)."""

from __future__ import annotations

import pytest

from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.dra.nodemode import (
    DRA_EXTENDED_NAMES,
    DRA_NODE_SELECTOR,
    GPU_MODE_LABEL,
    GpuMode,
    dra_fit_failure,
    is_dra_node,
    node_mode,
    node_object_labels,
)
from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest


def _request(**limits: str) -> PodRequest:
    return pod_request_from_manifest(pod_manifest("p", limits=limits))


def test_the_label_marks_a_dra_node() -> None:
    assert is_dra_node({GPU_MODE_LABEL: "dra"})
    assert not is_dra_node({GPU_MODE_LABEL: "device-plugin"})
    assert not is_dra_node({})
    assert not is_dra_node(None)


def test_a_node_without_the_dra_value_is_a_device_plugin_node() -> None:
    assert node_mode({GPU_MODE_LABEL: "dra"}) is GpuMode.DRA
    for labels in ({}, None, {GPU_MODE_LABEL: "device-plugin"}, {GPU_MODE_LABEL: "DRA"},
                   {"other": "dra"}):
        assert node_mode(labels) is GpuMode.DEVICE_PLUGIN
    # the label's values are the modes' own (the sandbox's cluster file writes them)
    assert [m.value for m in GpuMode] == ["device-plugin", "dra"]
    assert DRA_NODE_SELECTOR == "elasticgpu.io/gpu-mode=dra"


def test_a_node_objects_labels_are_read_whatever_is_missing() -> None:
    dra = {"metadata": {"name": "d", "labels": {GPU_MODE_LABEL: "dra"}}}
    assert is_dra_node(node_object_labels(dra))
    for node in ({}, {"metadata": None}, {"metadata": {"labels": None}},
                 {"metadata": {"labels": "dra"}}):
        assert node_object_labels(node) == {}


def test_whole_cards_by_the_extended_resource_name_pass() -> None:
    assert {"nvidia.com/gpu"} == DRA_EXTENDED_NAMES
    assert dra_fit_failure(_request(**{"nvidia.com/gpu": "2"}), names_claims=False) is None


@pytest.mark.parametrize("limits", [
    {"elasticgpu.io/gpu-core": "30"},
    {"elasticgpu.io/gpu-memory": "4096"},
    {"elasticgpu.io/gpu-core": "100"},  # a whole card, but by a name no DeviceClass maps
    {"elasticgpu.io/gpu-tflops": "50"},
    {"nvidia.com/gpu": "1", "elasticgpu.io/gpu-memory": "4096"},
])
def test_every_other_gpu_name_is_refused_naming_the_way_to_ask(limits: dict[str, str]) -> None:
    failure = dra_fit_failure(_request(**limits), names_claims=False)
    assert failure is not None
    assert failure.kind is FitKind.DRA_NOT_SERVED and failure.check == "dra-mode"
    reason = describe(failure)
    assert reason.startswith("the node serves GPUs through DRA; ask for a share with a "
                             "ResourceClaim of class gpu.elasticgpu.io")
    for name in limits:
        if name != "nvidia.com/gpu":
            assert name in reason


def test_a_mig_pod_is_told_to_ask_the_mig_class() -> None:
    """A MIG resource name on a DRA node: the way to ask is a claim of the MIG class, not a
    share of the card class (HAMi's dynamic_mig_example on a cluster with a DRA node was told
    to ask for a share; found trying the product as a new user)."""
    failure = dra_fit_failure(_request(**{"nvidia.com/mig-1g.10gb": "2"}), names_claims=False)
    assert failure is not None and failure.kind is FitKind.DRA_NOT_SERVED
    assert describe(failure) == (
        "the node serves GPUs through DRA; ask for a MIG instance with a ResourceClaim of "
        "class mig.gpu.elasticgpu.io (nvidia.com/mig-1g.10gb is not served there; whole "
        "cards as nvidia.com/gpu are)")


def test_a_pod_naming_elasticgpu_claims_is_refused() -> None:
    failure = dra_fit_failure(_request(**{"nvidia.com/gpu": "1"}), names_claims=True)
    assert failure is not None and failure.kind is FitKind.DRA_NAMES_CLAIMS
    assert "ElasticGPUClaims" in describe(failure)


def test_the_refusals_sentences_name_no_node() -> None:
    """The HTTP answers keep these words exactly, the same for every DRA-mode node, so that
    kube-scheduler's event for the pod counts them ("3 <reason>") as it does the engine's."""
    unserved = dra_fit_failure(_request(**{"elasticgpu.io/gpu-memory": "4096",
                                           "elasticgpu.io/gpu-core": "30"}),
                               names_claims=False)
    claims = dra_fit_failure(_request(**{"nvidia.com/gpu": "1"}), names_claims=True)
    assert unserved is not None and claims is not None
    assert describe(unserved) == (
        "the node serves GPUs through DRA; ask for a share with a ResourceClaim of class "
        "gpu.elasticgpu.io (elasticgpu.io/gpu-core, elasticgpu.io/gpu-memory are not served "
        "there; whole cards as nvidia.com/gpu are)")
    assert describe(claims) == (
        "the node serves GPUs through DRA; ask for a share with a ResourceClaim of class "
        "gpu.elasticgpu.io (ElasticGPUClaims are served on device-plugin nodes only)")


def test_admission_counts_a_dra_nodes_cards_by_its_node_level_count() -> None:
    """The webhook's largest-node check must not refuse `nvidia.com/gpu: 4` for a DRA-mode
    node of 8 cards because the device-plugin nodes have 2: a DRA node advertises no GPU name,
    only node.elasticgpu.io/gpu-core (100 per card)."""
    from elastic_gpu.core.admission.facts import facts_from_nodes, node_gpus

    dra = {"metadata": {"name": "d", "labels": {GPU_MODE_LABEL: "dra"}},
           "status": {"capacity": {"node.elasticgpu.io/gpu-core": "800", "cpu": "8"}}}
    dp = {"metadata": {"name": "p", "labels": {}},
          "status": {"capacity": {"nvidia.com/gpu": "2", "node.elasticgpu.io/gpu-core": "200"}}}
    gpus = [node_gpus(n) for n in (dra, dp)]
    assert [g.cards if g else None for g in gpus] == [8, 2]
    facts = facts_from_nodes(g for g in gpus if g is not None)
    assert (facts.largest_cards, facts.largest_cards_node) == (8, "d")
    # without the label the count alone is no GPU node (as before)
    assert node_gpus({**dra, "metadata": {"name": "d", "labels": {}}}) is None

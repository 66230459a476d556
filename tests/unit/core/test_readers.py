"""The one reader of each API fact (`core.nodestatus`, `core.assignment.pod_assignment`,
`core.podlife`): every component reads a Node's amounts, a pod's assignment and whether it has
finished through these, so these tests pin what each answers for odd objects too."""

from __future__ import annotations

from fractions import Fraction

import pytest

from elastic_gpu.api.gpudevice import nodes_from_objects
from elastic_gpu.core import nodestatus
from elastic_gpu.core.admission.facts import node_gpus
from elastic_gpu.core.assignment import Assignment, AssignmentError, CardShare, pod_assignment
from elastic_gpu.scheduler.app import node_info


def _node(allocatable: dict[str, object] | None, capacity: dict[str, object] | None,
          name: str = "n1") -> dict[str, object]:
    status: dict[str, object] = {}
    if allocatable is not None:
        status["allocatable"] = allocatable
    if capacity is not None:
        status["capacity"] = capacity
    return {"metadata": {"name": name}, "status": status}


def test_allocatable_is_read_from_allocatable_then_capacity() -> None:
    node = _node({"cpu": "3500m", "memory": "2Gi"}, {"cpu": "4", "memory": "4Gi"})
    assert nodestatus.allocatable(node, "cpu", 1000) == 3500
    assert nodestatus.allocatable(node, "memory") == 2 * 2**30
    bare = _node(None, {"cpu": "4"})
    assert nodestatus.allocatable(bare, "cpu", 1000) == 4000
    assert nodestatus.allocatable(_node({"cpu": "lots"}, None), "cpu", 1000) == 0
    assert nodestatus.allocatable({}, "cpu", 1000) == 0


def test_gpu_capacity_is_capacity_so_a_sick_card_does_not_hide_the_node() -> None:
    # allocatable drops to 0 while the card is unhealthy; what the node serves does not
    node = _node({"nvidia.com/gpu": "0", "cpu": "4"}, {"nvidia.com/gpu": "2", "cpu": "4",
                                                       "elasticgpu.io/gpu-memory": "x"})
    assert nodestatus.gpu_capacity(node) == {"nvidia.com/gpu": Fraction(2),
                                             "elasticgpu.io/gpu-memory": None}


def test_every_component_reads_the_same_node_amounts() -> None:
    node = _node({"cpu": "3", "memory": "1Gi", "nvidia.com/gpu": "0"},
                 {"cpu": "4", "memory": "2Gi", "nvidia.com/gpu": "2"})
    info = node_info(node)
    assert (info.cpu_milli, info.memory_mib, info.offers) == (3000, 1024, {"nvidia.com/gpu": 2})
    device = {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "GPUDevice",
              "metadata": {"name": "n1-gpu0"},
              "spec": {"node": "n1", "index": 0, "uuid": "GPU-0", "model": "A100",
                       "memoryMiB": 40960}}
    (inventory,) = nodes_from_objects([device], [node])
    assert (inventory.cpu_milli, inventory.memory_mib) == (3000, 1024)
    gpus = node_gpus(node)
    assert gpus is not None and gpus.cards == 2  # capacity, as the extender reads it


def test_pod_assignment_reads_the_annotation_or_says_why_not() -> None:
    assignment = Assignment("n1", {"main": (CardShare(0, "GPU-0", 500, 1024),)})
    pod = {"metadata": {"annotations": {"elasticgpu.io/assignment": assignment.to_json()}}}
    assert pod_assignment(pod) == assignment
    assert pod_assignment({"metadata": {"annotations": {}}}) is None
    assert pod_assignment({"metadata": {}}) is None
    for bad in ("", "{", '{"v": 9}'):
        with pytest.raises(AssignmentError):
            pod_assignment({"metadata": {"annotations": {"elasticgpu.io/assignment": bad}}})

"""The extender reads observed usage from GPUDevice status.usage (issue 28): out-of-band memory
refuses a share with its reason, and the `loadAware` knob moves new shares off hot cards."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.api import gpudevice
from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.usage import CardUsage
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state import SchedulerState

GIB = 1024


def node(name: str, cards: int = 2) -> Node:
    return Node(name, 64_000, 256_000, tuple(Card(i, f"GPU-{name}-{i}", "A100", 80 * GIB)
                                             for i in range(cards)))


def observe(state: SchedulerState, name: str, index: int, usage: CardUsage | None) -> None:
    """A GPUDevice update carrying `status.usage`, read as the extender's watch reads it."""
    card = Card(index, f"GPU-{name}-{index}", "A100", 80 * GIB, usage=usage)
    obj = gpudevice.card_to_object(name, card)
    node_name, read = gpudevice.card_from_gpudevice(obj)
    assert read.usage == usage
    state.upsert_device(gpudevice.object_name(name, index), node_name, read)


def share(name: str, percent: int, memory_mib: int) -> dict[str, Any]:
    return pod_manifest(name, uid=f"uid-{name}", limits={
        "elasticgpu.io/gpu-core": str(percent), "elasticgpu.io/gpu-memory": str(memory_mib)})


def test_out_of_band_memory_in_status_refuses_a_share_with_the_reason() -> None:
    state = ready_state([node("n1", cards=1)])
    observe(state, "n1", 0, CardUsage(60 * GIB, 60 * GIB, 10))
    pod = pod_request_from_manifest(share("a", 20, 30 * GIB))
    result = state.filter(pod, "uid-a", ["n1"])
    assert result.feasible == []
    failure = result.failed["n1"]
    assert failure.kind is FitKind.OUT_OF_BAND_MEMORY
    assert "61440 MiB of its 81920 MiB used out of band" in describe(failure)
    observe(state, "n1", 0, None)  # the foreign process went away
    assert state.filter(pod, "uid-a", ["n1"]).feasible == ["n1"]


@pytest.mark.parametrize("load_aware, card", [(False, 0), (True, 1)])
def test_load_aware_moves_a_new_share_off_the_hot_card(load_aware: bool, card: int) -> None:
    state = ready_state([node("n1")], SchedulerState(SchedulerConfig(load_aware=load_aware)))
    observe(state, "n1", 0, CardUsage(8 * GIB, 0, 97))
    observe(state, "n1", 1, CardUsage(GIB, 0, 3))
    _, assignment = state.reserve(pod_request_from_manifest(share("a", 20, GIB)), "uid-a", "n1")
    assert [s.index for s in assignment.shares()] == [card]


def test_load_aware_moves_a_new_share_off_the_hot_node() -> None:
    for hot in ("n1", "n2"):
        state = ready_state([node("n1", 1), node("n2", 1)],
                            SchedulerState(SchedulerConfig(load_aware=True, filter_result="best",
                                                           node_policy="binpack")))
        observe(state, hot, 0, CardUsage(GIB, 0, 90))
        pod = pod_request_from_manifest(share("a", 20, GIB))
        assert state.filter(pod, "uid-a", ["n1", "n2"]).feasible == (
            ["n2"] if hot == "n1" else ["n1"])


def test_load_aware_is_a_strict_boolean_and_off_by_default() -> None:
    assert SchedulerConfig().load_aware is False
    assert SchedulerConfig.model_validate({"loadAware": True}).load_aware is True
    with pytest.raises(ValidationError):
        SchedulerConfig.model_validate({"loadAware": "yes"})


"""The simulator and the extender pair a node policy with the same card tier.

`egpu simulate --card-policy auto` measures a node policy with the card tier it is paired with;
the extender without `cardPolicy` must choose cards by that same tier, or the cluster does not
get the quality the simulator measured (issue 12, item 9).
"""

from __future__ import annotations

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.policies import NODE_POLICIES, default_card_policy
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.sim.builtin import builtin_nodes
from elastic_gpu.sim.replay import replay
from elastic_gpu.sim.trace import Task


def _simulator_card_tier(policy: str) -> str:
    tasks = [Task("t0", 1000, 1024, 1, 500)]
    return replay(builtin_nodes()[:4], tasks, policy, inflation=0).card_policy


def _extender_card_tier(config: SchedulerConfig, **pod_policies: str) -> str:
    state = ready_state([Node("n", 8000, 16384, (Card(0, "G0", "A100", 40960),))],
                        SchedulerState(config))
    pod = pod_manifest("p", limits={"elasticgpu.io/gpu-core": "30"}, **pod_policies)
    return state.engine.card_policy_for(pod_request_from_manifest(pod))


@pytest.mark.parametrize("policy", sorted(NODE_POLICIES))
def test_the_extender_uses_the_card_tier_the_simulator_measured(policy: str) -> None:
    measured = _simulator_card_tier(policy)
    assert measured == default_card_policy(policy)
    config = SchedulerConfig(nodePolicy=policy)
    assert config.effective_card_policy == measured
    assert _extender_card_tier(config) == measured


def test_fgdx_mem_is_paired_with_fgd_waste_in_both() -> None:
    assert _simulator_card_tier("fgdx-mem") == "fgd-waste"
    assert _extender_card_tier(SchedulerConfig(nodePolicy="fgdx-mem")) == "fgd-waste"


def test_an_explicit_card_policy_and_the_pod_annotation_still_win() -> None:
    explicit = SchedulerConfig(nodePolicy="fgdx-mem", cardPolicy="binpack")
    assert explicit.effective_card_policy == "binpack"
    assert _extender_card_tier(explicit) == "binpack"
    assert _extender_card_tier(explicit, card_policy="topology") == "topology"
    paired = SchedulerConfig(nodePolicy="fgdx-mem")
    assert _extender_card_tier(paired, card_policy="spread") == "spread"
    # a pod that names another node policy gets that policy's pairing
    assert _extender_card_tier(paired, node_policy="random") == "random"


def test_the_extender_places_a_share_on_the_card_the_simulator_would() -> None:
    # Cards 0..3 have 20%, 70%, 10% and 35% used; a 15% share: binpack takes the tightest
    # card (1), fgd-waste the one FGD and expected waste prefer (0). The extender without
    # cardPolicy must agree with the simulator's fgdx-mem, not with binpack.
    node = Node("n", 64000, 1 << 18, tuple(Card(i, f"G{i}", "A100", 40960) for i in range(4)))
    used = (200, 700, 100, 350)

    def fill(engine: Engine) -> None:
        for i, milli in enumerate(used):
            engine.allocate(f"fill/{i}", Assignment("n", {"main": (CardShare(i, f"G{i}", milli, 0),)}))

    pod = pod_request_from_manifest(pod_manifest("p", limits={"elasticgpu.io/gpu-core": "15"}))
    simulator = Engine([node], PolicyConfig("fgdx-mem", _simulator_card_tier("fgdx-mem")))
    fill(simulator)
    binpack = Engine([node], PolicyConfig("fgdx-mem", "binpack"))
    fill(binpack)
    state = ready_state([node], SchedulerState(SchedulerConfig(nodePolicy="fgdx-mem")))
    fill(state.engine)
    _, chosen = state.reserve(pod, "uid-p", "n")
    expected = simulator.assign(pod, "n")
    assert [s.index for s in chosen.shares()] == [s.index for s in expected.shares()] == [0]
    assert [s.index for s in binpack.assign(pod, "n").shares()] == [1]

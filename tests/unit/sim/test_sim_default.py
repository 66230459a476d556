"""The simulator and the extender share one default node policy, and its one rule for the
target workload (issue 19: `core.policies.DEFAULT_NODE_POLICY`, `NodePolicy.popularity_for`)."""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.cli.simulate import simulate
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.policies import DEFAULT_NODE_POLICY, node_policy
from elastic_gpu.core.policies.node import FgdxAutoPolicy
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.workload import FGD_POPULARITY, TaskShape, cpu_only_share
from elastic_gpu.scheduler.config import SchedulerConfig, load_config
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.sim.replay import target_workload
from elastic_gpu.sim.trace import Task


def test_the_extender_and_the_simulator_default_to_the_same_node_policy() -> None:
    assert DEFAULT_NODE_POLICY == "fgdx-auto"
    assert SchedulerConfig().node_policy == DEFAULT_NODE_POLICY
    assert load_config(None).node_policy == DEFAULT_NODE_POLICY
    assert inspect.signature(simulate).parameters["policy"].default == DEFAULT_NODE_POLICY
    # and what it is paired with in both (tests/unit/sim/test_sim_pairing.py checks every policy)
    assert SchedulerConfig().effective_card_policy == "fgd-waste"


def test_cpu_only_share_counts_tasks_without_gpus() -> None:
    cpu, share = TaskShape(1000, 0, 0), TaskShape(1000, 500, 1)
    assert cpu_only_share({cpu: 1, share: 3}) == 0.25
    assert cpu_only_share({cpu: 0, share: 3}) == 0.0
    assert cpu_only_share({}) == 0.0


def test_fgdx_auto_takes_every_shape_until_cpu_only_tasks_are_many() -> None:
    policy = FgdxAutoPolicy()
    cpu, share = TaskShape(1000, 0, 0), TaskShape(1000, 500, 1)
    assert policy.popularity_for({cpu: 20, share: 80}) == 1.0  # 20%: every shape
    assert policy.popularity_for({cpu: 25, share: 75}) == FGD_POPULARITY  # 25%: FGD's 95%
    assert node_policy("fgdx-mem").popularity_for({cpu: 25, share: 75}) == 1.0


def _pods(cpu_only: int) -> list[dict[str, Any]]:
    """39 pods on 60% of a card, one on a whole card (a 1-in-40 shape FGD's 95% drops), and
    `cpu_only` pods without GPUs."""
    pods = [pod_manifest(f"s{i}", uid=f"uid-s{i}", limits={"elasticgpu.io/gpu-core": "60"})
            for i in range(39)]
    pods.append(pod_manifest("w", uid="uid-w", limits={"elasticgpu.io/gpu-core": "100"}))
    for i in range(cpu_only):
        pod = pod_manifest(f"c{i}", uid=f"uid-c{i}", containers={"main": {"cpu": "1", "memory": "1Gi"}})
        pod["spec"]["nodeName"] = "n1"
        pod["status"] = {"phase": "Running"}
        pods.append(pod)
    return pods


def _tasks(cpu_only: int) -> list[Task]:
    """The same mix as trace tasks."""
    return ([Task(f"s{i}", 0, 0, 1, 600) for i in range(39)] + [Task("w", 0, 0, 1, 1000)]
            + [Task(f"c{i}", 1000, 1024, 0, 0) for i in range(cpu_only)])


def _extender_shapes(cpu_only: int) -> set[tuple[int, int]]:
    config = SchedulerConfig(target_workload="observed")  # the default node policy
    nodes = [Node(n, 64_000, 256_000, (Card(0, f"GPU-{n}", "T4", 16384),)) for n in ("n1", "n2")]
    state = ready_state(nodes, SchedulerState(config), pods=_pods(cpu_only))
    probe = pod_request_from_manifest(pod_manifest("probe", limits={"elasticgpu.io/gpu-core": "10"}))
    state.filter(probe, "uid-probe", ["n1", "n2"])
    assert state.workload is not None
    return {(s.gpu_milli, s.gpu_count) for s in state.workload.shapes}


def _simulator_shapes(cpu_only: int, policy: str = DEFAULT_NODE_POLICY) -> set[tuple[int, int]]:
    return {(s.gpu_milli, s.gpu_count) for s in target_workload(_tasks(cpu_only), policy).shapes}


@pytest.mark.parametrize(("cpu_only", "expected"), [
    (5, {(600, 1), (1000, 1), (0, 0)}),   # 11% CPU-only: every shape, the whole card kept
    (20, {(600, 1), (0, 0)}),             # 33% CPU-only: FGD's 95%, the whole card dropped
])
def test_the_extender_adapts_its_observed_workload_as_the_simulator_does(
        cpu_only: int, expected: set[tuple[int, int]]) -> None:
    assert cpu_only_share(Counter(t.shape() for t in _tasks(cpu_only))) == pytest.approx(
        cpu_only / (40 + cpu_only))
    assert _simulator_shapes(cpu_only) == expected
    assert _extender_shapes(cpu_only) == expected
    # fgdx-mem, the previous default, keeps every shape whatever the mix
    assert _simulator_shapes(cpu_only, "fgdx-mem") == {(600, 1), (1000, 1), (0, 0)}

"""Scores cached across CPU and memory requests (`HostThresholds`, `scoring.host_band`): pods that
each ask their own CPU share one cache entry per GPU shape, and get the very scores an engine
without any cache gives them."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import gpu_node, share, whole

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.model import Node
from elastic_gpu.core.placement import Engine, PolicyConfig, task_shape
from elastic_gpu.core.placement.scoring import host_band
from elastic_gpu.core.policies import NODE_POLICIES, NodeView, ScoreContext
from elastic_gpu.core.policies.node import FgdxAutoPolicy
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.workload import TargetWorkload, TaskShape

#: shapes whose CPU and memory requests sit between the nodes' free amounts, so that the
#: thresholds matter (the default workload's few CPU values would rarely be crossed here)
WORKLOAD = TargetWorkload(
    shapes=(TaskShape(4000, 1000, 1, memory_mib=32768), TaskShape(8000, 500, 1, memory_mib=65536),
            TaskShape(2000, 250, 1, memory_mib=8192), TaskShape(16000, 1000, 2, memory_mib=131072),
            TaskShape(12000, 1000, 1, frozenset({"A100"}), 98304), TaskShape(1000, 0, 0)),
    weights=(0.3, 0.2, 0.2, 0.1, 0.1, 0.1))


def test_a_band_holds_exactly_the_requests_on_the_same_side_of_every_threshold() -> None:
    rng = np.random.default_rng(1)
    thresholds = np.array([1000, 2000, 4000, 8000, 16000], dtype=np.int64)
    free = rng.integers(-2000, 40000, size=200).astype(np.int64)
    for asked in (0, 1, 999, 1000, 3500, 16000, 50000):
        low, high = host_band(free, asked, thresholds)
        side = (free - asked)[:, None] >= thresholds
        for r in (-1, 0, 1, 500, 999, 1000, 1001, 3999, 4000, 7999, 12000, 16000, 30000, 60000):
            same = ((free - r)[:, None] >= thresholds).tolist() == side.tolist()
            inside = (low < r) & (r <= high)
            rows_same = np.all(((free - r)[:, None] >= thresholds) == side, axis=1)
            assert (inside == rows_same).all(), (asked, r, same)
        # at each finite edge: the request on the edge's inner side is in, the outer one out
        for row in range(free.size):
            sides = ((free[row] - asked) >= thresholds).tolist()
            for r, expect in ((low[row], False), (low[row] + 1, True), (high[row], True),
                              (high[row] + 1, False)):
                if np.isfinite(r):
                    assert (((free[row] - int(r)) >= thresholds).tolist() == sides) is expect


def cluster() -> list[Node]:
    return [*(gpu_node(f"t{i}", cards=4, cpu=32000 + 4000 * i, mem=131072 + 16384 * i)
              for i in range(6)),
            *(gpu_node(f"a{i}", cards=8, model="A100", memory=81920, cpu=64000,
                       mem=262144 + 32768 * i) for i in range(4))]


def probe(i: int, rng: np.random.Generator) -> PodRequest:
    cpu = int(rng.integers(0, 40)) * 500 + int(rng.integers(0, 3))  # near and on thresholds
    mem = int(rng.integers(0, 40)) * 4096 + int(rng.integers(0, 3))
    if i % 3 == 0:
        return whole(f"w{i}", int(rng.integers(1, 3)), cpu=cpu, mem=mem)
    return share(f"s{i}", int(rng.integers(1, 10)) * 100, cpu=cpu, mem=mem)


@pytest.mark.parametrize("policy", ["fgd", "fgdx", "fgdx-mem", "fgdx-auto"])
def test_pods_of_distinct_cpu_and_memory_get_an_uncached_engines_scores(policy: str) -> None:
    """Placements interleaved with probes of random CPU and memory (many on a threshold's
    edge): every probe's scores equal those of an engine built afresh for it, and the cache
    holds one entry per GPU shape, not one per pod."""
    nodes = cluster()
    names = [n.name for n in nodes]
    engine = Engine(nodes, PolicyConfig(node_policy=policy))
    engine.set_workload(WORKLOAD)
    rng = np.random.default_rng(7)
    held: dict[str, tuple[Assignment, PodRequest]] = {}
    gpu_shapes = set()
    for i in range(160):
        pod = probe(i, rng)
        fresh = Engine(nodes, PolicyConfig(node_policy=policy))
        fresh.set_workload(WORKLOAD)
        for key, (assignment, request) in held.items():
            fresh.allocate(key, assignment, request)
        assert engine.scored(pod, names).as_dict() == fresh.scored(pod, names).as_dict(), i
        shape = task_shape(pod)
        gpu_shapes.add((shape.gpu_milli, shape.gpu_count, shape.models))
        if i % 2 == 0:  # place some, so nodes change between probes
            node = engine.best(pod, names)
            if node is not None:
                assignment = engine.assign(pod, node)
                engine.allocate(pod.key, assignment, pod)
                held[pod.key] = (assignment, pod)
    assert len(engine._scorer.cache) <= len(gpu_shapes)


def test_under_cpu_pressure_fgdx_auto_scores_each_shape_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under CPU pressure fgdx-auto's balance term reads the CPU left itself: no thresholds,
    one entry per shape, and still the uncached scores."""
    monkeypatch.setattr(FgdxAutoPolicy, "balances_cpu", lambda self, ctx: True)
    nodes = cluster()
    names = [n.name for n in nodes]
    engine = Engine(nodes, PolicyConfig(node_policy="fgdx-auto"))
    engine.set_workload(WORKLOAD)
    assert engine._scorer.node_policy("fgdx-auto").host_thresholds(
        engine.ctx, TaskShape(1000, 500, 1)) is None
    rng = np.random.default_rng(3)
    for i in range(1, 30, 3):
        pod = probe(i, rng)
        fresh = Engine(nodes, PolicyConfig(node_policy="fgdx-auto"))
        fresh.set_workload(WORKLOAD)
        assert engine.scored(pod, names).as_dict() == fresh.scored(pod, names).as_dict()
    assert len(engine._scorer.cache) == 10


@pytest.mark.parametrize("name", sorted(NODE_POLICIES))
def test_a_policy_that_declares_thresholds_scores_alike_within_a_band(name: str) -> None:
    """The contract of `NodePolicy.host_thresholds`, for every registered node policy: two
    requests that leave a node on the same side of every declared threshold get the same
    score from `score`, node by node (a policy that declares none is not bound by it)."""
    policy = NODE_POLICIES[name]()
    ctx = ScoreContext(Fragmentation(WORKLOAD), np.random.default_rng(0))
    rng = np.random.default_rng(11)
    declared = 0
    for _ in range(300):
        free = tuple(int(x) for x in rng.choice([0, 250, 500, 750, 1000], size=4))
        node = NodeView(0, "n", "A100", 64000, int(rng.integers(0, 64000)), 262144,
                        int(rng.integers(0, 262144)), free)
        task = TaskShape(int(rng.integers(0, 20000)), int(rng.choice([250, 500, 1000])),
                         int(rng.integers(1, 3)), memory_mib=int(rng.integers(0, 140000)))
        limits = policy.host_thresholds(ctx, task)
        if limits is None:
            continue
        declared += 1
        _, cpu_high = host_band(np.array([node.cpu_free]), task.cpu_milli, limits.cpu)
        cpu = int(min(cpu_high[0], task.cpu_milli + 5000)) if np.isfinite(cpu_high[0]) \
            else task.cpu_milli + 5000
        memory = task.memory_mib
        if limits.memory is not None:
            _, mem_high = host_band(np.array([node.memory_free]), memory, limits.memory)
            memory = int(mem_high[0]) if np.isfinite(mem_high[0]) else memory + 9000
        other = TaskShape(cpu, task.gpu_milli, task.gpu_count, task.models, memory)
        assert policy.score(ctx, other, node) == policy.score(ctx, task, node), (name, task, other)
    if name in {"fgd", "fgdx", "fgdx-mem", "fgdx-auto"}:
        assert declared  # these do declare thresholds for GPU tasks

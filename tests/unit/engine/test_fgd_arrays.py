"""FGD's policies scored from arrays give the very doubles they give node by node.

The extender scores a new task shape (a pod with its own CPU request) over every node of a
request from arrays (`core/policies/fgd_arrays.py`); the simulator's recorded results, and the
promise that the simulator and the extender decide alike, need that to be the same number as
`score` on each node's view, to the last bit (FGD's scores are truncated integers and ties are
broken by rank: one ulp can change a placement).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.placement.scoring import node_arrays
from elastic_gpu.core.policies import NODE_POLICIES
from elastic_gpu.core.policies.node import FgdPolicy
from elastic_gpu.core.request import ContainerRequest, PodRequest
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.core.workload import TargetWorkload, TaskShape

FGD_FAMILY = ("fgd", "fgdx", "fgdx-mem", "fgdx-auto", "fgdx-cpufit")
MODELS = ("A100", "V100", "T4")


def random_node(rng: random.Random, i: int) -> Node:
    width = rng.choice((0, 1, 2, 4, 8, 8))
    model = rng.choice(MODELS)
    cards = []
    for c in range(width):
        health = Health.UNHEALTHY if rng.random() < 0.05 else Health.HEALTHY
        mig = ((MigInstance(MigProfile(3, 40), f"MIG-{i}-{c}", 0),)
               if rng.random() < 0.05 else ())
        cards.append(Card(c, f"GPU-{i}-{c}", rng.choice((model, model, "A100")), 32768,
                          health=health, mig=mig))
    return Node(f"n{i}", rng.choice((16_000, 32_000, 96_000)), rng.choice((65_536, 262_144)),
                tuple(cards))


def random_workload(rng: random.Random) -> TargetWorkload:
    shapes: dict[TaskShape, int] = {}
    for _ in range(30):
        kind = rng.random()
        cpu = rng.choice((0, 500, 2000, 4000, 8000, 16000))
        memory = rng.choice((0, 4096, 16384, 65536))
        models = frozenset(rng.sample(MODELS, 1)) if rng.random() < 0.2 else frozenset()
        if kind < 0.15:
            shape = TaskShape(cpu or 1000, 0, 0, memory_mib=memory)
        elif kind < 0.7:
            shape = TaskShape(cpu, rng.choice((100, 250, 300, 500, 700)), 1, models, memory)
        else:
            shape = TaskShape(cpu, 1000, rng.choice((1, 2, 4, 8)), models, memory)
        shapes[shape] = shapes.get(shape, 0) + rng.randint(1, 20)
    return TargetWorkload.from_counts(shapes, popularity=1.0)


def random_engine(rng: random.Random, policy: str) -> Engine:
    engine = Engine([random_node(rng, i) for i in range(40)], PolicyConfig(node_policy=policy),
                    seed=rng.randrange(1000), workload=random_workload(rng))
    for name in engine.nodes():
        engine.set_outside_usage(name, rng.randrange(0, 16_000, 250), rng.randrange(0, 65_536, 512))
    for i in range(60):  # shares and whole cards scattered over the cards
        node = rng.choice(engine.nodes())
        usage = engine.card_usage(node)
        if not usage:
            continue
        index, used, _ = rng.choice(usage)
        room = 1000 - used
        if room <= 0:
            continue
        take = rng.choice((room, max(1, room // 2), min(room, 100)))
        uuid = f"GPU-{node[1:]}-{index}"
        try:
            engine.allocate(f"bg{i}", Assignment(node, {"main": (CardShare(index, uuid, take, 0),)}))
        except Unschedulable:
            continue  # an unusable card: the allocation is refused, the node stays as it was
    return engine


def tasks(rng: random.Random) -> list[TaskShape]:
    out = [TaskShape(0, 0, 0), TaskShape(0, 1000, 1), TaskShape(1000, 0, 0, memory_mib=2048)]
    for _ in range(25):
        cpu = rng.choice((0, 100, 1000, 3000, 7777, 20000))
        memory = rng.choice((0, 1024, 30000, 200000))
        kind = rng.random()
        if kind < 0.2:
            out.append(TaskShape(cpu, 0, 0, memory_mib=memory))
        elif kind < 0.7:
            out.append(TaskShape(cpu, rng.choice((50, 250, 333, 500, 999)), 1, memory_mib=memory))
        else:
            out.append(TaskShape(cpu, rng.choice((1000, 1000, 500)), rng.choice((1, 2, 3, 8)),
                                 memory_mib=memory))
    return out


@pytest.mark.parametrize("policy", FGD_FAMILY)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cluster_cpu_per_gpu", [None, 1e6, 1e-6])
def test_arrays_equal_node_by_node_scores(policy: str, seed: int,
                                          cluster_cpu_per_gpu: float | None) -> None:
    """None: the engine's own nodes' CPU per GPU; 1e6: CPU plentiful (no pressure); 1e-6:
    CPU scarce, which turns fgdx-auto's CPU balance on."""
    rng = random.Random(seed * 31 + len(policy))
    engine = random_engine(rng, policy)
    ctx = engine.ctx
    if cluster_cpu_per_gpu is not None:
        ctx.cluster_cpu_per_gpu = cluster_cpu_per_gpu
    chosen = NODE_POLICIES[policy]()
    layout = engine._layout
    rows = np.arange(len(layout.rows), dtype=np.int64)
    for task in tasks(rng):
        arrays = chosen.score_arrays(ctx, task, node_arrays(layout, rows))
        assert arrays is not None
        expected = [chosen.score(ctx, task, layout.view(int(r))) for r in rows]
        assert arrays.tolist() == expected, task


def test_fgdx_auto_is_tested_under_cpu_pressure() -> None:
    """The parametrisation above really switches fgdx-auto's balance on (else its balanced
    branch would go untested)."""
    rng = random.Random(1)
    engine = random_engine(rng, "fgdx-auto")
    engine.ctx.cluster_cpu_per_gpu = 1e-6
    policy = NODE_POLICIES["fgdx-auto"]()
    assert policy.balances_cpu(engine.ctx)  # type: ignore[attr-defined]


def test_a_subclass_that_scores_its_own_way_is_not_scored_from_arrays() -> None:
    class Shifted(FgdPolicy):
        name = "test-shifted-fgd"

        def score(self, ctx, task, node):  # type: ignore[no-untyped-def]
            return 1.0

    engine = Engine([Node("a", 8000, 8192, (Card(0, "g", "T4", 16000),))])
    engine.node_view("a")  # the layout's arrays built
    rows = np.arange(1, dtype=np.int64)
    assert Shifted().score_arrays(engine.ctx, TaskShape(1000, 500, 1),
                                  node_arrays(engine._layout, rows)) is None


def place_stream(policy: str) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
    """Where 150 pods that each ask their own CPU land, one after the other."""
    rng = random.Random(7)
    engine = random_engine(rng, policy)
    out: list[tuple[str, tuple[tuple[int, int], ...]]] = []
    for i in range(150):
        milli = rng.choice((250, 500, 1000))
        container = (ContainerRequest.share("main", milli, 1024) if milli < 1000
                     else ContainerRequest.whole("main", rng.choice((1, 2))))
        pod = PodRequest(f"p{i}", containers=(container,), cpu_milli=100 + 37 * i,
                         memory_mib=1024 + i)
        try:
            placed = engine.place(pod)
        except Unschedulable:
            out.append(("-", ()))
            continue
        engine.allocate(f"p{i}", placed, pod)
        out.append((placed.node, tuple((s.index, s.milli) for s in placed.shares())))
    return out


@pytest.mark.parametrize("policy", FGD_FAMILY)
def test_distinct_shapes_place_as_node_views_do(policy: str, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    """A stream of pods that each differ in CPU is placed alike with and without the arrays
    (the engine asks them for a new shape's many missing scores)."""
    with_arrays = place_stream(policy)
    monkeypatch.setattr(NODE_POLICIES[policy], "cache_arrays", False)
    monkeypatch.setattr(NODE_POLICIES[policy], "score_arrays",
                        lambda self, ctx, task, nodes: None)
    assert place_stream(policy) == with_arrays


@pytest.mark.parametrize("seed", range(4))
def test_fragmentation_of_many_states_is_the_scalar_value(seed: int) -> None:
    """`nodes_array` against `node` / `node_with_memory` state by state, to the bit, with card
    models the workload's shapes restrict, rows padded, CPU and memory at the requests' edges."""
    from elastic_gpu.core.frag import Fragmentation

    rng = random.Random(seed)
    measure = Fragmentation(random_workload(rng))
    width = rng.choice((1, 4, 8))
    free = np.array([sorted((rng.choice((-1, 0, 50, 250, 500, 999, 1000))
                             for _ in range(width)), reverse=True) for _ in range(300)],
                    dtype=np.int64)
    free = np.where(np.cumsum(free < 0, axis=1) > 0, -1, free)  # the padding is a suffix
    model_ids = np.array([rng.randrange(len(MODELS)) for _ in range(300)], dtype=np.int64)
    cpu = np.array([rng.choice((0, 500, 1999, 2000, 16000, 96000)) for _ in range(300)],
                   dtype=np.int64)
    memory = np.array([rng.choice((0, 4095, 4096, 65536, 262144)) for _ in range(300)],
                      dtype=np.int64)
    cards = [tuple(int(v) for v in row if v >= 0) for row in free]
    plain = measure.nodes_array(MODELS, model_ids, cpu, None, free)
    assert plain.tolist() == [measure.node(MODELS[m], int(c), f)
                              for m, c, f in zip(model_ids, cpu, cards, strict=True)]
    with_memory = measure.nodes_array(MODELS, model_ids, cpu, memory, free)
    assert with_memory.tolist() == [
        measure.node_with_memory(MODELS[m], int(c), int(mem), f)
        for m, c, mem, f in zip(model_ids, cpu, memory, cards, strict=True)]

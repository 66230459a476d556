"""The Score plug-in seam: the engine scores every node policy through it, vectorised ones too."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from engine_helpers import gpu_node, share

from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.placement.scoring import node_arrays
from elastic_gpu.core.policies import NODE_POLICIES, NodeArrays, NodePolicy, NodeView, ScoreContext
from elastic_gpu.core.workload import TaskShape


class MostFreeCpu(NodePolicy):
    """A new policy written as one class: the node with the most free CPU, from arrays."""

    name = "test-most-free-cpu"
    calls = 0

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        raise AssertionError("a policy with score_arrays is never asked node by node")

    def score_arrays(self, ctx: ScoreContext, task: TaskShape, nodes: NodeArrays
                     ) -> npt.NDArray[np.float64]:
        MostFreeCpu.calls += 1
        return nodes.cpu_free.astype(np.float64)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(NODE_POLICIES, MostFreeCpu.name, MostFreeCpu)
    MostFreeCpu.calls = 0


@pytest.mark.usefixtures("registered")
def test_a_vectorised_policy_is_one_class_and_one_call_per_request() -> None:
    engine = Engine([gpu_node("a", cards=2), gpu_node("b", cards=2), gpu_node("c", cards=2)],
                    PolicyConfig(node_policy=MostFreeCpu.name, card_policy="binpack"))
    engine.set_outside_usage("a", 4000, 0)
    engine.set_outside_usage("c", 2000, 0)
    assert engine.place(share("p", 300)).node == "b"
    assert MostFreeCpu.calls == 1
    scores = engine.score(share("q", 300), ["a", "b", "c"])
    assert MostFreeCpu.calls == 2
    assert scores["b"] > scores["c"] > scores["a"]


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_the_classic_rules_score_from_arrays_as_node_by_node(policy: str) -> None:
    engine = Engine([gpu_node("a", cards=2), gpu_node("b", cards=4)],
                    PolicyConfig(node_policy=policy))
    engine.allocate("ns/x", engine.assign(share("x", 500), "a"), share("x", 500))
    chosen = NODE_POLICIES[policy]()
    task = TaskShape(1000, 300, 1)
    for name in ("a", "b"):
        row = engine.rows_of([name])
        arrays = chosen.score_arrays(engine.ctx, task, node_arrays(engine._layout, row))
        assert arrays is not None
        assert arrays.tolist() == [chosen.score(engine.ctx, task, engine.node_view(name))]

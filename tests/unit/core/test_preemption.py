"""core.preemption.victims_on on the engine alone: the victims the cards need, the engine
left as it was found."""

from __future__ import annotations

from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.preemption import victims_on
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest


def share(name: str, percent: int) -> PodRequest:
    return pod_request_from_manifest(pod_manifest(
        name, uid=f"uid-{name}", limits={"elasticgpu.io/gpu-core": str(percent)}))


def test_victims_are_added_lowest_priority_first_and_given_back_when_not_needed() -> None:
    engine = Engine([Node("n1", 64_000, 256_000, tuple(Card(i, f"GPU-{i}", "T4", 16384)
                                                        for i in range(2)))])
    for uid, percent in (("hi", 70), ("a", 20), ("b", 60)):
        engine.allocate(uid, engine.assign(share(uid, percent), "n1"))
    before = dict(engine.allocations())
    card = {uid: next(iter(a.shares())).index for uid, a in before.items()}
    assert card["hi"] == card["a"] != card["b"]  # the layout the case needs
    residents = {"hi": 100, "a": 0, "b": 1}
    # a (lowest) frees too little on its card; b frees card 1, and then a is not needed
    assert victims_on(engine, share("p", 50), "n1", [], before, residents, 50) == ["b"]
    # kube-scheduler's own victims are kept; a pod outranking the preemptor is never added
    assert victims_on(engine, share("p", 50), "n1", ["a"], before, residents, 50) == ["a", "b"]
    assert victims_on(engine, share("p", 200), "n1", [], before, residents, 50) is None
    assert dict(engine.allocations()) == before  # the what-if left every hold in place
